"""The guarded routes over real sockets: openai SDK (sync/async, stream/non-stream) and httpx."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import openai
import orjson
import pytest

from tests.fakes.vllm import FakeVLLM, Script

CORPUS = [
    json.loads(line)
    for line in (Path(__file__).parent / "data" / "corpus.jsonl").read_text().splitlines()
]
DEGENERATE = [r for r in CORPUS if r["label"] == "degenerate"]
HEALTHY = [r for r in CORPUS if r["label"] == "healthy"]
LOOP = "The answer is the answer. " * 300
MESSAGES = [{"role": "user", "content": "Tell me something."}]

ProxyFactory = Callable[..., str]


def sse_events(body: bytes) -> list[Any]:
    return [
        orjson.loads(block[6:])
        for block in body.split(b"\n\n")
        if block.startswith(b"data: ") and block != b"data: [DONE]"
    ]


@pytest.mark.parametrize("usage", [None, {"include_usage": True}], ids=["no-usage", "usage"])
def test_healthy_stream_is_byte_identical_to_the_upstream(
    fake_upstream: FakeVLLM, proxy_server: ProxyFactory, usage: dict[str, Any] | None
) -> None:
    """What the client gets through the proxy is exactly what the engine sends for the same
    request, though the proxy asked the engine for per-chunk usage and stripped it."""
    fake_upstream.script = Script(texts=[HEALTHY[0]["text"]])
    base = proxy_server()
    body: dict[str, Any] = {"model": "m", "messages": MESSAGES, "stream": True, "max_tokens": 500}
    if usage:
        body["stream_options"] = usage
    via_proxy = httpx.post(base + "/v1/chat/completions", json=body)
    direct = httpx.post(fake_upstream.url + "/v1/chat/completions", json=body)
    assert via_proxy.status_code == 200
    assert via_proxy.content == direct.content
    assert via_proxy.headers["content-type"] == "text/event-stream; charset=utf-8"
    sent = fake_upstream.guarded_requests()[0].json
    assert sent["stream_options"] == {"include_usage": True, "continuous_usage_stats": True}


def test_healthy_completions_stream_is_byte_identical(
    fake_upstream: FakeVLLM, proxy_server: ProxyFactory
) -> None:
    fake_upstream.script = Script(texts=[HEALTHY[1]["text"]])
    base = proxy_server()
    body = {"model": "m", "prompt": "Once", "stream": True, "max_tokens": 800}
    via_proxy = httpx.post(base + "/v1/completions", json=body)
    direct = httpx.post(fake_upstream.url + "/v1/completions", json=body)
    assert via_proxy.content == direct.content


def test_openai_sync_stream_and_non_stream(
    fake_upstream: FakeVLLM, proxy_server: ProxyFactory
) -> None:
    text = HEALTHY[2]["text"]
    fake_upstream.script = Script(texts=[text])
    client = openai.OpenAI(base_url=proxy_server() + "/v1", api_key="sk-test", max_retries=0)
    stream = client.chat.completions.create(model="m", messages=MESSAGES, stream=True)  # type: ignore[arg-type]
    chunks = list(stream)
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == text
    assert chunks[-1].choices[0].finish_reason == "stop"
    resp = client.chat.completions.create(model="m", messages=MESSAGES)  # type: ignore[arg-type]
    assert resp.choices[0].message.content == text
    assert resp.choices[0].finish_reason == "stop"
    assert resp.usage is not None and resp.usage.completion_tokens > 0
    assert fake_upstream.last.headers["authorization"] == "Bearer sk-test"


async def test_openai_async_stream_and_non_stream(
    fake_upstream: FakeVLLM, proxy_server: ProxyFactory
) -> None:
    text = HEALTHY[3]["text"]
    fake_upstream.script = Script(texts=[text])
    client = openai.AsyncOpenAI(base_url=proxy_server() + "/v1", api_key="x", max_retries=0)
    stream = await client.completions.create(model="m", prompt="Hi", stream=True, max_tokens=900)
    parts = [c.choices[0].text async for c in stream if c.choices]
    assert "".join(parts) == text
    resp = await client.completions.create(model="m", prompt="Hi", max_tokens=900)
    assert resp.choices[0].text == text
    assert resp.object == "text_completion"
    await client.close()


def test_non_streaming_healthy_answer_matches_the_upstream_content(
    fake_upstream: FakeVLLM, proxy_server: ProxyFactory
) -> None:
    fake_upstream.script = Script(texts=[HEALTHY[0]["text"]], reasoning="First, think.")
    base = proxy_server()
    body = {"model": "m", "messages": MESSAGES, "max_tokens": 600}
    via_proxy = httpx.post(base + "/v1/chat/completions", json=body).json()
    direct = httpx.post(fake_upstream.url + "/v1/chat/completions", json=body).json()
    assert via_proxy["object"] == direct["object"] == "chat.completion"
    for key in ("id", "created", "model", "usage"):
        assert via_proxy[key] == direct[key], key
    p, d = via_proxy["choices"][0], direct["choices"][0]
    assert p["message"] == d["message"]
    assert (p["finish_reason"], p["stop_reason"]) == (d["finish_reason"], d["stop_reason"])
    # The proxy watched a stream even though the client did not ask for one.
    sent = fake_upstream.guarded_requests()[0].json
    assert sent["stream"] is True


@pytest.mark.parametrize("row", DEGENERATE[:2], ids=lambda r: r["id"][:30])
def test_degenerate_stream_is_aborted_and_the_upstream_sees_the_disconnect(
    fake_upstream: FakeVLLM, proxy_server: ProxyFactory, row: dict[str, Any]
) -> None:
    fake_upstream.script = Script(texts=[row["text"]], chunk_delay=0.002)
    client = openai.OpenAI(base_url=proxy_server() + "/v1", api_key="x", max_retries=0)
    stream = client.chat.completions.create(
        model="m",
        messages=MESSAGES,
        stream=True,
        stream_options={"include_usage": True},  # type: ignore[arg-type]
    )
    chunks = list(stream)
    ending = [c for c in chunks if c.choices and c.choices[0].finish_reason][-1]
    choice = ending.choices[0]
    assert choice.finish_reason == "content_filter"
    extra = choice.model_extra or {}
    assert extra["stop_reason"].startswith("coherence_guard:")
    assert extra["guard"]["action"] == "aborted"
    assert chunks[-1].usage is not None
    assert chunks[-1].usage.completion_tokens == extra["guard"]["completion_tokens"]
    rec = fake_upstream.guarded_requests()[0]
    assert fake_upstream.wait_for(lambda: rec.disconnected is not None)
    assert not rec.completed


def test_abort_finish_reason_is_configurable(
    fake_upstream: FakeVLLM, proxy_server: ProxyFactory
) -> None:
    fake_upstream.script = Script(texts=["Ok. " + LOOP])
    base = proxy_server(abort_finish_reason="length")
    r = httpx.post(base + "/v1/completions", json={"model": "m", "prompt": "x", "stream": True})
    events = sse_events(r.content)
    assert events[-1]["choices"][0]["finish_reason"] == "length"
    assert r.content.endswith(b"data: [DONE]\n\n")
    # Completions chunks carry "usage": null, as vLLM writes them without usage options.
    assert all(e["usage"] is None for e in events)


@pytest.mark.parametrize("trim", [True, False])
def test_non_streaming_abort_is_trimmed_at_onset(
    fake_upstream: FakeVLLM, proxy_server: ProxyFactory, trim: bool
) -> None:
    prefix = "Here is a perfectly fine start. "
    fake_upstream.script = Script(texts=[prefix + LOOP], chunk_delay=0.001)
    base = proxy_server(trim_on_abort=trim)
    resp = httpx.post(base + "/v1/chat/completions", json={"model": "m", "messages": MESSAGES})
    assert resp.status_code == 200
    body = resp.json()
    choice = body["choices"][0]
    assert choice["finish_reason"] == "content_filter"
    guard = choice["guard"]
    content = choice["message"]["content"]
    assert (prefix + LOOP).startswith(content)
    if trim:
        assert len(content) == guard["onset_char"]
    else:
        assert len(content) > guard["onset_char"]
    assert body["usage"]["completion_tokens"] == guard["completion_tokens"] < 600
    rec = fake_upstream.guarded_requests()[0]
    assert fake_upstream.wait_for(lambda: rec.disconnected is not None)


def test_a_non_streamed_paragraph_repeated_eight_times_keeps_its_first_copy(
    fake_upstream: FakeVLLM, proxy_server: ProxyFactory
) -> None:
    """The repeating starts with the second copy: trimmed at the onset, a non-streamed answer
    that is one paragraph eight times over comes back as that paragraph (it came back empty
    when the onset was placed at the first copy). The paragraph is a real answer's opening
    (the corpus' ``alpaca-Mixtral-8x22B-Instruct-v0.1-307``)."""
    paragraph = HEALTHY[0]["text"].split("\n\n")[0] + "\n\n"
    assert len(paragraph) > 300
    fake_upstream.script = Script(texts=[paragraph * 8], chunk_delay=0.001)
    base = proxy_server(trim_on_abort=True)
    resp = httpx.post(base + "/v1/chat/completions", json={"model": "m", "messages": MESSAGES})
    assert resp.status_code == 200
    choice = resp.json()["choices"][0]
    assert choice["finish_reason"] == "content_filter"
    assert choice["guard"]["onset_char"] == len(paragraph)
    assert choice["message"]["content"] == paragraph


# A real answer's end and the turn it went on to invent (the tuning half of the real answers,
# guanaco-13b: tests/detect/test_turns.py quotes it whole).
ANSWER = "If you're still not sure, you can hire a plumber to do an inspection for you.\n\n"
INVENTED = (
    "### Human: I wanna hire a plumber, can you help me with that?\n\nI live in a 2-flat in "
    "Uptown, Chicago, IL.\n\nI need a plumber who is:\n\n* Available on short notice\n"
    "* Willing to work on weekends\n* Experienced with old cast-iron pipes\n\n"
    "### Assistant: Sure! Ask your neighbours first, then compare three written quotes."
)


@pytest.mark.parametrize("stream", [True, False])
def test_an_invented_turn_ends_the_answer_where_it_starts(
    fake_upstream: FakeVLLM, proxy_server: ProxyFactory, stream: bool
) -> None:
    """The answer the model gave reaches the client whole, the turn it invented does not (a
    stream ends within a check of it), and the engine stops writing it; a request that pastes
    a transcript may be answered with one."""
    fake_upstream.script = Script(texts=[ANSWER + INVENTED], chunk_delay=0.001)
    base = proxy_server(trim_on_abort=True)
    body = {"model": "m", "messages": MESSAGES, "stream": stream}
    resp = httpx.post(base + "/v1/chat/completions", json=body)
    assert resp.status_code == 200
    if stream:
        events = sse_events(resp.content)
        text = "".join(
            e["choices"][0]["delta"].get("content") or "" for e in events if e["choices"]
        )
        final = next(
            e["choices"][0] for e in events if e["choices"] and e["choices"][0].get("finish_reason")
        )
        # Streamed, the answer is checked every 128 characters (GUARD_CHECK_EVERY_CHARS), so
        # the client sees at most that much of the invented turn before the stream ends.
        assert text.startswith(ANSWER) and len(text) <= len(ANSWER) + 2 * 128
        assert len(text) < len(ANSWER + INVENTED)
    else:
        final = resp.json()["choices"][0]
        assert final["message"]["content"] == ANSWER
    assert final["finish_reason"] == "content_filter"
    assert (final["guard"]["signal"], final["guard"]["onset_char"]) == ("turn-leak", len(ANSWER))
    rec = fake_upstream.guarded_requests()[0]
    assert fake_upstream.wait_for(lambda: rec.disconnected is not None)

    pasted = [
        {"role": "user", "content": "Go on with this chat:\n### Human: hi\n### Assistant: hey"}
    ]
    resp = httpx.post(base + "/v1/chat/completions", json={"model": "m", "messages": pasted})
    choice = resp.json()["choices"][0]
    assert (choice["finish_reason"], choice["message"]["content"]) == ("stop", ANSWER + INVENTED)


def test_n2_with_one_looping_choice(fake_upstream: FakeVLLM, proxy_server: ProxyFactory) -> None:
    healthy = HEALTHY[0]["text"][:500]
    fake_upstream.script = Script(texts=[healthy, "Sure. " + LOOP], chunk_delay=0.001)
    client = openai.OpenAI(base_url=proxy_server() + "/v1", api_key="x", max_retries=0)
    chunks = list(
        client.chat.completions.create(model="m", messages=MESSAGES, stream=True, n=2)  # type: ignore[arg-type]
    )
    text = {0: "", 1: ""}
    finish: dict[int, list[str]] = {0: [], 1: []}
    for c in chunks:
        for ch in c.choices:
            text[ch.index] += ch.delta.content or ""
            if ch.finish_reason:
                finish[ch.index].append(ch.finish_reason)
    assert text[0] == healthy and finish[0] == ["stop"]
    assert finish[1] == ["content_filter"]
    assert len(text[1]) < len("Sure. " + LOOP)
    rec = fake_upstream.guarded_requests()[0]
    assert fake_upstream.wait_for(lambda: rec.disconnected is not None)


def test_monitor_mode_passes_a_loop_through(
    fake_upstream: FakeVLLM, proxy_server: ProxyFactory
) -> None:
    fake_upstream.script = Script(texts=["Ok. " + LOOP[:2000]])
    base = proxy_server(mode="monitor")
    body = {"model": "m", "messages": MESSAGES, "stream": True, "max_tokens": 900}
    via_proxy = httpx.post(base + "/v1/chat/completions", json=body)
    direct = httpx.post(fake_upstream.url + "/v1/chat/completions", json=body)
    assert via_proxy.content == direct.content


@pytest.mark.parametrize("stream", [True, False])
def test_off_mode_relays_the_upstream_untouched(
    fake_upstream: FakeVLLM, proxy_server: ProxyFactory, stream: bool
) -> None:
    fake_upstream.script = Script(texts=["Ok. " + LOOP[:2000]])
    base = proxy_server(mode="off")
    body = {"model": "m", "messages": MESSAGES, "stream": stream, "max_tokens": 900}
    via_proxy = httpx.post(base + "/v1/chat/completions", json=body)
    direct = httpx.post(fake_upstream.url + "/v1/chat/completions", json=body)
    assert via_proxy.content == direct.content
    assert "stream_options" not in fake_upstream.guarded_requests()[0].json


def test_client_mode_override_only_when_allowed(
    fake_upstream: FakeVLLM, proxy_server: ProxyFactory
) -> None:
    fake_upstream.script = Script(texts=["Ok. " + LOOP[:3000]])
    body = {"model": "m", "prompt": "x", "stream": True, "max_tokens": 900}
    strict = proxy_server()
    r = httpx.post(strict + "/v1/completions", json=body, headers={"x-guard-mode": "monitor"})
    assert sse_events(r.content)[-1]["choices"][0]["finish_reason"] == "content_filter"
    open_ = proxy_server(allow_client_override=True)
    r = httpx.post(open_ + "/v1/completions", json=body, headers={"x-guard-mode": "monitor"})
    assert sse_events(r.content)[-1]["choices"][0]["finish_reason"] == "stop"
    assert "x-guard-mode" not in fake_upstream.last.headers
    r = httpx.post(open_ + "/v1/completions", json=body, headers={"x-guard-mode": "loud"})
    assert r.status_code == 400 and r.json()["error"]["param"] == "x-guard-mode"


@pytest.mark.parametrize(
    ("request_fields", "header", "sent"),
    [
        ({}, "defaulted; value=8192", {"max_tokens": 8192}),
        ({"max_tokens": 100}, "unchanged; value=100", {"max_tokens": 100}),
        (
            {"max_completion_tokens": 99999},
            "clamped; value=32768; requested=99999",
            {"max_completion_tokens": 32768},
        ),
    ],
)
def test_max_tokens_rewriting_is_reported_in_a_header(
    fake_upstream: FakeVLLM,
    proxy_server: ProxyFactory,
    request_fields: dict[str, Any],
    header: str,
    sent: dict[str, Any],
) -> None:
    base = proxy_server()
    body = {"model": "m", "messages": MESSAGES, **request_fields}
    r = httpx.post(base + "/v1/chat/completions", json=body)
    assert r.status_code == 200
    assert r.headers["x-guard-max-tokens"] == header
    upstream_body = fake_upstream.guarded_requests()[0].json
    for key, value in sent.items():
        assert upstream_body[key] == value


def test_max_tokens_reject_policy(fake_upstream: FakeVLLM, proxy_server: ProxyFactory) -> None:
    base = proxy_server(max_tokens_policy="reject", max_tokens_cap=1000)
    r = httpx.post(
        base + "/v1/chat/completions", json={"model": "m", "messages": MESSAGES, "max_tokens": 5000}
    )
    assert r.status_code == 400
    assert r.json()["error"]["param"] == "max_tokens"
    assert fake_upstream.guarded_requests() == []


def test_language_instruction_reaches_the_upstream(
    fake_upstream: FakeVLLM, proxy_server: ProxyFactory
) -> None:
    base = proxy_server(language="it")
    httpx.post(base + "/v1/chat/completions", json={"model": "m", "messages": MESSAGES})
    messages = fake_upstream.guarded_requests()[0].json["messages"]
    assert messages[0] == {
        "role": "system",
        "content": "Rispondi esclusivamente in italiano. Non usare altre lingue.",
    }
    assert messages[1:] == MESSAGES


def test_unknown_fields_reach_the_upstream_untouched(
    fake_upstream: FakeVLLM, proxy_server: ProxyFactory
) -> None:
    base = proxy_server(sampling_defaults={"m*": {"repetition_penalty": 1.1, "top_k": 5}})
    extra = {"top_k": 40, "guided_regex": "a+", "vendor_x": {"deep": [1, 2]}}
    httpx.post(base + "/v1/chat/completions", json={"model": "m1", "messages": MESSAGES, **extra})
    sent = fake_upstream.guarded_requests()[0].json
    assert {k: sent[k] for k in extra} == extra
    assert sent["repetition_penalty"] == 1.1


def test_tool_call_and_reasoning_streams_are_relayed(
    fake_upstream: FakeVLLM, proxy_server: ProxyFactory
) -> None:
    fake_upstream.script = Script(
        texts=["Calling the tool."], reasoning="I should call it.", tool_call=("f", '{"x": 1}')
    )
    base = proxy_server()
    body = {"model": "m", "messages": MESSAGES, "max_tokens": 100}
    resp = httpx.post(base + "/v1/chat/completions", json=body).json()
    message = resp["choices"][0]["message"]
    assert message["reasoning"] == "I should call it."
    assert message["tool_calls"][0]["function"] == {"name": "f", "arguments": '{"x": 1}'}
    stream = httpx.post(base + "/v1/chat/completions", json={**body, "stream": True})
    direct = httpx.post(fake_upstream.url + "/v1/chat/completions", json={**body, "stream": True})
    assert stream.content == direct.content


def test_upstream_connection_is_reused_after_complete_streams(
    fake_upstream: FakeVLLM, proxy_server: ProxyFactory
) -> None:
    """Keep-alive to the engine survives [DONE]: no new TCP connection per request."""
    fake_upstream.script = Script(texts=["A short and healthy answer."], tail_delay=0.05)
    base = proxy_server()
    body = {"model": "m", "messages": MESSAGES, "max_tokens": 50}
    for stream in (True, False, True):
        r = httpx.post(base + "/v1/chat/completions", json={**body, "stream": stream})
        assert r.status_code == 200
        # The client has its answer; the engine writes the terminator apart (tail_delay): wait
        # for it to be written, then give the proxy's loop a moment to read it.
        assert fake_upstream.wait_for(
            lambda: fake_upstream.guarded_requests()[-1].finished is not None
        )
        time.sleep(0.05)
    assert len({r.peer for r in fake_upstream.guarded_requests()}) == 1
