"""Bounds on one request: client disconnect, a client that stops reading, an overall deadline.

Every upstream exchange runs under :func:`watched`, with a :class:`Watch`:

* **disconnect** — a watcher task waits for ``http.disconnect`` and cancels the handler; its
  ``finally`` closes the upstream response, so vLLM aborts the generation (one loop turn).
* **write timeout** (GUARD_CLIENT_WRITE_TIMEOUT) — a client that keeps the connection open but
  accepts no bytes blocks ``send`` in the server's flow control, and with it the upstream: the
  engine would hold the slot for as long as the client likes. Timing every ``send`` with
  ``asyncio.wait_for`` would cost a timer handle and a task switch per chunk; instead the relay
  bumps ``watch.seq`` before and after each ``send`` (odd = inside a send), and one timer per
  worker (:class:`Bounds`) sweeps the live watches: a ``seq`` that stayed odd and unchanged for the
  timeout means the client took nothing, and the handler is cancelled like on a disconnect.
  Chunks written straight onto the transport (:class:`proxy.server.asgi.DirectBody`) never block;
  once the transport asks to pause, the relay goes back to ``send`` and this applies.
* **deadline** (GUARD_REQUEST_DEADLINE, 0 = off) — the same sweep cancels a request older than
  the deadline; the endpoint then ends its answer properly (an SSE error event and ``[DONE]`` on
  a stream already started, a 504 otherwise).

Detection is never early and at most one sweep period late (a quarter of the bound, ≤ 1 s).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any, Literal

from proxy.errors import DeadlineExceeded
from proxy.server.asgi import Message, Receive, Send, abort_connection

log = logging.getLogger("coherence_guard")

Expiry = Literal["write", "deadline"]


class Watch:
    """The bounds state of one request (see the module docstring)."""

    __slots__ = (
        "cancellable",
        "expired",
        "gone",
        "seen_at",
        "seen_seq",
        "seq",
        "started",
        "task",
    )

    def __init__(self) -> None:
        self.gone = False
        #: False once the handler is writing its last bytes: a disconnect or the deadline no
        #: longer cancels it (a stalled write still does).
        self.cancellable = True
        self.task: asyncio.Task[Any] | None = None
        #: Bumped before and after every ``send`` of a body chunk: odd = inside a send.
        self.seq = 0
        self.seen_seq = -1
        self.seen_at = 0.0
        self.started = time.monotonic()
        self.expired: Expiry | None = None

    async def send_last(self, send: Send, message: Message) -> None:
        """The answer's last ``send``: no longer cancelled by a disconnect or the deadline, but
        timed like every other (a client that stops reading when the last chunk fills its
        buffer would otherwise hold the handler, and the engine's connection, for ever)."""
        self.cancellable = False
        self.seq += 1
        try:
            await send(message)
        finally:
            self.seq += 1

    def stalled(self) -> bool:
        """The client stopped reading (a method: ``expired`` changes under an ``await``)."""
        return self.expired == "write"


class Bounds:
    """One per worker: the live watches and the timer that sweeps them."""

    def __init__(
        self,
        *,
        write_timeout: float,
        deadline: float,
        on_expire: Callable[[Expiry], None] = lambda kind: None,
    ) -> None:
        self.write_timeout = write_timeout
        self.deadline = deadline
        self.on_expire = on_expire
        periods = [1.0, write_timeout / 4] + ([deadline / 4] if deadline > 0 else [])
        self.period = max(0.01, min(periods))
        self.watches: set[Watch] = set()
        self._handle: asyncio.TimerHandle | None = None

    def add(self, watch: Watch) -> None:
        self.watches.add(watch)
        if self._handle is None:
            loop = asyncio.get_running_loop()
            self._handle = loop.call_later(self.period, self._sweep)

    def discard(self, watch: Watch) -> None:
        self.watches.discard(watch)

    def close(self) -> None:
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None

    def _sweep(self) -> None:
        self._handle = None
        now = time.monotonic()
        deadline = self.deadline
        for w in self.watches:
            seq = w.seq
            if seq & 1:
                if seq != w.seen_seq:
                    w.seen_seq = seq
                    w.seen_at = now
                elif now - w.seen_at >= self.write_timeout and w.expired != "write":
                    self._expire(w, "write")
                    continue
            if deadline > 0 and w.expired is None and w.cancellable and now - w.started >= deadline:
                self._expire(w, "deadline")
        if self.watches:
            self._handle = asyncio.get_running_loop().call_later(self.period, self._sweep)

    def _expire(self, watch: Watch, kind: Expiry) -> None:
        watch.expired = kind
        if kind == "write":
            # Nothing more can reach this client: treat it as gone.
            watch.gone = True
            log.warning("client accepted no bytes for %.1f s: dropped", self.write_timeout)
        else:
            log.warning("request ran past the %.1f s deadline", self.deadline)
        self.on_expire(kind)
        if watch.task is not None:
            watch.task.cancel()


async def watched(
    receive: Receive,
    send: Send,
    work: Callable[[Watch], Awaitable[None]],
    watch: Watch,
    bounds: Bounds,
    on_deadline: Callable[[], Awaitable[None]] | None = None,
) -> Watch:
    """Run ``work`` under ``watch``: cancelled when the client goes, stops reading, or the
    deadline passes; after a deadline ``on_deadline`` writes the end of the answer. A client
    that stopped reading has its connection aborted (``send`` leads to it)."""
    task = watch.task = asyncio.current_task()

    async def watcher() -> None:
        while True:
            msg = await receive()
            if msg["type"] == "http.disconnect":
                break
        if watch.cancellable and task is not None and watch.expired is None:
            watch.gone = True
            task.cancel()

    w = asyncio.create_task(watcher())
    bounds.add(watch)
    try:
        # One loop turn lets the watcher see a client that is already gone, before the
        # upstream request is opened (queued requests of departed clients never reach it).
        await asyncio.sleep(0)
        await work(watch)
    except asyncio.CancelledError:
        if task is None or not (watch.gone or watch.expired is not None):
            raise
        task.uncancel()
        if watch.expired == "deadline" and on_deadline is not None and not watch.gone:
            watch.cancellable = False
            try:
                await on_deadline()
            except asyncio.CancelledError:
                if not watch.stalled():
                    raise
                task.uncancel()
    finally:
        bounds.discard(watch)
        w.cancel()
    if watch.stalled() and abort_connection(send):
        # Let the server see the connection gone before the endpoint returns (else it reports
        # a response that was never completed).
        await asyncio.sleep(0)
    return watch


def deadline_error() -> DeadlineExceeded:
    return DeadlineExceeded(
        "The request ran past this deployment's time limit.", code="request_deadline"
    )
