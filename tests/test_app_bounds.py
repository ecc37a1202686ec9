"""Bounds: a client that stops reading is dropped (and the engine's slot freed); a request that
runs past GUARD_REQUEST_DEADLINE is ended properly."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import socket
from collections.abc import Callable
from typing import Any

import httpx
import orjson
import pytest

from proxy.detect import DetectorConfig
from proxy.observability.metrics import Metrics
from proxy.server.app import create_app
from proxy.server.bounds import Bounds, Watch
from proxy.settings import load_settings
from tests.conftest import ProxyServer
from tests.fakes.vllm import FakeVLLM, Script
from tests.net import HANG_GUARD

ProxyFactory = Callable[..., str]
CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
#: Long enough (~20 MB of SSE) to fill every buffer between the engine and a stalled client.
VARIED = " ".join(f"token{i}-{'x' * (i % 40)}" for i in range(60_000))


class _Messages(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


#: A paced answer that lasts a minute at 0.1 s a token: far longer than any deadline here.
WORDS = " ".join(f"w{i}" for i in range(600))


def _timeouts(metrics: Metrics, kind: str) -> float:
    value = metrics.infra_registry.get_sample_value(
        "guard_proxy_client_timeouts_total", {"kind": kind}
    )
    return value or 0.0


# ---------------------------------------------------------------------------- the sweep (pure)


def test_the_sweep_fires_after_the_timeout_never_before() -> None:
    """A watch inside a send (odd seq) that does not move is expired after the write timeout;
    one whose seq keeps moving, or that is between sends, is left alone. Time passes by moving
    each watch's clock readings back, sweep by sweep: no test of the rule waits on the clock."""

    async def main() -> tuple[list[str | None], str | None, str | None, list[str]]:
        kinds: list[str] = []
        bounds = Bounds(write_timeout=0.3, deadline=0, on_expire=kinds.append)
        stalled, moving, idle = Watch(), Watch(), Watch()
        for w in (stalled, moving, idle):
            w.task = asyncio.create_task(asyncio.sleep(HANG_GUARD))
            bounds.add(w)
        stalled.seq = 1
        idle.seq = 2
        seen: list[str | None] = []
        for _ in range(8):  # 8 sweeps, 0.1 s apart: the stalled send lasts 0.7 s
            moving.seq += 2
            bounds._sweep()
            seen.append(stalled.expired)
            for w in (stalled, moving, idle):
                w.seen_at -= 0.1
        bounds.close()
        for w in (stalled, moving, idle):
            assert w.task is not None
            w.task.cancel()
        return seen, moving.expired, idle.expired, kinds

    seen, moving, idle, kinds = asyncio.run(main())
    # Seen first at sweep 0; 0.3 s later (sweep 3) it is expired, never before.
    assert seen == [None, None, None, "write", "write", "write", "write", "write"]
    assert moving is None and idle is None
    assert kinds == ["write"]


def test_the_sweep_runs_by_itself() -> None:
    """The timer ``add`` starts sweeps until a stalled send is expired and its task cancelled:
    the event is awaited, the timeout's length is not measured."""

    async def main() -> str | None:
        bounds = Bounds(write_timeout=0.05, deadline=0)
        stalled = Watch()
        stalled.task = asyncio.create_task(asyncio.sleep(HANG_GUARD))
        stalled.seq = 1
        bounds.add(stalled)
        with contextlib.suppress(asyncio.CancelledError):
            await stalled.task
        bounds.close()
        return stalled.expired

    assert asyncio.run(main()) == "write"


def test_the_deadline_spares_a_request_that_is_finishing() -> None:
    async def main() -> tuple[str | None, str | None]:
        bounds = Bounds(write_timeout=10, deadline=0.2)
        live, finishing = Watch(), Watch()
        finishing.cancellable = False
        for w in (live, finishing):
            w.task = asyncio.create_task(asyncio.sleep(HANG_GUARD))
            bounds.add(w)
        bounds._sweep()
        assert live.expired is None  # younger than the deadline
        for w in (live, finishing):
            w.started -= 0.5  # both older than the deadline now
        bounds._sweep()
        bounds.close()
        for w in (live, finishing):
            assert w.task is not None
            w.task.cancel()
        return live.expired, finishing.expired

    assert asyncio.run(main()) == ("deadline", None)


