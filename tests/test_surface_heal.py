"""Heal mode on ``/v1/responses`` and ``/v1/messages``, served through the engine's chat route
(:mod:`proxy.core.surfaces.via_chat`): the request conversion, the writers (property-tested against
arbitrary read boundaries), and the whole path with the official ``openai`` and ``anthropic``
SDKs against the fake vLLM, which loops on the first request and ends healthily on the
continuation. The real-engine counterpart is ``tests/e2e/test_heal_vllm.py``."""

from __future__ import annotations

import itertools
from collections.abc import Callable
from typing import Any

import anthropic
import httpx
import openai
import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st

from proxy.core.rewrite import RewritePolicy, rewrite_request
from proxy.core.surfaces import via_chat
from proxy.observability.metrics import Metrics
from tests.conftest import Clients
from tests.fakes.vllm import FakeVLLM, Script
from tests.test_heal import ENDING, KEPT, LOOPING, MESSAGES, looping_then_healthy, recorded

ProxyFactory = Callable[..., str]
HEALED = KEPT.rstrip() + ENDING


def convert(endpoint: Any, body: dict[str, Any], **kw: Any) -> Any:
    rw = rewrite_request(body, endpoint, RewritePolicy())
    return via_chat.to_chat(endpoint, rw, usage=kw.get("usage", True), logprobs=False)


# ---------------------------------------------------------------- the request


def test_messages_become_the_chat_request_vllm_builds_from_them() -> None:
    body = {
        "model": "m",
        "max_tokens": 300,
        "system": [
            {"type": "text", "text": "x-anthropic-billing-header: abc"},
            {"type": "text", "text": "Be brief. "},
            {"type": "text", "text": "Be kind."},
        ],
        "messages": [
            {"role": "user", "content": [{"type": "text", "text": "Hi"}]},
            {"role": "assistant", "content": "Hello."},
            {
                "role": "user",
                "content": [{"type": "text", "text": "A"}, {"type": "text", "text": "B"}],
            },
        ],
        "temperature": 0.2,
        "top_k": 5,
        "stop_sequences": ["END"],
        "metadata": {"user_id": "u"},
    }
    chat = convert("messages", body)
    assert chat.body == {
        "messages": [
            {"role": "system", "content": "Be brief. Be kind."},
            {"role": "user", "content": "Hi"},
            {"role": "assistant", "content": "Hello."},
            {
                "role": "user",
                "content": [{"type": "text", "text": "A"}, {"type": "text", "text": "B"}],
            },
        ],
        "model": "m",
        "temperature": 0.2,
        "top_k": 5,
        "stop": ["END"],
        "max_tokens": 300,
        "stream": True,
        "stream_options": {"include_usage": True, "continuous_usage_stats": True},
    }
    assert chat.max_tokens == 300 and chat.n == 1 and chat.client_stream is False


def test_responses_become_chat_with_instructions_as_the_system_message() -> None:
    body = {
        "model": "m",
        "instructions": "Answer in Italian.",
        "input": [
            {"role": "developer", "content": "Be brief."},
            {
                "type": "message",
                "role": "user",
                "content": [{"type": "input_text", "text": "Ciao"}],
            },
        ],
        "max_output_tokens": 64,
        "repetition_penalty": 1.1,
        "tools": [],
        "text": {"format": {"type": "text"}},
        "store": False,
        "stream": True,
    }
    chat = convert("responses", body, usage=False)
    assert chat.body == {
        "messages": [
            {"role": "system", "content": "Answer in Italian."},
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": "Ciao"},
        ],
        "model": "m",
        "repetition_penalty": 1.1,
        "max_tokens": 64,
        "stream": True,
    }
    assert chat.client_stream is True
    plain = convert("responses", {"model": "m", "input": "Hello"})
    assert plain.body["messages"] == [{"role": "user", "content": "Hello"}]
    assert plain.body["max_tokens"] == RewritePolicy().max_tokens_default


