"""Shared fixtures: a fake vLLM on a real socket and the real proxy under uvicorn.

Both servers run in their own threads with their own event loops, so the proxy is exercised
exactly as in production (uvicorn + uvloop + httptools, real TCP) by sync and async clients
alike.

    def test_x(fake_upstream, proxy_server):
        fake_upstream.script = Script(texts=["hello"])
        base = proxy_server(mode="monitor")          # Settings overrides; upstream = the fake
        httpx.post(base + "/v1/chat/completions", json=...)
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import anthropic
import httpx
import openai
import pytest
import uvicorn
from hypothesis import settings as hypothesis_settings

from proxy.observability.metrics import Metrics
from proxy.server.app import create_app
from proxy.server.engine_context import LOOKUP_USER_AGENT
from proxy.settings import load_settings
from tests.fakes.vllm import FakeVLLM, Script
from tests.net import HANG_GUARD

# Property tests assert what the code does, not how fast one example runs: on a loaded machine a
# pure function's example can take 0.5 s, which hypothesis's default 200 ms deadline reports as a
# failure. Linear-time properties are tested by the tests that measure them.
hypothesis_settings.register_profile("default", deadline=None)
hypothesis_settings.load_profile("default")

# httpx's default timeout (5 s for each phase) applies to every test client that sets none: on a
# busy laptop that is a margin a slow but correct answer can miss. In this test process it is
# the hang guard instead (the proxy under test sets its own timeouts explicitly).
_HTTPX_DEFAULT = httpx._config.DEFAULT_TIMEOUT_CONFIG
_HTTPX_DEFAULT.connect = _HTTPX_DEFAULT.read = _HTTPX_DEFAULT.write = HANG_GUARD
_HTTPX_DEFAULT.pool = HANG_GUARD

__all__ = ["FakeVLLM", "ProxyServer", "Script"]


class ProxyServer:
    """The proxy app under uvicorn on an ephemeral port, in a background thread."""

    def __init__(self, app: Any, http: str = "httptools", sndbuf: int | None = None) -> None:
        self.app = app
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if sndbuf is not None:
            # Accepted sockets inherit it (Linux): a fixed, small kernel send buffer, so a
            # client that stops reading fills it whatever the machine's tcp_wmem autotuning.
            self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, sndbuf)
        self.sock.bind(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        config = uvicorn.Config(
            app,
            loop="uvloop",
            http=http,
            lifespan="on",
            log_level="warning",
            access_log=False,
        )
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self._run, name="proxy", daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def _run(self) -> None:
        self.server.run(sockets=[self.sock])

    def start(self) -> ProxyServer:
        self.thread.start()
        deadline = time.monotonic() + HANG_GUARD
        while not self.server.started:
            if time.monotonic() > deadline or not self.thread.is_alive():
                raise RuntimeError("proxy did not start")
            time.sleep(0.005)
        return self

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(HANG_GUARD)
        self.sock.close()


@pytest.fixture
def fake_upstream() -> Iterator[FakeVLLM]:
    """A fresh fake vLLM (see ``tests/fakes/vllm.py``); set ``.script`` to change its answers."""
    with FakeVLLM() as fake:
        yield fake


@pytest.fixture
def proxy_server(fake_upstream: FakeVLLM) -> Iterator[Callable[..., str]]:
    """Factory: ``proxy_server(**settings_overrides) -> base URL`` of a running proxy.

    ``upstream_url`` defaults to ``fake_upstream``; ``upstream_metrics_interval`` to 0 (no
    background scrape unless a test asks). Pass ``metrics=`` for a Metrics instance and
    ``detector_config=`` for a DetectorConfig. The servers started are stopped at teardown.
    """
    servers: list[ProxyServer] = []

    def start(
        *,
        metrics: Metrics | None = None,
        detector_config: Any = None,
        **overrides: Any,
    ) -> str:
        overrides.setdefault("upstream_url", fake_upstream.url)
        overrides.setdefault("upstream_metrics_interval", 0)
        settings = load_settings(**overrides)
        app = create_app(settings, metrics=metrics, detector_config=detector_config)
        server = ProxyServer(app).start()
        servers.append(server)
        return server.url

    yield start
    for server in servers:
        server.stop()


class CannedEngine:
    """An engine that answers every request with the same raw HTTP/1.1 bytes (a redirect, a
    non-stream answer to a stream request, …): for answers the fake vLLM does not give. Records
    the request heads it saw."""

    def __init__(
        self,
        response: bytes,
        *,
        answers_per_connection: int | None = None,
        routes: dict[bytes, bytes] | None = None,
    ) -> None:
        self.response = response
        #: Other answers by request path (``b"/v1/models"``); every other path gets ``response``.
        self.routes = routes or {}
        self.heads: list[bytes] = []
        #: After this many answers on one connection the next request on it is read and the
        #: connection closed unanswered: an engine that closes an idle keep-alive connection
        #: just as the proxy reuses it. Those requests' heads go to :attr:`dropped`.
        self.answers_per_connection = answers_per_connection
        self.dropped: list[bytes] = []
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.port = self.sock.getsockname()[1]
        self.thread = threading.Thread(target=self._serve, name="canned-engine", daemon=True)
        self.thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            threading.Thread(target=self._answer, args=(conn,), daemon=True).start()

    def _answer(self, conn: socket.socket) -> None:
        """Answers each request on the connection. A canned answer with a length and no
        ``connection: close`` leaves the connection open for the next request, as an HTTP/1.1
        server does: closing it unannounced raced the proxy's reuse of its pooled connection."""
        with conn:
            data = b""
            answered = 0
            while True:
                while b"\r\n\r\n" not in data:
                    part = conn.recv(65536)
                    if not part:
                        return
                    data += part
                head, _, body = data.partition(b"\r\n\r\n")
                length = 0
                for line in head.split(b"\r\n")[1:]:
                    name, _, value = line.partition(b":")
                    if name.strip().lower() == b"content-length":
                        length = int(value)
                while len(body) < length:
                    part = conn.recv(65536)
                    if not part:
                        return
                    body += part
                data = body[length:]
                if answered == self.answers_per_connection:
                    self.dropped.append(head)
                    return
                answered += 1
                if LOOKUP_USER_AGENT.encode() not in head:  # the proxy's own /v1/models look-up
                    self.heads.append(head)
                answer = self.routes.get(head.split(b" ", 2)[1], self.response)
                conn.sendall(answer)
                lower = answer.split(b"\r\n\r\n", 1)[0].lower()
                if b"content-length:" not in lower or b"connection: close" in lower:
                    return

    def close(self) -> None:
        self.sock.close()


