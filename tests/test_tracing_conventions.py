"""The spans follow the OpenTelemetry GenAI client conventions
(``open-telemetry/semantic-conventions-genai``, ``client-inference.md``), read with the SDK's
in-memory exporter from the real proxy under uvicorn in front of the fake vLLM.

The client's request is a ``SERVER`` span; the guard's call to the model is a ``CLIENT`` span
under it, named ``{operation} {model}``, the parent of the engine's spans. It names the engine it
found (``gen_ai.provider.name`` from the ``owned_by`` of the engine's model list, never the
deprecated ``gen_ai.system``), the engine's address, the client's own sampling settings and
limit (never the guard's default), the time to the first chunk, and ``error.type`` on aborts and
failures.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import httpx
import pytest
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExportResult
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from proxy.observability.genai import (
    OPENAI_COMPATIBLE,
    provider_name,
    request_attributes,
    server_attributes,
)
from proxy.observability.metrics import Metrics
from proxy.observability.tracing import Tracing
from proxy.server.app import create_app
from proxy.settings import load_settings
from tests.conftest import ProxyServer
from tests.fakes.vllm import FakeVLLM, Script
from tests.net import HANG_GUARD

MODEL = "fake-model"
LOOP = "I will check the file again to make sure it is correct. " * 40
CLIENT_TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
CLIENT_SPAN = "00f067aa0ba902b7"
TRACEPARENT = f"00-{CLIENT_TRACE}-{CLIENT_SPAN}-01"
#: The client's sampling settings, each a value no default of the guard's would give.
SAMPLING = {
    "temperature": 0.3,
    "top_p": 0.9,
    "top_k": 40,
    "frequency_penalty": 0.5,
    "presence_penalty": 0.25,
    "stop": ["END", "STOP"],
    "seed": 7,
    "max_tokens": 300,
}


class Exporter(InMemorySpanExporter):
    """The SDK's in-memory exporter that also tells a waiting test (an export is an event)."""

    def __init__(self) -> None:
        super().__init__()
        self.changed = threading.Condition()

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        result = super().export(spans)
        with self.changed:
            self.changed.notify_all()
        return result

    def wait_for(self, count: int) -> list[ReadableSpan]:
        with self.changed:
            ok = self.changed.wait_for(lambda: len(self.get_finished_spans()) >= count, HANG_GUARD)
        spans = list(self.get_finished_spans())
        assert ok, f"spans: {[s.name for s in spans]}"
        return spans


Traced = Callable[..., tuple[str, Exporter]]


@pytest.fixture
def traced(fake_upstream: FakeVLLM) -> Iterator[Traced]:
    """Factory: the proxy under uvicorn with traces on into an in-memory exporter."""
    servers: list[ProxyServer] = []

    def start(**overrides: Any) -> tuple[str, Exporter]:
        overrides.setdefault("upstream_url", fake_upstream.url)
        overrides.setdefault("upstream_metrics_interval", 0)
        app = create_app(load_settings(**overrides), metrics=Metrics())
        exporter = Exporter()
        provider = TracerProvider()
        provider.add_span_processor(SimpleSpanProcessor(exporter))
        app.proxy.tracing = Tracing(
            provider,
            TraceContextTextMapPropagator(),
            log_text=False,
            upstream_url=app.proxy.engine_url,
        )
        server = ProxyServer(app).start()
        servers.append(server)
        return server.url, exporter

    yield start
    for server in servers:
        server.stop()


def chat(base: str, **fields: Any) -> httpx.Response:
    body = {
        "model": MODEL,
        "messages": [{"role": "user", "content": "Tell me about photosynthesis."}],
        "stream": True,
        **fields,
    }
    headers = {"traceparent": TRACEPARENT}
    return httpx.post(base + "/v1/chat/completions", json=body, headers=headers)


def pair(exporter: Exporter) -> tuple[ReadableSpan, ReadableSpan]:
    """The request's SERVER span and its model call's CLIENT span."""
    spans = exporter.wait_for(2)
    (server,) = [s for s in spans if s.kind is SpanKind.SERVER]
    (client,) = [s for s in spans if s.kind is SpanKind.CLIENT]
    return server, client


def span_id(span: ReadableSpan) -> str:
    return format(span.get_span_context().span_id, "016x")


