"""The SSE parser: exact raw bytes kept, lines split on CR/LF/CRLF only, splits anywhere."""

from __future__ import annotations

from pathlib import Path

import pytest

from proxy.core.sse import SSEParser

STREAMS = sorted((Path(__file__).parent / "streams").glob("*.sse"))


def parse(pieces: list[bytes]) -> tuple[list[tuple[bytes, bytes | None]], bytes]:
    parser = SSEParser()
    events = [e for piece in pieces for e in parser.feed(piece)] + parser.close()
    return [(e.raw, e.data) for e in events], parser.flush()


@pytest.mark.parametrize("path", STREAMS, ids=lambda p: p.name)
def test_every_split_point_gives_the_same_events(path: Path) -> None:
    """Cutting a recorded stream at any byte (inside UTF-8 characters, between CR and LF, …)
    yields the same data and the raw bytes still add up to the whole stream."""
    whole = path.read_bytes()
    expected, rest = parse([whole])
    assert rest == b""
    assert b"".join(raw for raw, _ in expected) == whole
    datas = [d for _, d in expected if d is not None]
    for cut in range(1, len(whole)):
        got, rest = parse([whole[:cut], whole[cut:]])
        assert [d for _, d in got if d is not None] == datas, cut
        assert b"".join(raw for raw, _ in got) + rest == whole


@pytest.mark.parametrize("path", STREAMS, ids=lambda p: p.name)
def test_byte_at_a_time_gives_the_same_events(path: Path) -> None:
    whole = path.read_bytes()
    expected, _ = parse([whole])
    got, rest = parse([whole[i : i + 1] for i in range(len(whole))])
    assert b"".join(raw for raw, _ in got) + rest == whole
    assert [d for _, d in got if d is not None] == [d for _, d in expected if d is not None]


def test_unicode_line_separators_inside_data_do_not_split_lines() -> None:
    """U+2028 and U+0085 are legal unescaped in JSON; only CR/LF end an SSE line."""
    data = '{"text":"a\u2028b\u0085c"}'.encode()
    [event] = SSEParser().feed(b"data: " + data + b"\n\n")
    assert event.data == data


@pytest.mark.parametrize("eol", [b"\n", b"\r", b"\r\n"], ids=["LF", "CR", "CRLF"])
def test_all_three_line_endings(eol: bytes) -> None:
    raw = b"data: one" + eol + eol + b"data: two" + eol + eol
    parser = SSEParser()
    events = parser.feed(raw) + parser.close()
    assert [e.data for e in events] == [b"one", b"two"]
    assert b"".join(e.raw for e in events) == raw


def test_cr_at_end_of_read_waits_for_a_possible_lf() -> None:
    parser = SSEParser()
    assert parser.feed(b"data: x\r\n\r") == []
    [event] = parser.feed(b"\ndata: y")
    assert event.raw == b"data: x\r\n\r\n"
    assert parser.flush() == b"data: y"


def test_comments_and_multi_line_data() -> None:
    events = SSEParser().feed(b": ping\n\nevent: message\ndata: a\ndata:b\nid: 3\n\n")
    assert events[0].data is None
    assert events[0].raw == b": ping\n\n"
    assert events[1].data == b"a\nb"
    assert events[1].event == "message"


def test_done_is_recognised() -> None:
    [event] = SSEParser().feed(b"data: [DONE]\n\n")
    assert event.is_done


def test_incomplete_event_is_kept_until_complete() -> None:
    parser = SSEParser()
    assert parser.feed(b'data: {"a":') == []
    assert parser.pending == len(b'data: {"a":')
    [event] = parser.feed(b"1}\n\n")
    assert event.data == b'{"a":1}'


def test_single_event_fast_path_still_honours_cr() -> None:
    """A lone CR inside what looks like one data line ends that line."""
    [event] = SSEParser().feed(b"data: a\rb\n\n")
    assert event.data == b"a"
    [event] = SSEParser().feed(b'data: {"x":1}\n\n')
    assert event.data == b'{"x":1}' and event.raw == b'data: {"x":1}\n\n'
