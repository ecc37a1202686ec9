"""The Responses writer of heal through the chat route: the lifecycle events of one response
(created, items, parts, deltas, the terminal event) and its final object, from what the chat
relay wrote.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import orjson

from proxy.core.chunks import named_event
from proxy.core.surfaces.responses import (
    abort_item_status,
    incomplete_reason,
    item_done_event,
    part_done_events,
    responses_usage,
    terminal_event,
)
from proxy.core.surfaces.via_chat.writer import Block, Writer, suffix

if TYPE_CHECKING:
    pass


class ResponsesWriter(Writer):
    """OpenAI Responses: ``response.created``/``in_progress``, an output item per reasoning/text
    run (added, part added, deltas, done events), then ``response.completed`` — with ``status:
    "incomplete"`` for a length stop or the guard's abort, as vLLM ends one, unless
    ``abort_event`` asks for ``response.incomplete`` — as on the native route."""

    def __init__(
        self, request: dict[str, Any], abort_finish_reason: str, abort_event: str = "completed"
    ) -> None:
        super().__init__(request, abort_finish_reason)
        self._seq = -1
        self.abort_event = abort_event

    def _emit(self, obj: dict[str, Any]) -> bytes:
        self._seq += 1
        obj["sequence_number"] = self._seq
        return named_event(obj)

    def error_body(self, status: int, value: dict[str, Any]) -> bytes:
        return orjson.dumps(value)  # the chat route's OpenAI envelope is the Responses one

    def _error_event(self, error: dict[str, Any]) -> bytes:
        return self._emit(
            {
                "type": "error",
                "code": error.get("type"),
                "message": error.get("message"),
                "param": error.get("param"),
            }
        )

    def _response(self, status: str) -> dict[str, Any]:
        req = self.request
        return {
            "id": "resp_" + suffix(self._id),
            "object": "response",
            "created_at": self._created,
            "status": status,
            "model": self._model,
            "output": [],
            "instructions": req.get("instructions"),
            "max_output_tokens": req.get("max_output_tokens"),
            "temperature": req.get("temperature"),
            "top_p": req.get("top_p"),
            "tools": [],
            "tool_choice": "auto",
            "parallel_tool_calls": True,
            "metadata": req.get("metadata"),
            "incomplete_details": None,
            "error": None,
            "usage": None,
        }

    def _start(self) -> bytes:
        response = self._response("in_progress")
        return self._emit({"type": "response.created", "response": response}) + self._emit(
            {"type": "response.in_progress", "response": response}
        )

    def _name(self, block: Block) -> None:
        prefix = "rs_" if block.kind == "reasoning" else "msg_"
        block.item_id = f"{prefix}{suffix(self._id)}{block.index}"

    def _part(self, block: Block, text: str) -> dict[str, Any]:
        if block.kind == "reasoning":
            return {"type": "reasoning_text", "text": text}
        return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}

    def _item(self, block: Block, status: str, text: str | None) -> dict[str, Any]:
        if block.kind == "reasoning":
            content = [] if text is None else [self._part(block, text)]
            return {
                "id": block.item_id,
                "type": "reasoning",
                "summary": [],
                "content": content,
                "status": status,
            }
        return {
            "id": block.item_id,
            "type": "message",
            "role": "assistant",
            "status": status,
            "content": [] if text is None else [self._part(block, text)],
        }

    def _open(self, block: Block) -> bytes:
        self._name(block)
        where = {"item_id": block.item_id, "output_index": block.index, "content_index": 0}
        return self._emit(
            {
                "type": "response.output_item.added",
                "output_index": block.index,
                "item": self._item(block, "in_progress", None),
            }
        ) + self._emit(
            {"type": "response.content_part.added", **where, "part": self._part(block, "")}
        )

    def _text(self, block: Block, text: str) -> bytes:
        where = {"item_id": block.item_id, "output_index": block.index, "content_index": 0}
        if block.kind == "reasoning":
            return self._emit({"type": "response.reasoning_text.delta", **where, "delta": text})
        return self._emit(
            {"type": "response.output_text.delta", **where, "delta": text, "logprobs": []}
        )

    def _item_status(self) -> str:
        if self._status() == "completed":
            return "completed"
        return abort_item_status(self.abort_event)

    def _close(self, block: Block) -> bytes:
        text = block.text
        # A block closed before the end (reasoning, then text) is complete either way.
        last = block is self._blocks[-1] and self._ended
        status = self._item_status() if last else "completed"
        part = self._part(block, "")
        events = part_done_events(block.item_id, block.index, 0, part, text)
        events.append(item_done_event(self._item(block, status, text), block.index))
        return b"".join(self._emit(event) for event in events)

    def _status(self) -> str:
        if self._aborted() or self._finish == "length":
            return "incomplete"
        return "completed"

    def _final(self) -> dict[str, Any]:
        status = self._status()
        response = self._response(status)
        output = []
        for block in self._blocks:
            last = block is self._blocks[-1]
            output.append(
                self._item(block, self._item_status() if last else "completed", block.text)
            )
        response["output"] = output
        if status == "incomplete":
            reason = (
                incomplete_reason(self.abort_finish_reason)
                if self._aborted()
                else "max_output_tokens"
            )
            details: dict[str, Any] = {"reason": reason}
            if self._guard is not None:
                details["guard"] = self._guard
            response["incomplete_details"] = details
        elif self._guard is not None:
            response["guard"] = self._guard  # healed: the answer is complete, and says so
        response["usage"] = responses_usage(
            self._input_tokens, self._output_tokens, self._reasoning_tokens
        )
        return response

    def _finish_events(self) -> bytes:
        response = self._final()
        kind = terminal_event(response["status"], self.abort_event)
        return self._emit({"type": kind, "response": response})
