"""Relayed chunks written straight onto uvicorn's transport (``proxy.server.asgi.DirectBody``)
against the ASGI ``send`` they replace: the same bytes on every route and mode, the fallback
wherever the shortcut does not apply (a middleware wrapping ``send``, uvicorn's h11 protocol),
a client that stops reading, and a guard that fails inside the connection's callback.

All under real uvicorn, against the fake engine on a real socket."""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from proxy.core.guard import StreamGuard
from proxy.server import asgi
from proxy.server.app import create_app
from proxy.settings import load_settings
from tests.conftest import ProxyServer
from tests.fakes.vllm import FakeVLLM, Script
from tests.net import HANG_GUARD

CORPUS = [
    json.loads(line)
    for line in (Path(__file__).parent / "data" / "corpus.jsonl").read_text().splitlines()
]
HEALTHY = [r["text"] for r in CORPUS if r["label"] == "healthy"]
LOOP = "The answer is the answer. " * 300
MESSAGES = [{"role": "user", "content": "Tell me something."}]


class Counted:
    """Counts :meth:`DirectBody.write` calls and the ones that handed back to ``send``."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.writes = 0
        self.handed_back = 0
        real = asgi.DirectBody.write

        def write(body: asgi.DirectBody, data: bytes) -> bool:
            self.writes += 1
            ok = real(body, data)
            self.handed_back += not ok
            return ok

        monkeypatch.setattr(asgi.DirectBody, "write", write)


def wrap_send(app: Any) -> Any:
    """A pass-through middleware that wraps ``send``, as GZip or a tracing middleware would."""

    async def wrapped(scope: Any, receive: Any, send: Any) -> None:
        async def send_(message: Any) -> None:
            await send(message)

        await app(scope, receive, send_)

    return wrapped


@pytest.fixture
def servers(fake_upstream: FakeVLLM) -> Iterator[Any]:
    started: list[ProxyServer] = []

    def start(
        *,
        middleware: bool = False,
        http: str = "httptools",
        sndbuf: int | None = None,
        **overrides: Any,
    ) -> str:
        settings = load_settings(
            upstream_url=fake_upstream.url, upstream_metrics_interval=0, **overrides
        )
        app: Any = create_app(settings)
        if middleware:
            app = wrap_send(app)
        server = ProxyServer(app, http=http, sndbuf=sndbuf).start()
        started.append(server)
        return server.url

    yield start
    for server in started:
        server.stop()


def chat(text_stream: bool = True, **extra: Any) -> dict[str, Any]:
    return {"model": "m", "messages": MESSAGES, "stream": text_stream, "max_tokens": 900, **extra}


@pytest.mark.parametrize("mode", ["enforce", "monitor", "off", "heal"])
@pytest.mark.parametrize("route", ["/v1/chat/completions", "/v1/completions"])
def test_direct_writes_send_the_same_bytes_as_send(
    fake_upstream: FakeVLLM,
    servers: Any,
    monkeypatch: pytest.MonkeyPatch,
    mode: str,
    route: str,
) -> None:
    """Healthy and looping answers, one token per read: the client's bytes are the same
    whether the chunks went through ``send`` (a middleware wraps it) or straight out."""
    counted = Counted(monkeypatch)
    direct = servers(mode=mode)
    wrapped = servers(mode=mode, middleware=True)
    body = (
        chat()
        if route.endswith("chat/completions")
        else {"model": "m", "prompt": "Once", "stream": True, "max_tokens": 900}
    )
    for text in (HEALTHY[0], HEALTHY[1], "Sure. " + LOOP):
        got = {}
        for name, base in (("direct", direct), ("send", wrapped)):
            fake_upstream.script = Script(texts=[text], chunk_delay=0.0005)
            before = counted.writes
            resp = httpx.post(base + route, json=body, timeout=HANG_GUARD)
            assert resp.status_code == 200
            got[name] = resp.content
            wrote = counted.writes - before
            assert (wrote > 0) if name == "direct" else (wrote == 0), (name, wrote)
        assert got["direct"] == got["send"]
        assert got["direct"].endswith(b"data: [DONE]\n\n")


def test_h11_uses_send(
    fake_upstream: FakeVLLM, servers: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Where uvicorn does not write chunks through its httptools cycle (its h11 protocol keeps
    a state machine per chunk), nothing is written around ``send``."""
    counted = Counted(monkeypatch)
    fake_upstream.script = Script(texts=[HEALTHY[2]], chunk_delay=0.0005)
    expected = httpx.post(fake_upstream.url + "/v1/chat/completions", json=chat()).content

    h11 = servers(http="h11")
    assert httpx.post(h11 + "/v1/chat/completions", json=chat()).content == expected
    assert counted.writes == 0


def dechunk(raw: bytes) -> bytes:
    out = bytearray()
    while True:
        size_line, _, raw = raw.partition(b"\r\n")
        size = int(size_line, 16)
        if size == 0:
            return bytes(out)
        out += raw[:size]
        assert raw[size : size + 2] == b"\r\n"
        raw = raw[size + 2 :]


