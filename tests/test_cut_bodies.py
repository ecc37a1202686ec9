"""What the client sees when the engine cuts its answer after the head went out (the engine
drops the connection mid-body, or GUARD_REQUEST_DEADLINE passes): never a complete body. The
connection is closed without the terminating chunk, so every HTTP client reports an incomplete
body, and an event stream first gets its surface's error event (docs/failures.md).

Also the last write's bound: a client that stops reading when the answer's last chunk fills
its buffer is dropped after GUARD_CLIENT_WRITE_TIMEOUT like any other, and the engine's
connection with it. Real sockets: a raw engine writes every byte, clients are raw sockets and
httpx."""

from __future__ import annotations

import asyncio
import json
import socket
import threading
from collections.abc import Callable

import httpx
import pytest

from tests.net import HANG_GUARD
from tests.servers.raw import RawConn, ThreadedRawServer, response

ProxyFactory = Callable[..., str]

CHUNKED = b"transfer-encoding: chunked\r\n\r\n"
SSE_HEAD = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n" + CHUNKED
JSON_HEAD = b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n" + CHUNKED
CHAT_EVENT = (
    b'data: {"id":"c","object":"chat.completion.chunk","created":1,"model":"m","choices":'
    b'[{"index":0,"delta":{"content":"Hello"},"logprobs":null,"finish_reason":null}]}\n\n'
)
MESSAGES_EVENT = (
    b'event: message_start\ndata: {"type":"message_start","message":{"id":"m","type":"message",'
    b'"role":"assistant","model":"m","content":[],"stop_reason":null,"stop_sequence":null,'
    b'"usage":{"input_tokens":1,"output_tokens":0}}}\n\n'
)
RESPONSES_EVENT = (
    b'event: response.created\ndata: {"type":"response.created","sequence_number":0,'
    b'"response":{"id":"r","object":"response","status":"in_progress","output":[]}}\n\n'
)


def chunk(data: bytes) -> bytes:
    return b"%x\r\n%b\r\n" % (len(data), data)


def engine(
    head: bytes, body: bytes, *, hold: bool, held: threading.Event | None = None
) -> ThreadedRawServer:
    """Answers every request with ``head`` and one chunk of ``body``, then drops the connection
    (or, ``hold``, keeps it open without another byte for the hang guard, then sets ``held``:
    a proxy that waited for the engine instead of its deadline meets that)."""

    async def handle(conn: RawConn) -> None:
        if await conn.request() is None:
            return
        await conn.write(head + chunk(body))
        if hold:
            await asyncio.sleep(HANG_GUARD)
            if held is not None:
                held.set()
        conn.writer.transport.abort()

    return ThreadedRawServer(handle)


def raw_exchange(base: str, path: str, body: bytes) -> bytes:
    """Everything the proxy writes until it closes the connection."""
    host, port = base.removeprefix("http://").split(":")
    head = (
        f"POST {path} HTTP/1.1\r\nhost: {host}\r\ncontent-type: application/json\r\n"
        f"content-length: {len(body)}\r\n\r\n"
    ).encode()
    out = b""
    with socket.create_connection((host, int(port)), timeout=HANG_GUARD) as sock:
        sock.sendall(head + body)
        try:
            while part := sock.recv(65536):
                out += part
        except ConnectionResetError:
            pass
    return out


def assert_cut(base: str, path: str, body: bytes) -> bytes:
    """The proxy's answer ends without the terminating chunk, and httpx says so."""
    raw = raw_exchange(base, path, body)
    assert raw.startswith(b"HTTP/1.1 200 "), raw[:200]
    assert b"transfer-encoding: chunked" in raw.lower()
    assert not raw.endswith(b"0\r\n\r\n"), raw[-200:]
    with (
        httpx.Client(timeout=HANG_GUARD) as client,
        client.stream("POST", base + path, content=body) as r,
    ):
        assert r.status_code == 200
        with pytest.raises(httpx.RemoteProtocolError):
            r.read()
    return raw


CHAT = json.dumps({"model": "m", "messages": [{"role": "user", "content": "hi"}], "stream": True})
MESSAGES = json.dumps(
    {"model": "m", "max_tokens": 8, "messages": [{"role": "user", "content": "hi"}], "stream": True}
)
RESPONSES = json.dumps({"model": "m", "input": "hi", "stream": True})


def test_pass_through_cut_mid_body_is_not_delivered_as_complete(
    proxy_server: ProxyFactory,
) -> None:
    with engine(JSON_HEAD, b'{"tokens":[1,2,3', hold=False) as up:
        base = proxy_server(upstream_url=up.url)
        raw = assert_cut(base, "/v1/tokenize", b"{}")
        assert b'{"tokens":[1,2,3' in raw


