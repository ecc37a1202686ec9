"""A small static HTTP server for exposition text: a stand-in for vLLM's and DCGM's /metrics.

Real sockets, real HTTP: the code under test (the upstream config watcher, a real Prometheus)
scrapes it like the real exporters. With ``grow=True`` every counter-like sample (``_total``,
``_bucket``, ``_count``, ``_sum``) grows by 1 % per scrape, so ``rate()`` over it is non-zero.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from tests.net import HANG_GUARD

EXPOSITION_DIR = Path(__file__).parent / "data" / "exposition"
_COUNTER_LINE = re.compile(r"^([A-Za-z_:][\w:]*(?:_total|_bucket|_count|_sum))(\{.*\})? (\S+)$")


Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def parse(body: bytes | str) -> Samples:
    """Exposition text → {(sample name, labels): value}, as Prometheus would read it."""
    text = body.decode() if isinstance(body, bytes) else body
    out: Samples = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, frozenset(s.labels.items()))] = s.value
    return out


def families(body: bytes | str) -> set[str]:
    text = body.decode() if isinstance(body, bytes) else body
    return {f.name for f in text_string_to_metric_families(text)}


def value(samples: Samples, name: str, **labels: str) -> float:
    return samples.get((name, frozenset(labels.items())), 0.0)


def fixture(name: str) -> str:
    return (EXPOSITION_DIR / name).read_text()


def grown(text: str, factor: float) -> str:
    out = []
    for line in text.splitlines():
        m = _COUNTER_LINE.match(line)
        if m and not line.startswith("#"):
            line = f"{m.group(1)}{m.group(2) or ''} {float(m.group(3)) * factor!r}"
        out.append(line)
    return "\n".join(out) + "\n"


@dataclass
class ExpositionServer:
    url: str
    routes: dict[str, str | int] = field(default_factory=dict)
    grow: bool = False
    hits: dict[str, int] = field(default_factory=dict)


@contextmanager
def serve_exposition(
    routes: dict[str, str | int], *, grow: bool = False
) -> Iterator[ExpositionServer]:
    """Serve ``routes`` (path → exposition text, or an HTTP status to answer with)."""
    state = ExpositionServer(url="", routes=dict(routes), grow=grow)

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            state.hits[self.path] = n = state.hits.get(self.path, 0) + 1
            body = state.routes.get(self.path, 404)
            if isinstance(body, int):
                self.send_error(body)
                return
            if state.grow:
                body = grown(body, 1.0 + 0.01 * n)
            data = body.encode()
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, format: str, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05})
    thread.start()
    state.url = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        yield state
    finally:
        server.shutdown()
        server.server_close()
        thread.join(HANG_GUARD)
