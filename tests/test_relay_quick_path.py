"""The relay's byte-level path beyond one chat chunk per read: the text and reasoning deltas of
Responses and Messages (``quick`` of their surfaces) and reads that hold several events, against
the general path (every event SSE-split and parsed): whatever the bytes and however the reads
are cut, the same client bytes and the same state."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import orjson
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from proxy.core.guard import GuardPolicy, StreamGuard
from proxy.core.records import Endpoint
from proxy.core.surfaces import messages, responses
from proxy.detect import Detector
from tests.relay_golden import _events, _split, _texts
from tests.test_relay_fast_path import _ESCAPED, _state

STREAMS = Path(__file__).parent / "streams"
RECORDED: list[tuple[str, Endpoint]] = [
    ("surfaces/responses_vllm.sse", "responses"),
    ("surfaces/responses_vllm_loop.sse", "responses"),
    ("reasoning/responses.sse", "responses"),
    ("surfaces/messages_vllm.sse", "messages"),
    ("surfaces/messages_vllm_loop.sse", "messages"),
    ("reasoning/messages.sse", "messages"),
    ("chat_usage.sse", "chat"),
    ("reasoning/chat.sse", "chat"),
]


def _guard(surface: Endpoint, quick: bool) -> StreamGuard:
    policy = GuardPolicy.create(
        endpoint=surface,
        strip_chunk_usage=surface == "chat",
        strip_final_usage=surface == "chat",
        client_wants_usage=False,
    )
    g = StreamGuard(policy, Detector)
    if not quick:
        g._quick = None
    return g


def _full_state(g: StreamGuard) -> Any:
    extra = None if g.extra is None else repr(dataclasses.asdict(g.extra))
    return _state(g), extra


def _relay(surface: Endpoint, reads: list[bytes], quick: bool) -> tuple[bytes, Any]:
    g = _guard(surface, quick)
    out = []
    for read in reads:
        out.append(g.feed(read))
    out.append(g.eof())
    return b"".join(out), _full_state(g)


def _agree(surface: Endpoint, reads: list[bytes]) -> bytes:
    quick = _relay(surface, reads, True)
    assert quick == _relay(surface, reads, False)
    return quick[0]


def _is_text_delta(event: bytes) -> bool:
    """A Responses text/reasoning delta or a Messages text/thinking delta."""
    obj = orjson.loads(event.split(b"data: ", 1)[1]) if b"data: {" in event else {}
    kind = obj.get("type")
    if kind == "content_block_delta":
        return obj["delta"]["type"] in ("text_delta", "thinking_delta")
    return kind in ("response.output_text.delta", "response.reasoning_text.delta")


def _head(path: str) -> list[bytes]:
    """The recorded stream's events before its first text delta."""
    events = _split((STREAMS / path).read_bytes())
    return events[: next(i for i, e in enumerate(events) if _is_text_delta(e))]


def _valid(body: bytes) -> bool:
    try:
        orjson.loads(b'"' + body + b'"')
    except orjson.JSONDecodeError:
        return False
    return True


def _responses_delta(body: bytes, kind: bytes, seq: int) -> bytes:
    logprobs = b'"logprobs":[],' if kind == b"output_text" else b""
    return (
        b"event: response." + kind + b".delta\ndata: "
        b'{"content_index":0,"delta":"' + body + b'","item_id":"msg_1",' + logprobs
        + b'"output_index":0,"sequence_number":%d,"type":"response.' % seq
        + kind + b'.delta"}\n\n'
    )  # fmt: skip


def _messages_delta(body: bytes, kind: bytes) -> bytes:
    key = b"text" if kind == b"text" else b"thinking"
    return (
        b'event: content_block_delta\ndata: {"type":"content_block_delta","delta":{"type":"'
        + kind + b'_delta","' + key + b'":"' + body + b'"},"index":0}\n\n'
    )  # fmt: skip


@settings(max_examples=100, deadline=None)
@given(body=_ESCAPED, kind=st.sampled_from([b"output_text", b"reasoning_text"]))
@example(body=b'caf\\u00e9 \\"x\\"', kind=b"output_text")
def test_a_responses_delta_reads_what_parsing_reads(body: bytes, kind: bytes) -> None:
    head = _head("surfaces/responses_vllm.sse")
    event = _responses_delta(body, kind, len(head))
    if _valid(body):
        assert responses._DELTA_EVENT(event) is not None
    _agree("responses", [*head, event, event])


@settings(max_examples=100, deadline=None)
@given(body=_ESCAPED, kind=st.sampled_from([b"text", b"thinking"]))
@example(body=b"", kind=b"text")
def test_a_messages_delta_reads_what_parsing_reads(body: bytes, kind: bytes) -> None:
    head = _head("surfaces/messages_vllm.sse")
    event = _messages_delta(body, kind)
    if _valid(body):
        assert messages._DELTA_EVENT(event) is not None
    _agree("messages", [*head, event, event])


@settings(max_examples=150, deadline=None)
@given(st.data())
def test_mutated_deltas_never_disagree(data: st.DataObject) -> None:
    """Any byte of a real delta changed, inserted or removed: the same outcome either way."""
    surface = data.draw(st.sampled_from(["responses", "messages"]))
    path = f"surfaces/{surface}_vllm.sse"
    head = _head(path)
    event = bytearray(_split((STREAMS / path).read_bytes())[len(head)])
    for _ in range(data.draw(st.integers(1, 3))):
        at = data.draw(st.integers(0, len(event) - 1))
        op = data.draw(st.sampled_from(["set", "insert", "delete"]))
        byte = data.draw(st.sampled_from([*b'"\\{}[],:0123nul\n\r\x00\xff ', 65]))
        if op == "set":
            event[at] = byte
        elif op == "insert":
            event.insert(at, byte)
        else:
            del event[at]
    _agree(surface, [*head, bytes(event), bytes(event)])


@pytest.mark.parametrize(("path", "surface"), RECORDED, ids=[p for p, _ in RECORDED])
@settings(max_examples=15, deadline=None)
@given(cuts=st.lists(st.integers(0, 1 << 16), max_size=40))
def test_recorded_streams_cut_anywhere_agree(path: str, surface: Endpoint, cuts: list[int]) -> None:
    data = (STREAMS / path).read_bytes()
    at = sorted({c % (len(data) + 1) for c in cuts})
    reads = [data[a:b] for a, b in zip([0, *at], [*at, len(data)], strict=True) if b > a]
    assert _agree(surface, reads)


@pytest.mark.parametrize("surface", ["chat", "completions", "responses", "messages"])
@pytest.mark.parametrize("per_read", [2, 3, 7])
def test_reads_of_several_whole_events_agree(surface: Endpoint, per_read: int) -> None:
    """The engine ran ahead of the relay: several whole events per read, healthy and looping
    answers (the golden test pins the bytes; this checks the state too)."""
    for _name, text in _texts():
        events = _events(surface, text, True)
        reads = [b"".join(events[i : i + per_read]) for i in range(0, len(events), per_read)]
        out = _agree(surface, reads)
        assert out


def test_the_quick_path_reads_the_recorded_deltas() -> None:
    """Guards against a pattern that silently stopped matching vLLM's events."""
    for path, surface in RECORDED[:6]:
        events = _split((STREAMS / path).read_bytes())
        pattern = responses._DELTA_EVENT if surface == "responses" else messages._DELTA_EVENT
        deltas = [e for e in events if _is_text_delta(e)]
        assert deltas, path
        assert all(pattern(e) is not None for e in deltas), path
