"""Heal mode on ``/v1/responses`` and ``/v1/messages``: the request is served by the engine's chat
route and the answer written in the surface's own protocol.

Why through chat: healing continues a cut answer from the text before the loop, and vLLM 0.32
continues a text only on chat (``continue_final_message``). Its Messages route builds a chat
request and sets neither that nor ``add_generation_prompt`` (and the request's values override
``chat_template_kwargs``), so a continuation cannot be asked for there; its Responses route can
continue an ``incomplete`` assistant item, but splicing a second Responses stream (new item ids,
a second ``response.created``, sequence numbers from 0) into the first is more state than
converting once. vLLM serves Messages the same way internally: it converts the request to chat.

So, for a request these can express exactly (text turns, system text, sampling fields the chat
route takes; anything else — tools, images, reasoning settings, server-side state — keeps the
native route and ``enforce``'s ending), :func:`to_chat` builds the chat request vLLM's own
conversion would build, the ordinary chat heal relay runs, and a :class:`Writer` turns what that
relay would have sent a chat client (SSE chunks or one JSON answer, errors included) into the
surface's events or JSON. Pure: bytes and dicts in, bytes out; the shell wraps ``send`` with it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from proxy.core.surfaces.via_chat.messages import MessagesWriter
from proxy.core.surfaces.via_chat.request import to_chat
from proxy.core.surfaces.via_chat.responses import ResponsesWriter
from proxy.core.surfaces.via_chat.writer import Writer

if TYPE_CHECKING:
    from proxy.core.records import Endpoint

__all__ = ["MessagesWriter", "ResponsesWriter", "Writer", "to_chat", "writer"]


def writer(
    endpoint: Endpoint,
    request: dict[str, Any],
    abort_finish_reason: str,
    abort_event: str = "completed",
) -> Writer:
    """The writer for ``endpoint``'s protocol; ``request`` is the client's rewritten body;
    ``abort_event`` is GUARD_RESPONSES_ABORT_EVENT."""
    if endpoint == "messages":
        return MessagesWriter(request, abort_finish_reason)
    return ResponsesWriter(request, abort_finish_reason, abort_event)