@pytest.mark.parametrize(
    ("endpoint", "extra", "reason"),
    [
        ("messages", {"tools": [{"name": "t", "input_schema": {}}]}, "field:tools"),
        ("messages", {"thinking": {"type": "enabled", "budget_tokens": 100}}, "field:thinking"),
        (
            "messages",
            {"messages": [{"role": "user", "content": [{"type": "image", "source": {}}]}]},
            "content",
        ),
        ("responses", {"tools": [{"type": "function", "name": "f"}]}, "field:tools"),
        ("responses", {"previous_response_id": "resp_1"}, "field:previous_response_id"),
        ("responses", {"store": True}, "field:store"),
        ("responses", {"reasoning": {"effort": "low"}}, "field:reasoning"),
        ("responses", {"text": {"format": {"type": "json_object"}}}, "field:text"),
        ("responses", {"input": [{"type": "function_call_output", "output": "1"}]}, "input"),
        (
            "responses",
            {"input": [{"role": "assistant", "status": "incomplete", "content": "Once"}]},
            "input",
        ),
    ],
)
def test_what_keeps_its_native_route(endpoint: Any, extra: dict[str, Any], reason: str) -> None:
    """Anything the chat form could not say exactly stays on the surface's own route."""
    base: dict[str, Any] = (
        {"model": "m", "max_tokens": 10, "messages": MESSAGES}
        if endpoint == "messages"
        else {"model": "m", "input": "Hi"}
    )
    assert convert(endpoint, {**base, **extra}) == reason


# ---------------------------------------------------------------- the writers


def chat_stream(
    pieces: list[str], *, finish: str = "stop", guard: dict[str, Any] | None = None
) -> bytes:
    def ev(obj: dict[str, Any]) -> bytes:
        return b"data: " + orjson.dumps(obj) + b"\n\n"

    head = {"id": "chatcmpl-abc", "object": "chat.completion.chunk", "created": 5, "model": "m"}
    role = {"index": 0, "delta": {"role": "assistant", "content": ""}}
    out = [ev({**head, "choices": [role], "usage": {"prompt_tokens": 9, "completion_tokens": 0}})]
    for i, text in enumerate(pieces):
        out.append(ev({**head, "choices": [{"index": 0, "delta": {"content": text}}],
                       "usage": {"prompt_tokens": 9, "completion_tokens": i + 1}}))  # fmt: skip
    final: dict[str, Any] = {"index": 0, "delta": {"content": ""}, "finish_reason": finish}
    if guard is not None:
        final["guard"] = guard
    out.append(ev({**head, "choices": [final]}))
    out.append(
        ev({**head, "choices": [], "usage": {"prompt_tokens": 9, "completion_tokens": len(pieces)}})
    )
    out.append(b"data: [DONE]\n\n")
    return b"".join(out)


def named_events(raw: bytes) -> list[dict[str, Any]]:
    events = []
    for block in raw.split(b"\n\n"):
        if not block:
            continue
        name, data = block.split(b"\n", 1)
        obj = orjson.loads(data.removeprefix(b"data: "))
        assert name == b"event: " + obj["type"].encode()
        events.append(obj)
    return events


texts = st.lists(st.text(min_size=1, max_size=8), min_size=0, max_size=12)


@given(pieces=texts, cuts=st.lists(st.integers(min_value=0, max_value=4000), max_size=8))
def test_messages_writer_is_the_same_whatever_the_read_boundaries(
    pieces: list[str], cuts: list[int]
) -> None:
    raw = chat_stream(pieces)
    whole = via_chat.writer("messages", {"model": "m"}, "content_filter").stream(raw)
    w = via_chat.writer("messages", {"model": "m"}, "content_filter")
    bounds = sorted({min(c, len(raw)) for c in cuts} | {0, len(raw)})
    split = b"".join(w.stream(raw[a:b]) for a, b in itertools.pairwise(bounds))
    assert split == whole
    events = named_events(whole)
    kinds = [e["type"] for e in events]
    assert kinds[0] == "message_start" and kinds[-2:] == ["message_delta", "message_stop"]
    text = "".join(e["delta"]["text"] for e in events if e["type"] == "content_block_delta")
    assert text == "".join(pieces)
    assert (
        kinds.count("content_block_start")
        == kinds.count("content_block_stop")
        == (1 if pieces else 0)
    )
    assert events[-2]["usage"] == {"input_tokens": 9, "output_tokens": len(pieces)}
    assert events[-2]["delta"]["stop_reason"] == "end_turn"


