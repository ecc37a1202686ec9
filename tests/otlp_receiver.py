"""An OTLP/HTTP trace receiver on 127.0.0.1 for the tracing tests: ``POST /v1/traces``.

It decodes each export with the protocol's own message classes (``opentelemetry-proto``, which
the exporter depends on), so what a test reads is exactly what the proxy's real exporter sent
over a real socket; spans are kept as plain dicts. The heavy receiver with a UI (Phoenix) is
the e2e test's (tests/e2e/test_tracing_phoenix.py).
"""

from __future__ import annotations

import gzip
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue


def _value(v: AnyValue) -> Any:
    kind = v.WhichOneof("value")
    if kind == "array_value":
        return [_value(x) for x in v.array_value.values]
    return getattr(v, kind) if kind else None


def _attrs(kvs: Any) -> dict[str, Any]:
    return {kv.key: _value(kv.value) for kv in kvs}


@dataclass
class Receiver:
    url: str
    spans: list[dict[str, Any]] = field(default_factory=list)
    changed: threading.Condition = field(default_factory=threading.Condition)

    def wait_for(
        self, predicate: Callable[[list[dict[str, Any]]], bool], timeout: float = 20
    ) -> list[dict[str, Any]]:
        """The spans once ``predicate`` holds for them (an export is an event: no polling)."""
        with self.changed:
            ok = self.changed.wait_for(lambda: predicate(self.spans), timeout)
        assert ok, f"spans received: {self.spans}"
        return list(self.spans)


@contextmanager
def otlp_receiver() -> Iterator[Receiver]:
    receiver = Receiver("")

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers.get("content-length", "0")))
            if self.headers.get("content-encoding") == "gzip":
                body = gzip.decompress(body)
            request = ExportTraceServiceRequest.FromString(body)
            spans = []
            for rs in request.resource_spans:
                resource = _attrs(rs.resource.attributes)
                for ss in rs.scope_spans:
                    for s in ss.spans:
                        spans.append(
                            {
                                "resource": resource,
                                "name": s.name,
                                "kind": s.kind,
                                "trace_id": s.trace_id.hex(),
                                "span_id": s.span_id.hex(),
                                "parent_span_id": s.parent_span_id.hex(),
                                "start": s.start_time_unix_nano,
                                "end": s.end_time_unix_nano,
                                "attributes": _attrs(s.attributes),
                                "status": s.status.code,
                                "events": [
                                    {
                                        "name": e.name,
                                        "time": e.time_unix_nano,
                                        "attributes": _attrs(e.attributes),
                                    }
                                    for e in s.events
                                ],
                            }
                        )
            out = ExportTraceServiceResponse().SerializeToString()
            self.send_response(200)
            self.send_header("content-type", "application/x-protobuf")
            self.send_header("content-length", str(len(out)))
            self.end_headers()
            self.wfile.write(out)
            with receiver.changed:
                receiver.spans.extend(spans)
                receiver.changed.notify_all()

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    receiver.url = f"http://127.0.0.1:{server.server_address[1]}"
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield receiver
    finally:
        server.shutdown()
        server.server_close()


@contextmanager
def receiving(monkeypatch: pytest.MonkeyPatch) -> Iterator[Receiver]:
    """A receiver, and the SDK's variables pointing the proxy at it (exports every 50 ms)."""
    with otlp_receiver() as rec:
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", rec.url)
        monkeypatch.setenv("OTEL_BSP_SCHEDULE_DELAY", "50")
        for name in ("OTEL_SERVICE_NAME", "OTEL_RESOURCE_ATTRIBUTES", "OTEL_TRACES_EXPORTER"):
            monkeypatch.delenv(name, raising=False)
        yield rec