def test_a_client_that_stops_reading_gets_every_byte_in_order(
    fake_upstream: FakeVLLM, servers: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A client with a small receive buffer that reads nothing for a while: the direct writes
    fill the transport, the relay hands back to ``send`` (which waits for the client), and when
    the client reads again it gets the whole answer, in order, exactly once."""
    counted = Counted(monkeypatch)
    words = " ".join(HEALTHY).split()
    # Megabytes of events against a proxy-side kernel send buffer fixed at 64 KiB: the buffers
    # on both sides fill whatever the machine's autotuning would allow
    text = " ".join(words[i % len(words)] for i in range(60_000))
    fake_upstream.script = Script(texts=[text])
    expected = httpx.post(
        fake_upstream.url + "/v1/chat/completions", json=chat(max_tokens=60_000)
    ).content
    assert len(expected) > 3_000_000
    base = servers(mode="monitor", max_tokens_cap=100_000, default_max_tokens=100_000, sndbuf=65536)
    payload = json.dumps(chat(max_tokens=60_000)).encode()
    host, port = base.removeprefix("http://").split(":")
    sock = socket.socket()
    # Small, but not below loopback's segment size (~64 KiB): a receive window that can never
    # open by a full segment leaves the sender on zero-window probes that back off for seconds.
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 65536)
    sock.settimeout(HANG_GUARD)
    sock.connect((host, int(port)))
    with sock:
        sock.sendall(
            b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
            b"connection: close\r\ncontent-length: %d\r\n\r\n%b" % (len(payload), payload)
        )
        # Not reading until the proxy's transport has asked to pause (a write handed back to
        # ``send``): the event, with a hang guard, not a second's sleep.
        deadline = time.monotonic() + HANG_GUARD
        while not counted.handed_back:
            assert time.monotonic() < deadline, "the proxy's transport never asked to pause"
            time.sleep(0.01)
        raw = b""
        while chunk := sock.recv(65536):
            raw += chunk
    head, _, content = raw.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200")
    assert dechunk(content) == expected
    assert counted.handed_back >= 1


def test_a_guard_that_fails_in_the_callback_fails_its_request_only(
    fake_upstream: FakeVLLM, servers: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An exception from the guard inside the connection's callback is raised in the request's
    task: that response is cut (never completed as if healthy), the engine sees the disconnect,
    and the worker goes on serving."""
    real = StreamGuard.feed
    calls = 0

    def feed(guard: StreamGuard, data: bytes) -> bytes:
        nonlocal calls
        calls += 1
        if calls == 5:
            raise RuntimeError("a bug")
        return real(guard, data)

    monkeypatch.setattr(StreamGuard, "feed", feed)
    fake_upstream.script = Script(texts=[HEALTHY[3]], chunk_delay=0.002)
    base = servers()
    with pytest.raises(httpx.RemoteProtocolError):
        httpx.post(base + "/v1/chat/completions", json=chat(), timeout=HANG_GUARD)
    rec = fake_upstream.guarded_requests()[0]
    assert fake_upstream.wait_for(lambda: rec.disconnected is not None)
    assert not rec.completed
    resp = httpx.post(base + "/v1/chat/completions", json=chat(), timeout=HANG_GUARD)
    assert resp.status_code == 200
    assert resp.content.endswith(b"data: [DONE]\n\n")


def test_of_keeps_to_send_for_anything_but_a_started_chunked_httptools_cycle() -> None:
    """``DirectBody.of`` looks at the server's objects it relies on and says no (rather than
    failing the request) when any of them is not there or not in the state it needs."""

    class Flow:
        write_paused = False

    class Transport:
        def __init__(self) -> None:
            self.written: list[bytes] = []

        def write(self, data: bytes) -> None:
            self.written.append(data)

    from uvicorn.protocols.http import httptools_impl

    real = httptools_impl.RequestResponseCycle
    cycle = object.__new__(real)
    cycle.chunked_encoding = True
    cycle.response_started = True
    cycle.response_complete = False
    cycle.disconnected = False
    cycle.scope = {"method": "POST"}
    cycle.flow = Flow()
    cycle.transport = Transport()
    direct = asgi.DirectBody.of(cycle.send)
    assert direct is not None
    assert direct.write(b"data: x\n\n") is True
    assert cycle.transport.written == [b"9\r\ndata: x\n\n\r\n"]
    cycle.flow.write_paused = True
    assert direct.write(b"y") is False  # written, but the caller goes back to send
    cycle.disconnected = True
    assert direct.write(b"z") is False
    assert cycle.transport.written[-1] == b"1\r\ny\r\n"

    for name, value in [
        ("chunked_encoding", False),
        ("response_started", False),
        ("response_complete", True),
        ("disconnected", True),
        ("scope", {"method": "HEAD"}),
    ]:
        other = object.__new__(real)
        other.__dict__.update(cycle.__dict__)
        other.disconnected = False
        setattr(other, name, value)
        assert asgi.DirectBody.of(other.send) is None, name
    missing = object.__new__(real)  # a uvicorn whose cycle has none of these attributes
    assert asgi.DirectBody.of(missing.send) is None
    assert asgi.DirectBody.of(cycle.send_500_response) is None  # not the cycle's send

    async def plain(message: Any) -> None:
        pass

    assert asgi.DirectBody.of(plain) is None