@pytest.mark.parametrize(
    ("path", "body", "event", "error"),
    [
        ("/v1/chat/completions", CHAT, CHAT_EVENT, b'data: {"error":'),
        ("/v1/messages", MESSAGES, MESSAGES_EVENT, b'event: error\ndata: {"type":"error"'),
        ("/v1/responses", RESPONSES, RESPONSES_EVENT, b'event: error\ndata: {"type":"error"'),
    ],
    ids=["chat", "messages", "responses"],
)
def test_off_mode_stream_cut_before_its_end_gets_the_error_event_and_a_cut_body(
    proxy_server: ProxyFactory, path: str, body: str, event: bytes, error: bytes
) -> None:
    with engine(SSE_HEAD, event, hold=False) as up:
        base = proxy_server(upstream_url=up.url, mode="off")
        raw = assert_cut(base, path, body.encode())
        assert event in raw
        assert error in raw and b"The upstream closed the connection" in raw


def test_pass_through_past_the_deadline_is_cut_not_completed(proxy_server: ProxyFactory) -> None:
    held = threading.Event()
    with engine(JSON_HEAD, b'{"tokens":[1,2,3', hold=True, held=held) as up:
        base = proxy_server(upstream_url=up.url, request_deadline=1)
        raw = raw_exchange(base, "/v1/tokenize", b"{}")
        assert not held.is_set()  # the deadline ended it, not the engine
        assert raw.startswith(b"HTTP/1.1 200 ") and b'{"tokens":[1,2,3' in raw
        assert not raw.endswith(b"0\r\n\r\n"), raw[-200:]


def test_off_mode_stream_past_the_deadline_gets_the_error_event_and_a_cut_body(
    proxy_server: ProxyFactory,
) -> None:
    held = threading.Event()
    with engine(SSE_HEAD, CHAT_EVENT, hold=True, held=held) as up:
        base = proxy_server(upstream_url=up.url, mode="off", request_deadline=1)
        raw = raw_exchange(base, "/v1/chat/completions", CHAT.encode())
        assert not held.is_set()  # the deadline ended it, not the engine
        assert CHAT_EVENT in raw and b"request_deadline" in raw
        assert not raw.endswith(b"0\r\n\r\n"), raw[-200:]


def test_a_client_that_stops_reading_at_the_last_chunk_is_dropped_and_frees_the_engine(
    proxy_server: ProxyFactory,
) -> None:
    """The engine sends a large event and ``[DONE]`` in one write, then waits (no end of body
    yet): the proxy's last write to a client that reads nothing blocks. The write timeout must
    end it and close the engine's connection."""
    # Past what the kernel's socket buffers take (tcp_wmem's maximum is 4 MiB), in a field the
    # guard does not read: the guard writes the whole event and [DONE] at once.
    padding = b"x" * (6 << 20)
    event = (
        b'data: {"id":"c","object":"chat.completion.chunk","created":1,"model":"m","pad":"'
        + padding
        + b'","choices":[{"index":0,"delta":{"content":"Hi."},"logprobs":null,'
        b'"finish_reason":"stop"}]}\n\ndata: [DONE]\n\n'
    )
    released = threading.Event()

    async def handle(conn: RawConn) -> None:
        request = await conn.request()
        if request is None:
            return
        if not request:
            # The proxy's look-up of the engine's context (GET /v1/models, no body): a 404, so
            # this connection's close can never be taken for the stream's below.
            await conn.write(response(b"{}", status=b"404 Not Found"))
            return
        await conn.write(SSE_HEAD + chunk(event))
        # No terminating chunk: the proxy reads on (or drops the connection) after [DONE].
        with_eof = await conn.reader.read()
        assert with_eof == b""
        released.set()

    with ThreadedRawServer(handle) as up:
        base = proxy_server(
            upstream_url=up.url,
            mode="monitor",
            client_write_timeout=1,
            max_event_bytes=16 << 20,
        )
        host, port = base.removeprefix("http://").split(":")
        sock = socket.socket()
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        sock.connect((host, int(port)))
        try:
            body = CHAT.encode()
            sock.sendall(
                b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: "
                b"application/json\r\ncontent-length: %d\r\n\r\n%b" % (len(body), body)
            )
            # Reads nothing. The write timeout (1 s, swept every 0.25 s) must let the engine go.
            assert released.wait(HANG_GUARD), (
                "the engine's connection was held by a stalled last write"
            )
        finally:
            sock.close()
