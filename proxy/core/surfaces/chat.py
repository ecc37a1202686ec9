"""Chat and completions as a surface: the guard's own event handler, the hot path.

The Responses and Messages surfaces keep per-surface state and rewrite events; chat and
completions are relayed by :meth:`proxy.core.guard.StreamGuard._event` itself, and their
non-streamed answers rebuilt by :func:`proxy.core.reassemble.chat_response`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from proxy.core.reassemble import chat_response
from proxy.core.sse import DONE_EVENT, encode_data

if TYPE_CHECKING:
    from proxy.core.relay_types import GuardView
    from proxy.errors import GuardError


class ChatSurface:
    """Chat and completions: the event handler is :meth:`StreamGuard._event` itself."""

    def event(self, guard: GuardView, raw: bytes, data: bytes | None) -> bytes:
        return guard._event(raw, data)

    def failure(self, guard: GuardView, error: GuardError) -> bytes:
        return encode_data(error.to_json()) + DONE_EVENT

    def response(self, guard: GuardView, trim: bool) -> dict[str, Any]:
        return chat_response(guard, trim=trim)


CHAT = ChatSurface()
