"""The chat request a Responses or Messages request becomes when it is healed through the chat
route: what vLLM's own conversion would build, for the requests that can be expressed exactly
(text turns, system text, sampling fields the chat route takes). Anything else keeps the native
route: :func:`to_chat` says why in a string.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any

from proxy.core.rewrite import SURFACE_SAMPLING_FIELDS

if TYPE_CHECKING:
    from proxy.core.records import Endpoint
    from proxy.core.rewrite import Rewrite


#: Sampling fields each surface passes to the engine that the chat route takes as they are
#: (Messages' ``stop_sequences`` becomes chat's ``stop``).
_SAMPLING = {
    endpoint: tuple(sorted(fields - {"stop_sequences"}))
    for endpoint, fields in SURFACE_SAMPLING_FIELDS.items()
}


#: Fields that change nothing in the generated text, so a healed request may ignore them.
_INERT = {
    "responses": frozenset(
        {"model", "input", "instructions", "max_output_tokens", "stream", "store", "metadata",
         "user", "service_tier", "parallel_tool_calls", "truncation", "include",
         "stream_options", "prompt_cache_key", "safety_identifier", "background"}
    ),
    "messages": frozenset(
        {"model", "messages", "system", "max_tokens", "stream", "metadata", "stop_sequences",
         "service_tier"}
    ),
}  # fmt: skip


_BILLING_HEADER = "x-anthropic-billing-header"


def to_chat(endpoint: Endpoint, rw: Rewrite, *, usage: bool, logprobs: bool) -> Rewrite | str:
    """The chat form of ``rw`` (a rewritten Responses or Messages request), or why there is
    none (a short reason, for the log and the ``unhealable`` counter)."""
    body = rw.body
    messages = chat_messages(endpoint, body)
    if isinstance(messages, str):
        return messages
    out: dict[str, Any] = {"messages": messages}
    if body.get("model") is not None:
        out["model"] = body["model"]
    for key in _SAMPLING[endpoint]:
        if body.get(key) is not None:
            out[key] = body[key]
    if endpoint == "messages" and body.get("stop_sequences"):
        out["stop"] = body["stop_sequences"]
    if not rw.engine_limited:  # else the engine's own limit applies here too
        out["max_tokens"] = rw.max_tokens
    out["stream"] = True
    if usage:
        out["stream_options"] = {"include_usage": True, "continuous_usage_stats": True}
    if logprobs:
        out["logprobs"] = True
        out["top_logprobs"] = 0
    return dataclasses.replace(
        rw, body=out, client_wants_usage=True, n=1, injected_logprobs=logprobs
    )


def chat_messages(endpoint: Endpoint, body: dict[str, Any]) -> list[dict[str, Any]] | str:
    """The chat messages of a Responses or Messages request that the chat route expresses
    exactly (the prompt the engine builds from them is the same), or why there are none."""
    if endpoint == "responses" and body.get("store") is True:
        # A stored response is one a later request may name (previous_response_id); a healed
        # answer is never stored by the engine, so a client that asks for storage keeps the
        # native route. (vLLM stores nothing unless VLLM_ENABLE_RESPONSES_API_STORE is set.)
        return "field:store"
    for key, value in body.items():
        if key in _INERT[endpoint] or key in _SAMPLING[endpoint]:
            continue
        if endpoint == "responses" and _default(key, value):
            continue
        return f"field:{key}"
    return _responses_messages(body) if endpoint == "responses" else _messages_messages(body)


def _default(key: str, value: Any) -> bool:
    """A Responses field at a value that asks for nothing beyond plain text."""
    if key not in ("tools", "text", "tool_choice", "reasoning"):
        return False
    if value is None:
        return True
    if key == "tools":
        return bool(value == [])
    if key == "tool_choice":
        return value in ("none", "auto")
    if key == "text":
        fmt = value.get("format") if isinstance(value, dict) else None
        return isinstance(value, dict) and (fmt is None or fmt == {"type": "text"})
    return False


def _text_parts(content: Any, kinds: tuple[str, ...]) -> list[str] | None:
    """The texts of a content list made only of text parts (``None`` otherwise)."""
    if not isinstance(content, list):
        return None
    texts = []
    for part in content:
        if not isinstance(part, dict) or part.get("type") not in kinds:
            return None
        text = part.get("text")
        if not isinstance(text, str):
            return None
        if text:
            texts.append(text)
    return texts


def _messages_messages(body: dict[str, Any]) -> list[dict[str, Any]] | str:
    """vLLM's Messages → chat conversion, for text only: the system text joined, each turn's
    text blocks as one string (one block) or text parts (several)."""
    out: list[dict[str, Any]] = []
    system = body.get("system")
    if isinstance(system, str):
        parts = [system] if system else []
    elif system is None:
        parts = []
    else:
        found = _text_parts(system, ("text",))
        if found is None:
            return "system"
        parts = [t for t in found if not t.startswith(_BILLING_HEADER)]
    if parts:
        out.append({"role": "system", "content": "".join(parts)})
    for message in body["messages"]:
        if not isinstance(message, dict) or message.get("role") not in ("user", "assistant"):
            return "messages"
        content = message.get("content")
        if isinstance(content, str):
            out.append({"role": message["role"], "content": content})
            continue
        texts = _text_parts(content, ("text",))
        if texts is None:
            return "content"
        if not texts:
            if message["role"] == "user":
                continue
            return "content"
        value: Any = texts[0] if len(texts) == 1 else [{"type": "text", "text": t} for t in texts]
        out.append({"role": message["role"], "content": value})
    return out


def _responses_messages(body: dict[str, Any]) -> list[dict[str, Any]] | str:
    """vLLM's Responses input → chat messages, for text only: ``instructions`` as the system
    message, a string input as one user turn, message items with text parts as turns."""
    out: list[dict[str, Any]] = []
    instructions = body.get("instructions")
    if isinstance(instructions, str) and instructions:
        out.append({"role": "system", "content": instructions})
    value = body["input"]
    if isinstance(value, str):
        out.append({"role": "user", "content": value})
        return out
    for item in value:
        if not isinstance(item, dict) or item.get("type", "message") != "message":
            return "input"
        role = item.get("role")
        if role not in ("user", "assistant", "system", "developer"):
            return "input"
        if item.get("status") in ("in_progress", "incomplete"):
            return "input"  # vLLM would continue it; the healed form would not
        content = item.get("content")
        if isinstance(content, str):
            text = content
        else:
            texts = _text_parts(content, ("input_text", "output_text"))
            if texts is None:
                return "content"
            text = "".join(texts)
        out.append({"role": "system" if role == "developer" else role, "content": text})
    return out
