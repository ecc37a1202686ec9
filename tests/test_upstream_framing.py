"""The guarded routes' client against raw sockets that misbehave on purpose: interim responses,
every body framing, lying lengths, closes at every point, stale pooled connections, limits.

Each test also checks what a keep-alive pool must guarantee: the next request on the client gets
exactly its own answer, never bytes of the previous one.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

import httpx
import orjson
import pytest

from proxy.server import upstream_http
from proxy.server.upstream_http import UpstreamClient, UpstreamFailure
from tests.net import HANG_GUARD
from tests.servers.raw import RawConn, RawServer, ThreadedRawServer, chunked, response

HEADERS = [(b"content-type", b"application/json")]


def body_of(n: int) -> bytes:
    return orjson.dumps({"model": "m", "prompt": f"request {n}"})


def client(url: str, *, read_timeout: float = 5.0, write_timeout: float = 30.0) -> UpstreamClient:
    return UpstreamClient.for_url(
        url, connect_timeout=2, read_timeout=read_timeout, write_timeout=write_timeout
    )


async def fetch(up: UpstreamClient, n: int) -> bytes:
    resp = await up.post("/v1/completions", HEADERS, body_of(n))
    try:
        return await resp.aread()
    finally:
        await resp.aclose()


def echo(first: bytes) -> object:
    """A handler: the first request gets ``first`` (raw bytes), later ones on the same
    connection a correct answer naming their own request body."""

    async def handle(conn: RawConn) -> None:
        sent_first = False
        while (req := await conn.request()) is not None:
            if not sent_first and conn.index == 0:
                sent_first = True
                await conn.write(first)
            else:
                await conn.write(response(b"answer to " + req))

    return handle


# -- interim responses ------------------------------------------------------------------------


@pytest.mark.parametrize(
    "interim",
    [
        b"HTTP/1.1 100 Continue\r\n\r\n",
        b"HTTP/1.1 103 Early Hints\r\nlink: </style.css>; rel=preload\r\n\r\n",
        b"HTTP/1.1 102 Processing\r\n\r\n",
        b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 103 Early Hints\r\nlink: <a>\r\n\r\n",
    ],
    ids=["100", "103", "102", "100+103"],
)
@pytest.mark.parametrize("separate", [False, True], ids=["one-write", "own-packet"])
async def test_interim_responses_are_skipped_and_never_taken_as_the_answer(
    interim: bytes, separate: bool
) -> None:
    """The interim response is not the answer: the client waits for the final one, gets its
    headers (not the interim ones) and body, and the next request on the same connection gets
    its own answer — the cross-user leak came from taking ``100 Continue`` as the response."""

    async def handle(conn: RawConn) -> None:
        while (req := await conn.request()) is not None:
            if separate:
                await conn.write(interim, pause=0.02)
                await conn.write(response(b"answer to " + req, headers=b"x-final: 1\r\n"))
            else:
                await conn.write(interim + response(b"answer to " + req, headers=b"x-final: 1\r\n"))

    async with RawServer(handle) as server:
        up = client(server.url)
        for n in range(5):
            resp = await up.post("/v1/completions", HEADERS, body_of(n))
            assert resp.status_code == 200
            assert (b"x-final", b"1") in resp.headers
            assert all(name != b"link" for name, _ in resp.headers)
            assert await resp.aread() == b"answer to " + body_of(n)
            await resp.aclose()
        assert len(server.connections) == 1, "a clean exchange keeps the connection"
        await up.aclose()


async def test_101_switching_protocols_is_a_protocol_error() -> None:
    async with RawServer(echo(b"HTTP/1.1 101 Switching Protocols\r\nupgrade: x\r\n\r\n")) as server:
        up = client(server.url)
        with pytest.raises(UpstreamFailure) as err:
            await fetch(up, 0)
        assert err.value.kind == "protocol" and err.value.error.status == 502
        assert await fetch(up, 1) == b"answer to " + body_of(1)
        await up.aclose()


# -- closes ------------------------------------------------------------------------------------


@pytest.mark.parametrize("read_request", [True, False], ids=["after-request", "at-once"])
async def test_close_before_the_status_line_fails_at_once(read_request: bool) -> None:
    """An engine that closes without answering is a 502 for the close (``disconnect``), not a
    wait for the read timeout (the hang guard here: a wait would end as ``timeout``)."""

    async def handle(conn: RawConn) -> None:
        if read_request:
            await conn.request()
        conn.close()

    async with RawServer(handle) as server:
        up = client(server.url, read_timeout=HANG_GUARD)
        with pytest.raises(UpstreamFailure) as err:
            await fetch(up, 0)
        assert err.value.kind == "disconnect" and err.value.error.status == 502
        await up.aclose()


async def test_close_mid_head_is_a_failure() -> None:
    async def handle(conn: RawConn) -> None:
        await conn.request()
        await conn.write(b"HTTP/1.1 200 OK\r\ncontent-le")
        conn.close()

    async with RawServer(handle) as server:
        with pytest.raises(UpstreamFailure):
            await fetch(client(server.url), 0)


# -- framings ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("first", "body", "reused"),
    [
        (response(b"hello"), b"hello", True),
        (chunked(b"hello world", [3]), b"hello world", True),
        (
            chunked(b"hello world", [2, 5], ext=b";name=value;x", trailers=b"x-t: 1\r\nx-u: 2\r\n"),
            b"hello world",
            True,
        ),
        (b"HTTP/1.1 200 OK\r\nconnection: close\r\ncontent-length: 2\r\n\r\nok", b"ok", False),
        (b"HTTP/1.0 200 OK\r\ncontent-length: 2\r\n\r\nok", b"ok", False),
    ],
    ids=["content-length", "chunked", "chunked-ext-trailers", "connection-close", "http-1.0"],
)
async def test_framings_deliver_the_exact_body(first: bytes, body: bytes, reused: bool) -> None:
    """Exact body for every framing; the connection is kept only when the server allows it."""
    async with RawServer(echo(first)) as server:
        up = client(server.url)
        assert await fetch(up, 0) == body
        assert await fetch(up, 1) == b"answer to " + body_of(1)
        assert len(server.connections) == (1 if reused else 2)
        await up.aclose()


async def test_close_delimited_body_ends_at_close() -> None:
    async def handle(conn: RawConn) -> None:
        await conn.request()
        await conn.write(b"HTTP/1.1 200 OK\r\n\r\ndata: a\n\n", pause=0.01)
        await conn.write(b"data: b\n\n")
        conn.close()

    async with RawServer(handle) as server:
        assert await fetch(client(server.url), 0) == b"data: a\n\ndata: b\n\n"


@pytest.mark.parametrize(
    "payload",
    [
        b"HTTP/1.1 200 OK\r\ncontent-length: 50\r\n\r\nshort",
        b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n3\r\nabc\r\n",
        b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n5\r\nab",
        b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\nx-t: 1\r\n",
    ],
    ids=["short-content-length", "no-last-chunk", "short-chunk", "unterminated-trailers"],
)
async def test_truncated_bodies_are_failures_not_short_successes(payload: bytes) -> None:
    async def handle(conn: RawConn) -> None:
        await conn.request()
        await conn.write(payload)
        conn.close()

    async with RawServer(handle) as server:
        up = client(server.url)
        resp = await up.post("/v1/completions", HEADERS, body_of(0))
        with pytest.raises(UpstreamFailure) as err:
            await resp.aread()
        assert err.value.kind == "disconnect"
        await resp.aclose()
        assert up.idle_connections == 0
        await up.aclose()


LEAK = response(b"LEAKED ANSWER")


@pytest.mark.parametrize("later", [False, True], ids=["same-write", "later-write"])
async def test_bytes_past_content_length_never_reach_the_next_response(later: bool) -> None:
    """A server that sends more than it declared — even a whole well-formed response — loses
    the connection: the extra bytes are not read as the next request's answer."""
    leaked = asyncio.Event()

    async def handle(conn: RawConn) -> None:
        seen = 0
        while (req := await conn.request()) is not None:
            seen += 1
            if conn.index == 0 and seen == 1:
                if later:
                    await conn.write(response(b"first"), pause=0.05)
                    await conn.write(LEAK)
                    leaked.set()
                else:
                    await conn.write(response(b"first") + LEAK)
            else:
                await conn.write(response(b"answer to " + req))

    async with RawServer(handle) as server:
        up = client(server.url)
        assert await fetch(up, 0) == b"first"
        if later:
            await leaked.wait()  # the extra bytes arrive while the connection is idle
            await asyncio.sleep(0)  # and the loop has seen them
        assert await fetch(up, 1) == b"answer to " + body_of(1)
        assert len(server.connections) == 2
        await up.aclose()


