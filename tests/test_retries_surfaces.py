"""The retry of a structured request the guard aborted goes out with the repetition defences
raised on every route, not on chat alone: through real uvicorn in front of the fake engine, on
the completions, Responses and Messages routes, with each route's own field names (the fields
vLLM's route passes to the engine: completions and Responses take chat's penalties, Messages only
``temperature``); and a plain retry on completions is healed, as on chat."""

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
COMPLETIONS = {
    "model": "m", "prompt": "Give JSON:", "stream": True, "temperature": 0, "max_tokens": 1000,
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


#: The fields the defences raise; a retry is otherwise the request sent before.
DEFENCES = ("temperature", "repetition_penalty", "frequency_penalty")


@pytest.mark.parametrize("setting", ["heal", "defend"])
@pytest.mark.parametrize(
    ("path", "body", "text"),
    [
        ("/v1/responses", RESPONSES, "Fine start. " + LOOP),
        (
            "/v1/completions",
            {**COMPLETIONS, "response_format": {"type": "json_object"}},
            '{"a": "' + LOOP,
        ),
    ],
    ids=["responses-tools", "completions-json"],
)
def test_a_structured_retry_goes_out_with_raised_defences(
    fake_upstream: FakeVLLM,
    proxy_server: Callable[..., str],
    setting: str,
    path: str,
    body: dict[str, Any],
    text: str,
) -> None:
    """A continuation would restart a tool call or a JSON grammar mid-string: the retry is sent
    whole again, with the penalties raised and greedy decoding made sampled, under either
    setting, and is otherwise the request sent before."""
    fake_upstream.script = Script(texts=[text])
    base = proxy_server(retry_after_abort=setting)
    assert '"action":"aborted"' in _send(base, path, body)
    _send(base, path, body)
    first, second = (r.json for r in fake_upstream.guarded_requests())
    assert first is not None and second is not None
    assert first["temperature"] == 0 and "repetition_penalty" not in first
    assert second["temperature"] == 0.3
    assert second["repetition_penalty"] == 1.1 and second["frequency_penalty"] == 0.3
    rest = [{k: v for k, v in r.items() if k not in DEFENCES} for r in (first, second)]
    assert rest[0] == rest[1]
    assert [r.path for r in fake_upstream.guarded_requests()] == [path] * 2


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


def test_a_completions_retry_is_healed(
    fake_upstream: FakeVLLM, proxy_server: Callable[..., str]
) -> None:
    """The same plain request again after an abort: relayed in heal mode, so the engine is
    asked to continue the cut answer (its prompt followed by the kept text) with its
    repetition defences raised."""
    fake_upstream.script = Script(texts=["Fine start. " + LOOP])
    base = proxy_server(retry_after_abort="heal")
    assert '"action":"aborted"' in _send(base, "/v1/completions", COMPLETIONS)
    assert len(fake_upstream.guarded_requests()) == 1
    _send(base, "/v1/completions", COMPLETIONS)
    retry, *continuations = (r.json for r in fake_upstream.guarded_requests()[1:])
    assert retry == fake_upstream.guarded_requests()[0].json  # the first stage: as sent before
    assert continuations, "the retry was not healed"
    first = continuations[0]
    assert first["prompt"].startswith(COMPLETIONS["prompt"] + "Fine start")
    assert first["repetition_penalty"] == 1.1 and first["frequency_penalty"] == 0.3
