"""Incremental Server-Sent Events parser that keeps each event's raw bytes.

Pure (no I/O): ``feed`` takes whatever bytes the socket gave and returns the events completed by
them. Each :class:`Event` carries its exact upstream bytes so the relay can forward it untouched
and parse only the ``data`` field it needs.

Lines end at CR, LF or CRLF and nowhere else: vLLM writes JSON with non-ASCII characters
unescaped, so U+2028 or U+0085 can sit inside a data line (``str.splitlines`` would break it; see
httpx-sse 0.4.2). A CR at the very end of a read is held back until the next read says whether
an LF follows. Everything happens on bytes, so a multi-byte UTF-8 character split across reads
is simply joined before anyone decodes it.

Bounded and linear: the parser remembers where its scan stopped and never looks at a byte twice
(a 4 MiB event fed in 1 KiB reads costs what one 4 MiB read costs, not 4,096 rescans of a
growing buffer), and an event larger than ``max_event_bytes`` raises :class:`EventTooLarge` —
an :class:`~proxy.errors.UpstreamFailure`, so the relay ends the stream with an error event
exactly as for an engine that broke the connection. Memory is at most the cap plus one read.

An event is dispatched at the first blank line that follows a non-blank line; blank lines
before it belong to it, so the events' raw bytes always add up to the stream.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from proxy.errors import UpstreamError, UpstreamFailure

DONE = b"[DONE]"

_EOL = re.compile(rb"\r\n|\r|\n")


@dataclass(slots=True, frozen=True)
class Event:
    """One dispatched event (or a run of blank/comment lines, which has ``data is None``).

    ``raw`` is the exact bytes from the first byte of the event up to and including the blank
    line that ended it; ``data`` is the joined ``data:`` field values, or ``None`` when the event
    had no data line (comments, keep-alives, stray blank lines).
    """

    raw: bytes
    data: bytes | None
    event: str | None = None

    @property
    def is_done(self) -> bool:
        return self.data == DONE


def _parse_event(raw: bytes) -> Event:
    # The shape vLLM writes for every event: one data line and a blank line.
    if (
        raw[:6] == b"data: "
        and raw.find(b"\n") == len(raw) - 2
        and raw[-2:] == b"\n\n"
        and b"\r" not in raw
    ):
        return Event(raw, raw[6:-2])
    data: list[bytes] = []
    name: str | None = None
    for line in _EOL.split(raw):
        if not line or line[:1] == b":":
            continue
        field, sep, value = line.partition(b":")
        if sep and value[:1] == b" ":
            value = value[1:]
        if field == b"data":
            data.append(value)
        elif field == b"event":
            name = value.decode("utf-8", "replace")
    return Event(raw, b"\n".join(data) if data else None, name)


class EventTooLarge(UpstreamFailure):
    """One SSE event (or the pending part of one) grew past ``limit`` bytes. ``events`` are the
    complete events the same read held before it, for the caller to process first."""

    def __init__(self, limit: int, events: list[Event]) -> None:
        super().__init__(
            UpstreamError(
                f"The upstream sent an SSE event larger than {limit} bytes.",
                code="upstream_event_too_large",
            ),
            "protocol",
        )
        self.limit = limit
        self.events = events


#: Default cap on one event (GUARD_MAX_EVENT_BYTES has the same default).
MAX_EVENT_BYTES = 4 * 1024 * 1024


class SSEParser:
    """Split a byte stream into events; see the module docstring for the rules.

    State between reads: the pending bytes of the unfinished event (``_buf``), where the scan
    resumes (``_pos``), where the current line started (``_line``) and whether the pending event
    has a non-blank line yet (``_content``).
    """

    __slots__ = ("_buf", "_content", "_line", "_max", "_pos")

    def __init__(self, max_event_bytes: int = MAX_EVENT_BYTES) -> None:
        self._buf = bytearray()
        self._pos = 0
        self._line = 0
        self._content = False
        self._max = max_event_bytes

    def feed(self, data: bytes) -> list[Event]:
        buf = self._buf
        if not buf:
            # One whole vLLM event in one read: the usual case when tokens come one by one.
            if (
                data[:6] == b"data: "
                and data.find(b"\n") == len(data) - 2
                and data[-1:] == b"\n"
                and b"\r" not in data
                and len(data) <= self._max
            ):
                return [Event(data, data[6:-2])]
            if not data:
                return []
            # Scan the read itself; only its unfinished tail is copied.
            events, start = self._scan(data, 0)
            if start < len(data):
                self._buf = bytearray(data[start:]) if start else bytearray(data)
                self._pos -= start
                self._line -= start
            else:
                self._pos = self._line = 0
        else:
            buf += data
            events, start = self._scan(buf, self._pos)
            if start:
                del buf[:start]  # O(1) at the front of a bytearray
                self._pos -= start
                self._line -= start
        if len(self._buf) > self._max:
            self._reset()
            raise EventTooLarge(self._max, events)
        return events

    def _scan(
        self, buf: bytes | bytearray, pos: int, *, final: bool = False
    ) -> tuple[list[Event], int]:
        """Events completed in ``buf`` from ``pos`` on; returns them and the index where the
        pending event now starts. Updates ``_pos``, ``_line`` and ``_content``."""
        events: list[Event] = []
        start = 0
        line = self._line
        content = self._content
        limit = self._max
        size = len(buf)
        if buf.find(b"\r", pos) < 0:
            find = buf.find
            while (j := find(b"\n", pos)) >= 0:
                if j != line:
                    content = True
                    line = pos = j + 1
                    if pos == size or buf[pos] != 10:
                        continue
                    j = pos  # the usual "\n\n": the blank line follows at once
                elif not content:
                    line = pos = j + 1  # a stray blank line: it stays with the next event
                    continue
                if j + 1 - start > limit:
                    self._reset()
                    raise EventTooLarge(limit, events)
                events.append(_parse_event(bytes(buf[start : j + 1])))
                start = line = pos = j + 1
                content = False
            pos = size
        else:
            for m in _EOL.finditer(buf, pos):
                s, e = m.span()
                if e == size and e - s == 1 and buf[s] == 13 and not final:
                    pos = s  # might be the first half of a CRLF: look again next read
                    break
                if s != line:
                    content = True
                elif content:
                    if e - start > limit:
                        self._reset()
                        raise EventTooLarge(limit, events)
                    events.append(_parse_event(bytes(buf[start:e])))
                    start = e
                    content = False
                line = e
            else:
                pos = size
        self._pos = pos
        self._line = line
        self._content = content
        return events, start

    def _reset(self) -> None:
        self._buf = bytearray()
        self._pos = self._line = 0
        self._content = False

    def close(self) -> list[Event]:
        """End of stream: a CR held back at the end is a line end after all. What is still
        incomplete stays in the buffer (see :meth:`flush`)."""
        buf = self._buf
        if not buf.endswith(b"\r"):
            return []
        events, start = self._scan(buf, self._pos, final=True)
        if start:
            del buf[:start]
            self._pos -= start
            self._line -= start
        return events

    def flush(self) -> bytes:
        """Bytes of an unterminated event at end of stream; per the SSE spec it is discarded
        (forwarding it would glue its partial line to whatever the relay writes next)."""
        rest = bytes(self._buf)
        self._reset()
        return rest

    @property
    def pending(self) -> int:
        return len(self._buf)


def encode_data(data: bytes) -> bytes:
    """One ``data:`` event for a single-line payload (compact JSON has no newlines)."""
    return b"data: " + data + b"\n\n"


DONE_EVENT = b"data: [DONE]\n\n"