# ---------------------------------------------------------------------------- a stalled client


@pytest.mark.parametrize(
    ("mode", "path"),
    [
        ("off", "/v1/chat/completions"),
        ("monitor", "/v1/chat/completions"),
        ("enforce", "/inference/v1/generate"),  # pass-through: the same bound
        ("heal", "/v1/messages"),  # served through the chat route, written as Messages
    ],
)
def test_a_client_that_stops_reading_is_dropped_and_the_engine_freed(
    fake_upstream: FakeVLLM, mode: str, path: str
) -> None:
    """A real socket with a tiny receive buffer reads the first bytes, then nothing: the fake
    engine sees its connection closed mid-stream, by the write timeout (counted as such).

    The engine is paced (so it is still generating then, not done into the kernel's buffers)
    and the proxy's listening socket has a fixed 16 KiB send buffer (inherited by the accepted
    socket): without it Linux grows the buffer to megabytes and the test would mostly measure
    how long the paced engine takes to fill it."""
    fake_upstream.script = Script(texts=[VARIED], chunk_delay=0.0002)
    metrics = Metrics()
    timeout = 1.0
    settings = load_settings(
        upstream_url=fake_upstream.url,
        upstream_metrics_interval=0,
        mode=mode,
        client_write_timeout=timeout,
    )
    # VARIED is a counter loop to the detector ("tokenN-x…"): where a verdict would end the
    # stream (heal) the signals are off, since the bound is what this test is about.
    quiet = None
    if mode == "heal":
        quiet = DetectorConfig(
            repetition=False, line_loop=False, ngram=False, diversity=False, script=False,
            language_drift=False, entropy=False, compression=False, end_judgement=False,
        )  # fmt: skip
    server = ProxyServer(create_app(settings, metrics=metrics, detector_config=quiet))
    server.sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 16384)
    server_errors = _Messages()
    logging.getLogger("uvicorn.error").addHandler(server_errors)
    server.start()
    request = {**CHAT, "stream": True, "max_tokens": 100_000}
    if path == "/inference/v1/generate":
        request = {"model": "m", "input": "hi", "stream": True}
    if path == "/v1/messages":
        request = {"model": "m", "max_tokens": 30_000, "messages": CHAT["messages"], "stream": True}
    body = orjson.dumps(request)
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.connect(("127.0.0.1", server.port))
    try:
        sock.sendall(
            b"POST %s HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
            b"content-length: %d\r\n\r\n%s" % (path.encode(), len(body), body)
        )
        assert sock.recv(1024).startswith(b"HTTP/1.1 200")
        # The event, not its timing: the engine sees the proxy close its stream before the
        # stream is done (100,000 paced tokens), and the write timeout is what did it.
        assert fake_upstream.wait_for(
            lambda: bool(fake_upstream.requests) and fake_upstream.last.disconnected is not None
        ), "the engine never saw the proxy close the stream"
        rec = fake_upstream.last
        assert rec.disconnected is not None and not rec.completed
        assert _timeouts(metrics, "write") == 1
        # The proxy's side of the connection is gone (what the kernel still holds ends in
        # EOF or a reset), and the server saw it go (no "response not completed" error).
        sock.settimeout(HANG_GUARD)
        with contextlib.suppress(ConnectionResetError):
            while sock.recv(65536):
                pass
        assert not [m for m in server_errors.messages if "without completing" in m]
    finally:
        sock.close()
        server.stop()
        logging.getLogger("uvicorn.error").removeHandler(server_errors)


def test_a_reading_client_is_never_dropped(
    fake_upstream: FakeVLLM, proxy_server: ProxyFactory
) -> None:
    """Slow tokens (longer in total than the write timeout) reach a client that reads."""
    fake_upstream.script = Script(texts=["a b c d e f g h"], chunk_delay=0.1)
    metrics = Metrics()
    base = proxy_server(client_write_timeout=0.2, metrics=metrics)
    r = httpx.post(base + "/v1/chat/completions", json={**CHAT, "stream": True})
    assert r.content.endswith(b"data: [DONE]\n\n") and b'"finish_reason":"stop"' in r.content
    assert _timeouts(metrics, "write") == 0


