"""A looping answer of a real engine, traced through the guard into a real trace store: Phoenix.

Real parts only: llama.cpp's server with SmolLM2 (greedy-decoding the long numbered story, which
loops for real), ``coherence-guard serve`` in front of it with traces on through the SDK's own
``OTEL_EXPORTER_OTLP_ENDPOINT``, and Arize Phoenix (``arize-phoenix`` from PyPI, installed by
``.ci/run`` into its own environment) receiving OTLP/HTTP at ``/v1/traces``. What Phoenix holds,
read back through its REST API: one trace, the client's, with the request's span under the
client's span, the guard's model call (named by the engine it found: llama.cpp) under that, and
the verdict as the model call's event; and the request the engine got (read off a TCP tap
between the proxy and the engine) carries a ``traceparent`` naming the model call, so the
engine's own spans (vLLM with ``--otlp-traces-endpoint``) sit under it.
"""

from __future__ import annotations

import os
import re
import tempfile
import time
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.e2e.conftest import E2E_HOME, _unavailable
from tests.e2e.support import GREEDY, LOOP_PROMPTS, ProxyFactory, Server, StartError, start_server
from tests.e2e.tap import ByteTap
from tests.net import free_port

pytestmark = pytest.mark.e2e

TRACE = "5e1f0c7e2a9d4b3f8c6a1d2e3f4a5b6c"
CLIENT_SPAN = "1a2b3c4d5e6f7081"
#: Where .ci/run installs Phoenix (or COHERENCE_GUARD_PHOENIX names its ``phoenix`` command).
PHOENIX = Path(os.environ.get("COHERENCE_GUARD_PHOENIX", E2E_HOME / "phoenix-venv/bin/phoenix"))


@pytest.fixture(scope="module")
def phoenix() -> Iterator[Server]:
    if not PHOENIX.exists():
        _unavailable(f"no Phoenix at {PHOENIX} (.ci/run installs arize-phoenix there)")
    with tempfile.TemporaryDirectory(prefix="phoenix-") as home:
        env = {
            "PHOENIX_WORKING_DIR": home,
            "PHOENIX_HOST": "127.0.0.1",
            "PHOENIX_PORT": "{port}",
            "PHOENIX_GRPC_PORT": str(free_port()),
            "PHOENIX_TELEMETRY_ENABLED": "false",
        }
        try:
            server = start_server("phoenix", [str(PHOENIX), "serve"], env, "/healthz", 180)
        except StartError as exc:
            pytest.fail(str(exc), pytrace=False)
        yield server
        server.stop()


def phoenix_spans(phoenix: Server) -> list[dict[str, Any]]:
    r = httpx.get(phoenix.url + "/v1/projects/default/spans", params={"limit": 100}, timeout=10)
    if r.status_code == 404:  # the project appears with its first span
        return []
    r.raise_for_status()
    spans: list[dict[str, Any]] = r.json()["data"]
    return [s for s in spans if s["context"]["trace_id"] == TRACE]


def test_loop_traced_into_phoenix(
    llama_engine: Server,
    start_proxy: ProxyFactory,
    model_name: str,
    phoenix: Server,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", phoenix.url)
    monkeypatch.setenv("OTEL_BSP_SCHEDULE_DELAY", "100")
    tap = ByteTap(llama_engine.url)
    try:
        proxy = start_proxy(tap.url, language="en")  # one language: a short warm-up
        body = {
            "model": model_name,
            "messages": [{"role": "user", "content": LOOP_PROMPTS["en"]}],
            "max_tokens": 1500,
            "stream": True,
            "temperature": GREEDY["temperature"],
            **GREEDY["extra_body"],
        }
        headers = {"traceparent": f"00-{TRACE}-{CLIENT_SPAN}-01"}
        with httpx.stream(
            "POST", proxy.url + "/v1/chat/completions", json=body, headers=headers, timeout=300
        ) as r:
            text = "".join(r.iter_text())
        assert '"finish_reason":"content_filter"' in text
        sent = b"".join(tap.requests()).decode("latin-1")
    finally:
        tap.close()

    deadline = time.monotonic() + 30
    while len(spans := phoenix_spans(phoenix)) < 2:
        assert time.monotonic() < deadline, f"Phoenix has {len(spans)} spans of the trace"
        time.sleep(0.5)
    by_name = {s["name"]: s for s in spans}
    assert by_name.keys() == {"POST /v1/chat/completions", f"chat {model_name}"}
    server, span = by_name["POST /v1/chat/completions"], by_name[f"chat {model_name}"]
    assert server["parent_id"] == CLIENT_SPAN
    assert span["parent_id"] == server["context"]["span_id"]
    a = span["attributes"]
    assert a["gen_ai.request.model"] == model_name
    assert a["gen_ai.provider.name"] == "llama.cpp"
    assert a["error.type"] in ("coherence_guard:repetition", "coherence_guard:token-flood")
    assert a["coherence_guard.outcome"] == "aborted"
    assert a["gen_ai.response.finish_reasons"] == ["content_filter"]
    (event,) = [e for e in span["events"] if e["name"] == "coherence_guard.verdict"]
    e = event["attributes"]
    assert e["coherence_guard.action"] == "aborted"
    assert e["coherence_guard.signal"] in ("repetition", "token-flood")
    assert e["coherence_guard.fired_at_token"] == a["gen_ai.usage.output_tokens"]
    moments = [span["start_time"], event["timestamp"], span["end_time"]]
    start, fired, end = (datetime.fromisoformat(m) for m in moments)
    assert start <= fired <= end

    # The engine's request names the guard's span as its parent, in the client's trace.
    parents = re.findall(r"(?im)^traceparent: *(\S+)\r$", sent)
    assert f"00-{TRACE}-{span['context']['span_id']}-01" in parents, sent[:2000]
