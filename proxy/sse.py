"""Incremental Server-Sent Events parser that keeps each event's raw bytes.

Pure (no I/O): ``feed`` takes whatever bytes the socket gave and returns the events completed by
them. Each :class:`Event` carries its exact upstream bytes so the relay can forward it untouched
and parse only the ``data`` field it needs.

Lines end at CR, LF or CRLF and nowhere else: vLLM writes JSON with non-ASCII characters
unescaped, so U+2028 or U+0085 can sit inside a data line (``str.splitlines`` would break it; see
httpx-sse 0.4.2). A CR at the very end of a read is held back until the next read says whether
an LF follows. Everything happens on bytes, so a multi-byte UTF-8 character split across reads
is simply joined before anyone decodes it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

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


class SSEParser:
    """Split a byte stream into events; see the module docstring for the line rules."""

    __slots__ = ("_buf",)

    def __init__(self) -> None:
        self._buf = b""

    def feed(self, data: bytes) -> list[Event]:
        # One whole vLLM event in one read: the usual case when tokens come one by one.
        if (
            not self._buf
            and data[:6] == b"data: "
            and data.find(b"\n") == len(data) - 2
            and data[-1:] == b"\n"
            and b"\r" not in data
        ):
            return [Event(data, data[6:-2])]
        buf = self._buf + data if self._buf else data
        if b"\r" not in buf:
            return self._feed_lf(buf)
        return self._feed_any(buf)

    def _feed_lf(self, buf: bytes) -> list[Event]:
        events: list[Event] = []
        start = 0
        while True:
            end = buf.find(b"\n\n", start)
            if end < 0:
                break
            if end == start:
                # A stray blank line before an event: keep it with the bytes that follow it.
                nxt = buf.find(b"\n\n", end + 1)
                if nxt < 0:
                    break
                end = nxt
            events.append(_parse_event(buf[start : end + 2]))
            start = end + 2
        self._buf = buf[start:]
        return events

    def _feed_any(self, buf: bytes, *, final: bool = False) -> list[Event]:
        events: list[Event] = []
        start = 0  # first byte of the pending event
        line_start = 0
        has_content = False
        size = len(buf)
        for m in _EOL.finditer(buf):
            if m.end() == size and m.group() == b"\r" and not final:
                break  # might be the first half of a CRLF
            if m.start() == line_start:
                if has_content:
                    events.append(_parse_event(buf[start : m.end()]))
                    start = m.end()
                    has_content = False
            else:
                has_content = True
            line_start = m.end()
        self._buf = buf[start:]
        return events

    def close(self) -> list[Event]:
        """End of stream: a CR held back at the end is a line end after all. What is still
        incomplete stays in the buffer (see :meth:`flush`)."""
        if not self._buf.endswith(b"\r"):
            return []
        return self._feed_any(self._buf, final=True)

    def flush(self) -> bytes:
        """Bytes of an unterminated event at end of stream; per the SSE spec it is discarded
        (forwarding it would glue its partial line to whatever the relay writes next)."""
        rest, self._buf = self._buf, b""
        return rest

    @property
    def pending(self) -> int:
        return len(self._buf)


def encode_data(data: bytes) -> bytes:
    """One ``data:`` event for a single-line payload (compact JSON has no newlines)."""
    return b"data: " + data + b"\n\n"


DONE_EVENT = b"data: [DONE]\n\n"
