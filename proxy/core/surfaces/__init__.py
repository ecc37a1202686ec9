"""The generation surfaces beside chat and completions, each a :class:`proxy.core.guard.Surface`.

* :mod:`proxy.core.surfaces.chat` — chat and completions: the guard's own event handler.
* :mod:`proxy.core.surfaces.responses` — ``POST /v1/responses`` (OpenAI Responses API): one
  detector per output item, a verdict ends the stream with ``response.completed`` whose status is
  ``incomplete`` (as the engine ends a response it stopped early).
* :mod:`proxy.core.surfaces.messages` — ``POST /v1/messages`` (Anthropic Messages): one detector
  per message, a verdict ends the stream with ``message_delta`` + ``message_stop``.
* :mod:`proxy.core.surfaces.via_chat` — heal mode on both: the request in its chat form, and the
  chat relay's answer written back in the surface's protocol.

Pure like :mod:`proxy.core.guard`: events in, client bytes out.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

from proxy.core.records import Endpoint
from proxy.core.surfaces.chat import CHAT
from proxy.core.surfaces.messages import MESSAGES
from proxy.core.surfaces.responses import RESPONSES

if TYPE_CHECKING:
    from proxy.core.relay_types import Surface

SURFACES: Mapping[str, Surface] = {"responses": RESPONSES, "messages": MESSAGES}

__all__ = ["CHAT", "SURFACES", "surface_for"]


def surface_for(endpoint: Endpoint) -> Surface:
    """The surface that relays ``endpoint``."""
    if endpoint in ("chat", "completions"):
        return CHAT
    return SURFACES[endpoint]
