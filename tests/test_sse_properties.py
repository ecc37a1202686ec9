"""Properties of the SSE parser over arbitrary byte streams (hypothesis): a stream cut anywhere
parses exactly like the whole and like a plain line-by-line reference; memory stays under the
cap plus one read; an oversized event is an error wherever the cuts fall; and time is linear."""

from __future__ import annotations

import itertools
import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from proxy.core.sse import Event, EventTooLarge, SSEParser
from proxy.errors import UpstreamFailure

_EOL = re.compile(rb"\r\n|\r|\n")

# Pieces SSE streams are made of, weighted towards the ones that matter (line ends, field
# names, the CR/LF boundary, multi-byte UTF-8, U+2028 inside data).
PIECES = st.sampled_from(
    [
        b"data: ",
        b"data:",
        b"event: x",
        b": ping",
        b"id: 1",
        b"\n",
        b"\r",
        b"\r\n",
        b"\n\n",
        b'{"a":1}',
        b"[DONE]",
        "é\u2028\u0085".encode(),
        b"x",
        b" ",
    ]
)
STREAMS = st.one_of(
    st.lists(PIECES, max_size=60).map(b"".join),
    st.binary(max_size=300),
)


def reference(stream: bytes) -> tuple[list[tuple[bytes, bytes | None, str | None]], bytes]:
    """Line by line over the whole stream at once: an event ends at a blank line that follows
    a non-blank one; the unterminated rest is returned separately."""
    events = []
    start = line = 0
    content = False
    for m in _EOL.finditer(stream):
        if m.start() != line:
            content = True
        elif content:
            raw = stream[start : m.end()]
            data: list[bytes] = []
            name = None
            for ln in _EOL.split(raw):
                if not ln or ln[:1] == b":":
                    continue
                field, sep, value = ln.partition(b":")
                if sep and value[:1] == b" ":
                    value = value[1:]
                if field == b"data":
                    data.append(value)
                elif field == b"event":
                    name = value.decode("utf-8", "replace")
            events.append((raw, b"\n".join(data) if data else None, name))
            start = m.end()
            content = False
        line = m.end()
    return events, stream[start:]


def run(pieces: list[bytes], cap: int = 1 << 20) -> tuple[list[Event], bytes, bool]:
    """Feed ``pieces``; the events, the unterminated rest, and whether the cap was hit."""
    parser = SSEParser(max_event_bytes=cap)
    events: list[Event] = []
    try:
        for piece in pieces:
            events += parser.feed(piece)
            assert parser.pending <= cap
        events += parser.close()
    except EventTooLarge as exc:
        return events + exc.events, b"", True
    return events, parser.flush(), False


def cut(stream: bytes, points: list[int]) -> list[bytes]:
    bounds = sorted({p % (len(stream) + 1) for p in points} | {0, len(stream)})
    return [stream[a:b] for a, b in itertools.pairwise(bounds)]


def shape(events: list[Event]) -> list[tuple[bytes, bytes | None, str | None]]:
    return [(e.raw, e.data, e.event) for e in events]


@settings(max_examples=400, deadline=None)
@given(STREAMS, st.lists(st.integers(min_value=0), max_size=12))
def test_any_split_parses_like_the_whole_and_like_the_reference(
    stream: bytes, points: list[int]
) -> None:
    whole, rest, _ = run([stream])
    expected, expected_rest = reference(stream)
    assert shape(whole) == expected
    assert rest == expected_rest
    split, split_rest, _ = run(cut(stream, points))
    assert shape(split) == expected
    assert split_rest == expected_rest
    assert b"".join(e.raw for e in split) + split_rest == stream


@settings(max_examples=300, deadline=None)
@given(STREAMS, st.lists(st.integers(min_value=0), max_size=12), st.integers(8, 64))
def test_the_cap_holds_wherever_the_stream_is_cut(
    stream: bytes, points: list[int], cap: int
) -> None:
    """Whole or cut, the same events come out before an oversized one and the same verdict;
    ``pending`` never exceeds the cap after a read (checked in :func:`run`)."""
    expected, rest = reference(stream)
    too_large = any(len(raw) > cap for raw, _, _ in expected) or len(rest) > cap
    before = []
    for ev in expected:
        if len(ev[0]) > cap:
            break
        before.append(ev)
    for pieces in ([stream], cut(stream, points)):
        events, _, raised = run(pieces, cap)
        assert raised == too_large
        assert shape(events) == (before if raised else expected)


def test_event_too_large_is_an_upstream_failure_the_relay_already_handles() -> None:
    parser = SSEParser(max_event_bytes=1024)
    parser.feed(b"data: ok\n\n")
    with pytest.raises(UpstreamFailure) as err:
        for _ in range(10):
            parser.feed(b"data: " + b"x" * 200)
    assert isinstance(err.value, EventTooLarge)
    assert err.value.kind == "protocol" and err.value.error.status == 502
    assert err.value.error.code == "upstream_event_too_large"
    assert parser.pending == 0


@pytest.mark.parametrize("eol", [b"\n", b"\r\n"], ids=["LF", "CRLF"])
def test_a_4_mib_event_in_1_kib_reads_is_linear(eol: bytes) -> None:
    """The scan resumes where it stopped: the bytes scanned over 4,096 reads of one 4 MiB event
    are about the event's size, so they cost about one read (the rescanning parser scanned
    each read's whole buffer again: 0.8 s for 1 MiB, > 20 s for 6 MiB). The work is counted,
    not timed: ``bench/measure/relay/bench_sse.py`` has the figures."""

    class Counting(SSEParser):
        scanned = 0

        def _scan(
            self, buf: bytes | bytearray, pos: int, *, final: bool = False
        ) -> tuple[list[Event], int]:
            self.scanned += len(buf) - pos
            return super()._scan(buf, pos, final=final)

    size = 4 << 20
    event = b"data: " + b"x" * (size - 6 - 2 * len(eol)) + eol + eol
    parser = Counting(max_event_bytes=size)
    out = []
    for i in range(0, len(event), 1024):
        out += parser.feed(event[i : i + 1024])
    assert [e.raw for e in out] == [event]
    assert parser.scanned <= 2 * len(event), parser.scanned
