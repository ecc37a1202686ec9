"""The relay's per-token fast path (``chunks.text_chunk`` and ``StreamGuard._text_event``) against
the general path it short-cuts: whatever the bytes, a match reads exactly what ``orjson.loads``
reads (hypothesis), and a guard fed one event per read (the fast path) sends the same bytes and
ends in the same state as one that parses every event."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import orjson
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from proxy.core import chunks
from proxy.core.guard import GuardPolicy, StreamGuard
from proxy.detect import Detector
from tests.fakes.vllm import FakeVLLM, Script

CORPUS = [
    json.loads(line)
    for line in (Path(__file__).parent / "data" / "corpus.jsonl").read_text().splitlines()
]
LOOP = "The answer is the answer. " * 200

_HEAD = b'{"id":"chatcmpl-1","object":"chat.completion.chunk","created":1,"model":"m",'


def _general(read: bytes) -> tuple[int, str, dict[str, Any] | None] | None:
    """What the general path reads out of a one-event read: index, text, usage dict."""
    if not (read.startswith(b"data: ") and read.endswith(b"\n\n")):
        return None
    try:
        chunk = orjson.loads(read[6:-2])
    except orjson.JSONDecodeError:
        return None
    [choice] = chunk["choices"]
    usage = chunk.get("usage")
    return choice["index"], chunks.choice_text(choice), usage


def _check_agrees(read: bytes) -> chunks.TextChunk | None:
    tc = chunks.text_chunk(read)
    if tc is not None:
        assert _general(read) == (tc.index, tc.text, tc.usage)
        assert read[tc.usage_at :].startswith(b',"usage":') or tc.usage_at == -1
    return tc


# JSON string bodies as an engine might escape them, lone surrogates and bad escapes included.
_ESCAPED = st.lists(
    st.one_of(
        st.text(max_size=8).map(lambda s: orjson.dumps(s)[1:-1]),
        st.text(max_size=4).map(lambda s: json.dumps(s)[1:-1].encode()),  # \uXXXX escapes
        st.sampled_from(
            [
                b"\\ud800",
                b"\\udc00x",
                b"\\ud83d\\ude42",
                b"\\u00e9",
                b"\\/",
                b"\\x",
                b"\\",
                b'"',
                b"\\\n",
                b"\x01",
                b"\xff",
                b"\xc3",
                b"\xe2\x80\xa8",
            ]
        ),
    ),
    max_size=6,
).map(b"".join)


@settings(max_examples=400, deadline=None)
@given(
    body=_ESCAPED,
    usage=st.sampled_from(
        [
            b"",
            b',"usage":null',
            b',"usage":{"prompt_tokens":7,"total_tokens":9,"completion_tokens":2}',
            b',"usage":{"prompt_tokens":7,"total_tokens":9,"completion_tokens":2,'
            b'"completion_tokens_details":null}',
        ]
    ),
    chat=st.booleans(),
)
@example(body=b'caf\\u00e9 \\"x\\"', usage=b"", chat=True)
def test_a_match_reads_what_orjson_reads(body: bytes, usage: bytes, chat: bool) -> None:
    text = b'"delta":{"content":"' + body + b'"}' if chat else b'"text":"' + body + b'"'
    read = (
        b"data: "
        + _HEAD
        + b'"choices":[{"index":0,'
        + text
        + b',"logprobs":null,"finish_reason":null}]'
        + usage
        + b"}\n\n"
    )
    tc = _check_agrees(read)
    try:
        expected = orjson.loads(b'"' + body + b'"')
    except orjson.JSONDecodeError:
        assert tc is None
    else:
        # Every valid string body takes the fast path.
        assert tc is not None and tc.text == expected


@settings(max_examples=400, deadline=None)
@given(st.data())
def test_mutated_chunks_never_disagree(data: st.DataObject) -> None:
    """Any byte changed, inserted or removed in a real chunk: no match, or the same reading."""
    text = data.draw(st.text(max_size=10))
    chunk = {
        "id": "chatcmpl-1",
        "object": "chat.completion.chunk",
        "created": 1,
        "model": "m",
        "choices": [
            {"index": 0, "delta": {"content": text}, "logprobs": None, "finish_reason": None}
        ],
        "usage": {"prompt_tokens": 7, "total_tokens": 9, "completion_tokens": 2},
    }
    read = bytearray(b"data: " + orjson.dumps(chunk) + b"\n\n")
    assert _check_agrees(bytes(read)) is not None
    for _ in range(data.draw(st.integers(1, 3))):
        at = data.draw(st.integers(0, len(read) - 1))
        op = data.draw(st.sampled_from(["set", "insert", "delete"]))
        byte = data.draw(st.sampled_from([*b'"\\{}[],:0123nul\n\x00\xff ', 65]))
        if op == "set":
            read[at] = byte
        elif op == "insert":
            read.insert(at, byte)
        else:
            del read[at]
    try:
        _check_agrees(bytes(read))
    except (ValueError, KeyError, TypeError, AttributeError):
        # The general reading itself does not apply (no single choice, not a dict, ...):
        # then the fast path must not have matched.
        assert chunks.text_chunk(bytes(read)) is None


@pytest.mark.parametrize(
    "read",
    [
        # a finish reason, a role, a second choice, logprobs, an unknown key: the general path
        _HEAD[:-1] + b',"choices":[{"index":0,"delta":{"content":"a"},"finish_reason":"stop"}]}',
        _HEAD + b'"choices":[{"index":0,"delta":{"role":"assistant","content":""}}]}',
        _HEAD + b'"choices":[{"index":0,"delta":{"content":"a"}},{"index":1,"delta":{}}]}',
        _HEAD + b'"choices":[{"index":0,"delta":{"content":"a"},"logprobs":{"content":[]}}]}',
        _HEAD + b'"choices":[{"index":0,"delta":{"content":"a"}}],"error":null}',
        _HEAD + b'"choices":[{"index":00,"delta":{"content":"a"}}]}',
        b'{"id":"caf\xc3\xa9","choices":[{"index":0,"delta":{"content":"a"}}]}',
    ],
)
def test_other_shapes_take_the_general_path(read: bytes) -> None:
    assert chunks.text_chunk(b"data: " + read + b"\n\n") is None


def _events(texts: list[str], *, chat: bool, usage: bool, n: int = 1) -> list[bytes]:
    req: dict[str, Any] = {"model": "m", "stream": True, "n": n}
    if usage:
        req["stream_options"] = {"include_usage": True, "continuous_usage_stats": True}
    events = FakeVLLM()._events(req, chat, Script(texts=texts))
    return [e for e in events if e is not None]


_COUNTS_END = re.compile(rb'("completion_tokens":[0-9]+)\}')


def _as_vllm_032(events: list[bytes], chat: bool) -> list[bytes]:
    """The events with the null fields vLLM 0.32 adds (``token_ids`` on every choice,
    ``prompt_token_ids`` on completions, ``completion_tokens_details`` on chat usage)."""
    extra = b',"token_ids":null' if chat else b',"prompt_token_ids":null,"token_ids":null'
    out = []
    for e in events:
        e = e.replace(b'"finish_reason":null}', b'"finish_reason":null' + extra + b"}")
        if chat:
            e = _COUNTS_END.sub(rb'\1,"completion_tokens_details":null}', e)
        out.append(e)
    return out


def _run(events: list[bytes], fast: bool, **policy: Any) -> tuple[bytes, StreamGuard]:
    g = StreamGuard(GuardPolicy.create(**policy), Detector)
    if not fast:
        g._quick = None
    out = b"".join(g.feed(e) for e in events) + g.eof()
    return out, g


def _state(g: StreamGuard) -> Any:
    return (
        g.done,
        g.saw_done,
        g.aborted,
        g.usage,
        g.prompt_tokens,
        g.first_content,
        [
            (s.index, s.tokens, s.chars, s.finish_reason, s.stop_reason, s.verdict, s.action)
            for s in g.choices.values()
        ],
        [(r.completion_tokens, r.summary) for r in g.records(None)],
    )


TEXTS = [r["text"] for r in CORPUS[:12]] + ["Sure. " + LOOP, 'Quote "me" \\ naïve 🙂\u2028 end']


@pytest.mark.parametrize("text", TEXTS, ids=range(len(TEXTS)))
@pytest.mark.parametrize("vllm_032", [False, True], ids=["fake", "vllm-0.32"])
@pytest.mark.parametrize("mode", ["enforce", "monitor"])
@pytest.mark.parametrize(
    ("chat", "usage", "strip"),
    [(True, True, True), (True, True, False), (True, False, False), (False, True, True)],
)
def test_one_event_per_read_matches_the_general_path(
    text: str, vllm_032: bool, mode: str, chat: bool, usage: bool, strip: bool
) -> None:
    events = _events([text], chat=chat, usage=usage)
    if vllm_032:
        events = _as_vllm_032(events, chat)
    policy: dict[str, Any] = {
        "endpoint": "chat" if chat else "completions",
        "mode": mode,
        "strip_chunk_usage": strip,
        "strip_final_usage": strip,
        "client_wants_usage": not strip,
        "usage_null": not chat,
    }
    fast_out, fast = _run(events, True, **policy)
    slow_out, slow = _run(events, False, **policy)
    assert fast_out == slow_out
    assert _state(fast) == _state(slow)
    if (mode == "monitor" or not slow.aborted) and not strip:
        assert fast_out == b"".join(events)


@pytest.mark.parametrize("chat", [True, False])
def test_the_fast_path_is_taken(chat: bool) -> None:
    """Guards against a pattern that silently stopped matching vLLM's chunks."""
    events = _as_vllm_032(_events([CORPUS[0]["text"]], chat=chat, usage=True), chat)
    assert b"_details" in events[2] or not chat
    assert (
        sum(chunks.text_chunk(e) is not None for e in events) >= len(events) - 4
    )  # role, finish, usage, [DONE]


def test_n2_streams_match_the_general_path() -> None:
    events = _events([CORPUS[0]["text"][:400], "Well. " + LOOP], chat=True, usage=False, n=2)
    fast_out, fast = _run(events, True)
    slow_out, slow = _run(events, False)
    assert fast_out == slow_out
    assert _state(fast) == _state(slow)
    assert fast.aborted
