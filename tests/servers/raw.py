"""A raw asyncio socket server for misbehaving upstreams: the test writes every byte.

``RawServer(handler)`` serves each connection with ``handler(conn)``, in the test's own event
loop; :class:`RawConn` reads whole requests (head + ``Content-Length`` body) and writes bytes.
It records every request per connection, so a test can assert that a request reached the
server exactly once and which connection carried it.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Awaitable, Callable
from types import TracebackType

from tests.net import HANG_GUARD


class RawConn:
    def __init__(
        self, server: RawServer, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        self.server = server
        self.reader = reader
        self.writer = writer
        self.index = len(server.connections)
        self.requests: list[bytes] = []

    async def request(self) -> bytes | None:
        """The next request's body, or None when the client closed the connection."""
        try:
            head = await self.reader.readuntil(b"\r\n\r\n")
        except (asyncio.IncompleteReadError, ConnectionError, asyncio.LimitOverrunError):
            return None
        length = 0
        for line in head.split(b"\r\n")[1:]:
            name, _, value = line.partition(b":")
            if name.strip().lower() == b"content-length":
                length = int(value)
        try:
            body = await self.reader.readexactly(length)
        except (asyncio.IncompleteReadError, ConnectionError):
            return None
        self.requests.append(body)
        self.server.requests.append((self.index, body))
        return body

    async def write(self, data: bytes, *, pause: float = 0.0) -> None:
        self.writer.write(data)
        with contextlib.suppress(ConnectionError):
            await self.writer.drain()
        if pause:
            await asyncio.sleep(pause)

    def close(self) -> None:
        self.writer.close()


Handler = Callable[[RawConn], Awaitable[None]]


class RawServer:
    """``async with RawServer(handler) as server: server.url``."""

    def __init__(self, handler: Handler) -> None:
        self.handler = handler
        self.connections: list[RawConn] = []
        self.requests: list[tuple[int, bytes]] = []
        self.open = 0
        self._none_open = asyncio.Event()
        self._none_open.set()
        self._server: asyncio.Server | None = None

    @property
    def url(self) -> str:
        assert self._server is not None
        return f"http://127.0.0.1:{self._server.sockets[0].getsockname()[1]}"

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        conn = RawConn(self, reader, writer)
        self.connections.append(conn)
        self.open += 1
        self._none_open.clear()
        try:
            await self.handler(conn)
            # Keep the socket until the client closes it, so "not reused" is the client's doing.
            with contextlib.suppress(ConnectionError):
                while await reader.read(65536):
                    pass
        except ConnectionError:
            pass
        finally:
            self.open -= 1
            if not self.open:
                self._none_open.set()
            writer.transport.abort()

    async def all_closed(self) -> None:
        """Until no connection is open (the client closed or aborted all of them)."""
        await self._none_open.wait()

    async def __aenter__(self) -> RawServer:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        return self

    async def __aexit__(
        self,
        typ: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        assert self._server is not None
        self._server.close()
        for conn in self.connections:
            conn.writer.transport.abort()
        await self._server.wait_closed()


def response(body: bytes, *, status: bytes = b"200 OK", headers: bytes = b"") -> bytes:
    """A well-formed ``Content-Length`` response."""
    return (
        b"HTTP/1.1 "
        + status
        + b"\r\ncontent-length: "
        + str(len(body)).encode()
        + b"\r\n"
        + headers
        + b"\r\n"
        + body
    )


def chunked(body: bytes, sizes: list[int], *, ext: bytes = b"", trailers: bytes = b"") -> bytes:
    """``body`` as a chunked response cut into chunks of ``sizes`` (cycled)."""
    out = [b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n"]
    i = 0
    k = 0
    while i < len(body):
        n = max(1, sizes[k % len(sizes)]) if sizes else len(body)
        k += 1
        piece = body[i : i + n]
        i += n
        out.append(b"%x%s\r\n%s\r\n" % (len(piece), ext, piece))
    out.append(b"0\r\n" + trailers + b"\r\n")
    return b"".join(out)


class ThreadedRawServer:
    """:class:`RawServer` in its own thread and event loop, for a proxy running elsewhere.

    ``with ThreadedRawServer(handler) as server: server.url``
    """

    def __init__(self, handler: Handler) -> None:
        self.handler = handler
        self.url = ""
        self._ready = threading.Event()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._thread = threading.Thread(target=lambda: asyncio.run(self._main()), daemon=True)

    async def _main(self) -> None:
        async with RawServer(self.handler) as server:
            self.url = server.url
            self._loop = asyncio.get_running_loop()
            self._stop = asyncio.Event()
            self._ready.set()
            await self._stop.wait()

    def __enter__(self) -> ThreadedRawServer:
        self._thread.start()
        if not self._ready.wait(HANG_GUARD):
            raise RuntimeError("raw server did not start")
        return self

    def __exit__(self, *exc: object) -> None:
        if self._loop is not None and self._stop is not None:
            self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(HANG_GUARD)
