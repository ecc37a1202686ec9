"""``POST /v1/messages`` (Anthropic Messages, as vLLM serves it): the per-surface part.

The stream is ``message_start``, then per content block ``content_block_start`` →
``content_block_delta``… → ``content_block_stop``, then ``message_delta`` (``stop_reason``,
usage) and ``message_stop``; ``ping`` and ``error`` may come anywhere. No ``[DONE]``.

One block state per message, not per content block: vLLM builds the message out of one chat
choice, and its blocks (``thinking``, then ``text``, then ``tool_use``) are consecutive slices of
that choice. Each channel of it (thinking, text, tool input) is judged in its own register
exactly as on ``/v1/chat/completions`` for the same generation (:mod:`proxy.core.channels`), so the
verdicts are the same, and a model that loops by opening text block after text block is still
one window.

On a verdict (enforce) the delta that fired is forwarded, then the open block ends with
``content_block_stop``, a ``message_delta`` carries the stop reason (see :func:`stop_reason`),
the ``guard`` object and the usage, and ``message_stop`` ends the stream.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import orjson

from proxy.core import chunks
from proxy.core.channels import channel_of
from proxy.core.chunks import Piece

if TYPE_CHECKING:
    from proxy.core.channels import BlockState
    from proxy.core.relay_types import GuardView
    from proxy.detect import Verdict
    from proxy.errors import GuardError

#: The text field of each delta type the detector reads.
DELTA_FIELDS = {
    "text_delta": "text",
    "thinking_delta": "thinking",
    "input_json_delta": "partial_json",
}
#: One text or thinking delta exactly as vLLM writes it (keys in its order): the event the
#: byte-level path reads without parsing (see :meth:`_Messages.quick`).
_DELTA_EVENT = re.compile(
    rb'event: [\x21-\x7e]+\ndata: \{"type":"content_block_delta","delta":\{"type":"'
    + rb'(?:(text)_delta","text"|thinking_delta","thinking"):'
    + chunks.JSON_TEXT
    + rb'\},"index":('
    + chunks.JSON_INT
    + rb")\}\n\n"
).match
#: Anthropic stop reasons back to the OpenAI finish reasons the records use.
FINISH_REASONS = {
    "end_turn": "stop",
    "stop_sequence": "stop",
    "max_tokens": "length",
    "tool_use": "tool_calls",
    "refusal": "content_filter",
}


@dataclass(slots=True)
class MessagesState:
    #: The message of ``message_start``.
    message: dict[str, Any] | None = None
    #: Blocks started and not yet stopped (index → ``content_block``).
    open: dict[int, dict[str, Any]] = field(default_factory=dict)
    #: Every block as it started (for a non-streamed answer).
    blocks: dict[int, dict[str, Any]] = field(default_factory=dict)
    stop_reason: str | None = None
    stop_sequence: str | None = None
    #: The usage of the engine's ``message_delta``.
    usage: dict[str, Any] | None = None


def _state(guard: GuardView) -> MessagesState:
    state = guard.extra
    if state is None:
        state = guard.extra = MessagesState()
    return state  # type: ignore[no-any-return]


def stop_reason(abort_finish_reason: str) -> str:
    """The Anthropic ``stop_reason`` of the guard's abort, one of the SDK's ``StopReason``.

    ``refusal`` for ``content_filter`` (the default) and ``repetition``: it is Anthropic's own
    word for "a classifier stopped this stream", the SDK carries its ``stop_details`` (where the
    guard's signal goes) into the final message, and clients treat it as final. ``max_tokens``
    would invite agent tools to ask for a continuation of the loop; ``end_turn`` would present
    a cut answer as complete. Operators who want those anyway get them from
    ``GUARD_ABORT_FINISH_REASON=length`` / ``stop``.
    """
    if abort_finish_reason == "length":
        return "max_tokens"
    if abort_finish_reason == "stop":
        return "end_turn"
    return "refusal"


def stop_details(reason: str, verdict: Verdict) -> dict[str, Any] | None:
    if reason != "refusal":
        return None
    return {"type": "refusal", "category": None, "explanation": "coherence_guard:" + verdict.signal}


encode = chunks.named_event


class _Messages:
    def event(self, guard: GuardView, raw: bytes, data: bytes | None) -> bytes:
        obj = chunks.json_object(data)
        if obj is None:
            return raw
        kind = obj.get("type")
        if kind == "content_block_delta":
            return self._delta(guard, raw, obj)
        ms = _state(guard)
        if kind == "content_block_start":
            index = obj.get("index")
            block = obj.get("content_block")
            if type(index) is int and isinstance(block, dict):
                ms.open[index] = block
                ms.blocks[index] = block
        elif kind == "content_block_stop":
            ms.open.pop(obj.get("index"), None)  # type: ignore[arg-type]
        elif kind == "message_start":
            message = obj.get("message")
            if isinstance(message, dict):
                ms.message = guard.template = message
                usage = message.get("usage")
                if isinstance(usage, dict) and isinstance(usage.get("input_tokens"), int):
                    guard.prompt_tokens = usage["input_tokens"]
            if 0 not in guard.choices:
                guard.new_block(0)
        elif kind == "message_delta":
            delta = obj.get("delta")
            if isinstance(delta, dict):
                ms.stop_reason = delta.get("stop_reason")
                ms.stop_sequence = delta.get("stop_sequence")
            usage = obj.get("usage")
            if isinstance(usage, dict):
                ms.usage = guard.usage = usage
                state = guard.choices.get(0) or guard.new_block(0)
                if isinstance(usage.get("output_tokens"), int):
                    state.tokens = usage["output_tokens"]
            state = guard.choices.get(0) or guard.new_block(0)
            if not state.ended:
                state.ended = True
                reason = ms.stop_reason
                state.finish_reason = FINISH_REASONS.get(reason, reason) if reason else None
                state.stop_reason = ms.stop_sequence
                verdict = guard.judge_finish(state) if reason else None
                if verdict is not None:
                    # Judged as it finished: the guard's ending, with the engine's usage.
                    state.finish_reason = guard.policy.abort_finish_reason
                    ending = abort_delta(guard, state, verdict)
                    if ms.usage is not None:
                        ending["usage"] = ms.usage
                    return encode(ending)
        elif kind == "message_stop":
            guard.saw_done = True
            guard.done = True
        elif kind == "error":
            err = obj.get("error")
            guard.error = err if isinstance(err, dict) else {"message": str(err)}
            guard.done = True
        return raw

    def quick(self, guard: GuardView, read: bytes, pos: int) -> tuple[bytes, int] | None:
        """:meth:`event` for a whole text or thinking delta at ``pos`` of ``read`` in vLLM's
        layout, without parsing its JSON: the same state changes and client bytes, and where the
        event ends; ``None`` before touching anything when :meth:`event` must decide."""
        m = _DELTA_EVENT(read, pos)
        if m is None:
            return None
        text = chunks.json_string(m[2])
        if text is None:
            return None
        end = m.end()
        raw = read if pos == 0 and end == len(read) else read[pos:end]
        if not text:
            return raw, end
        kind = "text_delta" if m[1] is not None else "thinking_delta"
        return self._text(guard, raw, kind, text, int(m[3])), end

    def _delta(self, guard: GuardView, raw: bytes, obj: dict[str, Any]) -> bytes:
        delta = obj.get("delta")
        if type(delta) is not dict:
            return raw
        kind = delta.get("type")
        key = DELTA_FIELDS.get(kind)  # type: ignore[arg-type]
        text = delta.get(key) if key is not None else None
        if type(text) is not str or not text:
            return raw
        return self._text(guard, raw, kind, text, obj.get("index"))  # type: ignore[arg-type]

    def _text(self, guard: GuardView, raw: bytes, kind: str, text: str, index: Any) -> bytes:
        """A delta's non-empty ``text`` of ``kind`` (``text_delta``...) to the message's
        detector; ``raw`` and, on a verdict, the events that end the message."""
        state = guard.choices.get(0) or guard.new_block(0)
        if state.ended:
            return raw
        if guard.policy.collect:
            block = index if type(index) is int else 0
            state.pieces.append((state.chars, Piece(kind, text, block)))
        verdict = guard.feed_text(state, text, channel_of(kind))
        if verdict is None:
            return raw
        state.ended = True
        state.finish_reason = guard.policy.abort_finish_reason
        return raw + guard.ending(functools.partial(self._abort_tail, guard, state, verdict))

    def _abort_tail(self, guard: GuardView, state: BlockState, verdict: Verdict) -> bytes:
        ms = _state(guard)
        out = [encode({"type": "content_block_stop", "index": i}) for i in sorted(ms.open)]
        ms.open.clear()
        out.append(encode(abort_delta(guard, state, verdict)))
        out.append(encode({"type": "message_stop"}))
        return b"".join(out)

    def failure(self, guard: GuardView, error: GuardError) -> bytes:
        return error_event(error)

    def response(self, guard: GuardView, trim: bool) -> dict[str, Any]:
        return messages_response(guard, trim=trim)


def error_event(error: GuardError) -> bytes:
    """``event: error`` with Anthropic's envelope: how the Messages API ends a stream that
    failed after its 200 (the SDK raises it as an ``APIStatusError`` of that type)."""
    return encode(error.to_anthropic())


def abort_delta(guard: GuardView, state: BlockState, verdict: Verdict) -> dict[str, Any]:
    """The ``message_delta`` that ends an aborted message."""
    reason = stop_reason(guard.policy.abort_finish_reason)
    delta: dict[str, Any] = {"stop_reason": reason, "stop_sequence": None}
    details = stop_details(reason, verdict)
    if details is not None:
        delta["stop_details"] = details
    delta["guard"] = chunks.guard_object(verdict, state.tokens)
    return {"type": "message_delta", "delta": delta, "usage": usage(guard)}


def messages_usage(input_tokens: int | None, output_tokens: int) -> dict[str, int]:
    """The Messages ``usage`` object: the one place it is built, by this surface and by the
    chat-route writer of heal mode (:mod:`proxy.core.surfaces.via_chat`). ``input_tokens`` is
    left out where the engine's count is not known (``None``), never written as 0."""
    if input_tokens is None:
        return {"output_tokens": output_tokens}
    return {"input_tokens": input_tokens, "output_tokens": output_tokens}


def usage(guard: GuardView) -> dict[str, Any]:
    """Input tokens as ``message_start`` said (or as the engine counted them when asked), and
    the other counts of that ``usage`` as the engine wrote them (llama.cpp's
    ``cache_read_input_tokens``: its ``input_tokens`` leaves out the cached part), output tokens
    counted one per delta."""
    ms = _state(guard)
    start = ms.message.get("usage") if ms.message is not None else None
    out = (
        {k: v for k, v in start.items() if k != "output_tokens"} if isinstance(start, dict) else {}
    )
    out.update(messages_usage(guard.prompt_tokens, sum(s.tokens for s in guard.choices.values())))
    return out


MESSAGES = _Messages()


def messages_response(guard: GuardView, *, trim: bool) -> dict[str, Any]:
    """The Message object, with its content blocks rebuilt from the deltas."""
    ms = guard.extra
    if not isinstance(ms, MessagesState):
        ms = MessagesState()
    state = guard.choices.get(0)
    cut = None
    verdict = state.verdict if state is not None and state.action == "aborted" else None
    if trim and verdict is not None:
        cut = verdict.onset_char
    texts: dict[int, list[str]] = {}
    for offset, piece in state.pieces if state is not None else ():
        text = piece.text
        if cut is not None:
            if offset >= cut:
                break
            text = text[: cut - offset]
        texts.setdefault(piece.tool_index, []).append(text)
    content = []
    for index in sorted(ms.blocks):
        block = dict(ms.blocks[index])
        text = "".join(texts.get(index, ()))
        kind = block.get("type")
        if kind == "text":
            block["text"] = text
        elif kind == "thinking":
            block["thinking"] = text
        elif kind == "tool_use":
            try:
                block["input"] = orjson.loads(text) if text else {}
            except orjson.JSONDecodeError:
                block["input"] = {}  # cut inside the arguments: nothing callable is left
        content.append(block)
    out: dict[str, Any] = {}
    for key, value in (ms.message or {}).items():  # the engine's key order
        if key == "content":
            out["content"] = content
        elif key != "stop_sequence":
            out[key] = value
    out.setdefault("content", content)
    if verdict is not None and state is not None:
        delta = abort_delta(guard, state, verdict)["delta"]
        out["stop_reason"] = delta["stop_reason"]
        if "stop_details" in delta:
            out["stop_details"] = delta["stop_details"]
        out["usage"] = usage(guard)
        out["guard"] = delta["guard"]
        return out
    out["stop_reason"] = ms.stop_reason
    if ms.stop_sequence is not None:
        out["stop_sequence"] = ms.stop_sequence
    totals = dict(out.get("usage") or {})
    totals.update(ms.usage or {})
    out["usage"] = totals or usage(guard)
    return out