@given(pieces=texts)
def test_responses_writer_numbers_every_event_and_closes_what_it_opened(pieces: list[str]) -> None:
    events = named_events(
        via_chat.writer("responses", {"model": "m"}, "content_filter").stream(chat_stream(pieces))
    )
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    kinds = [e["type"] for e in events]
    assert kinds[:2] == ["response.created", "response.in_progress"]
    assert kinds[-1] == "response.completed"
    for opened, closed in (
        ("response.output_item.added", "response.output_item.done"),
        ("response.content_part.added", "response.content_part.done"),
    ):
        assert kinds.count(opened) == kinds.count(closed) == (1 if pieces else 0)
    text = "".join(e["delta"] for e in events if e["type"] == "response.output_text.delta")
    assert text == "".join(pieces)
    final = events[-1]["response"]
    assert final["usage"]["output_tokens"] == len(pieces)
    assert "".join(c["text"] for item in final["output"] for c in item["content"]) == text


def test_an_abort_ends_each_surface_as_its_enforce_ending() -> None:
    guard = {"action": "aborted", "attempts": 2, "signal": "repetition", "onset_char": 3}
    raw = chat_stream(["abc"], finish="content_filter", guard=guard)
    m = named_events(via_chat.writer("messages", {}, "content_filter").stream(raw))
    assert m[-2]["delta"]["stop_reason"] == "refusal"
    assert m[-2]["delta"]["stop_details"]["explanation"] == "coherence_guard:repetition"
    assert m[-2]["delta"]["guard"] == guard
    r = named_events(via_chat.writer("responses", {}, "content_filter").stream(raw))
    assert r[-1]["type"] == "response.completed"  # vLLM's own early-stop ending
    assert r[-1]["response"]["status"] == "incomplete"
    details = r[-1]["response"]["incomplete_details"]
    assert details == {"reason": "content_filter", "guard": guard}
    assert r[-2]["item"]["status"] == "completed"
    old = via_chat.writer("responses", {}, "content_filter", "incomplete")
    r = named_events(old.stream(raw))
    assert r[-1]["type"] == "response.incomplete"
    assert r[-1]["response"]["incomplete_details"] == details
    assert r[-2]["item"]["status"] == "incomplete"


def test_a_length_stop_and_a_stop_sequence() -> None:
    m = named_events(
        via_chat.writer("messages", {}, "content_filter").stream(
            chat_stream(["a"], finish="length")
        )
    )
    assert m[-2]["delta"]["stop_reason"] == "max_tokens"
    r = named_events(
        via_chat.writer("responses", {}, "content_filter").stream(
            chat_stream(["a"], finish="length")
        )
    )
    assert r[-1]["type"] == "response.completed"
    assert r[-1]["response"]["incomplete_details"] == {"reason": "max_output_tokens"}
    raw = chat_stream(["a"]).replace(
        b'"finish_reason":"stop"', b'"finish_reason":"stop","stop_reason":"END"'
    )
    m = named_events(via_chat.writer("messages", {}, "content_filter").stream(raw))
    assert m[-2]["delta"] == {"stop_reason": "stop_sequence", "stop_sequence": "END"}


def test_errors_take_the_surface_envelope() -> None:
    err = orjson.dumps(
        {"error": {"message": "bad", "type": "BadRequestError", "param": None, "code": 400}}
    )
    assert orjson.loads(via_chat.writer("messages", {}, "content_filter").answer(400, err)) == {
        "type": "error",
        "error": {"type": "invalid_request_error", "message": "bad"},
    }
    assert via_chat.writer("responses", {}, "content_filter").answer(400, err) == err
    mid = b'data: {"error":{"message":"engine died","type":"upstream_error"}}\n\ndata: [DONE]\n\n'
    events = named_events(
        via_chat.writer("messages", {}, "content_filter").stream(
            chat_stream(["a"]).split(b"\n\n")[0] + b"\n\n" + mid
        )
    )
    assert events[-1] == {"type": "error", "error": {"type": "api_error", "message": "engine died"}}


