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

import dataclasses
import time
from typing import TYPE_CHECKING, Any

import orjson

from proxy.chunks import REASONING_KEYS, named_event
from proxy.errors import anthropic_error_object
from proxy.rewrite import SURFACE_SAMPLING_FIELDS
from proxy.sse import SSEParser
from proxy.surfaces.messages import FINISH_REASONS, stop_reason
from proxy.surfaces.responses import (
    abort_item_status,
    incomplete_reason,
    terminal_event,
    usage_object,
)

if TYPE_CHECKING:
    from proxy.records import Endpoint
    from proxy.rewrite import Rewrite

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


def to_chat(endpoint: Endpoint, rw: Rewrite, *, usage: bool, logprobs: bool) -> Rewrite | str:
    """The chat form of ``rw`` (a rewritten Responses or Messages request), or why there is
    none (a short reason, for the log and the ``unhealable`` counter)."""
    body = rw.body
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
    messages = _responses_messages(body) if endpoint == "responses" else _messages_messages(body)
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


# ---------------------------------------------------------------------------- the answer


@dataclasses.dataclass(slots=True)
class _Block:
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
        self._blocks: list[_Block] = []
        self._id = ""
        self._model = request.get("model")
        self._created = int(time.time())
        self._input_tokens = 0
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
            block = _Block(kind, len(self._blocks))
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
                self._blocks.append(_Block("reasoning", len(self._blocks), texts=[message[key]]))
                break
        if isinstance(message.get("content"), str):
            self._blocks.append(_Block("text", len(self._blocks), texts=[message["content"]]))
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

    def _name(self, block: _Block) -> None:
        raise NotImplementedError

    def _open(self, block: _Block) -> bytes:
        raise NotImplementedError

    def _text(self, block: _Block, text: str) -> bytes:
        raise NotImplementedError

    def _close(self, block: _Block) -> bytes:
        raise NotImplementedError

    def _finish_events(self) -> bytes:
        raise NotImplementedError

    def _final(self) -> dict[str, Any]:
        raise NotImplementedError


#: Chat finish reasons to Anthropic stop reasons (the inverse of the Messages reader's map).
_STOP_REASONS = {v: k for k, v in FINISH_REASONS.items() if k != "stop_sequence"}


def _suffix(chat_id: str) -> str:
    """The random part of a chat id (``chatcmpl-<hex>``), reused for the surface's ids."""
    return chat_id.rsplit("-", 1)[-1] or "0"


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
            "id": "msg_" + _suffix(self._id),
            "type": "message",
            "role": "assistant",
            "model": self._model,
            "content": [],
            "stop_reason": None,
            "stop_sequence": None,
            "usage": {"input_tokens": self._input_tokens, "output_tokens": 0},
        }

    def _start(self) -> bytes:
        return named_event({"type": "message_start", "message": self._message()})

    def _name(self, block: _Block) -> None:
        pass

    def _content_block(self, block: _Block, text: str) -> dict[str, Any]:
        if block.kind == "reasoning":
            return {"type": "thinking", "thinking": text, "signature": ""}
        return {"type": "text", "text": text}

    def _open(self, block: _Block) -> bytes:
        return named_event(
            {
                "type": "content_block_start",
                "index": block.index,
                "content_block": self._content_block(block, ""),
            }
        )

    def _text(self, block: _Block, text: str) -> bytes:
        delta = (
            {"type": "thinking_delta", "thinking": text}
            if block.kind == "reasoning"
            else {"type": "text_delta", "text": text}
        )
        return named_event({"type": "content_block_delta", "index": block.index, "delta": delta})

    def _close(self, block: _Block) -> bytes:
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
        usage = {"input_tokens": self._input_tokens, "output_tokens": self._output_tokens}
        return named_event(
            {"type": "message_delta", "delta": self._stop_fields(), "usage": usage}
        ) + named_event({"type": "message_stop"})

    def _final(self) -> dict[str, Any]:
        message = self._message()
        message["content"] = [self._content_block(b, b.text) for b in self._blocks]
        message.update(self._stop_fields())
        message["usage"]["output_tokens"] = self._output_tokens
        return message


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
            "id": "resp_" + _suffix(self._id),
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

    def _name(self, block: _Block) -> None:
        prefix = "rs_" if block.kind == "reasoning" else "msg_"
        block.item_id = f"{prefix}{_suffix(self._id)}{block.index}"

    def _part(self, block: _Block, text: str) -> dict[str, Any]:
        if block.kind == "reasoning":
            return {"type": "reasoning_text", "text": text}
        return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}

    def _item(self, block: _Block, status: str, text: str | None) -> dict[str, Any]:
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

    def _open(self, block: _Block) -> bytes:
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

    def _text(self, block: _Block, text: str) -> bytes:
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

    def _close(self, block: _Block) -> bytes:
        where = {"item_id": block.item_id, "output_index": block.index, "content_index": 0}
        text = block.text
        if block.kind == "reasoning":
            done = {"type": "response.reasoning_text.done", **where, "text": text}
        else:
            done = {"type": "response.output_text.done", **where, "text": text, "logprobs": []}
        # A block closed before the end (reasoning, then text) is complete either way.
        last = block is self._blocks[-1] and self._ended
        status = self._item_status() if last else "completed"
        return (
            self._emit(done)
            + self._emit(
                {"type": "response.content_part.done", **where, "part": self._part(block, text)}
            )
            + self._emit(
                {
                    "type": "response.output_item.done",
                    "output_index": block.index,
                    "item": self._item(block, status, text),
                }
            )
        )

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
        response["usage"] = usage_object(
            self._input_tokens, self._output_tokens, self._reasoning_tokens
        )
        return response

    def _finish_events(self) -> bytes:
        response = self._final()
        kind = terminal_event(response["status"], self.abort_event)
        return self._emit({"type": kind, "response": response})


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
