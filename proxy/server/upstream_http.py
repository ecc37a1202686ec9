"""A minimal HTTP/1.1 client for the guarded POSTs: asyncio protocol + httptools, keep-alive pool.

Why not httpx here: as a *streaming* client reading small SSE chunks, httpx costs ~70 µs of CPU
per chunk (its per-chunk path runs through httpcore's state machine, h11 and several async
generator layers); this client costs ~12 µs per relayed chunk end to end (``bench/bench_relay.py``,
README "Speed") — the body bytes go from ``data_received`` through httptools' C parser into a
buffer, and the relay wakes once per socket read — or not at all: :meth:`Response.relay` hands
each read to a callback inside the protocol's own ``data_received``. httpx is still used for
everything that is not a guarded route (pass-through, readiness, the config watcher), where its
generality matters more than per-chunk cost. Both are built from one
:class:`~proxy.server.upstream.UpstreamConfig` (same TLS context, timeouts, limits, errors).

Scope, on purpose: one request per connection at a time, ``Content-Length`` request bodies.
What makes it safe to keep connections alive (each rule has a test against a real socket):

* **1xx interim responses** (``100 Continue``, ``102 Processing``, ``103 Early Hints``) are
  skipped: httptools reports each as a complete message, so the parser state is reset and
  reading goes on until the final response. ``101`` (never asked for) is a protocol error.
* **Framing**: ``Content-Length``, chunked (extensions and trailers are llhttp's business) and
  close-delimited bodies. A body shorter than declared, or a chunked body cut before its last
  chunk, is an :class:`UpstreamFailure`, never a short success.
* **A connection goes back to the pool only** when its response was read to the end, the server
  did not ask to close, the whole request was written, and no byte arrived after the response.
  Bytes past the declared end (a lying ``Content-Length``) or any byte that arrives on an idle
  connection close it: they can never become the start of the next request's response.
* **Stale connections**: before reuse a pooled connection is checked (closed, or readable —
  EOF or stray bytes — or idle longer than :data:`KEEPALIVE_EXPIRY`, which is below
  uvicorn's/vLLM's 5 s keep-alive timeout). A request is never sent twice: once written, a
  failure is the caller's (a POST the engine may have started is not retried).
* A server that closes before the status line fails the request at once (502).

Reading pauses when the relay falls behind (back-pressure to the engine).
:meth:`Response.aclose` before the end of the body aborts the connection: that is what makes
vLLM abort the generation.
"""

from __future__ import annotations

import asyncio
import contextlib
import select
import ssl
from collections import deque
from collections.abc import Callable
from typing import cast
from urllib.parse import urlsplit

import httptools

from proxy.errors import UpstreamFailure
from proxy.server.upstream import UpstreamConfig, failure

__all__ = ["KEEPALIVE_EXPIRY", "Response", "UpstreamClient", "UpstreamFailure"]

#: Unread body bytes at which the connection stops reading from the engine.
_HIGH_WATER = 1 << 20
#: Seconds a pooled connection may stay idle and still be reused: below the 5 s keep-alive
#: timeout of uvicorn (vLLM's server), so the proxy drops a connection before the engine does
#: instead of racing the engine's close with a new request.
KEEPALIVE_EXPIRY = 4.0


class _ExtraMessage(Exception):
    """Raised from a parser callback: a second response began on the same exchange."""


