"""OpenTelemetry traces through the real proxy: uvicorn, the fake vLLM over a real socket, the
SDK's own OTLP/HTTP exporter, and a receiver decoding what it sent (tests/otlp_receiver.py).

Per guarded request a server span continuing the client's ``traceparent`` and under it the
guard's model call (a client span); the engine gets a ``traceparent`` naming the model call; the
verdict is an event with its signal, position and action; the verdict counters carry the trace id
as an OpenMetrics exemplar; nothing of this exists unless the ``OTEL_*`` variables ask for it.
(Each attribute against the GenAI conventions: ``tests/test_tracing_conventions.py``.)
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from proxy.observability.metrics import Metrics
from proxy.observability.tracing import VERDICT_EVENT, Tracing, wanted
from tests.deploy_tools import COMPOSE, ROOT, dashboard, panels
from tests.exposition_server import parse, value
from tests.fakes.vllm import FakeVLLM, Script
from tests.otlp_receiver import Receiver, receiving

MODEL = "fake-model"
#: ``Span.SpanKind`` in OTLP (opentelemetry-proto trace.proto).
SPAN_KIND_SERVER, SPAN_KIND_CLIENT = 2, 3
LOOP = "I will check the file again to make sure it is correct. " * 40
HEALTHY = "Photosynthesis turns light into chemical energy in the chloroplasts of plants. "
CLIENT_TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
CLIENT_SPAN = "00f067aa0ba902b7"
TRACEPARENT = f"00-{CLIENT_TRACE}-{CLIENT_SPAN}-01"
OPENMETRICS = "application/openmetrics-text;version=1.0.0,text/plain;version=0.0.4;q=0.5"


@pytest.fixture
def receiver(monkeypatch: pytest.MonkeyPatch) -> Iterator[Receiver]:
    with receiving(monkeypatch) as rec:
        yield rec


def chat(base: str, *, mode: str | None = None, stream: bool = True) -> httpx.Response:
    headers = {"traceparent": TRACEPARENT, "tracestate": "vendor=x"}
    if mode is not None:
        headers["x-guard-mode"] = mode
    body = {
        "model": MODEL,
        "messages": [{"role": "user", "content": "Tell me about the file."}],
        "stream": stream,
        "max_tokens": 2000,
    }
    r = httpx.post(base + "/v1/chat/completions", json=body, headers=headers, timeout=30)
    assert r.status_code == 200, r.text
    return r


def verdicts(span: dict[str, Any]) -> list[dict[str, Any]]:
    return [e for e in span["events"] if e["name"] == VERDICT_EVENT]


def requests(spans: list[dict[str, Any]]) -> list[tuple[dict[str, Any], dict[str, Any]]]:
    """(server span, model-call span) of each request, in the order they were exported."""
    calls = [s for s in spans if s["kind"] == SPAN_KIND_CLIENT]
    servers = {s["span_id"]: s for s in spans if s["kind"] == SPAN_KIND_SERVER}
    return [(servers[c["parent_span_id"]], c) for c in calls]


def test_looping_request_one_span_verdict_event_and_engine_parent(
    receiver: Receiver, fake_upstream: FakeVLLM, proxy_server: Callable[..., str]
) -> None:
    metrics = Metrics()
    base = proxy_server(metrics=metrics, language="en")
    fake_upstream.script = Script(texts=["Photosynthesis starts with light. " + LOOP])
    r = chat(base)
    assert '"finish_reason":"content_filter"' in r.text

    ((server, span),) = requests(receiver.wait_for(lambda spans: len(spans) >= 2))
    # The client's trace, continued: same trace id, the client's span as parent of the
    # request's, which is the parent of the model call's.
    assert server["trace_id"] == CLIENT_TRACE and server["parent_span_id"] == CLIENT_SPAN
    assert span["trace_id"] == CLIENT_TRACE
    assert server["name"] == "POST /v1/chat/completions"
    assert span["name"] == f"chat {MODEL}"
    assert span["resource"]["service.name"] == "coherence-guard"
    a = span["attributes"]
    assert a["gen_ai.operation.name"] == "chat"
    assert a["gen_ai.request.model"] == MODEL and a["gen_ai.response.model"] == MODEL
    assert a["gen_ai.request.max_tokens"] == 2000
    assert a["gen_ai.response.finish_reasons"] == ["content_filter"]
    assert a["gen_ai.usage.input_tokens"] == 7
    assert 0 < a["gen_ai.usage.output_tokens"] < len(LOOP.split())
    assert a["coherence_guard.outcome"] == "aborted"

    (event,) = verdicts(span)
    e = event["attributes"]
    assert e["coherence_guard.signal"] == "repetition"
    assert e["coherence_guard.action"] == "aborted"
    assert e["coherence_guard.score"] >= 4
    assert e["coherence_guard.fired_at_token"] == a["gen_ai.usage.output_tokens"]
    assert 0 < e["coherence_guard.onset_char"] < e["coherence_guard.fired_at_char"]
    assert e["coherence_guard.expected_language"] == "en"
    assert e["coherence_guard.language_source"] == "config"
    assert "coherence_guard.trigger_text" not in e  # no text without GUARD_LOG_TEXT
    assert not any("text" in k or "prompt" in k for k in a)
    assert span["start"] <= event["time"] <= span["end"]

    # The engine got the same trace, with the guard's span as its parent, and the tracestate.
    engine = fake_upstream.guarded_requests()[-1].headers
    assert engine["traceparent"] == f"00-{CLIENT_TRACE}-{span['span_id']}-01"
    assert engine["tracestate"] == "vendor=x"

    # The verdict counter carries the trace id as an exemplar, in OpenMetrics only.
    body, ctype = metrics.render_quality(OPENMETRICS)
    assert ctype.startswith("application/openmetrics-text")
    line = next(
        ln
        for ln in body.decode().splitlines()
        if ln.startswith("guard_detections_total{") and 'action="aborted"' in ln
    )
    assert f' 1.0 # {{trace_id="{CLIENT_TRACE}"}} 1.0 ' in line, line
    plain, ctype = metrics.render_quality()
    assert ctype.startswith("text/plain") and b"trace_id" not in plain
    with httpx.Client() as client:
        scraped = client.get(base + "/metrics/quality", headers={"accept": OPENMETRICS})
    assert scraped.headers["content-type"].startswith("application/openmetrics-text")
    assert f'trace_id="{CLIENT_TRACE}"' in scraped.text


def test_monitor_heal_and_text_only_when_asked(
    receiver: Receiver, fake_upstream: FakeVLLM, proxy_server: Callable[..., str]
) -> None:
    metrics = Metrics()
    base = proxy_server(metrics=metrics, allow_client_override=True, log_text=True, language="en")

    # Monitor: relayed to its end; the verdict is an event all the same, action observed.
    fake_upstream.script = Script(texts=[LOOP], finish_reason="length")
    chat(base, mode="monitor", stream=False)
    ((_, span),) = requests(receiver.wait_for(lambda spans: len(spans) >= 2))
    (event,) = verdicts(span)
    assert event["attributes"]["coherence_guard.action"] == "observed"
    assert span["attributes"]["gen_ai.response.finish_reasons"] == ["length"]
    assert event["attributes"]["coherence_guard.trigger_text"].strip()  # GUARD_LOG_TEXT=true

    # Heal: cut, continued to a healthy stop; the first verdict led to a heal.
    fake_upstream.scripts = [
        Script(texts=["Photosynthesis starts with light. " + LOOP]),
        Script(texts=[HEALTHY], finish_reason="stop"),
    ]
    r = chat(base, mode="heal", stream=False)
    assert r.json()["choices"][0]["guard"]["action"] == "healed"
    _, heal = requests(receiver.wait_for(lambda spans: len(spans) >= 4))[1]
    assert heal["attributes"]["coherence_guard.heal.attempts"] == 1
    assert heal["attributes"]["coherence_guard.heal.healed"] is True
    assert "error.type" not in heal["attributes"]  # the loop was cut and the answer went on
    (event,) = verdicts(heal)
    assert event["attributes"]["coherence_guard.action"] == "healed"
    assert event["attributes"]["coherence_guard.heal.attempt"] == 0
    # Both engine requests (the answer and its continuation) are children of the model call.
    parents = {r.headers["traceparent"] for r in fake_upstream.guarded_requests()[-2:]}
    assert parents == {f"00-{CLIENT_TRACE}-{heal['span_id']}-01"}
    q = parse(metrics.render_quality()[0])
    assert value(q, "guard_heals_total", model=MODEL) == 1
    assert f'trace_id="{CLIENT_TRACE}"' in metrics.render_quality(OPENMETRICS)[0].decode()


def test_off_by_default_the_client_traceparent_goes_through(
    monkeypatch: pytest.MonkeyPatch, fake_upstream: FakeVLLM, proxy_server: Callable[..., str]
) -> None:
    for name in ("OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.delenv("OTEL_TRACES_EXPORTER", raising=False)
    assert Tracing.from_env() is None
    metrics = Metrics()
    base = proxy_server(metrics=metrics, language="en")
    fake_upstream.script = Script(texts=[LOOP])
    chat(base)
    assert fake_upstream.guarded_requests()[-1].headers["traceparent"] == TRACEPARENT
    assert b"trace_id" not in metrics.render_quality(OPENMETRICS)[0]


@pytest.mark.parametrize(
    ("env", "on"),
    [
        ({}, False),
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318"}, True),
        ({"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://collector:4318/v1/traces"}, True),
        ({"OTEL_TRACES_EXPORTER": "console"}, True),
        ({"OTEL_TRACES_EXPORTER": "none", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318"}, False),
        ({"OTEL_SDK_DISABLED": "true", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318"}, False),
    ],
)
def test_on_only_when_the_sdk_variables_ask(env: dict[str, str], on: bool) -> None:
    assert wanted(env) is on


def test_grafana_links_the_abort_panels_exemplars_to_traces() -> None:
    """The abort panel asks for exemplars; the data source links their ``trace_id`` (the label
    the proxy writes) to a traces data source named by a variable; Prometheus stores them."""
    ds = yaml.safe_load((ROOT / "grafana/provisioning/datasources/prometheus.yml").read_text())
    (link,) = ds["datasources"][0]["jsonData"]["exemplarTraceIdDestinations"]
    assert link == {
        "name": "trace_id",
        "datasourceUid": "${GRAFANA_TRACES_DATASOURCE_UID}",
        "urlDisplayLabel": "Open the trace",
    }
    (abort,) = [p for p in panels(dashboard()) if p["title"] == "Abort rate by signal"]
    assert all(t["exemplar"] for t in abort["targets"])
    assert "guard_detections_total" in abort["targets"][0]["expr"]
    compose = yaml.safe_load(COMPOSE.read_text())["services"]
    assert "--enable-feature=exemplar-storage" in compose["prometheus"]["command"]
    assert "GRAFANA_TRACES_DATASOURCE_UID" in compose["grafana"]["environment"]


_MULTIPROCESS = """
import dataclasses, sys
from proxy.observability.metrics import Metrics
from tests.test_metrics import aborted
m = Metrics()
m.record_generation(dataclasses.replace(aborted(), trace_id=sys.argv[2]))
body, content_type = m.render_quality(sys.argv[1])
sys.stdout.write(content_type + "\\n" + body.decode())
"""


def test_multiprocess_mode_counts_without_exemplars(tmp_path: Path) -> None:
    """``--workers N > 1``: prometheus-client's shared files hold values, not exemplars; the
    OpenMetrics answer has the same counts and no trace id (docs/observability.md says so)."""
    env = {**os.environ, "PROMETHEUS_MULTIPROC_DIR": str(tmp_path)}
    out = subprocess.run(
        [sys.executable, "-c", _MULTIPROCESS, OPENMETRICS, CLIENT_TRACE],
        env=env,
        cwd=ROOT,
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    content_type, body = out.split("\n", 1)
    assert content_type.startswith("application/openmetrics-text")
    line = 'guard_detections_total{action="aborted",model="m",signal="repetition"} 1.0'
    assert line in body.splitlines()
    assert "trace_id" not in body