@pytest.fixture
def canned_engine() -> Iterator[Callable[..., CannedEngine]]:
    """Factory: ``canned_engine(raw_response) -> CannedEngine`` (closed at teardown)."""
    engines: list[CannedEngine] = []

    def start(
        response: bytes,
        *,
        answers_per_connection: int | None = None,
        routes: dict[bytes, bytes] | None = None,
    ) -> CannedEngine:
        engine = CannedEngine(
            response, answers_per_connection=answers_per_connection, routes=routes
        )
        engines.append(engine)
        return engine

    yield start
    for engine in engines:
        engine.close()


class Clients:
    """The official SDKs pointed at a proxy; every client made is closed after the test."""

    def __init__(self) -> None:
        self.made: list[openai.OpenAI | anthropic.Anthropic] = []

    def openai(self, base: str) -> openai.OpenAI:
        client = openai.OpenAI(base_url=base + "/v1", api_key="k", max_retries=0)
        self.made.append(client)
        return client

    def anthropic(self, base: str) -> anthropic.Anthropic:
        # An explicit timeout: the SDK refuses large non-streamed max_tokens without one.
        client = anthropic.Anthropic(base_url=base, api_key="k", max_retries=0, timeout=HANG_GUARD)
        self.made.append(client)
        return client


@pytest.fixture
def sdk() -> Iterator[Clients]:
    clients = Clients()
    yield clients
    for client in clients.made:
        client.close()


def in_engine_suite(path: Path, tests: Path) -> bool:
    """Whether ``path`` lies under ``tests/e2e``. Only the path inside ``tests/`` counts: a
    checkout under a folder named ``e2e`` holds no engine tests for that."""
    try:
        inside = path.resolve().relative_to(tests.resolve()).parts
    except ValueError:  # a test file given from outside tests/
        return False
    return inside[:1] == ("e2e",)


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Everything under tests/e2e needs a real engine: it is marked ``e2e`` whether or not its
    module says so, so the default run (``-m 'not e2e ...'``) never starts an engine."""
    here = Path(__file__).parent
    for item in items:
        if in_engine_suite(item.path, here) and item.get_closest_marker("e2e") is None:
            item.add_marker(pytest.mark.e2e)