async def test_garbage_instead_of_a_response_is_a_protocol_error() -> None:
    async with RawServer(echo(b"NOT HTTP AT ALL\r\n\r\n")) as server:
        up = client(server.url)
        with pytest.raises(UpstreamFailure) as err:
            await fetch(up, 0)
        assert err.value.kind == "protocol"
        assert await fetch(up, 1) == b"answer to " + body_of(1)
        await up.aclose()


# -- the pool ----------------------------------------------------------------------------------


async def test_connection_closed_while_idle_is_not_used_and_nothing_is_sent_twice() -> None:
    async def handle(conn: RawConn) -> None:
        req = await conn.request()
        assert req is not None
        await conn.write(response(b"answer to " + req))
        conn.close()  # keep-alive promised, then closed while idle

    async with RawServer(handle) as server:
        up = client(server.url)
        for n in range(3):
            assert await fetch(up, n) == b"answer to " + body_of(n)
            await asyncio.sleep(0.02)
        assert [body for _, body in server.requests] == [body_of(n) for n in range(3)]
        await up.aclose()


async def test_stale_connection_found_at_send_is_skipped_even_before_the_loop_sees_eof() -> None:
    """The server's FIN is in the kernel but the event loop has not run: the readability check
    before reuse catches it, so the request goes out once, on a fresh connection."""
    closed = asyncio.Event()

    async def handle(conn: RawConn) -> None:
        req = await conn.request()
        if req is None:
            return
        await conn.write(response(b"answer to " + req))
        if conn.index == 0:
            conn.close()
            closed.set()
        while (req := await conn.request()) is not None:
            await conn.write(response(b"answer to " + req))

    async with RawServer(handle) as server:
        up = client(server.url)
        assert await fetch(up, 0) == b"answer to " + body_of(0)
        await closed.wait()
        time.sleep(0.05)  # noqa: ASYNC251 -- blocking on purpose: the FIN arrives, the loop does not run
        assert await fetch(up, 1) == b"answer to " + body_of(1)
        assert [body for _, body in server.requests] == [body_of(0), body_of(1)]
        await up.aclose()