# ---------------------------------------------------------------- through the proxy


def test_messages_sdk_stream_is_healed(
    fake_upstream: FakeVLLM, proxy_server: ProxyFactory, sdk: Clients
) -> None:
    looping_then_healthy(fake_upstream)
    metrics = Metrics()
    base = proxy_server(mode="heal", metrics=metrics)
    client = sdk.anthropic(base)
    with client.messages.stream(model="m", max_tokens=1000, messages=MESSAGES) as stream:  # type: ignore[arg-type]
        kinds = [event.type for event in stream]
        final = stream.get_final_message()
    assert final.content[0].text == HEALED  # type: ignore[union-attr]
    assert final.stop_reason == "end_turn" and final.id == "msg_first"
    assert kinds.count("message_start") == 1 and kinds.count("message_stop") == 1
    sent = fake_upstream.guarded_requests()
    assert [r.path for r in sent] == ["/v1/chat/completions"] * 2
    assert sent[0].json["messages"] == MESSAGES and sent[0].json["max_tokens"] == 1000
    assert sent[1].json["messages"][-1] == {"role": "assistant", "content": KEPT.rstrip()}
    assert sent[0].disconnected is not None  # the loop was closed at the engine
    assert recorded(metrics, "guard_heal_successes_total", "messages") == 1
    labels = {"model": "m", "endpoint": "messages", "outcome": "completed"}
    assert metrics.quality_registry.get_sample_value("guard_generations_total", labels) == 1


def test_no_byte_of_the_loop_reaches_a_messages_or_responses_client(
    fake_upstream: FakeVLLM, proxy_server: ProxyFactory
) -> None:
    base = proxy_server(mode="heal")
    for path, body in (
        ("/v1/messages", {"model": "m", "max_tokens": 1000, "messages": MESSAGES, "stream": True}),
        ("/v1/responses", {"model": "m", "input": "Tell me a story.", "stream": True}),
    ):
        looping_then_healthy(fake_upstream)
        raw = httpx.post(base + path, json=body).content
        assert b"answer. The answer" not in raw
        assert b"[DONE]" not in raw and b"chatcmpl" not in raw
        guard = [e for e in named_events(raw) if "guard" in orjson.dumps(e).decode()]
        assert len(guard) == 1


def test_messages_sdk_create_is_healed(
    fake_upstream: FakeVLLM, proxy_server: ProxyFactory, sdk: Clients
) -> None:
    looping_then_healthy(fake_upstream)
    client = sdk.anthropic(proxy_server(mode="heal"))
    message = client.messages.create(model="m", max_tokens=1000, messages=MESSAGES)  # type: ignore[arg-type]
    assert message.content[0].text == HEALED  # type: ignore[union-attr]
    assert message.usage.input_tokens == 7 and message.usage.output_tokens > 0
    assert (message.model_extra or {})["guard"]["action"] == "healed"


def test_responses_sdk_stream_and_create_are_healed(
    fake_upstream: FakeVLLM, proxy_server: ProxyFactory, sdk: Clients
) -> None:
    client = sdk.openai(proxy_server(mode="heal"))
    looping_then_healthy(fake_upstream)
    with client.responses.stream(model="m", input="Tell me a story.", max_output_tokens=1000) as s:
        kinds = [event.type for event in s]
        final = s.get_final_response()
    assert final.output_text == HEALED and final.status == "completed"
    assert kinds[-1] == "response.completed" and kinds.count("response.created") == 1
    assert (final.model_extra or {})["guard"]["action"] == "healed"
    looping_then_healthy(fake_upstream)
    answer = client.responses.create(model="m", input="Tell me a story.", max_output_tokens=1000)
    assert answer.output_text == HEALED and answer.status == "completed"
    assert answer.usage is not None and answer.usage.input_tokens == 7


