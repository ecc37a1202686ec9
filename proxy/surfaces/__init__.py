"""The generation surfaces beside chat and completions, each a :class:`proxy.relay.Surface`.

* :mod:`proxy.surfaces.responses` — ``POST /v1/responses`` (OpenAI Responses API): one detector
  per output item, a verdict ends the stream with ``response.incomplete``.
* :mod:`proxy.surfaces.messages` — ``POST /v1/messages`` (Anthropic Messages): one detector per
  message, a verdict ends the stream with ``message_delta`` + ``message_stop``.
* :mod:`proxy.surfaces.via_chat` — heal mode on both: the request in its chat form, and the chat
  relay's answer written back in the surface's protocol.

Pure like :mod:`proxy.relay`: events in, client bytes out.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

from proxy.surfaces.messages import MESSAGES
from proxy.surfaces.responses import RESPONSES

if TYPE_CHECKING:
    from proxy.relay import Surface

SURFACES: Mapping[str, Surface] = {"responses": RESPONSES, "messages": MESSAGES}

__all__ = ["SURFACES"]