# ---------------------------------------------------------------------------- the deadline


def _read(url: str, body: Any) -> tuple[bytes, bool]:
    """A 200's body as far as it went, and whether it was complete (not cut)."""
    parts: list[bytes] = []
    with httpx.stream("POST", url, json=body) as r:
        assert r.status_code == 200
        try:
            for part in r.iter_raw():
                parts.append(part)
        except httpx.RemoteProtocolError:
            return b"".join(parts), False
    return b"".join(parts), True


def _events(body: bytes) -> list[bytes]:
    return [b for b in body.split(b"\n\n") if b]


@pytest.mark.parametrize("mode", ["enforce", "off"])
def test_a_stream_past_the_deadline_ends_with_an_error_event(
    fake_upstream: FakeVLLM, proxy_server: ProxyFactory, mode: str
) -> None:
    """Guarded (the guard writes the end) or relayed as is (``off``): the same error event;
    ``off`` then cuts the body (the engine's own stream was not complete: docs/failures.md)."""
    # 600 paced tokens (a minute): the deadline, not the end of the stream, ends the answer.
    fake_upstream.script = Script(texts=[WORDS], chunk_delay=0.1)
    metrics = Metrics()
    base = proxy_server(request_deadline=1.0, metrics=metrics, mode=mode)
    content, complete = _read(base + "/v1/chat/completions", {**CHAT, "stream": True})
    assert b" w599" not in content
    assert complete is (mode != "off")
    events = _events(content)
    assert events[-1] == b"data: [DONE]"
    error = json.loads(events[-2][len(b"data: ") :])["error"]
    assert error["code"] == "request_deadline"
    assert any(b'"content":" w1"' in e for e in events)  # tokens went out before the end
    assert fake_upstream.wait_for(lambda: fake_upstream.last.disconnected is not None)
    assert not fake_upstream.last.completed
    assert _timeouts(metrics, "deadline") == 1


@pytest.mark.parametrize("mode", ["enforce", "off"])
def test_a_non_streaming_request_past_the_deadline_gets_504(
    fake_upstream: FakeVLLM, proxy_server: ProxyFactory, mode: str
) -> None:
    """enforce reads a paced stream; off asks for a JSON answer, which never comes."""
    fake_upstream.script = (
        Script(texts=[WORDS], chunk_delay=0.1) if mode == "enforce" else Script(hang=True)
    )
    base = proxy_server(request_deadline=0.5, mode=mode)
    r = httpx.post(base + "/v1/chat/completions", json=CHAT)
    assert r.status_code == 504
    assert r.json()["error"]["code"] == "request_deadline"
    assert r.headers["x-request-id"]


def test_a_stream_whose_engine_is_silent_past_the_deadline_gets_504(
    fake_upstream: FakeVLLM, proxy_server: ProxyFactory
) -> None:
    fake_upstream.script = Script(hang=True)
    base = proxy_server(request_deadline=0.5)
    r = httpx.post(base + "/v1/chat/completions", json={**CHAT, "stream": True})
    assert r.status_code == 504 and r.json()["error"]["code"] == "request_deadline"
    assert fake_upstream.wait_for(lambda: fake_upstream.last.disconnected is not None)


def test_a_pass_through_stream_past_the_deadline_is_cut(
    fake_upstream: FakeVLLM, proxy_server: ProxyFactory
) -> None:
    fake_upstream.script = Script(texts=[WORDS], chunk_delay=0.1)
    base = proxy_server(request_deadline=0.5)
    content, complete = _read(base + "/inference/v1/generate", {"model": "m", "input": "x"})
    assert not complete  # never a short body passed off as the whole answer
    assert content.count(b"response.output_text.delta") < 600
    assert fake_upstream.wait_for(lambda: fake_upstream.last.disconnected is not None)
