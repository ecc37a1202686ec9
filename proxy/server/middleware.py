"""Pure-ASGI middleware for what every request needs: a request id, a canonical path, a key.

Pure ASGI (not ``BaseHTTPMiddleware``) so that nothing buffers a stream or adds a task per
request, and none of them wraps ``send``: the headers they want on the answer go into the scope
(:data:`proxy.server.asgi.RESPONSE_HEADERS`) and the endpoint writes them, so a relayed chunk costs
exactly one ``send`` however many of these run.

Order (outermost first): :class:`RequestId` → :class:`CanonicalPath` → :class:`Auth` → the
user's ``app.add_middleware(...)`` → the dispatcher. So an error from any of them already
carries the request id, and the key check sees the canonical path (a spelling cannot reach a
protected route unchecked).
"""

from __future__ import annotations

import hmac
import re
import uuid
from collections.abc import Iterable

from proxy.errors import BadRequest, Unauthorized
from proxy.observability import context
from proxy.server.asgi import (
    MAY_OVERRIDE,
    REQUEST_ID,
    RESPONSE_HEADERS,
    ASGIApp,
    Receive,
    Scope,
    Send,
    scope_headers,
    send_error,
)
from proxy.server.paths import (
    ENGINE_METRICS_ROUTE,
    METRICS_ROUTES,
    OWN_ROUTES,
    PathError,
    canonical_path,
    wire_path,
)

#: A client's ``x-request-id`` is kept when it looks like an id, not like a payload.
_SANE_ID = re.compile(rb"[A-Za-z0-9._:\-]{1,128}")


class RequestId:
    """``x-request-id``: the client's when sane (≤ 128 of ``[A-Za-z0-9._:-]``), else a fresh
    uuid4 hex. Put into the scope (the endpoints answer with it and forward it to the engine)
    and into :data:`proxy.observability.context.request_id` for the log formatter."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        rid: bytes | None = None
        for name, value in scope["headers"]:
            if name == b"x-request-id":
                rid = value
                break
        if rid is None or _SANE_ID.fullmatch(rid) is None:
            rid = uuid.uuid4().hex.encode()
        text = rid.decode("ascii")
        scope[REQUEST_ID] = text
        scope[RESPONSE_HEADERS] = [(b"x-request-id", rid)]
        token = context.request_id.set(text)
        try:
            await self.app(scope, receive, send)
        finally:
            context.request_id.reset(token)


class CanonicalPath:
    """Rewrite ``path``/``raw_path`` to the canonical spelling (see :mod:`proxy.server.paths`); 400
    for a path that cannot be normalised. Everything inside sees, routes on and forwards only
    the canonical path."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            raw = scope.get("raw_path") or scope["path"].encode("utf-8")
            try:
                path = canonical_path(raw)
            except PathError as exc:
                error = BadRequest(str(exc), code="invalid_path")
                await send_error(send, error, scope_headers(scope), path=scope["path"])
                return
            if path != scope["path"] or raw != path.encode():
                scope["path"] = path
                scope["raw_path"] = wire_path(path).encode("ascii")
        await self.app(scope, receive, send)


class Auth:
    """Client keys (``Authorization: Bearer``, or ``x-api-key``): GUARD_API_KEYS guard every
    route except the proxy's own (``/health``, ``/ready``, ``/metrics``, ``/metrics/quality``:
    open unless GUARD_PROTECT_METRICS). GUARD_PROTECT_METRICS puts ``/metrics``,
    ``/metrics/quality`` and the engine's ``/metrics/engine`` (relayed) behind GUARD_API_KEYS
    or GUARD_METRICS_API_KEYS. Without it ``/metrics/engine`` is a relayed route like any
    other (GUARD_API_KEYS only).

    A request that repeats a credential header (two ``Authorization``, two ``x-api-key``) is
    refused with 400 when keys are checked: the proxy would check one and the engine might
    read the other.

    Also decides whether this request may send ``x-guard-mode``: with GUARD_OVERRIDE_API_KEYS
    set, only those keys may (they are accepted as API keys too); unset, any accepted client
    may. The guarded endpoint reads the answer from the scope (:data:`MAY_OVERRIDE`)."""

    def __init__(
        self,
        app: ASGIApp,
        *,
        api_keys: Iterable[str],
        override_keys: Iterable[str],
        metrics_keys: Iterable[str],
        protect_metrics: bool,
    ) -> None:
        self.app = app
        self.override = [k.encode() for k in override_keys]
        self.keys = [k.encode() for k in api_keys]
        if self.keys:
            self.keys += self.override
        self.metrics_keys = (
            [*self.keys, *(k.encode() for k in metrics_keys)] if protect_metrics else None
        )

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        path = scope["path"]
        if path in OWN_ROUTES:
            keys = self.metrics_keys if path in METRICS_ROUTES else None
        elif path == ENGINE_METRICS_ROUTE and self.metrics_keys is not None:
            keys = self.metrics_keys
        else:
            keys = self.keys or None
        try:
            key = _client_key(scope["headers"])
        except _Ambiguous:
            if keys is not None or self.override:
                ambiguous = BadRequest(
                    "The request carries more than one API key header.",
                    code="ambiguous_api_key",
                )
                await send_error(send, ambiguous, scope_headers(scope), path=path)
                return
            key = None
        if keys is not None and (key is None or not _match(key, keys)):
            error = Unauthorized("Invalid or missing API key.", code="invalid_api_key")
            await send_error(send, error, scope_headers(scope), path=path)
            return
        scope[MAY_OVERRIDE] = not self.override or (key is not None and _match(key, self.override))
        await self.app(scope, receive, send)


class _Ambiguous(Exception):
    """A credential header came more than once."""


def _client_key(headers: Iterable[tuple[bytes, bytes]]) -> bytes | None:
    """The key the client sent: ``Authorization: Bearer <key>`` (OpenAI's SDKs), else
    ``x-api-key: <key>`` (Anthropic's SDK sends its ``api_key`` only there, so without it an
    Anthropic client could authenticate only through ``auth_token``). Raises
    :class:`_Ambiguous` when either header is repeated."""
    bearer: bytes | None = None
    api_key: bytes | None = None
    seen_auth = False
    for name, value in headers:
        if name == b"authorization":
            if seen_auth:
                raise _Ambiguous
            seen_auth = True
            scheme, _, key = value.partition(b" ")
            if scheme.lower() == b"bearer":
                bearer = key.strip()
        elif name == b"x-api-key":
            if api_key is not None:
                raise _Ambiguous
            api_key = value.strip()
    return bearer if bearer is not None else api_key


def _match(key: bytes, keys: list[bytes]) -> bool:
    """Constant time per key, and every key compared (no early exit that times the list)."""
    found = False
    for k in keys:
        found |= hmac.compare_digest(key, k)
    return found
