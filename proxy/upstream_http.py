"""A minimal HTTP/1.1 client for the guarded POSTs: asyncio protocol + httptools, keep-alive pool.

Why not httpx here: as a *streaming* client reading small SSE chunks, httpx costs ~70 µs of CPU
per chunk (its per-chunk path runs through httpcore's state machine, h11 and several async
generator layers); this client costs a few µs — the body bytes go from ``data_received``
through httptools' C parser into a buffer, and the relay wakes once per socket read. httpx is
still used for everything that is not a guarded route (pass-through, readiness), where its
generality matters more than per-chunk cost.

Scope, on purpose: one request per connection at a time, ``Content-Length`` request bodies,
responses with ``Content-Length``, chunked or close-delimited bodies. Reading pauses when the
relay falls behind (back-pressure to the engine). :meth:`Response.aclose` before the end of
the body aborts the connection: that is what makes vLLM abort the generation.
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl
from collections import deque
from typing import cast
from urllib.parse import urlsplit

import httptools

from proxy.errors import GuardError, UpstreamError, UpstreamTimeout
from proxy.upstream import base_url as upstream_base_url

#: Unread body bytes at which the connection stops reading from the engine.
_HIGH_WATER = 1 << 20


class UpstreamFailure(Exception):
    """The upstream could not be reached or broke the exchange; ``error`` is what the client
    gets, ``kind`` the metrics label (connect | timeout | disconnect | protocol)."""

    def __init__(self, error: GuardError, kind: str) -> None:
        super().__init__(error.message)
        self.error = error
        self.kind = kind


def _unreachable() -> UpstreamFailure:
    return UpstreamFailure(
        UpstreamError("The upstream is unreachable.", code="upstream_unreachable"), "connect"
    )


def _timeout() -> UpstreamFailure:
    return UpstreamFailure(
        UpstreamTimeout("The upstream did not answer in time.", code="upstream_timeout"),
        "timeout",
    )


def _disconnected() -> UpstreamFailure:
    return UpstreamFailure(
        UpstreamError(
            "The upstream closed the connection unexpectedly.", code="upstream_disconnected"
        ),
        "disconnect",
    )


class _Connection(asyncio.Protocol):
    """One TCP connection; parser callbacks fill the current response's state."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.transport: asyncio.Transport | None = None
        self.parser = httptools.HttpResponseParser(self)
        self.closed = False
        self.used = False
        self.status = 0
        self.headers: list[tuple[bytes, bytes]] = []
        self.body: deque[bytes] = deque()
        self.buffered = 0
        self.headers_done = False
        self.complete = False
        self.keep_alive = False
        self.failure: UpstreamFailure | None = None
        self.waiter: asyncio.Future[None] | None = None
        self.paused = False
        #: Read-timeout bookkeeping: one timer per connection, re-armed lazily when it fires
        #: early (creating and cancelling a timer per read costs more than the read).
        self.deadline = 0.0
        self.timer: asyncio.TimerHandle | None = None

    # -- protocol
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports do not subclass asyncio.Transport; they implement it.
        self.transport = cast(asyncio.Transport, transport)

    def data_received(self, data: bytes) -> None:
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError:
            self._fail(
                UpstreamFailure(
                    UpstreamError("The upstream sent an invalid HTTP response."), "protocol"
                )
            )
            self.abort()

    def eof_received(self) -> bool | None:
        return None  # close the transport; connection_lost follows

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        if not self.complete:
            # A close-delimited body ends here; anything else is a broken exchange.
            if self.headers_done and not self.keep_alive and exc is None and self._close_ends():
                self.complete = True
            else:
                self._fail(_disconnected())
        self._wake()

    def _close_ends(self) -> bool:
        for name, value in self.headers:
            lname = name.lower()
            if lname == b"content-length" or (
                lname == b"transfer-encoding" and b"chunked" in value.lower()
            ):
                return False
        return True

    # -- httptools callbacks
    def on_header(self, name: bytes, value: bytes) -> None:
        self.headers.append((name, value))

    def on_headers_complete(self) -> None:
        self.status = self.parser.get_status_code()
        self.keep_alive = self.parser.should_keep_alive()
        self.headers_done = True
        self._wake()

    def on_body(self, body: bytes) -> None:
        self.body.append(body)
        self.buffered += len(body)
        if self.buffered > _HIGH_WATER and not self.paused and self.transport is not None:
            self.paused = True
            self.transport.pause_reading()
        waiter = self.waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def on_message_complete(self) -> None:
        self.complete = True
        self._wake()

    # -- helpers
    def _fail(self, failure: UpstreamFailure) -> None:
        if self.failure is None:
            self.failure = failure
        self._wake()

    def _wake(self) -> None:
        waiter = self.waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def abort(self) -> None:
        self.stop_timer()
        self.closed = True
        if self.transport is not None:
            self.transport.abort()

    def reset(self) -> None:
        self.parser = httptools.HttpResponseParser(self)
        self.status = 0
        self.headers = []
        self.body.clear()
        self.buffered = 0
        self.headers_done = False
        self.complete = False
        self.keep_alive = False
        self.failure = None

    async def wait(self, limit: float) -> None:
        """Until the parser makes progress, the connection fails, or ``limit`` seconds pass."""
        waiter = self.waiter = self.loop.create_future()
        self.deadline = self.loop.time() + limit
        if self.timer is None:
            self.timer = self.loop.call_at(self.deadline, self._expire)
        try:
            await waiter
        finally:
            self.waiter = None

    def _expire(self) -> None:
        self.timer = None
        waiter = self.waiter
        if waiter is None or waiter.done():
            return
        if self.loop.time() < self.deadline:
            self.timer = self.loop.call_at(self.deadline, self._expire)
            return
        waiter.set_exception(_timeout())

    def stop_timer(self) -> None:
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None


