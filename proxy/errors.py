"""The proxy's exception tree and its two error envelopes (OpenAI's and Anthropic's).

    GuardError                      status, OpenAI ``type``, ``param``, ``code``; Anthropic type
    ├── BadRequest        400       malformed JSON, wrong field types,  invalid_request_error
    │                               max_tokens over cap (reject)
    ├── Unauthorized      401       GUARD_API_KEYS set and the key      authentication_error
    │                               is missing or wrong
    ├── Forbidden         403       x-guard-mode from a key not         permission_error
    │                               allowed to send it; a generating
    │                               route refused by
    │                               GUARD_UNGUARDED_ROUTES=reject
    ├── PayloadTooLarge   413       body over GUARD_MAX_BODY_BYTES      request_too_large
    └── UpstreamError     502/504   upstream unreachable, timed out,    api_error
        │                           or broke the protocol
        └── UpstreamTimeout   504   … timed out                         timeout_error
            └── DeadlineExceeded    the request ran past                timeout_error
                                    GUARD_REQUEST_DEADLINE

Which envelope a client gets depends on the route it called
(:func:`proxy.server.paths.error_format`): an Anthropic SDK on ``/v1/messages`` only maps errors to
its exception classes and reads their message from Anthropic's shape, ``{"type": "error", "error":
{"type", "message"}}`` (the types are the ones Anthropic documents and its SDK's ``ErrorType``
lists); every other route speaks OpenAI's ``{"error": {"message", "type", "param", "code"}}``.

    UpstreamFailure                 an UpstreamError plus its metrics label, raised by the upstream
                                    clients and the SSE parser (an event over the size cap)

Foreign exceptions (httpx, orjson) are translated at the boundary that sees them, so the rest of
the proxy only ever handles these.
"""

from __future__ import annotations

from typing import Any, Final, Literal

import orjson

#: The error envelope a route speaks.
ErrorFormat = Literal["openai", "anthropic"]

#: Anthropic's documented error types (its API's "Errors" page and the SDK's ``ErrorType``).
ANTHROPIC_TYPES: Final = frozenset(
    {
        "invalid_request_error",
        "authentication_error",
        "billing_error",
        "permission_error",
        "not_found_error",
        "request_too_large",
        "rate_limit_error",
        "timeout_error",
        "api_error",
        "overloaded_error",
    }
)


class GuardError(Exception):
    status = 500
    type = "internal_error"
    #: The ``error.type`` of Anthropic's envelope.
    anthropic_type = "api_error"

    def __init__(self, message: str, *, param: str | None = None, code: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.param = param
        self.code = code

    def to_dict(self) -> dict[str, Any]:
        return {
            "error": {
                "message": self.message,
                "type": self.type,
                "param": self.param,
                "code": self.code if self.code is not None else self.status,
            }
        }

    def to_json(self) -> bytes:
        return orjson.dumps(self.to_dict())

    def to_anthropic(self, request_id: str | None = None) -> dict[str, Any]:
        """Anthropic's envelope; ``request_id`` (the proxy's ``x-request-id``) is added when
        given, as Anthropic's own error bodies carry theirs."""
        out: dict[str, Any] = {
            "type": "error",
            "error": {"type": self.anthropic_type, "message": self.message},
        }
        if request_id is not None:
            out["request_id"] = request_id
        return out

    def render(self, fmt: ErrorFormat, request_id: str | None = None) -> bytes:
        """The response body in the envelope of ``fmt``."""
        if fmt == "anthropic":
            return orjson.dumps(self.to_anthropic(request_id))
        return self.to_json()


class BadRequest(GuardError):
    status = 400
    type = "invalid_request_error"
    anthropic_type = "invalid_request_error"


class Unauthorized(GuardError):
    status = 401
    type = "authentication_error"
    anthropic_type = "authentication_error"


class Forbidden(GuardError):
    status = 403
    type = "permission_error"
    anthropic_type = "permission_error"


class PayloadTooLarge(GuardError):
    status = 413
    type = "invalid_request_error"
    anthropic_type = "request_too_large"


class UpstreamError(GuardError):
    status = 502
    type = "upstream_error"
    anthropic_type = "api_error"


class UpstreamTimeout(UpstreamError):
    status = 504
    type = "upstream_timeout"
    anthropic_type = "timeout_error"


class DeadlineExceeded(UpstreamTimeout):
    type = "request_timeout"


class UpstreamFailure(Exception):
    """The upstream could not be reached or broke the exchange: ``error`` is what the client
    gets, ``kind`` the ``guard_proxy_upstream_errors_total`` label (connect | timeout |
    disconnect | protocol). Raised by both upstream clients and by the SSE parser, so one
    ``except UpstreamFailure`` in the relay covers every way an upstream answer can break."""

    def __init__(self, error: UpstreamError, kind: str) -> None:
        super().__init__(error.message)
        self.error = error
        self.kind = kind


#: OpenAI-envelope types the proxy writes, to Anthropic's (an error the relay recorded).
_ANTHROPIC_OF: Final = {
    cls.type: cls.anthropic_type
    for cls in (GuardError, UpstreamError, UpstreamTimeout, DeadlineExceeded)
}


def anthropic_error_object(error: dict[str, Any]) -> dict[str, Any]:
    """An ``error`` object recorded during a stream — the engine's own (already Anthropic's),
    or the proxy's in OpenAI's shape — as the ``error`` of Anthropic's envelope."""
    kind = error.get("type")
    if kind not in ANTHROPIC_TYPES:
        kind = _ANTHROPIC_OF.get(str(kind), "api_error")
    message = error.get("message")
    return {"type": kind, "message": message if isinstance(message, str) else str(message or "")}
