"""Writing a guarded answer in the surface's own protocol when the engine spoke another.

:class:`SurfaceSend` is the ``send`` of a Responses/Messages request healed through the chat
route: what the chat relay writes reaches the client as the surface's events
(:mod:`proxy.core.surfaces.via_chat`). :func:`failure_event` is the event that tells a stream's
client its answer failed, in that surface's words.
"""

from __future__ import annotations

from typing import Any

from proxy.core.chunks import named_event
from proxy.core.records import Endpoint
from proxy.core.sse import DONE_EVENT, encode_data
from proxy.core.surfaces import messages, via_chat
from proxy.errors import GuardError
from proxy.server.asgi import Message, Send


class SurfaceSend:
    """``send`` for a Responses/Messages request served through the chat route: what the chat
    relay writes goes to the client in the surface's protocol (:mod:`proxy.core.surfaces.via_chat`).

    A streamed 200 is converted event by event as it goes; any other answer (a non-streamed
    answer, an error) is held until complete, converted once and sent with its new length.
    """

    __slots__ = ("_held", "_send", "_start", "_stream", "_writer")

    def __init__(self, send: Send, writer: via_chat.Writer) -> None:
        self._send = send
        self._writer = writer
        self._stream = False
        self._start: Message | None = None
        self._held: list[bytes] = []

    @property
    def transport(self) -> Any:
        """The server's transport behind the wrapped ``send`` (see :func:`cut_response`)."""
        return getattr(getattr(self._send, "__self__", None), "transport", None)

    async def __call__(self, message: Message) -> None:
        if message["type"] == "http.response.start":
            self._stream = message["status"] == 200 and is_sse(message.get("headers", []))
            if self._stream:
                await self._send(message)
            else:
                self._start = message
            return
        if message["type"] != "http.response.body":
            await self._send(message)
            return
        body = message.get("body", b"")
        more = message.get("more_body", False)
        if self._stream:
            out = self._writer.stream(body) if body else b""
            if out or not more:
                await self._send({"type": "http.response.body", "body": out, "more_body": more})
            return
        self._held.append(body)
        if more:
            return
        start = self._start or {"type": "http.response.start", "status": 502, "headers": []}
        out = self._writer.answer(start["status"], b"".join(self._held))
        headers = [(k, v) for k, v in start.get("headers", []) if k.lower() != b"content-length"]
        headers.append((b"content-length", str(len(out)).encode()))
        await self._send({**start, "headers": headers})
        await self._send({"type": "http.response.body", "body": out})


def failure_event(protocol: Endpoint, error: GuardError) -> bytes:
    """The event that tells a stream's client the answer failed, in the surface's protocol
    (for a stream the guard did not follow: ``off`` mode, a deadline)."""
    if protocol == "messages":
        return messages.error_event(error)
    if protocol == "responses":
        err = error.to_dict()["error"]
        event = {"type": "error", "code": err.get("type"), "message": err.get("message")}
        return named_event(event)
    return encode_data(error.to_json()) + DONE_EVENT


def is_sse(headers: list[tuple[bytes, bytes]]) -> bool:
    for name, value in headers:
        if name.lower() == b"content-type":
            return value.split(b";", 1)[0].strip().lower() == b"text/event-stream"
    return False
