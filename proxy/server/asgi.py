"""ASGI plumbing shared by the middleware and the endpoints: types, errors, bodies, headers.

The endpoints are raw ASGI callables on purpose (a relay's per-chunk cost is one ``send``), so
the few things Starlette would do for them — an error response, reading a body, response
headers that every answer carries — are written once here.

Response headers that every answer must carry (``x-request-id``) travel in the scope under
:data:`RESPONSE_HEADERS`: a middleware that wrapped ``send`` to add them would put one more
coroutine call on every relayed chunk, so each endpoint writes them into its own
``http.response.start`` instead.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Iterable, MutableMapping
from typing import Any

from proxy.errors import GuardError, PayloadTooLarge
from proxy.observability import context
from proxy.server import upstream
from proxy.server.paths import error_format, relative_location

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

#: Scope key: headers every response to this request carries (a list the middleware fills).
RESPONSE_HEADERS = "guard.response_headers"
#: Scope key: the request id (str) the request-id middleware chose.
REQUEST_ID = "guard.request_id"
#: Scope key: True when the request's key may send ``x-guard-mode``.
MAY_OVERRIDE = "guard.may_override"

JSON_HEADERS = [(b"content-type", b"application/json")]
#: Upstream response headers the proxy writes itself (its server: date, server; the request
#: id middleware: x-request-id, which an engine may echo).
_OWN_HEADERS = frozenset({"date", "server", "x-request-id"})
_LOCATIONS = frozenset({b"location", b"content-location"})
#: Engine response headers never relayed, with and without its ``Content-Length``.
_SKIP_KEEP_LENGTH = (upstream.HOP_BY_HOP - {"content-length"}) | _OWN_HEADERS
_SKIP = _SKIP_KEEP_LENGTH | {"content-length"}


class ClientGone(Exception):
    """The client disconnected before the request body was complete."""


def abort_connection(send: Send) -> bool:
    """Close the client's connection at once, without flushing what is buffered for it.

    For a client that stopped reading (see :mod:`proxy.server.bounds`): a graceful close would wait
    for it to read the buffered bytes, so its socket and buffers would live as long as it
    likes. ASGI has no way to say "abort"; uvicorn's ``send`` is a bound method of its request
    cycle, which holds the transport. When ``send`` is anything else (a middleware wrapped it),
    nothing happens and the server closes the connection its own way. Returns whether it
    aborted."""
    transport = getattr(getattr(send, "__self__", None), "transport", None)
    abort = getattr(transport, "abort", None)
    if abort is None:
        return False
    abort()
    return True


async def cut_response(send: Send, linger: float) -> bool:
    """End a started response *without* its end: the connection is closed after what is
    buffered for the client, so the terminating chunk never goes out (or the body stays
    shorter than its ``Content-Length``) and every HTTP client sees an incomplete body.

    Why: the engine cut its answer. A clean end (``0\r\n\r\n``) would hand the client a
    truncated body as if it were complete. ASGI has no "abort"; uvicorn's ``send`` is a bound
    method of its request cycle, which holds the transport (see :func:`abort_connection`). A
    client that does not read what is buffered gets ``linger`` seconds, then the connection
    is aborted. Returns False when ``send`` is anything else: the caller then returns without
    ending the response and the server closes the connection its own way."""
    transport = getattr(getattr(send, "__self__", None), "transport", None)
    if transport is None or not hasattr(transport, "close"):
        return False
    if not transport.is_closing():
        transport.close()
        if transport.get_write_buffer_size():
            asyncio.get_running_loop().call_later(linger, transport.abort)
    # Let the server see the connection gone before the endpoint returns (else it reports a
    # response that was never completed).
    await asyncio.sleep(0)
    return True


class DirectBody:
    """Body chunks of a started, chunked response written straight onto the server's transport.

    Why: at real pacing each relayed token is a chunk of its own, and an ASGI ``send`` (a
    message dict, the server's ``send`` coroutine, its flow-control check) costs as much as the
    guard's work on it. With uvicorn's httptools protocol, ``send`` is a bound method of its
    request cycle, whose chunked body write is one ``transport.write`` of
    ``<hex length>\r\n<bytes>\r\n`` with no per-chunk state; this writes the same bytes.
    The end of the body still goes through ``send`` (uvicorn writes the last chunk and keeps
    its connection state). :meth:`of` returns None for anything else — another server or
    protocol, a ``send`` wrapped by a middleware, a response that is not chunked — and the
    caller keeps using ``send``.
    """

    __slots__ = ("_cycle", "_flow", "_write")

    def __init__(self, cycle: Any) -> None:
        self._cycle = cycle
        self._flow = cycle.flow
        self._write = cycle.transport.write

    @classmethod
    def of(cls, send: Send) -> DirectBody | None:
        cycle: Any = getattr(send, "__self__", None)
        if (
            type(cycle).__module__ != "uvicorn.protocols.http.httptools_impl"
            or getattr(send, "__name__", None) != "send"
        ):
            return None
        try:
            if (
                cycle.chunked_encoding is not True
                or not cycle.response_started
                or cycle.response_complete
                or cycle.disconnected
                or cycle.scope.get("method") == "HEAD"
            ):
                return None
            return cls(cycle)
        except AttributeError:  # a uvicorn whose cycle looks otherwise: keep to ``send``
            return None

    def write(self, body: bytes) -> bool:
        """Write one non-empty chunk (dropped, as ``send`` would, once the client is gone).
        False when the client is gone or not reading fast enough: the caller goes back to
        ``send``, which waits for the transport to drain."""
        if self._cycle.disconnected:
            return False
        self._write(b"%x\r\n%b\r\n" % (len(body), body))
        return not self._flow.write_paused


def scope_headers(scope: Scope) -> list[tuple[bytes, bytes]]:
    """The headers every response to this request carries (empty outside the middleware)."""
    headers: list[tuple[bytes, bytes]] = scope.get(RESPONSE_HEADERS, [])
    return headers


async def send_error(
    send: Send,
    error: GuardError,
    headers: Iterable[tuple[bytes, bytes]] = (),
    *,
    path: str | None = None,
) -> None:
    """The error as a complete response, in the envelope the clients of ``path`` read
    (Anthropic's on ``/v1/messages``, OpenAI's elsewhere and when no path is given; see
    :func:`proxy.server.paths.error_format`)."""
    if path is not None and error_format(path) == "anthropic":
        body = error.render("anthropic", context.request_id.get())
    else:
        body = error.to_json()
    await send(
        {
            "type": "http.response.start",
            "status": error.status,
            "headers": [*JSON_HEADERS, (b"content-length", str(len(body)).encode()), *headers],
        }
    )
    await send({"type": "http.response.body", "body": body})


async def read_body(receive: Receive, headers: dict[bytes, bytes], limit: int) -> bytes:
    """The whole request body, refused (413) as soon as it is known to exceed ``limit``."""
    declared = headers.get(b"content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise _too_large(limit)
    parts: list[bytes] = []
    size = 0
    while True:
        msg = await receive()
        if msg["type"] == "http.disconnect":
            raise ClientGone
        body = msg.get("body", b"")
        if body:
            size += len(body)
            if size > limit:
                raise _too_large(limit)
            parts.append(body)
        if not msg.get("more_body", False):
            break
    return parts[0] if len(parts) == 1 else b"".join(parts)


def _too_large(limit: int) -> PayloadTooLarge:
    return PayloadTooLarge(
        f"The request body is larger than this deployment's limit of {limit} bytes.",
        code="payload_too_large",
    )


def response_headers(
    raw: Iterable[tuple[bytes, bytes]], engine_url: str, *, keep_length: bool
) -> list[tuple[bytes, bytes]]:
    """An engine response's headers for the client: hop-by-hop and server-owned ones dropped,
    those the engine's ``Connection`` header names too (RFC 9110 §7.6.1: they were meant for
    the proxy's hop, and the proxy's own server writes its own ``Connection``), an absolute
    ``Location``/``Content-Location`` naming the engine made relative (see
    :func:`proxy.server.paths.relative_location`)."""
    pairs = raw if isinstance(raw, list) else list(raw)
    skip = _SKIP_KEEP_LENGTH if keep_length else _SKIP
    for k, v in pairs:
        if k.lower() == b"connection":
            skip = skip | {t.strip().lower() for t in v.decode("latin-1").split(",") if t.strip()}
    out = []
    for k, v in pairs:
        name = k.lower()
        if name.decode("latin-1") in skip:
            continue
        if name in _LOCATIONS:
            v = relative_location(v, engine_url)
        out.append((k, v))
    return out
