"""Per-request context that crosses module boundaries without being passed around.

The request id is set by the request-id middleware for the task that serves one request and read
by the log formatter, so every log line written while serving a request names it; a contextvar
(not a global) because one worker serves many requests concurrently on one event loop.
"""

from __future__ import annotations

from contextvars import ContextVar

#: The id of the request being served (``x-request-id``), or ``None`` outside a request.
request_id: ContextVar[str | None] = ContextVar("coherence_guard_request_id", default=None)