def test_async_clients_read_a_healed_answer(
    fake_upstream: FakeVLLM, proxy_server: ProxyFactory
) -> None:
    import asyncio

    base = proxy_server(mode="heal")

    async def run() -> tuple[str, str]:
        a = anthropic.AsyncAnthropic(base_url=base, api_key="k", max_retries=0)
        o = openai.AsyncOpenAI(base_url=base + "/v1", api_key="k", max_retries=0)
        looping_then_healthy(fake_upstream)
        async with a.messages.stream(model="m", max_tokens=1000, messages=MESSAGES) as s:  # type: ignore[arg-type]
            m = await s.get_final_message()
        looping_then_healthy(fake_upstream)
        r = await o.responses.create(model="m", input="Tell me a story.")
        await a.close()
        await o.close()
        return m.content[0].text, r.output_text  # type: ignore[union-attr]

    assert asyncio.run(run()) == (HEALED, HEALED)


def test_after_the_last_attempt_both_surfaces_end_as_enforce(
    fake_upstream: FakeVLLM, proxy_server: ProxyFactory
) -> None:
    base = proxy_server(mode="heal", heal_max_attempts=1)
    fake_upstream.scripts = [Script(texts=[LOOPING], chunk_delay=0.001)] * 4
    message = httpx.post(
        base + "/v1/messages", json={"model": "m", "max_tokens": 1000, "messages": MESSAGES}
    ).json()
    assert message["stop_reason"] == "refusal" and message["guard"]["action"] == "aborted"
    response = httpx.post(base + "/v1/responses", json={"model": "m", "input": "Hi"}).json()
    assert response["status"] == "incomplete"
    assert response["incomplete_details"]["guard"]["action"] == "aborted"
    assert len(fake_upstream.guarded_requests()) == 4


def test_requests_the_chat_form_cannot_say_end_as_enforce_on_their_own_route(
    fake_upstream: FakeVLLM, proxy_server: ProxyFactory
) -> None:
    fake_upstream.script = Script(texts=[LOOPING])
    base = proxy_server(mode="heal")
    tools = [{"type": "function", "name": "f", "parameters": {"type": "object"}}]
    response = httpx.post(
        base + "/v1/responses", json={"model": "m", "input": "Tell me.", "tools": tools}
    ).json()
    assert response["status"] == "incomplete"
    assert response["incomplete_details"]["guard"]["action"] == "aborted"
    thinking = {"type": "enabled", "budget_tokens": 64}
    message = httpx.post(
        base + "/v1/messages",
        json={"model": "m", "max_tokens": 1000, "messages": MESSAGES, "thinking": thinking},
    ).json()
    assert message["guard"]["action"] == "aborted"
    assert [r.path for r in fake_upstream.guarded_requests()] == ["/v1/responses", "/v1/messages"]


def test_an_engine_error_reaches_a_messages_client_in_anthropics_envelope(
    fake_upstream: FakeVLLM, proxy_server: ProxyFactory, sdk: Clients
) -> None:
    fake_upstream.script = Script(
        status=400,
        error_body=orjson.dumps(
            {"error": {"message": "maximum context length is 10", "type": "BadRequestError"}}
        ),
    )
    client = sdk.anthropic(proxy_server(mode="heal"))
    with pytest.raises(anthropic.BadRequestError) as caught:
        client.messages.create(model="m", max_tokens=1000, messages=MESSAGES)  # type: ignore[arg-type]
    assert "maximum context length" in str(caught.value)


def test_a_messages_stream_past_the_deadline_ends_with_anthropics_error_event(
    fake_upstream: FakeVLLM, proxy_server: ProxyFactory
) -> None:
    fake_upstream.script = Script(texts=[" ".join(f"w{i}" for i in range(40))], chunk_delay=0.1)
    base = proxy_server(mode="heal", request_deadline=0.6)
    body = {"model": "m", "max_tokens": 1000, "messages": MESSAGES, "stream": True}
    events = named_events(httpx.post(base + "/v1/messages", json=body).content)
    assert events[0]["type"] == "message_start"
    assert events[-1] == {
        "type": "error",
        "error": {"type": "timeout_error", "message": events[-1]["error"]["message"]},
    }
    assert "time limit" in events[-1]["error"]["message"]
