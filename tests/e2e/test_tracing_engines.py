"""The model call's span names the real engine behind the guard: ``gen_ai.provider.name`` comes
from the ``owned_by`` that vLLM and llama.cpp's server each write on their own ``/v1/models``
(``vllm``, ``llamacpp``), read by ``coherence-guard serve`` as it runs in production, and exported
over OTLP/HTTP to the test's receiver (tests/otlp_receiver.py)."""

from __future__ import annotations

from urllib.parse import urlsplit

import httpx
import pytest

from tests.e2e.support import ProxyFactory, Server
from tests.otlp_receiver import receiving

pytestmark = pytest.mark.e2e

#: OTLP ``Span.SpanKind`` values (opentelemetry-proto trace.proto).
SERVER, CLIENT = 2, 3


@pytest.mark.parametrize(
    ("engine", "provider"), [("llama_engine", "llama.cpp"), ("vllm_engine", "vllm")]
)
def test_the_model_call_names_the_engine(
    engine: str,
    provider: str,
    start_proxy: ProxyFactory,
    model_name: str,
    request: pytest.FixtureRequest,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    server: Server = request.getfixturevalue(engine)
    with receiving(monkeypatch) as receiver:
        proxy = start_proxy(server, language="en")
        body = {
            "model": model_name,
            "messages": [{"role": "user", "content": "Name one colour of the rainbow."}],
            "max_tokens": 16,
            "temperature": 0.0,
            "stream": True,
        }
        r = httpx.post(proxy.url + "/v1/chat/completions", json=body, timeout=120)
        assert r.status_code == 200, r.text
        spans = receiver.wait_for(lambda spans: len(spans) >= 2)
    (call,) = [s for s in spans if s["kind"] == CLIENT]
    (incoming,) = [s for s in spans if s["kind"] == SERVER]
    assert call["parent_span_id"] == incoming["span_id"]
    a = call["attributes"]
    assert a["gen_ai.provider.name"] == provider
    assert "gen_ai.system" not in a
    assert (a["server.address"], a["server.port"]) == ("127.0.0.1", urlsplit(server.url).port)
    assert a["gen_ai.request.max_tokens"] == 16 and a["gen_ai.request.temperature"] == 0.0
    assert a["gen_ai.response.time_to_first_chunk"] > 0
    assert "error.type" not in a
