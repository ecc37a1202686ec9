"""The Messages writer of heal through the chat route: Anthropic's events and message object, its
error envelope and status types, from what the chat relay wrote.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import orjson

from proxy.core.chunks import named_event
from proxy.core.surfaces.messages import FINISH_REASONS, messages_usage, stop_reason
from proxy.core.surfaces.via_chat.writer import Block, Writer, suffix
from proxy.errors import anthropic_error_object

if TYPE_CHECKING:
    pass


#: Anthropic's error type for each status an engine's chat route may answer with.
_ANTHROPIC_STATUS = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    422: "invalid_request_error",
    429: "rate_limit_error",
    504: "timeout_error",
    529: "overloaded_error",
}


#: Chat finish reasons to Anthropic stop reasons (the inverse of the Messages reader's map).
_STOP_REASONS = {v: k for k, v in FINISH_REASONS.items() if k != "stop_sequence"}


class MessagesWriter(Writer):
    """Anthropic Messages: ``message_start``, a block per reasoning/text run, ``message_delta``
    with the stop reason (and the ``guard`` object when the guard acted), ``message_stop``."""

    def error_body(self, status: int, value: dict[str, Any]) -> bytes:
        if value.get("type") == "error":
            return orjson.dumps(value)  # already Anthropic's (the proxy's own errors)
        err = value.get("error")
        error = anthropic_error_object(err if isinstance(err, dict) else value)
        if error["type"] == "api_error" and status in _ANTHROPIC_STATUS:
            # The engine's chat route names its errors its own way; the status says which
            # of Anthropic's types it is (the SDK picks its exception from the status).
            error["type"] = _ANTHROPIC_STATUS[status]
        return orjson.dumps({"type": "error", "error": error})

    def _error_event(self, error: dict[str, Any]) -> bytes:
        return named_event({"type": "error", "error": anthropic_error_object(error)})

    def _message(self) -> dict[str, Any]:
        return {
            "id": "msg_" + suffix(self._id),
            "type": "message",
            "role": "assistant",
            "model": self._model,
            "content": [],
            "stop_reason": None,
            "stop_sequence": None,
            "usage": messages_usage(self._input_tokens, 0),
        }

    def _start(self) -> bytes:
        return named_event({"type": "message_start", "message": self._message()})

    def _name(self, block: Block) -> None:
        pass

    def _content_block(self, block: Block, text: str) -> dict[str, Any]:
        if block.kind == "reasoning":
            return {"type": "thinking", "thinking": text, "signature": ""}
        return {"type": "text", "text": text}

    def _open(self, block: Block) -> bytes:
        return named_event(
            {
                "type": "content_block_start",
                "index": block.index,
                "content_block": self._content_block(block, ""),
            }
        )

    def _text(self, block: Block, text: str) -> bytes:
        delta = (
            {"type": "thinking_delta", "thinking": text}
            if block.kind == "reasoning"
            else {"type": "text_delta", "text": text}
        )
        return named_event({"type": "content_block_delta", "index": block.index, "delta": delta})

    def _close(self, block: Block) -> bytes:
        return named_event({"type": "content_block_stop", "index": block.index})

    def _stop_fields(self) -> dict[str, Any]:
        if self._aborted():
            reason = stop_reason(self.abort_finish_reason)
            out: dict[str, Any] = {"stop_reason": reason, "stop_sequence": None}
            if reason == "refusal":
                signal = (self._guard or {}).get("signal", "unknown")
                out["stop_details"] = {
                    "type": "refusal",
                    "category": None,
                    "explanation": f"coherence_guard:{signal}",
                }
        elif self._finish == "stop" and isinstance(self._stop, str):
            out = {"stop_reason": "stop_sequence", "stop_sequence": self._stop}
        else:
            out = {"stop_reason": _STOP_REASONS.get(self._finish or "stop", "end_turn")}
            out["stop_sequence"] = None
        if self._guard is not None:
            out["guard"] = self._guard
        return out

    def _finish_events(self) -> bytes:
        usage = messages_usage(self._input_tokens, self._output_tokens)
        return named_event(
            {"type": "message_delta", "delta": self._stop_fields(), "usage": usage}
        ) + named_event({"type": "message_stop"})

    def _final(self) -> dict[str, Any]:
        message = self._message()
        message["content"] = [self._content_block(b, b.text) for b in self._blocks]
        message.update(self._stop_fields())
        message["usage"]["output_tokens"] = self._output_tokens
        return message