async def test_request_the_engine_may_have_started_is_never_retried() -> None:
    """Reused connection, request read by the server, connection closed without an answer:
    a 502 for this request, and the engine saw it exactly once."""

    async def handle(conn: RawConn) -> None:
        req = await conn.request()
        if req is None:
            return
        await conn.write(response(b"answer to " + req))
        await conn.request()
        conn.close()

    async with RawServer(handle) as server:
        up = client(server.url)
        assert await fetch(up, 0) == b"answer to " + body_of(0)
        with pytest.raises(UpstreamFailure) as err:
            await fetch(up, 1)
        assert err.value.kind == "disconnect"
        assert [body for _, body in server.requests] == [body_of(0), body_of(1)]
        await up.aclose()


async def test_idle_connections_expire_before_the_engines_keep_alive_timeout(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(upstream_http, "KEEPALIVE_EXPIRY", 0.05)
    async with RawServer(echo(response(b"first"))) as server:
        up = client(server.url)
        assert await fetch(up, 0) == b"first"
        await asyncio.sleep(0.1)
        assert await fetch(up, 1) == b"answer to " + body_of(1)
        assert len(server.connections) == 2
        await up.aclose()


async def test_response_before_the_request_was_written_does_not_keep_the_connection() -> None:
    """A server that answers (413) without reading a large body: the rest of the body may
    still be in flight, so the connection is closed, not pooled."""

    async def handle(conn: RawConn) -> None:
        await conn.reader.readuntil(b"\r\n\r\n")
        await conn.write(response(b"too large", status=b"413 Payload Too Large"))

    async with RawServer(handle) as server:
        up = client(server.url)
        resp = await up.post("/v1/completions", HEADERS, b"x" * (32 << 20))
        assert resp.status_code == 413
        assert await resp.aread() == b"too large"
        await resp.aclose()
        assert up.idle_connections == 0
        await up.aclose()


async def test_write_timeout_when_the_engine_reads_nothing() -> None:
    """The engine reads nothing and never closes: the write timeout ends the wait."""
    done = asyncio.Event()

    async def handle(conn: RawConn) -> None:
        await done.wait()

    async with RawServer(handle) as server:
        up = client(server.url, write_timeout=0.3)
        with pytest.raises(UpstreamFailure) as err:
            await up.post("/v1/completions", HEADERS, b"x" * (64 << 20))
        assert err.value.kind == "timeout" and err.value.error.status == 504
        done.set()
        await up.aclose()


async def test_connection_limit_queues_then_times_out() -> None:
    """``max_connections`` requests at most in flight; the next waits for a slot and, if none
    frees within the connect timeout, fails with 504 like httpx's pool timeout."""
    release = asyncio.Event()
    arrived = asyncio.Event()

    async def handle(conn: RawConn) -> None:
        while (req := await conn.request()) is not None:
            arrived.set()
            await release.wait()
            await conn.write(response(b"answer to " + req))

    async with RawServer(handle) as server:
        up = UpstreamClient.for_url(server.url, connect_timeout=0.2, max_connections=1)
        first = asyncio.create_task(fetch(up, 0))
        await arrived.wait()  # the first request holds the only connection
        with pytest.raises(UpstreamFailure) as err:
            await fetch(up, 1)
        assert err.value.kind == "timeout"
        release.set()
        assert await first == b"answer to " + body_of(0)
        assert await fetch(up, 2) == b"answer to " + body_of(2)
        assert len(server.connections) == 1
        await up.aclose()


async def test_aclose_mid_body_closes_the_connection_and_frees_its_slot() -> None:
    async def handle(conn: RawConn) -> None:
        while (req := await conn.request()) is not None:
            if conn.index == 0:
                await conn.write(b"HTTP/1.1 200 OK\r\ncontent-length: 100\r\n\r\npartial")
            else:
                await conn.write(response(b"answer to " + req))

    async with RawServer(handle) as server:
        up = UpstreamClient.for_url(server.url, max_connections=1)
        resp = await up.post("/v1/completions", HEADERS, body_of(0))
        assert await resp.read() == b"partial"
        await resp.aclose()
        assert await fetch(up, 1) == b"answer to " + body_of(1)
        await up.aclose()
        async with asyncio.timeout(HANG_GUARD):
            await server.all_closed()


# -- through the proxy -------------------------------------------------------------------------


@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
def test_engine_closing_without_an_answer_is_a_prompt_502_through_the_proxy(
    proxy_server: Callable[..., str], stream: bool
) -> None:
    async def handle(conn: RawConn) -> None:
        await conn.request()
        conn.close()

    with ThreadedRawServer(handle) as engine:
        # A wait for the read timeout would end in a 504 (upstream_timeout), not this 502.
        base = proxy_server(upstream_url=engine.url, read_timeout=HANG_GUARD)
        r = httpx.post(
            base + "/v1/chat/completions",
            json={"model": "m", "messages": [{"role": "user", "content": "hi"}], "stream": stream},
            timeout=HANG_GUARD,
        )
        assert r.status_code == 502
        assert r.json()["error"]["code"] == "upstream_disconnected"


@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
def test_an_sse_event_over_the_cap_ends_the_answer_with_an_error_through_the_proxy(
    proxy_server: Callable[..., str], stream: bool
) -> None:
    """An engine that never ends its event: the proxy stops at the cap (4 MiB by default) with
    an error (SSE error event + ``[DONE]``, or a 502), instead of buffering without bound."""
    first = (
        b'data: {"id":"c","object":"chat.completion.chunk","created":1,"model":"m","choices":'
        b'[{"index":0,"delta":{"role":"assistant","content":"Hi"},"finish_reason":null}]}\n\n'
    )

    async def handle(conn: RawConn) -> None:
        await conn.request()
        await conn.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n\r\n" + first)
        await conn.write(b"data: " + b"x" * (5 << 20))
        await asyncio.sleep(5)

    with ThreadedRawServer(handle) as engine:
        base = proxy_server(upstream_url=engine.url)
        r = httpx.post(
            base + "/v1/chat/completions",
            json={"model": "m", "messages": [{"role": "user", "content": "hi"}], "stream": stream},
            timeout=HANG_GUARD,
        )
        if stream:
            assert r.status_code == 200
            assert r.content.startswith(first)
            assert b"upstream_event_too_large" in r.content
            assert r.content.endswith(b"data: [DONE]\n\n")
            assert len(r.content) < 1 << 20
        else:
            assert r.status_code == 502
            assert r.json()["error"]["code"] == "upstream_event_too_large"


def test_guard_max_event_bytes_sets_the_cap(proxy_server: Callable[..., str]) -> None:
    """GUARD_MAX_EVENT_BYTES reaches the relay's parser: an 8 KiB event is too large at 4 KiB."""

    async def handle(conn: RawConn) -> None:
        await conn.request()
        await conn.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n\r\n")
        await conn.write(b"data: " + b"x" * 8192 + b"\n\n")
        await asyncio.sleep(5)

    with ThreadedRawServer(handle) as engine:
        base = proxy_server(upstream_url=engine.url, max_event_bytes=4096)
        r = httpx.post(
            base + "/v1/chat/completions",
            json={"model": "m", "messages": [{"role": "user", "content": "hi"}]},
            timeout=HANG_GUARD,
        )
        assert r.status_code == 502
        assert r.json()["error"]["code"] == "upstream_event_too_large"
