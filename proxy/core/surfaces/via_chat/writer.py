"""The writer base of heal through the chat route: what the chat relay would have sent a chat
client (SSE chunks or one JSON answer, errors included), read block by block (reasoning, text),
for a surface writer to turn into its own events or JSON.
"""

from __future__ import annotations

import dataclasses
import time
from typing import TYPE_CHECKING, Any

import orjson

from proxy.core.chunks import REASONING_KEYS
from proxy.core.sse import SSEParser

if TYPE_CHECKING:
    pass


@dataclasses.dataclass(slots=True)
class Block:
    """One thing the answer is made of, in order: reasoning or text."""

    kind: str  # "reasoning" | "text"
    index: int
    item_id: str = ""
    texts: list[str] = dataclasses.field(default_factory=list)

    @property
    def text(self) -> str:
        return "".join(self.texts)


class Writer:
    """What the chat relay writes for one request, in a surface's protocol.

    ``stream`` turns chat SSE bytes into the surface's events (whole events in, whole events
    out; a partial event waits); ``answer`` turns a complete non-streamed chat answer (or an
    error body) into the surface's JSON.
    """

    def __init__(self, request: dict[str, Any], abort_finish_reason: str) -> None:
        self.request = request
        self.abort_finish_reason = abort_finish_reason
        self._parser = SSEParser()
        self._started = False
        self._ended = False
        self._blocks: list[Block] = []
        self._id = ""
        self._model = request.get("model")
        self._created = int(time.time())
        #: The engine's count of the prompt, once a chunk's usage carried it.
        self._input_tokens: int | None = None
        self._output_tokens = 0
        self._finish: str | None = None
        self._stop: Any = None
        self._guard: dict[str, Any] | None = None
        #: Reasoning deltas seen (one token each, as the native relay counts them).
        self._reasoning_tokens = 0

    # -------------------------------------------------------------- streaming
    def stream(self, data: bytes) -> bytes:
        out: list[bytes] = []
        for event in self._parser.feed(data):
            if self._ended or event.data is None:
                continue
            if event.data == b"[DONE]":
                out.append(self._end())
                continue
            try:
                chunk = orjson.loads(event.data)
            except orjson.JSONDecodeError:
                continue
            if not isinstance(chunk, dict):
                continue
            if "error" in chunk and "choices" not in chunk:
                error = chunk["error"] if isinstance(chunk["error"], dict) else {}
                out.append(self._error_event(error))
                self._ended = True
                continue
            out.append(self._chunk(chunk))
        return b"".join(out)

    def _chunk(self, chunk: dict[str, Any]) -> bytes:
        out: list[bytes] = []
        if not self._started:
            self._started = True
            self._id = str(chunk.get("id") or "")
            self._model = chunk.get("model", self._model)
            created = chunk.get("created")
            if isinstance(created, int):
                self._created = created
            self._usage(chunk.get("usage"))
            out.append(self._start())
        else:
            self._usage(chunk.get("usage"))
        choices = chunk.get("choices")
        for choice in choices if isinstance(choices, list) else ():
            if not isinstance(choice, dict) or choice.get("index", 0) != 0:
                continue
            delta = choice.get("delta")
            if isinstance(delta, dict):
                for key in REASONING_KEYS:
                    text = delta.get(key)
                    if isinstance(text, str) and text:
                        self._reasoning_tokens += 1
                        out.append(self._delta("reasoning", text))
                text = delta.get("content")
                if isinstance(text, str) and text:
                    out.append(self._delta("text", text))
            if choice.get("finish_reason") is not None:
                self._finish = choice["finish_reason"]
                self._stop = choice.get("stop_reason")
                guard = choice.get("guard")
                self._guard = guard if isinstance(guard, dict) else None
        return b"".join(out)

    def _usage(self, usage: Any) -> None:
        if not isinstance(usage, dict):
            return
        if isinstance(usage.get("prompt_tokens"), int):
            self._input_tokens = usage["prompt_tokens"]
        if isinstance(usage.get("completion_tokens"), int):
            self._output_tokens = usage["completion_tokens"]

    def _delta(self, kind: str, text: str) -> bytes:
        out = b""
        block = self._blocks[-1] if self._blocks else None
        if block is None or block.kind != kind:
            if block is not None:
                out += self._close(block)
            block = Block(kind, len(self._blocks))
            self._blocks.append(block)
            out += self._open(block)
        block.texts.append(text)
        return out + self._text(block, text)

    def _end(self) -> bytes:
        if self._ended:
            return b""
        self._ended = True
        out = b"" if self._started else self._start()
        self._started = True
        if self._blocks:
            out += self._close(self._blocks[-1])
        return out + self._finish_events()

    def _aborted(self) -> bool:
        """The relay ended the answer on a verdict (after the last heal attempt, or when it
        could not be healed): its final chunk carries a ``guard`` object other than healed."""
        return self._guard is not None and self._guard.get("action") != "healed"

    # -------------------------------------------------------------- non-streaming
    def answer(self, status: int, body: bytes) -> bytes:
        """The surface's JSON for the chat relay's non-streamed answer (or error)."""
        try:
            value = orjson.loads(body)
        except orjson.JSONDecodeError:
            return body
        if not isinstance(value, dict):
            return body
        if status != 200 or "choices" not in value:
            return self.error_body(status, value)
        self._id = str(value.get("id") or "")
        self._model = value.get("model", self._model)
        if isinstance(value.get("created"), int):
            self._created = value["created"]
        self._usage(value.get("usage"))
        choices = value.get("choices") or [{}]
        choice = choices[0] if isinstance(choices[0], dict) else {}
        found = choice.get("message")
        message: dict[str, Any] = found if isinstance(found, dict) else {}
        for key in REASONING_KEYS:
            if isinstance(message.get(key), str) and message[key]:
                self._blocks.append(Block("reasoning", len(self._blocks), texts=[message[key]]))
                break
        if isinstance(message.get("content"), str):
            self._blocks.append(Block("text", len(self._blocks), texts=[message["content"]]))
        self._finish = choice.get("finish_reason")
        self._stop = choice.get("stop_reason")
        guard = choice.get("guard")
        self._guard = guard if isinstance(guard, dict) else None
        for block in self._blocks:
            self._name(block)
        return orjson.dumps(self._final())

    # -------------------------------------------------------------- per surface
    def error_body(self, status: int, value: dict[str, Any]) -> bytes:
        raise NotImplementedError

    def _error_event(self, error: dict[str, Any]) -> bytes:
        raise NotImplementedError

    def _start(self) -> bytes:
        raise NotImplementedError

    def _name(self, block: Block) -> None:
        raise NotImplementedError

    def _open(self, block: Block) -> bytes:
        raise NotImplementedError

    def _text(self, block: Block, text: str) -> bytes:
        raise NotImplementedError

    def _close(self, block: Block) -> bytes:
        raise NotImplementedError

    def _finish_events(self) -> bytes:
        raise NotImplementedError

    def _final(self) -> dict[str, Any]:
        raise NotImplementedError


def suffix(chat_id: str) -> str:
    """The random part of a chat id (``chatcmpl-<hex>``), reused for the surface's ids."""
    return chat_id.rsplit("-", 1)[-1] or "0"
