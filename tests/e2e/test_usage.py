"""The usage of an answer the guard cut, in front of real engines: the prompt count is the
engine's own, never 0.

llama.cpp's server sends usage only at the end of a stream, and vLLM writes a Responses usage
only on its terminal event (and a chat usage only at the end once the proxy does not ask for
per-chunk usage, ``GUARD_REQUEST_USAGE=false``): at the abort the proxy has no count, asks the
engine (``POST /tokenize``, llama.cpp's ``/apply-template`` for its chat template) and reports
what it answers. The count each answer reports is compared with the one the same engine reports
for the same prompt, asked directly (one token of answer, no proxy).
"""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from tests.e2e.support import LOOP_PROMPTS, ProxyFactory, Server, record_figure
from tests.usage_reading import events, prompt_count, usage_of

pytestmark = pytest.mark.e2e

PROMPT = LOOP_PROMPTS["en"]
#: A text prompt that loops greedily too (the chat prompt, then the first number).
COMPLETION_PROMPT = PROMPT + "\n\n1."
GREEDY = {"temperature": 0, "repetition_penalty": 1.0}
PATHS = {
    "chat": "/v1/chat/completions",
    "completions": "/v1/completions",
    "responses": "/v1/responses",
    "messages": "/v1/messages",
}


def body(surface: str, model: str, limit: int, stream: bool) -> dict[str, Any]:
    out: dict[str, Any] = {"model": model, "stream": stream, **GREEDY}
    if surface == "completions":
        out.update(prompt=COMPLETION_PROMPT, max_tokens=limit)
    elif surface == "responses":
        out.update(input=PROMPT, max_output_tokens=limit)
    else:
        out.update(messages=[{"role": "user", "content": PROMPT}], max_tokens=limit)
    if stream and surface in ("chat", "completions"):
        out["stream_options"] = {"include_usage": True}
    return out


def answer(server: Server, surface: str, model: str, limit: int, stream: bool) -> Any:
    resp = httpx.post(
        server.url + PATHS[surface], json=body(surface, model, limit, stream), timeout=300
    )
    assert resp.status_code == 200, resp.text
    return events(resp.content) if stream else resp.json()


def check(engine: Server, proxy: Server, surface: str, model: str, stream: bool) -> int:
    """The cut answer's prompt count is the engine's; returns it."""
    direct, _ = usage_of(surface, False, answer(engine, surface, model, 1, False))
    own = prompt_count(surface, direct)
    assert own is not None and own > 0, direct
    usage, cut = usage_of(surface, stream, answer(proxy, surface, model, 1500, stream))
    assert cut, usage
    assert usage is not None, "usage left out although the engine counts prompts"
    assert prompt_count(surface, usage) == own, (usage, own)  # the totals agree with it
    return own


@pytest.mark.parametrize("stream", [True, False], ids=["stream", "non-stream"])
@pytest.mark.parametrize("surface", ["chat", "completions", "messages"])
def test_llamacpp_cut_answer_reports_the_engines_prompt_count(
    llama_engine: Server, start_proxy: ProxyFactory, model_name: str, surface: str, stream: bool
) -> None:
    """llama.cpp counts the prompt only when an answer ends (Messages: in ``message_start``,
    without the part it had cached, which it reports as ``cache_read_input_tokens``)."""
    proxy = start_proxy(llama_engine)
    own = check(llama_engine, proxy, surface, model_name, stream)
    record_figure(f"llamacpp_cut_prompt_tokens_{surface}_{'stream' if stream else 'json'}", own)


@pytest.mark.parametrize("stream", [True, False], ids=["stream", "non-stream"])
@pytest.mark.parametrize("surface", ["chat", "completions", "responses"])
def test_vllm_cut_answer_reports_the_engines_prompt_count(
    vllm_engine: Server, start_proxy: ProxyFactory, model_name: str, surface: str, stream: bool
) -> None:
    """vLLM writes a Responses usage only on its terminal event, and a chat or completions
    usage only at the end without the per-chunk usage the proxy asks for by default."""
    proxy = start_proxy(vllm_engine, request_usage=False)
    own = check(vllm_engine, proxy, surface, model_name, stream)
    record_figure(f"vllm_cut_prompt_tokens_{surface}_{'stream' if stream else 'json'}", own)