@pytest.mark.parametrize(
    ("owned_by", "provider"),
    [("vllm", "vllm"), ("llamacpp", "llama.cpp"), ("some-gateway", OPENAI_COMPATIBLE)],
)
def test_the_model_call_is_a_client_span_under_the_requests_server_span(
    traced: Traced, fake_upstream: FakeVLLM, owned_by: str, provider: str
) -> None:
    fake_upstream.owned_by = owned_by
    # The first chunk comes a while after the response head: the time is the first chunk's.
    fake_upstream.script = Script(first_delay=0.3)
    base, exporter = traced(language="en")
    r = chat(base, **SAMPLING)
    assert r.status_code == 200 and '"finish_reason":"stop"' in r.text
    server, client = pair(exporter)

    assert server.kind is SpanKind.SERVER and client.kind is SpanKind.CLIENT
    assert server.name == "POST /v1/chat/completions"
    assert format(server.context.trace_id, "032x") == CLIENT_TRACE
    assert server.parent is not None and format(server.parent.span_id, "016x") == CLIENT_SPAN
    assert client.parent is not None and client.parent.span_id == server.context.span_id
    s = dict(server.attributes or {})
    assert s.pop("coherence_guard.request_id")
    assert s == {
        "http.request.method": "POST",
        "http.route": "/v1/chat/completions",
        "http.response.status_code": 200,
        "coherence_guard.endpoint": "chat",
        "coherence_guard.mode": "enforce",
        "coherence_guard.stream": True,
    }

    assert client.name == f"chat {MODEL}"
    a = dict(client.attributes or {})
    first_chunk = a.pop("gen_ai.response.time_to_first_chunk")
    assert isinstance(first_chunk, float)
    assert client.start_time is not None and client.end_time is not None
    assert 0.3 <= first_chunk <= (client.end_time - client.start_time) / 1e9
    assert str(a.pop("gen_ai.response.id")).startswith("chatcmpl-")
    assert a == {
        "gen_ai.operation.name": "chat",
        "gen_ai.provider.name": provider,
        "gen_ai.request.model": MODEL,
        "gen_ai.request.temperature": 0.3,
        "gen_ai.request.top_p": 0.9,
        "gen_ai.request.top_k": 40,
        "gen_ai.request.frequency_penalty": 0.5,
        "gen_ai.request.presence_penalty": 0.25,
        "gen_ai.request.stop_sequences": ("END", "STOP"),
        "gen_ai.request.seed": 7,
        "gen_ai.request.max_tokens": 300,
        "gen_ai.request.stream": True,
        "server.address": "127.0.0.1",
        "server.port": fake_upstream.port,
        "gen_ai.response.model": MODEL,
        "gen_ai.response.finish_reasons": ("stop",),
        "gen_ai.usage.input_tokens": 7,
        "gen_ai.usage.output_tokens": a["gen_ai.usage.output_tokens"],
        "coherence_guard.outcome": "completed",
        "coherence_guard.max_tokens": 300,
        "coherence_guard.expected_language": "en",
        "coherence_guard.language_source": "config",
    }
    assert "gen_ai.system" not in a and "error.type" not in a
    assert client.status.status_code is StatusCode.UNSET
    assert server.status.status_code is StatusCode.UNSET
    # The engine's spans go under the model call.
    engine = fake_upstream.guarded_requests()[-1].headers
    assert engine["traceparent"] == f"00-{CLIENT_TRACE}-{span_id(client)}-01"


def test_the_limit_recorded_is_the_clients_own_never_the_guards(
    traced: Traced, fake_upstream: FakeVLLM
) -> None:
    """No limit asked: none recorded as asked, the guard's default as the guard's. A limit
    above the cap: the client's as asked, the clamped one as sent."""
    base, exporter = traced(max_tokens_default=1000, max_tokens_cap=5000)
    chat(base)
    _, client = pair(exporter)
    assert "gen_ai.request.max_tokens" not in (client.attributes or {})
    assert (client.attributes or {})["coherence_guard.max_tokens"] == 1000
    assert fake_upstream.guarded_requests()[-1].json["max_tokens"] == 1000

    exporter.clear()
    chat(base, max_completion_tokens=9000)
    _, client = pair(exporter)
    assert (client.attributes or {})["gen_ai.request.max_tokens"] == 9000
    assert (client.attributes or {})["coherence_guard.max_tokens"] == 5000


