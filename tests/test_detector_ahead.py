"""The first block's detector is built while the engine works on the first token, not when the
first event arrives, so building it is not on the path of the first token to the client.

An engine on a raw socket holds its answer until a detector exists (a hang guard, never a
margin, bounds the wait) and records whether one did before it answered; the proxy runs under
real uvicorn.
"""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

import proxy.server.detectors
from proxy.detect import Detector
from proxy.server.app import create_app
from proxy.settings import load_settings
from tests.conftest import CannedEngine, ProxyServer
from tests.net import HANG_GUARD

CHUNK = (
    b'data: {"id":"chatcmpl-1","object":"chat.completion.chunk","created":1,"model":"m",'
    b'"choices":[{"index":0,"delta":%s,"finish_reason":%s}]}\n\n'
)
STREAM = b"".join(
    [
        b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\nconnection: close\r\n\r\n",
        CHUNK % (b'{"role":"assistant","content":""}', b"null"),
        CHUNK % (b'{"content":"Hello there, a healthy reply."}', b"null"),
        CHUNK % (b"{}", b'"stop"'),
        b"data: [DONE]\n\n",
    ]
)
NOT_FOUND = b"HTTP/1.1 404 Not Found\r\ncontent-length: 0\r\nconnection: close\r\n\r\n"


class GatedEngine(CannedEngine):
    """Answers a chat request only once ``built`` is set (or the hang guard passed), and
    records whether it was set when it answered; any other request gets a 404."""

    def __init__(self, built: threading.Event) -> None:
        self.built = built  # before the accepting thread starts
        self.built_before_answer: bool | None = None
        super().__init__(STREAM)

    def _answer(self, conn: socket.socket) -> None:
        with conn:
            data = b""
            while b"\r\n\r\n" not in data:
                part = conn.recv(65536)
                if not part:
                    return
                data += part
            if not data.startswith(b"POST /v1/chat/completions "):
                conn.sendall(NOT_FOUND)
                return
            self.built.wait(HANG_GUARD)
            self.built_before_answer = self.built.is_set()
            conn.sendall(self.response)


@pytest.fixture
def built(monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[threading.Event, list[int]]]:
    """Set when the exchange builds a detector; the list counts the detectors built."""
    event = threading.Event()
    count = [0]

    class Counted(Detector):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            count[0] += 1
            event.set()

    monkeypatch.setattr(proxy.server.detectors, "Detector", Counted)
    yield event, count


def test_the_first_detector_is_built_before_the_engine_answers(
    built: tuple[threading.Event, list[int]],
) -> None:
    event, count = built
    engine = GatedEngine(event)
    settings = load_settings(upstream_url=engine.url, upstream_metrics_interval=0)
    server = ProxyServer(create_app(settings)).start()
    try:
        body = {"model": "m", "messages": [{"role": "user", "content": "Hi."}], "stream": True}
        with (
            httpx.Client(base_url=server.url) as client,
            client.stream("POST", "/v1/chat/completions", json=body) as resp,
        ):
            stream = b"".join(resp.iter_raw())
    finally:
        server.stop()
        engine.close()
    assert resp.status_code == 200
    assert b"Hello there, a healthy reply." in stream
    assert stream.rstrip().endswith(b"data: [DONE]")
    # Built while the engine held its answer, and the block used that one: no second build.
    assert engine.built_before_answer is True
    assert count[0] == 1
