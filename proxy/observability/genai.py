"""The GenAI semantic conventions' attributes of a guarded request, from what the guard knows.

Pure: the request's own fields, the engine's URL and the name the engine gives itself in, out
come ``gen_ai.*`` and ``server.*`` attributes (``open-telemetry/semantic-conventions-genai``,
``client-inference.md``). :mod:`proxy.observability.tracing` puts them on the model call's span.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final
from urllib.parse import urlsplit

#: ``gen_ai.operation.name`` per guarded surface (the GenAI conventions' well-known values).
OPERATIONS: Final = {
    "chat": "chat",
    "completions": "text_completion",
    "responses": "chat",
    "messages": "chat",
}
#: ``gen_ai.provider.name`` of an engine, by the ``owned_by`` of its model list
#: (:func:`proxy.server.engine_context.model_owner`). None of these engines is among the
#: conventions' well-known providers (which name hosted services: ``openai``, ``anthropic``,
#: ...), so each is its own custom value, as the conventions allow.
PROVIDERS: Final = {
    "vllm": "vllm",
    "llamacpp": "llama.cpp",
    "sglang": "sglang",
    "openai": "openai",
}
#: An engine whose model list named none of :data:`PROVIDERS` (or was not read yet): the guard
#: knows only that it speaks the OpenAI-compatible API.
OPENAI_COMPATIBLE: Final = "openai_compatible"
#: The client's token limit on each surface, in the order the engine reads them (chat:
#: ``max_completion_tokens`` wins over ``max_tokens``).
_LIMITS: Final = {
    "chat": ("max_completion_tokens", "max_tokens"),
    "completions": ("max_tokens",),
    "responses": ("max_output_tokens",),
    "messages": ("max_tokens",),
}
#: Request fields → ``gen_ai.request.*`` numbers (``float``: a double in the conventions).
_SAMPLING: Final = (
    ("temperature", "gen_ai.request.temperature", float),
    ("top_p", "gen_ai.request.top_p", float),
    ("top_k", "gen_ai.request.top_k", int),
    ("frequency_penalty", "gen_ai.request.frequency_penalty", float),
    ("presence_penalty", "gen_ai.request.presence_penalty", float),
    ("seed", "gen_ai.request.seed", int),
)


def provider_name(owner: str | None) -> str:
    """``gen_ai.provider.name`` for an engine whose model list says ``owned_by: owner``."""
    return PROVIDERS.get((owner or "").lower(), OPENAI_COMPATIBLE)


def server_attributes(url: str) -> dict[str, Any]:
    """``server.address`` and ``server.port`` of the engine at ``url`` (the port the scheme
    implies when the URL names none)."""
    parts = urlsplit(url)
    if not parts.hostname:
        return {}
    port = parts.port or (443 if parts.scheme == "https" else 80)
    return {"server.address": parts.hostname, "server.port": port}


def _number(value: Any, kind: type) -> int | float | None:
    if type(value) is bool or not isinstance(value, int | float):
        return None
    if kind is int:
        return value if isinstance(value, int) else None
    return float(value)


def request_attributes(endpoint: str, body: Mapping[str, Any]) -> dict[str, Any]:
    """The ``gen_ai.request.*`` attributes of the client's own request ``body`` on
    ``endpoint``: sampling settings, stop sequences, token limit and choice count as the client
    sent them. What the guard added or changed (a default limit, sampling defaults, heal's
    penalties) is not the client's request and stays out; fields of the wrong type are left
    out rather than guessed."""
    out: dict[str, Any] = {}
    for field, name, kind in _SAMPLING:
        value = _number(body.get(field), kind)
        if value is not None:
            out[name] = value
    for field in _LIMITS.get(endpoint, ()):
        limit = _number(body.get(field), int)
        if limit is not None:
            out["gen_ai.request.max_tokens"] = limit
            break
    stop = body.get("stop_sequences" if endpoint == "messages" else "stop")
    if isinstance(stop, str):
        stop = [stop]
    if isinstance(stop, list) and stop and all(isinstance(s, str) for s in stop):
        out["gen_ai.request.stop_sequences"] = stop
    n = _number(body.get("n"), int)
    if n is not None and n != 1:
        out["gen_ai.request.choice.count"] = n
    return out
