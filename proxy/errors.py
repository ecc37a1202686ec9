"""The proxy's exception tree and the OpenAI-shaped error envelope.

    GuardError                      status, OpenAI ``type``, ``param``, ``code``
    ├── BadRequest        400       malformed JSON, wrong field types, max_tokens over cap (reject)
    ├── Unauthorized      401       GUARD_API_KEYS set and the key is missing or wrong
    ├── Forbidden         403       x-guard-mode from a key not allowed to send it; a
    │                               generating route refused by GUARD_UNGUARDED_ROUTES=reject
    ├── PayloadTooLarge   413       body over GUARD_MAX_BODY_BYTES
    └── UpstreamError     502/504   upstream unreachable, timed out, or broke the protocol
        └── UpstreamTimeout   504   … timed out
            └── DeadlineExceeded    the request ran past GUARD_REQUEST_DEADLINE

    UpstreamFailure                 an UpstreamError plus its metrics label, raised by the upstream
                                    clients and the SSE parser (an event over the size cap)

Foreign exceptions (httpx, orjson) are translated at the boundary that sees them, so the rest of
the proxy only ever handles these.
"""

from __future__ import annotations

from typing import Any

import orjson


class GuardError(Exception):
    status = 500
    type = "internal_error"

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


class BadRequest(GuardError):
    status = 400
    type = "invalid_request_error"


class Unauthorized(GuardError):
    status = 401
    type = "authentication_error"


class Forbidden(GuardError):
    status = 403
    type = "permission_error"


class PayloadTooLarge(GuardError):
    status = 413
    type = "invalid_request_error"


class UpstreamError(GuardError):
    status = 502
    type = "upstream_error"


class UpstreamTimeout(UpstreamError):
    status = 504
    type = "upstream_timeout"


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
