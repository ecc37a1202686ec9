"""One HTTP/1.1 connection to the engine: an asyncio protocol fed to httptools' C parser.

:class:`Connection` is what :mod:`proxy.server.upstream_http`'s pool keeps alive; the parser
callbacks fill the current response's state and the body bytes go from ``data_received``
straight into a buffer (or a relay callback), so a relayed chunk costs one parser call.
What makes it safe to keep connections alive (each rule has a test against a real socket):

* **1xx interim responses** (``100 Continue``, ``102 Processing``, ``103 Early Hints``) are
  skipped: httptools reports each as a complete message, so the parser state is reset and
  reading goes on until the final response. ``101`` (never asked for) is a protocol error.
* **Framing**: ``Content-Length``, chunked (extensions and trailers are llhttp's business) and
  close-delimited bodies. A body shorter than declared, or a chunked body cut before its last
  chunk, is an :class:`~proxy.errors.UpstreamFailure`, never a short success.
* **A connection goes back to the pool only** when its response was read to the end, the server
  did not ask to close, the whole request was written, and no byte arrived after the response.
  Bytes past the declared end (a lying ``Content-Length``) or any byte that arrives on an idle
  connection close it: they can never become the start of the next request's response.
* **Stale connections**: before reuse a pooled connection is checked (closed, or readable —
  EOF or stray bytes — or idle longer than the pool's expiry, below uvicorn's/vLLM's 5 s
  keep-alive timeout).
* A server that closes before the status line fails the request at once (502).

Reading pauses when the relay falls behind (back-pressure to the engine); :meth:`Connection.abort`
closes the socket at once, which is what makes vLLM abort a generation.
"""

from __future__ import annotations

import asyncio
import select
from collections import deque
from collections.abc import Callable
from typing import cast

import httptools

from proxy.errors import UpstreamFailure
from proxy.server.upstream import failure

__all__ = ["Connection", "ExtraMessage"]

#: Unread body bytes at which the connection stops reading from the engine.
_HIGH_WATER = 1 << 20


class ExtraMessage(Exception):
    """Raised from a parser callback: a second response began on the same exchange."""


class Connection(asyncio.Protocol):
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
            raise ExtraMessage
        self.headers = []

    def on_header(self, name: bytes, value: bytes) -> None:
        self.headers.append((name, value))

    def on_headers_complete(self) -> None:
        status = self.parser.get_status_code()
        if 100 <= status < 200:
            if status == 101:  # an upgrade nobody asked for
                raise ExtraMessage
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

    def stale(self, now: float, expiry: float) -> bool:
        """Whether a pooled connection must not carry another request: closed, idle too long,
        or readable (an EOF or bytes the event loop has not delivered yet). ``expiry``: seconds
        it may stay idle."""
        transport = self.transport
        if self.closed or transport is None or transport.is_closing():
            return True
        if now - self.idle_since > expiry:
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