class Response:
    """A streaming upstream response; read with :meth:`read` until it returns ``b""``."""

    __slots__ = ("_client", "_conn", "_done", "headers", "status_code")

    def __init__(self, client: UpstreamClient, conn: _Connection) -> None:
        self._client = client
        self._conn = conn
        self._done = False
        self.status_code = conn.status
        self.headers = conn.headers

    async def read(self) -> bytes:
        """The body bytes that arrived since the last call (waiting for some); ``b""`` at the
        end. Raises :class:`UpstreamFailure`."""
        conn = self._conn
        while True:
            if conn.body:
                data = conn.body.popleft() if len(conn.body) == 1 else b"".join(conn.body)
                conn.body.clear()
                conn.buffered = 0
                if conn.paused and conn.transport is not None:
                    conn.paused = False
                    conn.transport.resume_reading()
                return data
            if conn.failure is not None:
                raise conn.failure
            if conn.complete:
                self._finish()
                return b""
            await conn.wait(self._client.read_timeout)

    async def aread(self) -> bytes:
        parts = []
        while data := await self.read():
            parts.append(data)
        return b"".join(parts)

    async def drain(self, limit: float) -> None:
        """Read the rest of a body whose content has ended (vLLM writes the chunked terminator
        after ``[DONE]``, often in a later packet), so the connection can be reused."""
        try:
            async with asyncio.timeout(limit):
                while await self.read():
                    pass
        except (UpstreamFailure, TimeoutError):
            pass

    def _finish(self) -> None:
        if not self._done:
            self._done = True
            self._client._release(self._conn)

    async def aclose(self) -> None:
        """Before the end of the body this aborts the connection (the engine sees the client
        go and stops generating); after it, the connection goes back to the pool."""
        if self._done:
            return
        conn = self._conn
        if conn.complete and not conn.body and conn.failure is None:
            self._finish()
            return
        self._done = True
        conn.abort()


class UpstreamClient:
    """Keep-alive pool of :class:`_Connection` to one ``http://host:port`` upstream."""

    def __init__(
        self, base_url: str, *, connect_timeout: float, read_timeout: float, max_idle: int = 256
    ) -> None:
        parts = urlsplit(upstream_base_url(base_url))
        if parts.scheme not in ("http", "https"):
            raise ValueError(f"unsupported upstream scheme: {parts.scheme!r}")
        self.ssl: ssl.SSLContext | None = (
            ssl.create_default_context() if parts.scheme == "https" else None
        )
        self.host = parts.hostname or "127.0.0.1"
        self.port = parts.port or (443 if self.ssl else 80)
        self.prefix = parts.path.rstrip("/")
        self.host_header = parts.netloc.rsplit("@", 1)[-1].encode()
        self.connect_timeout = connect_timeout
        self.read_timeout = read_timeout
        self.max_idle = max_idle
        self._idle: list[_Connection] = []

    async def _connect(self) -> _Connection:
        loop = asyncio.get_running_loop()
        try:
            _, conn = await asyncio.wait_for(
                loop.create_connection(
                    lambda: _Connection(loop), self.host, self.port, ssl=self.ssl
                ),
                self.connect_timeout,
            )
        except TimeoutError:
            raise _timeout() from None
        except OSError:
            raise _unreachable() from None
        return conn

    def _release(self, conn: _Connection) -> None:
        conn.stop_timer()
        if conn.keep_alive and not conn.closed and len(self._idle) < self.max_idle:
            conn.reset()
            self._idle.append(conn)
        else:
            conn.abort()

    async def post(self, path: str, headers: list[tuple[bytes, bytes]], body: bytes) -> Response:
        """Send a POST and wait for the response head."""
        head = [b"POST ", (self.prefix + path).encode(), b" HTTP/1.1\r\nhost: ", self.host_header]
        for name, value in headers:
            head += (b"\r\n", name, b": ", value)
        head += (b"\r\ncontent-length: ", str(len(body)).encode(), b"\r\n\r\n")
        request = b"".join(head) + body
        conn: _Connection | None = None
        while self._idle and conn is None:
            candidate = self._idle.pop()
            if candidate.closed or candidate.transport is None:
                continue
            conn = candidate
        reused = conn is not None
        while True:
            if conn is None:
                conn = await self._connect()
            assert conn.transport is not None
            conn.transport.write(request)
            try:
                while not conn.headers_done:
                    if conn.failure is not None:
                        raise conn.failure
                    await conn.wait(self.read_timeout)
            except UpstreamFailure as exc:
                conn.abort()
                # A kept-alive connection the server closed while idle: once more on a new one.
                if reused and exc.kind == "disconnect":
                    reused = False
                    conn = None
                    continue
                raise
            except BaseException:
                conn.abort()
                raise
            return Response(self, conn)

    async def aclose(self) -> None:
        idle, self._idle = self._idle, []
        for conn in idle:
            with contextlib.suppress(Exception):
                conn.abort()