class _Connection(asyncio.Protocol):
    """One TCP connection; parser callbacks fill the current response's state."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.transport: asyncio.Transport | None = None
        self.parser = httptools.HttpResponseParser(self)
        self.closed = False
        #: In the pool: any byte or EOF now means the connection cannot be reused.
        self.idle = False
        self.idle_since = 0.0
        self.status = 0
        self.headers: list[tuple[bytes, bytes]] = []
        self.body: deque[bytes] = deque()
        self.buffered = 0
        self.interim = False
        self.headers_done = False
        self.complete = False
        self.keep_alive = False
        self.failure: UpstreamFailure | None = None
        self.waiter: asyncio.Future[None] | None = None
        self.paused = False
        self.write_paused = False
        #: Read-timeout bookkeeping: one timer per connection, re-armed lazily when it fires
        #: early (creating and cancelling a timer per read costs more than the read).
        self.deadline = 0.0
        self.limit = 0.0
        self.timer: asyncio.TimerHandle | None = None
        #: Set by :meth:`Response.relay`: each read's body bytes go to it from this protocol's
        #: callback; False from it hands the stream back to :meth:`Response.read`.
        self.on_data: Callable[[bytes], bool] | None = None

    # -- protocol
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports do not subclass asyncio.Transport; they implement it.
        self.transport = cast(asyncio.Transport, transport)

    def data_received(self, data: bytes) -> None:
        if self.idle or self.closed:
            # Nobody asked: unsolicited bytes (or the tail of an over-long body) on a pooled
            # connection. Reading them as the next response would hand them to another request.
            self.abort()
            return
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError:
            if not self.complete:
                self._fail(failure("protocol"))
            # Complete already: the bytes after the response's end are dropped with the
            # connection, and the response itself stands.
            self.keep_alive = False
            self.abort()
            return
        on_data = self.on_data
        if on_data is not None and self.body:
            self.deadline = self.loop.time() + self.limit
            if not on_data(self.take()):
                self.on_data = None
                self._wake()

    def eof_received(self) -> bool | None:
        return None  # close the transport; connection_lost follows

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self.stop_timer()
        if not self.complete:
            # A close-delimited body ends here; anything else is a broken exchange.
            if self.headers_done and not self.keep_alive and exc is None and self._close_ends():
                self.complete = True
            else:
                self._fail(failure("disconnect"))
        self._wake()

    def pause_writing(self) -> None:
        self.write_paused = True

    def resume_writing(self) -> None:
        self.write_paused = False
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
    def on_message_begin(self) -> None:
        if self.complete:
            raise _ExtraMessage
        self.headers = []

    def on_header(self, name: bytes, value: bytes) -> None:
        self.headers.append((name, value))

    def on_headers_complete(self) -> None:
        status = self.parser.get_status_code()
        if 100 <= status < 200:
            if status == 101:  # an upgrade nobody asked for
                raise _ExtraMessage
            self.interim = True  # no body; on_message_complete follows and resets
            return
        self.status = status
        self.keep_alive = self.parser.should_keep_alive()
        self.headers_done = True
        self._wake()

    def on_body(self, body: bytes) -> None:
        self.body.append(body)
        self.buffered += len(body)
        if self.buffered > _HIGH_WATER and not self.paused and self.transport is not None:
            self.paused = True
            self.transport.pause_reading()
        if self.on_data is None:
            waiter = self.waiter
            if waiter is not None and not waiter.done():
                waiter.set_result(None)

    def on_message_complete(self) -> None:
        if self.interim:
            # 1xx: not the answer. The parser goes on with the next message on its own.
            self.interim = False
            self.headers = []
            return
        self.keep_alive = self.keep_alive and self.parser.should_keep_alive()
        self.complete = True
        self._wake()

    # -- helpers
    def take(self) -> bytes:
        """The body bytes buffered so far (reading resumes if it was paused for them)."""
        body = self.body
        data = body.popleft() if len(body) == 1 else b"".join(body)
        body.clear()
        self.buffered = 0
        if self.paused and self.transport is not None:
            self.paused = False
            self.transport.resume_reading()
        return data

    def _fail(self, exc: UpstreamFailure) -> None:
        if self.failure is None:
            self.failure = exc
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

    def stale(self, now: float) -> bool:
        """Whether a pooled connection must not carry another request: closed, idle too long,
        or readable (an EOF or bytes the event loop has not delivered yet)."""
        transport = self.transport
        if self.closed or transport is None or transport.is_closing():
            return True
        if now - self.idle_since > KEEPALIVE_EXPIRY:
            return True
        sock = transport.get_extra_info("socket")
        if sock is None:
            return False
        try:
            poller = select.poll()
            poller.register(sock.fileno(), select.POLLIN | select.POLLPRI)
            return bool(poller.poll(0))
        except (OSError, ValueError):
            return True

    def reset(self) -> None:
        self.parser = httptools.HttpResponseParser(self)
        self.status = 0
        self.headers = []
        self.body.clear()
        self.buffered = 0
        self.interim = False
        self.headers_done = False
        self.complete = False
        self.keep_alive = False
        self.failure = None

    async def wait(self, limit: float) -> None:
        """Until the parser makes progress, the connection fails, or ``limit`` seconds pass."""
        waiter = self.waiter = self.loop.create_future()
        self.limit = limit
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
        waiter.set_exception(failure("timeout"))

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
                return conn.take()
            if conn.failure is not None:
                raise conn.failure
            if conn.complete:
                self._finish()
                return b""
            await conn.wait(self._client.read_timeout)

    async def relay(self, on_data: Callable[[bytes], bool]) -> None:
        """Hand the body to ``on_data`` read by read, from the connection's protocol callback,
        until it returns False, the body ends or the exchange fails; then return (what is left,
        the end or the failure, is :meth:`read`'s). Raises :class:`UpstreamFailure` on the read
        timeout.

        Why: at real pacing every token arrives alone, and waking a task for it (a future, a
        loop callback, three coroutine frames) costs more than the guard's work on the chunk.
        ``on_data`` runs inside the event loop's callback and must not raise or block.
        """
        conn = self._conn
        if conn.body and not on_data(conn.take()):
            return
        if conn.complete or conn.failure is not None:
            return
        conn.on_data = on_data
        try:
            while conn.on_data is not None and not conn.complete and conn.failure is None:
                await conn.wait(self._client.read_timeout)
        finally:
            conn.on_data = None

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
        self._client._slots.release()


class UpstreamClient:
    """Keep-alive pool of :class:`_Connection` to one ``http(s)://host:port`` upstream.

    At most ``config.max_connections`` requests are in flight at once (a request waits up to
    the connect timeout for a slot, then fails with 504 like httpx's pool timeout), and at most
    as many idle connections are kept.
    """

    def __init__(self, config: UpstreamConfig) -> None:
        parts = urlsplit(config.url)
        if parts.scheme not in ("http", "https"):
            raise ValueError(f"unsupported upstream scheme: {parts.scheme!r}")
        self.config = config
        self.ssl: ssl.SSLContext | None = config.ssl if parts.scheme == "https" else None
        self.host = parts.hostname or "127.0.0.1"
        self.port = parts.port or (443 if self.ssl else 80)
        self.prefix = parts.path.rstrip("/")
        self.host_header = parts.netloc.rsplit("@", 1)[-1].encode()
        self.connect_timeout = config.connect_timeout
        self.read_timeout = config.read_timeout
        self.write_timeout = config.write_timeout
        self.max_idle = config.max_connections
        self._slots = asyncio.Semaphore(config.max_connections)
        self._idle: list[_Connection] = []

    @classmethod
    def for_url(
        cls,
        url: str,
        *,
        connect_timeout: float = 5.0,
        read_timeout: float = 600.0,
        write_timeout: float = 30.0,
        max_connections: int = 1024,
    ) -> UpstreamClient:
        """A client with default TLS and no key for ``url`` (tests, tools)."""
        config = UpstreamConfig.create(
            url,
            connect_timeout=connect_timeout,
            read_timeout=read_timeout,
            write_timeout=write_timeout,
            max_connections=max_connections,
        )
        return cls(config)

    @property
    def idle_connections(self) -> int:
        return len(self._idle)

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
            raise failure("timeout") from None
        except ssl.SSLError:
            raise failure("connect", "The upstream's TLS handshake failed.") from None
        except OSError:
            raise failure("connect") from None
        return conn

    def _release(self, conn: _Connection) -> None:
        """Back to the pool only after a clean, complete exchange; closed otherwise."""
        self._slots.release()
        conn.stop_timer()
        transport = conn.transport
        if (
            conn.keep_alive
            and conn.complete
            and conn.failure is None
            and not conn.body
            and not conn.closed
            and transport is not None
            and not transport.is_closing()
            and transport.get_write_buffer_size() == 0
            and len(self._idle) < self.max_idle
        ):
            conn.reset()
            conn.idle = True
            conn.idle_since = conn.loop.time()
            self._idle.append(conn)
        else:
            conn.abort()

    def _pooled(self) -> _Connection | None:
        now = asyncio.get_running_loop().time()
        while self._idle:
            conn = self._idle.pop()
            if conn.stale(now):
                conn.abort()
                continue
            conn.idle = False
            return conn
        return None

    async def post(self, path: str, headers: list[tuple[bytes, bytes]], body: bytes) -> Response:
        """Send a POST and wait for the final response head (1xx skipped)."""
        head = [b"POST ", (self.prefix + path).encode(), b" HTTP/1.1\r\nhost: ", self.host_header]
        for name, value in headers:
            head += (b"\r\n", name, b": ", value)
        head += (b"\r\ncontent-length: ", str(len(body)).encode(), b"\r\n\r\n")
        request = b"".join(head) + body
        if self._slots.locked():
            try:
                async with asyncio.timeout(self.connect_timeout):
                    await self._slots.acquire()
            except TimeoutError:
                raise failure("timeout", "No upstream connection was free in time.") from None
        else:
            await self._slots.acquire()  # free: returns without yielding to the loop
        conn: _Connection | None = None
        try:
            conn = self._pooled() or await self._connect()
            assert conn.transport is not None
            conn.transport.write(request)
            if conn.write_paused:
                await self._drained(conn)
            while not conn.headers_done:
                if conn.failure is not None:
                    raise conn.failure
                await conn.wait(self.read_timeout)
        except BaseException:
            if conn is not None:
                conn.abort()
            self._slots.release()
            raise
        return Response(self, conn)

    async def _drained(self, conn: _Connection) -> None:
        """Until the request is handed to the kernel (or the answer came early, or the
        connection failed), at most the write timeout."""
        deadline = conn.loop.time() + self.write_timeout
        while conn.write_paused and not conn.headers_done and conn.failure is None:
            left = deadline - conn.loop.time()
            if left <= 0:
                raise failure("timeout", "The upstream did not accept the request in time.")
            with contextlib.suppress(UpstreamFailure):
                await conn.wait(left)

    async def aclose(self) -> None:
        idle, self._idle = self._idle, []
        for conn in idle:
            with contextlib.suppress(Exception):
                conn.abort()
