"""The retry of a structured request the guard aborted goes out with the repetition defences
raised on every route, not on chat and completions alone: through real uvicorn in front of the
fake engine, on the Responses and Messages routes, with each route's own field names (the
fields vLLM's route passes to the engine: Responses takes chat's penalties, Messages only
``temperature``)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import httpx
import pytest

from tests.fakes.vllm import FakeVLLM, Script

LOOP = "The answer is the answer. " * 200
HANG_GUARD = 300.0

RESPONSES = {
    "model": "m", "input": "Look it up.", "stream": True, "temperature": 0,
    "max_output_tokens": 1000,
    "tools": [{"type": "function", "name": "look_up", "description": "Look a word up.",
               "parameters": {"type": "object", "properties": {"q": {"type": "string"}}}}],
}  # fmt: skip
MESSAGES = {
    "model": "m", "max_tokens": 1000, "stream": True, "temperature": 0,
    "messages": [{"role": "user", "content": "Look it up."}],
    "tools": [{"name": "look_up", "description": "Look a word up.",
               "input_schema": {"type": "object", "properties": {"q": {"type": "string"}}}}],
}  # fmt: skip


def _send(base: str, path: str, body: dict[str, Any]) -> str:
    done = httpx.post(base + path, json=body, timeout=HANG_GUARD)
    assert done.status_code == 200, done.text
    return done.text


@pytest.mark.parametrize("setting", ["heal", "defend"])
def test_a_responses_retry_with_tools_goes_out_with_raised_defences(
    fake_upstream: FakeVLLM, proxy_server: Callable[..., str], setting: str
) -> None:
    fake_upstream.script = Script(texts=["Fine start. " + LOOP])
    base = proxy_server(retry_after_abort=setting)
    assert b'"action":"aborted"' in _send(base, "/v1/responses", RESPONSES).encode()
    _send(base, "/v1/responses", RESPONSES)
    first, second = (r.json for r in fake_upstream.guarded_requests())
    assert first is not None and second is not None
    assert first["temperature"] == 0 and "repetition_penalty" not in first
    assert second["temperature"] == 0.3
    assert second["repetition_penalty"] == 1.1 and second["frequency_penalty"] == 0.3
    assert second["max_output_tokens"] == first["max_output_tokens"]
    assert [r.path for r in fake_upstream.guarded_requests()] == ["/v1/responses"] * 2


@pytest.mark.parametrize("setting", ["heal", "defend"])
def test_a_messages_retry_with_tools_goes_out_sampled(
    fake_upstream: FakeVLLM, proxy_server: Callable[..., str], setting: str
) -> None:
    """vLLM's Messages route drops the penalties: the temperature step is what it passes on."""
    fake_upstream.script = Script(texts=["Fine start. " + LOOP])
    base = proxy_server(retry_after_abort=setting)
    assert "coherence_guard" in _send(base, "/v1/messages", MESSAGES)  # aborted
    _send(base, "/v1/messages", MESSAGES)
    first, second = (r.json for r in fake_upstream.guarded_requests())
    assert first is not None and second is not None
    assert first["temperature"] == 0 and second["temperature"] == 0.3
    assert "repetition_penalty" not in second and "frequency_penalty" not in second
    assert [r.path for r in fake_upstream.guarded_requests()] == ["/v1/messages"] * 2
