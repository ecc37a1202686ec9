"""FastAPI's native OpenTelemetry layer (FastAPI >= 0.165) and the guarded routes.

That layer switches itself on when a global tracer provider is set (``opentelemetry-instrument``,
the OpenTelemetry operator's injection) and wraps ``send`` for the whole request. On a guarded
route it would put a Python layer on every relayed chunk, take away the direct write onto
uvicorn's transport and add a second server span beside the proxy's own; ``GuardApp`` keeps
guarded routes out of it and leaves every other route to FastAPI.

A global tracer provider can be set once per process, and once set it turns the layer on for
every app after it, so the check runs in a child process: real uvicorn, the fake engine on a
real socket, the SDK's in-memory exporter as the global provider's.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.net import HANG_GUARD

pytest.importorskip("fastapi.telemetry", reason="FastAPI before 0.165 has no native telemetry")
pytest.importorskip("opentelemetry.sdk.trace")

ROOT = Path(__file__).resolve().parent.parent

CHILD = r"""
import json

import httpx
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

exporter = InMemorySpanExporter()
provider = TracerProvider()
provider.add_span_processor(SimpleSpanProcessor(exporter))
trace.set_tracer_provider(provider)

from proxy.server import asgi
from proxy.server.app import create_app
from proxy.settings import load_settings
from tests.conftest import ProxyServer
from tests.fakes.vllm import FakeVLLM

writes = 0
real_write = asgi.DirectBody.write


def counted(body, data):
    global writes
    writes += 1
    return real_write(body, data)


asgi.DirectBody.write = counted

with FakeVLLM() as engine:
    settings = load_settings(upstream_url=engine.url, upstream_metrics_interval=0)
    server = ProxyServer(create_app(settings)).start()
    try:
        with httpx.Client(base_url=server.url) as client:
            body = {
                "model": "m",
                "messages": [{"role": "user", "content": "Tell me something."}],
                "stream": True,
            }
            with client.stream("POST", "/v1/chat/completions", json=body) as resp:
                stream = b"".join(resp.iter_raw())
            health = client.get("/health").status_code
    finally:
        server.stop()

spans = [
    {"name": s.name, "attributes": {k: str(v) for k, v in (s.attributes or {}).items()}}
    for s in exporter.get_finished_spans()
]
print(json.dumps({
    "spans": spans,
    "direct_writes": writes,
    "done": stream.rstrip().endswith(b"data: [DONE]"),
    "health": health,
}))
"""


def test_a_global_tracer_provider_leaves_the_guarded_relay_as_it_is() -> None:
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
    }
    for name in [n for n in env if n.startswith("OTEL_")]:
        del env[name]  # the proxy's own traces stay off: only FastAPI's layer could make spans
    run = subprocess.run(
        [sys.executable, "-c", CHILD],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=HANG_GUARD * 4,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    got = json.loads(run.stdout.strip().splitlines()[-1])

    assert got["done"] and got["health"] == 200
    # The chunks went straight onto uvicorn's transport, as without a global provider.
    assert got["direct_writes"] > 0
    paths = [span["attributes"].get("url.path") for span in got["spans"]]
    # FastAPI's layer is on in this process (the proxy's own route got its server span) ...
    assert "/health" in paths, got["spans"]
    # ... and the guarded route went past it.
    assert "/v1/chat/completions" not in paths, got["spans"]
