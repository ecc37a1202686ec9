"""Heal mode: the pure parts (continuation request, word boundary, the hold-back window) and the
whole path through the proxy with the official openai SDK against the fake vLLM, which answers
the first request with a loop and the continuation with a healthy ending."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import openai
import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import BaseModel

from proxy.core.guard import GuardPolicy
from proxy.core.heal import HealGuard
from proxy.core.heal_cut import word_boundary
from proxy.core.heal_request import (
    REPETITION_DETECTION,
    HealPolicy,
    continuation_request,
    unhealable,
)
from proxy.detect import Detector
from proxy.observability.metrics import Metrics
from tests.conftest import Clients
from tests.fakes.vllm import FakeVLLM, Script, tokenize
from tests.net import HANG_GUARD

ProxyFactory = Callable[..., str]

INTRO = "Once upon a time a fox lived in the woods near a river. "
LOOP_SENTENCE = "The answer is the answer. "
LOOPING = INTRO + LOOP_SENTENCE * 300
# What a heal keeps: the repeating starts with the loop's second copy, its first is content.
KEPT = INTRO + LOOP_SENTENCE
ENDING = " And then the fox went home, happy and tired."
MESSAGES: list[dict[str, Any]] = [{"role": "user", "content": "Tell me a story."}]
HEALTHY = next(
    json.loads(line)["text"]
    for line in (Path(__file__).parent / "data" / "corpus.jsonl").read_text().splitlines()
    if json.loads(line)["label"] == "healthy"
)


def looping_then_healthy(fake: FakeVLLM, *, completions: bool = False) -> None:
    prefix = "cmpl-" if completions else "chatcmpl-"
    fake.scripts = [
        # Paced, so the loop is still being generated when the guard closes it (unpaced, the
        # fake can finish writing the whole loop into socket buffers first).
        Script(texts=[LOOPING], response_id=prefix + "first", created=111, chunk_delay=0.001),
        Script(texts=[ENDING], response_id=prefix + "second", created=222),
    ]


def recorded(metrics: Metrics, name: str, endpoint: str = "chat") -> float | None:
    """``name`` for model m once the proxy recorded the request (it does so after the last byte,
    so a fast client can read the answer first)."""
    q = metrics.quality_registry
    deadline = time.monotonic() + HANG_GUARD
    while q.get_sample_value(
        "guard_generations_total", {"model": "m", "endpoint": endpoint, "outcome": "completed"}
    ) is None and (
        q.get_sample_value(
            "guard_generations_total", {"model": "m", "endpoint": endpoint, "outcome": "aborted"}
        )
        is None
    ):
        assert time.monotonic() < deadline, "the proxy recorded nothing"
        time.sleep(0.01)
    return q.get_sample_value(name, {"model": "m"})


def data_events(body: bytes) -> list[dict[str, Any]]:
    return [
        orjson.loads(block[6:])
        for block in body.split(b"\n\n")
        if block.startswith(b"data: ") and block != b"data: [DONE]"
    ]


def streamed_text(events: list[dict[str, Any]]) -> str:
    out = []
    for ev in events:
        for c in ev.get("choices") or []:
            delta = c.get("delta")
            out.append((delta or {}).get("content") or c.get("text") or "")
    return "".join(out)


# ---------------------------------------------------------------- continuation request


def test_chat_continuation_appends_the_cut_text_as_a_final_assistant_message() -> None:
    """The engine continues the same assistant turn (vLLM's ``continue_final_message``) with
    the budget that is left and one step more of every anti-repetition knob."""
    body = {
        "model": "m",
        "messages": MESSAGES,
        "max_tokens": 500,
        "temperature": 0,
        "stream": True,
        "logit_bias": {"5": 1},
    }
    out = continuation_request(body, "chat", "Once upon", 480, 1, HealPolicy())
    assert out["messages"] == [*MESSAGES, {"role": "assistant", "content": "Once upon"}]
    assert out["continue_final_message"] is True
    assert out["add_generation_prompt"] is False
    assert out["max_tokens"] == 480
    assert out["n"] == 1
    assert out["repetition_penalty"] == pytest.approx(1.1)
    assert out["frequency_penalty"] == pytest.approx(0.3)
    assert out["temperature"] == pytest.approx(0.3)
    assert out["repetition_detection"] == REPETITION_DETECTION
    assert out["logit_bias"] == {"5": 1}
    assert body["messages"] == MESSAGES and "continue_final_message" not in body


def test_second_attempt_steps_up_from_the_request_own_values_and_keeps_sampling() -> None:
    body = {
        "model": "m",
        "messages": MESSAGES,
        "max_completion_tokens": 900,
        "repetition_penalty": 1.05,
        "frequency_penalty": 0.1,
        "temperature": 0.7,
    }
    policy = HealPolicy(presence_penalty_step=0.2, repetition_detection=False)
    out = continuation_request(body, "chat", "x", 100, 2, policy)
    assert out["max_completion_tokens"] == 100 and "max_tokens" not in out
    assert out["repetition_penalty"] == pytest.approx(1.2)  # 1.25, bounded
    assert out["frequency_penalty"] == pytest.approx(0.6)  # 0.7, bounded
    assert out["presence_penalty"] == pytest.approx(0.4)
    assert out["temperature"] == 0.7  # not greedy: left as the client set it
    assert "repetition_detection" not in out


def test_a_client_continuation_of_its_own_assistant_message_is_extended() -> None:
    messages = [*MESSAGES, {"role": "assistant", "content": "Title: "}]
    body = {"model": "m", "messages": messages, "continue_final_message": True}
    out = continuation_request(body, "chat", "The fox", 10, 1, HealPolicy())
    assert out["messages"][-1] == {"role": "assistant", "content": "Title: The fox"}
    assert len(out["messages"]) == 2


@pytest.mark.parametrize(
    ("prompt", "expected"), [("Once", "Once upon"), (["Once"], ["Once upon"])], ids=["str", "list"]
)
def test_completions_continuation_extends_the_prompt(prompt: Any, expected: Any) -> None:
    out = continuation_request(
        {"model": "m", "prompt": prompt, "max_tokens": 50},
        "completions",
        " upon",
        40,
        1,
        HealPolicy(),
    )
    assert out["prompt"] == expected and out["max_tokens"] == 40


@pytest.mark.parametrize(
    ("endpoint", "body", "n", "reason"),
    [
        ("chat", {"messages": MESSAGES}, 1, None),
        ("completions", {"prompt": "x"}, 1, None),
        ("completions", {"prompt": ["x"]}, 1, None),
        ("chat", {"messages": MESSAGES}, 2, "n"),
        ("completions", {"prompt": [1, 2, 3]}, 1, "prompt"),
        ("completions", {"prompt": ["a", "b"]}, 1, "prompt"),
        ("completions", {"prompt": "x", "echo": True}, 1, "echo"),
        ("responses", {"input": "x"}, 1, "surface"),
        ("messages", {"messages": MESSAGES}, 1, "surface"),
    ],
)
def test_what_cannot_be_healed(endpoint: Any, body: dict[str, Any], n: int, reason: Any) -> None:
    assert unhealable(endpoint, body, n) == reason


@pytest.mark.parametrize(
    ("text", "cut", "floor", "expected"),
    [
        ("near a river. The", 14, 0, 13),  # onset at a word start: drop the space before it
        ("near a river. The", 9, 0, 13),  # inside "river": on to the end of "river."
        ("near a river. The", 7, 0, 6),  # at the start of "river": back before the space
        ("near a river. The", 7, 7, 7),  # the client already holds "near a ": stay
        ('"bio": "She', 8, 0, 8),  # a quote is a token boundary
        ("一二三四五六", 3, 0, 3),  # no spaces: the onset as it is
    ],
)
def test_word_boundary(text: str, cut: int, floor: int, expected: int) -> None:
    assert word_boundary(text, cut, floor) == expected


@given(st.text(alphabet='ab." \n', max_size=40), st.data())
def test_word_boundary_stays_between_floor_and_cut(text: str, data: st.DataObject) -> None:
    cut = data.draw(st.integers(0, len(text)))
    floor = data.draw(st.integers(0, cut))
    got = word_boundary(text, cut, floor)
    assert floor <= got <= len(text)
    assert got == floor or not text[got - 1].isspace()
    assert text[cut:got].strip(" \n") == text[cut:got]  # forward only within one word


# ---------------------------------------------------------------- the relay stage


def sse_stream(text: str, rid: str = "chatcmpl-x") -> bytes:
    def ev(choice: dict[str, Any]) -> bytes:
        chunk = {"id": rid, "object": "chat.completion.chunk", "created": 1, "model": "m"}
        chunk["choices"] = [choice]
        return b"data: " + orjson.dumps(chunk) + b"\n\n"

    out = [ev({"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": None})]
    out += [
        ev({"index": 0, "delta": {"content": t}, "finish_reason": None}) for t in tokenize(text)
    ]
    out.append(ev({"index": 0, "delta": {"content": ""}, "finish_reason": "stop"}))
    return b"".join(out) + b"data: [DONE]\n\n"


def heal_guard(holdback: int) -> HealGuard:
    return HealGuard(
        GuardPolicy.create(mode="heal"), Detector, HealPolicy(holdback_tokens=holdback)
    )


def feed_events(guard: HealGuard, stream: bytes) -> bytes:
    out = []
    for block in stream.split(b"\n\n")[:-1]:
        out.append(guard.feed(block + b"\n\n"))
        if guard.done:
            break
    return b"".join(out)


def test_with_hold_back_no_byte_of_the_loop_leaves_the_guard() -> None:
    """The verdict comes ~40 tokens into this loop; a 64-token window holds all of them, so the
    client gets the healthy text up to the cut and nothing after it."""
    guard = heal_guard(64)
    sent = feed_events(guard, sse_stream(LOOPING))
    assert guard.needs_heal and guard.done
    text = streamed_text(data_events(sent))
    assert text == KEPT.rstrip()
    assert b"answer. The answer" not in sent
    assert guard.cut == len(KEPT.rstrip())
    assert guard.kept_tokens == len(tokenize(KEPT.rstrip()))
    nxt = guard.continuation()
    assert nxt.carry.prefix == KEPT.rstrip()
    assert nxt.carry.discarded == guard.stage_tokens() - guard.kept_tokens > 0


def test_without_hold_back_the_cut_moves_to_what_the_client_already_has() -> None:
    """Text already sent cannot be unsent: the continuation continues exactly the text the
    client holds, loop included."""
    guard = heal_guard(0)
    sent = feed_events(guard, sse_stream(LOOPING))
    text = streamed_text(data_events(sent))
    assert LOOP_SENTENCE in text
    assert guard.cut == len(text)
    assert guard.continuation().carry.prefix == text


def test_a_healthy_stream_leaves_the_window_unchanged_and_in_order() -> None:
    """Hold-back delays chunks, never changes them: at [DONE] the client has the engine's bytes."""
    stream = sse_stream(HEALTHY)
    guard = heal_guard(8)
    out = b"".join(guard.feed(block + b"\n\n") for block in stream.split(b"\n\n")[:-1])
    assert out == stream
    assert not guard.needs_heal


def test_the_window_runs_the_stated_number_of_text_chunks_behind() -> None:
    stream = sse_stream(ENDING * 3)
    blocks = stream.split(b"\n\n")[:-1]
    guard = heal_guard(5)
    released = [guard.feed(b + b"\n\n") for b in blocks[:12]]
    assert released[0] == blocks[0] + b"\n\n"  # the role chunk is not held
    assert released[1:6] == [b""] * 5
    assert released[6] == blocks[1] + b"\n\n"


# ---------------------------------------------------------------- through the proxy


def test_openai_sync_stream_is_one_healed_response(
    fake_upstream: FakeVLLM, proxy_server: ProxyFactory, sdk: Clients
) -> None:
    looping_then_healthy(fake_upstream)
    metrics = Metrics()
    client = sdk.openai(proxy_server(mode="heal", metrics=metrics))
    chunks = list(
        client.chat.completions.create(
            model="m",
            messages=MESSAGES,  # type: ignore[arg-type]
            stream=True,
            max_tokens=1000,
            stream_options={"include_usage": True},
        )
    )
    assert {c.id for c in chunks} == {"chatcmpl-first"}
    assert {c.created for c in chunks} == {111}
    assert {ch.index for c in chunks for ch in c.choices} == {0}
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == KEPT.rstrip() + ENDING
    finals = [c for c in chunks if c.choices and c.choices[0].finish_reason]
    assert len(finals) == 1 and finals[0].choices[0].finish_reason == "stop"
    guard = finals[0].choices[0].model_extra["guard"]  # type: ignore[index]
    assert guard["action"] == "healed" and guard["attempts"] == 1
    assert guard["onset_char"] == len(KEPT.rstrip())
    assert guard["tokens_discarded"] > 0
    usage = chunks[-1].usage
    assert usage is not None and usage.completion_tokens == len(tokenize(KEPT + ENDING))
    sent = fake_upstream.guarded_requests()
    assert len(sent) == 2
    cont = sent[1].json
    assert cont["messages"][-1] == {"role": "assistant", "content": KEPT.rstrip()}
    assert cont["continue_final_message"] is True and cont["add_generation_prompt"] is False
    assert cont["max_tokens"] == 1000 - len(tokenize(KEPT.rstrip()))
    assert sent[0].disconnected is not None  # the looping generation was closed at the engine
    q = metrics.quality_registry
    assert recorded(metrics, "guard_heals_total") == 1
    assert q.get_sample_value("guard_heal_attempts_total", {"model": "m"}) == 1
    assert q.get_sample_value("guard_heal_successes_total", {"model": "m"}) == 1
    assert (
        q.get_sample_value("guard_heal_discarded_tokens_total", {"model": "m"})
        == (guard["tokens_discarded"])
    )
    assert (
        q.get_sample_value(
            "guard_detections_total", {"model": "m", "signal": "repetition", "action": "healed"}
        )
        == 1
    )


def test_no_byte_of_the_discarded_loop_reaches_the_client(
    fake_upstream: FakeVLLM, proxy_server: ProxyFactory
) -> None:
    looping_then_healthy(fake_upstream)
    base = proxy_server(mode="heal")
    body = {"model": "m", "messages": MESSAGES, "stream": True, "max_tokens": 1000}
    raw = httpx.post(base + "/v1/chat/completions", json=body).content
    assert b"answer. The answer" not in raw
    assert raw.endswith(b"data: [DONE]\n\n") and raw.count(b"[DONE]") == 1
    assert b"chatcmpl-second" not in raw and b'"role"' in raw and raw.count(b'"role"') == 1


def test_openai_sync_non_stream_answers_the_healed_text(
    fake_upstream: FakeVLLM, proxy_server: ProxyFactory, sdk: Clients
) -> None:
    looping_then_healthy(fake_upstream)
    client = sdk.openai(proxy_server(mode="heal"))
    resp = client.chat.completions.create(model="m", messages=MESSAGES, max_tokens=1000)  # type: ignore[arg-type]
    assert resp.id == "chatcmpl-first" and resp.created == 111
    assert len(resp.choices) == 1
    assert resp.choices[0].message.content == KEPT.rstrip() + ENDING
    assert resp.choices[0].finish_reason == "stop"
    assert resp.choices[0].model_extra["guard"]["action"] == "healed"  # type: ignore[index]
    assert resp.usage is not None
    assert resp.usage.completion_tokens == len(tokenize(KEPT + ENDING))


def test_openai_async_stream_and_non_stream_on_completions(
    fake_upstream: FakeVLLM, proxy_server: ProxyFactory
) -> None:
    base = proxy_server(mode="heal") + "/v1"

    async def run() -> tuple[list[Any], Any]:
        client = openai.AsyncOpenAI(base_url=base, api_key="k", max_retries=0)
        looping_then_healthy(fake_upstream, completions=True)
        stream = await client.completions.create(
            model="m", prompt="Once", stream=True, max_tokens=1000
        )
        chunks = [c async for c in stream]
        looping_then_healthy(fake_upstream, completions=True)
        resp = await client.completions.create(model="m", prompt="Once", max_tokens=1000)
        await client.close()
        return chunks, resp

    chunks, resp = asyncio.run(run())
    assert {c.id for c in chunks} == {"cmpl-first"}
    assert {ch.index for c in chunks for ch in c.choices} == {0}
    assert "".join(c.choices[0].text for c in chunks if c.choices) == KEPT.rstrip() + ENDING
    assert chunks[-1].choices[0].finish_reason == "stop"
    assert resp.id == "cmpl-first"
    assert resp.choices[0].text == KEPT.rstrip() + ENDING
    conts = [r.json for r in fake_upstream.guarded_requests()[1::2]]
    assert [c["prompt"] for c in conts] == ["Once" + KEPT.rstrip()] * 2


def test_openai_async_chat_stream(fake_upstream: FakeVLLM, proxy_server: ProxyFactory) -> None:
    looping_then_healthy(fake_upstream)
    base = proxy_server(mode="heal") + "/v1"

    async def run() -> list[Any]:
        client = openai.AsyncOpenAI(base_url=base, api_key="k", max_retries=0)
        stream = await client.chat.completions.create(
            model="m",
            messages=MESSAGES,  # type: ignore[arg-type]
            stream=True,
            max_tokens=1000,
        )
        chunks = [c async for c in stream]
        await client.close()
        return chunks

    chunks = asyncio.run(run())
    assert {c.id for c in chunks} == {"chatcmpl-first"}
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == KEPT.rstrip() + ENDING


class Person(BaseModel):
    name: str
    bio: str


def test_enforce_aborts_the_same_json_answer_and_parse_raises(
    fake_upstream: FakeVLLM, proxy_server: ProxyFactory, sdk: Clients
) -> None:
    """The contrast heal exists for."""
    looping = '{"name": "Ada Lovelace", "bio": "' + "She wrote the notes. " * 200
    fake_upstream.script = Script(texts=[looping])
    client = sdk.openai(proxy_server())
    with pytest.raises(openai.ContentFilterFinishReasonError):
        client.chat.completions.parse(
            model="m",
            messages=MESSAGES,  # type: ignore[arg-type]
            response_format=Person,
            max_tokens=1000,
        )


def test_after_the_last_attempt_the_choice_ends_as_enforce_ends_it(
    fake_upstream: FakeVLLM, proxy_server: ProxyFactory
) -> None:
    fake_upstream.script = Script(texts=[LOOPING])
    metrics = Metrics()
    base = proxy_server(mode="heal", heal_max_attempts=2, metrics=metrics)
    body = {"model": "m", "messages": MESSAGES, "stream": True, "max_tokens": 2000}
    raw = httpx.post(base + "/v1/chat/completions", json=body).content
    events = data_events(raw)
    assert len(fake_upstream.guarded_requests()) == 3
    final = events[-1]["choices"][0]
    assert final["finish_reason"] == "content_filter"
    assert final["stop_reason"] == "coherence_guard:repetition"
    assert final["guard"]["action"] == "aborted" and final["guard"]["attempts"] == 2
    assert raw.endswith(b"data: [DONE]\n\n")
    assert b"answer. The answer" not in raw
    q = metrics.quality_registry
    assert recorded(metrics, "guard_heals_total") == 1
    assert q.get_sample_value("guard_heal_attempts_total", {"model": "m"}) == 2
    assert q.get_sample_value("guard_heal_successes_total", {"model": "m"}) is None
    assert (
        q.get_sample_value(
            "guard_generations_total", {"model": "m", "endpoint": "chat", "outcome": "aborted"}
        )
        == 1
    )


def test_a_continuation_the_engine_refuses_ends_as_enforce(
    fake_upstream: FakeVLLM, proxy_server: ProxyFactory, sdk: Clients
) -> None:
    fake_upstream.scripts = [Script(texts=[LOOPING]), Script(status=500)]
    client = sdk.openai(proxy_server(mode="heal"))
    resp = client.chat.completions.create(model="m", messages=MESSAGES, max_tokens=1000)  # type: ignore[arg-type]
    assert resp.choices[0].finish_reason == "content_filter"
    assert resp.choices[0].message.content == KEPT.rstrip()


def test_n2_requests_fall_back_to_enforce(
    fake_upstream: FakeVLLM, proxy_server: ProxyFactory
) -> None:
    fake_upstream.script = Script(texts=[ENDING, LOOPING])
    base = proxy_server(mode="heal")
    body = {"model": "m", "messages": MESSAGES, "stream": True, "max_tokens": 1000, "n": 2}
    events = data_events(httpx.post(base + "/v1/chat/completions", json=body).content)
    assert len(fake_upstream.guarded_requests()) == 1
    ends = {
        c["index"]: c["finish_reason"]
        for e in events
        for c in e["choices"]
        if c.get("finish_reason")
    }
    assert ends == {0: "stop", 1: "content_filter"}


def test_x_guard_mode_heal_is_accepted_where_overrides_are(
    fake_upstream: FakeVLLM, proxy_server: ProxyFactory
) -> None:
    looping_then_healthy(fake_upstream)
    base = proxy_server(allow_client_override=True)
    body = {"model": "m", "messages": MESSAGES, "max_tokens": 1000}
    resp = httpx.post(
        base + "/v1/chat/completions", json=body, headers={"x-guard-mode": "heal"}
    ).json()
    assert resp["choices"][0]["message"]["content"] == KEPT.rstrip() + ENDING


def test_a_healthy_answer_in_heal_mode_is_byte_identical(
    fake_upstream: FakeVLLM, proxy_server: ProxyFactory
) -> None:
    fake_upstream.script = Script(texts=[HEALTHY])
    base = proxy_server(mode="heal")
    body = {"model": "m", "messages": MESSAGES, "stream": True, "max_tokens": 1000}
    via_proxy = httpx.post(base + "/v1/chat/completions", json=body).content
    direct = httpx.post(fake_upstream.url + "/v1/chat/completions", json=body).content
    assert via_proxy == direct


def test_the_engine_loop_stop_in_a_continuation_is_not_a_heal(
    fake_upstream: FakeVLLM, proxy_server: ProxyFactory
) -> None:
    """vLLM's repetition_detection (the backstop) ending the continuation shows as the abort
    finish reason, and the choice does not count as healed."""
    fake_upstream.scripts = [
        Script(texts=[LOOPING]),
        Script(texts=[ENDING], finish_reason="repetition"),
    ]
    metrics = Metrics()
    base = proxy_server(mode="heal", metrics=metrics)
    body = {"model": "m", "messages": MESSAGES, "stream": True, "max_tokens": 1000}
    final = data_events(httpx.post(base + "/v1/chat/completions", json=body).content)[-1]
    choice = final["choices"][0]
    assert choice["finish_reason"] == "content_filter"
    assert choice["guard"]["action"] == "aborted" and choice["guard"]["attempts"] == 1
    q = metrics.quality_registry
    assert recorded(metrics, "guard_heals_total") == 1
    assert q.get_sample_value("guard_heal_successes_total", {"model": "m"}) is None
