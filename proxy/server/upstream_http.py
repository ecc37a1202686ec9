"""A minimal HTTP/1.1 client for the guarded POSTs: asyncio protocol + httptools, keep-alive pool.

Why not httpx here: as a *streaming* client reading small SSE chunks, httpx costs ~70 µs of CPU per
chunk (its per-chunk path runs through httpcore's state machine, h11 and several async generator
layers); this client costs ~12 µs per relayed chunk end to end (``off``, 32 streams back to back:
``bench/measure/relay/results-relay-nginx.md``) — the body bytes go from ``data_received``
through httptools' C parser into a buffer, and the relay wakes once per socket read — or not at all:
:meth:`Response.relay` hands each read to a callback inside the protocol's own ``data_received``.
httpx is still used for everything that is not a guarded route (pass-through, readiness, the config
watcher), where its generality matters more than per-chunk cost. Both are built from one
:class:`~proxy.server.upstream.UpstreamConfig` (same TLS context, timeouts, limits, errors).

Scope, on purpose: one request per connection at a time, ``Content-Length`` request bodies. The
rules that make keep-alive safe (1xx responses, framing, when a connection returns to the pool,
stale connections) are :mod:`proxy.server.upstream_protocol`'s, one connection's protocol; this
module is the pool and the response a caller reads.

A request is never sent twice: once written, a failure is the caller's (a POST the engine may
have started is not retried). :meth:`Response.aclose` before the end of the body aborts the
connection: that is what makes vLLM abort the generation.
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl
from collections.abc import Callable
from urllib.parse import urlsplit

from proxy.errors import UpstreamFailure
from proxy.server.upstream import KEEPALIVE_EXPIRY, UpstreamConfig, failure
from proxy.server.upstream_protocol import Connection

__all__ = ["DRAIN_SECONDS", "KEEPALIVE_EXPIRY", "Response", "UpstreamClient", "UpstreamFailure"]

#: How long to wait for the end of a body after ``[DONE]`` before giving the connection up.
DRAIN_SECONDS = 1.0


class Response:
    """A streaming upstream response; read with :meth:`read` until it returns ``b""``."""

    __slots__ = ("_client", "_conn", "_done", "headers", "status_code")

    def __init__(self, client: UpstreamClient, conn: Connection) -> None:
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
    """Keep-alive pool of :class:`Connection` to one ``http(s)://host:port`` upstream.

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
        self._idle: list[Connection] = []

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

    async def _connect(self) -> Connection:
        loop = asyncio.get_running_loop()
        try:
            _, conn = await asyncio.wait_for(
                loop.create_connection(
                    lambda: Connection(loop), self.host, self.port, ssl=self.ssl
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

    def _release(self, conn: Connection) -> None:
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

    def _pooled(self) -> Connection | None:
        now = asyncio.get_running_loop().time()
        while self._idle:
            conn = self._idle.pop()
            if conn.stale(now, KEEPALIVE_EXPIRY):
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
        conn: Connection | None = None
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

    async def _drained(self, conn: Connection) -> None:
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