def test_an_abort_is_an_error_of_the_model_call_not_of_the_request(
    traced: Traced, fake_upstream: FakeVLLM
) -> None:
    """The guard cut the model's answer: the call ended in an error named as the client's
    ``stop_reason`` names it; the client's request was answered (200), so it did not."""
    fake_upstream.script = Script(texts=["Photosynthesis starts with light. " + LOOP])
    base, exporter = traced(language="en")
    r = chat(base)
    assert '"stop_reason":"coherence_guard:repetition"' in r.text
    server, client = pair(exporter)
    a = client.attributes or {}
    assert a["error.type"] == "coherence_guard:repetition"
    assert a["coherence_guard.outcome"] == "aborted"
    assert client.status.status_code is StatusCode.ERROR
    assert "error.type" not in (server.attributes or {})
    assert server.status.status_code is StatusCode.UNSET


@pytest.mark.parametrize(
    ("script", "error", "status"),
    [(Script(status=500), "500", 500), (Script(die_after=3), "disconnect", 200)],
    ids=["engine-500", "engine-cut-mid-stream"],
)
def test_an_upstream_failure_names_its_kind(
    traced: Traced, fake_upstream: FakeVLLM, script: Script, error: str, status: int
) -> None:
    fake_upstream.script = script
    base, exporter = traced()
    r = chat(base)
    assert r.status_code == status
    server, client = pair(exporter)
    assert (client.attributes or {})["error.type"] == error
    assert (client.attributes or {})["coherence_guard.outcome"] == "upstream_error"
    assert client.status.status_code is StatusCode.ERROR
    if status >= 500:  # an HTTP server's error: the request failed too
        assert (server.attributes or {})["error.type"] == str(status)
        assert server.status.status_code is StatusCode.ERROR


def test_an_engine_that_cannot_be_reached(traced: Traced) -> None:
    """Nothing listens: the call fails to connect, and with no model list read the engine
    is named only as OpenAI-compatible."""
    with FakeVLLM() as gone:
        url = gone.url
    base, exporter = traced(upstream_url=url)
    assert chat(base).status_code == 502
    server, client = pair(exporter)
    a = client.attributes or {}
    assert a["error.type"] == "connect"
    assert a["gen_ai.provider.name"] == OPENAI_COMPATIBLE
    assert (server.attributes or {})["error.type"] == "502"


@pytest.mark.parametrize(
    ("endpoint", "body", "expected"),
    [
        (
            "messages",
            {"max_tokens": 64, "temperature": 1, "top_k": 5, "stop_sequences": ["\n\n"],
             "stop": "ignored"},
            {"gen_ai.request.max_tokens": 64, "gen_ai.request.temperature": 1.0,
             "gen_ai.request.top_k": 5, "gen_ai.request.stop_sequences": ["\n\n"]},
        ),
        (
            "responses",
            {"max_output_tokens": 50, "max_tokens": 9, "top_p": 0.5},
            {"gen_ai.request.max_tokens": 50, "gen_ai.request.top_p": 0.5},
        ),
        (
            "chat",
            {"max_tokens": 10, "max_completion_tokens": 20, "n": 3, "stop": "END"},
            {"gen_ai.request.max_tokens": 20, "gen_ai.request.choice.count": 3,
             "gen_ai.request.stop_sequences": ["END"]},
        ),
        (
            "completions",
            {"max_tokens": True, "temperature": "hot", "seed": 1.5, "n": 1, "stop": [1, "x"],
             "top_k": 2.0},
            {},
        ),
    ],
    ids=["messages", "responses", "chat-max-completion-tokens-wins", "wrong-types-left-out"],
)  # fmt: skip
def test_request_attributes_read_each_surfaces_own_fields(
    endpoint: str, body: dict[str, Any], expected: dict[str, Any]
) -> None:
    assert request_attributes(endpoint, body) == expected


def test_provider_and_server_names() -> None:
    assert provider_name("vllm") == "vllm"
    assert provider_name("llamacpp") == "llama.cpp"
    assert provider_name("SGLang") == "sglang"
    assert provider_name(None) == provider_name("organization-owner") == OPENAI_COMPATIBLE
    assert server_attributes("http://vllm:8000") == {"server.address": "vllm", "server.port": 8000}
    assert server_attributes("https://engine.example") == {
        "server.address": "engine.example",
        "server.port": 443,
    }
