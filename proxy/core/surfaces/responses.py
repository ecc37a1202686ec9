"""``POST /v1/responses`` (OpenAI Responses API, as vLLM serves it): the per-surface part.

The stream is named SSE events whose JSON carries ``type`` and ``sequence_number`` and which
ends with exactly one ``response.completed``/``response.incomplete``/``response.failed`` (no
``[DONE]``). Text arrives as ``response.output_text.delta``, ``response.reasoning_text.delta``
and ``response.function_call_arguments.delta``, each naming its ``output_index``.

One detector per output item: an item is one thing the model produced (a reasoning trace, a
message, one tool call), each with its own register, and the Responses API itself ends and
reports them one by one. A reasoning item's text is thinking and a tool call's is arguments:
each is judged as its channel is (:mod:`proxy.core.channels`), never against the answer's expected
language. Every other event is forwarded as it is.

On a verdict (enforce) the delta that fired is forwarded, then the open item is closed the way
the engine would close it — ``response.output_text.done`` / ``response.reasoning_text.done`` /
``response.function_call_arguments.done`` with the text so far, ``response.content_part.done``,
``response.output_item.done`` — and the stream ends the way vLLM ends a response it stopped
early (at ``max_output_tokens``): ``response.completed`` whose response has ``status:
"incomplete"``, its items ``completed``, and ``incomplete_details`` with the reason and the
``guard`` object. That is the ending the openai SDK's ``responses.stream()`` helper and
openai-agents accept; a stream that ends with a ``response.incomplete`` event makes both raise.
``GUARD_RESPONSES_ABORT_EVENT=incomplete`` picks the ``response.incomplete`` event (items
``incomplete``) instead, as OpenAI's own API ends such a response. Sequence numbers continue from
the engine's.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from proxy.core import chunks

if TYPE_CHECKING:
    from proxy.core.channels import BlockState, Channel
    from proxy.core.relay_types import GuardView
    from proxy.errors import GuardError

#: Delta events whose text the detector reads, and the field holding it.
DELTAS = frozenset(
    {
        "response.output_text.delta",
        "response.reasoning_text.delta",
        "response.function_call_arguments.delta",
    }
)
#: The channel of each delta's text (see :mod:`proxy.core.channels`): a reasoning item is thinking,
#: judged in its own register without the answer's language expectation.
CHANNELS: dict[str, Channel] = {
    "response.output_text.delta": "content",
    "response.reasoning_text.delta": "reasoning",
    "response.function_call_arguments.delta": "tool",
}
TERMINAL = frozenset({"response.completed", "response.incomplete", "response.failed"})
#: One text or reasoning delta exactly as vLLM writes it (keys in its order, ``logprobs`` empty
#: on text, absent on reasoning): the event the byte-level path reads without parsing (see
#: :meth:`_Responses.quick`).
_DELTA_EVENT = re.compile(
    rb'event: [\x21-\x7e]+\ndata: \{"content_index":('
    + chunks.JSON_INT
    + rb'),"delta":'
    + chunks.JSON_TEXT
    + rb',"item_id":'
    + chunks.JSON_STR
    + rb'(?:,"logprobs":\[\])?,"output_index":('
    + chunks.JSON_INT
    + rb'),"sequence_number":('
    + chunks.JSON_INT
    + rb'),"type":"(response\.(?:output_text|reasoning_text)\.delta)"\}\n\n'
).match
_KINDS = {k.encode(): k for k in DELTAS}
#: ``content_index`` key under which a function call's arguments are kept.
ARGUMENTS = -1


@dataclass(slots=True)
class Item:
    """One output item as the client has seen it so far."""

    item: dict[str, Any]
    #: Open content parts (``content_index`` → the part as added).
    parts: dict[int, dict[str, Any]] = field(default_factory=dict)
    #: Text received per content part (``ARGUMENTS`` for a tool call), in order.
    texts: dict[int, list[str]] = field(default_factory=dict)
    #: The engine's own ``output_item.done`` item, once it arrived.
    done: dict[str, Any] | None = None
    #: Content parts in the order they were added (also the closed ones).
    order: list[tuple[int, dict[str, Any]]] = field(default_factory=list)

    def text(self, key: int) -> str:
        return "".join(self.texts.get(key, ()))


@dataclass(slots=True)
class ResponsesState:
    seq: int = -1
    items: dict[int, Item] = field(default_factory=dict)
    #: The response object of the terminal event.
    final: dict[str, Any] | None = None


def _state(guard: GuardView) -> ResponsesState:
    state = guard.extra
    if state is None:
        state = guard.extra = ResponsesState()
    return state  # type: ignore[no-any-return]


def abort_item_status(abort_event: str) -> str:
    """The status of an item the guard closed: the engine's ``completed`` with its own
    ending (vLLM writes it on the items of a response cut at ``max_output_tokens``), else
    ``incomplete``."""
    return "completed" if abort_event == "completed" else "incomplete"


def terminal_event(status: str, abort_event: str) -> str:
    """The event that ends a response of ``status`` (``completed``/``incomplete``): vLLM's
    ``response.completed`` for both, unless operators asked for ``response.incomplete``."""
    if status == "incomplete" and abort_event == "incomplete":
        return "response.incomplete"
    return "response.completed"


def incomplete_reason(abort_finish_reason: str) -> str:
    """``incomplete_details.reason`` for the guard's abort: one the OpenAI SDK knows
    (``max_output_tokens`` when operators ask for ``length``, else ``content_filter``)."""
    return "max_output_tokens" if abort_finish_reason == "length" else "content_filter"


encode = chunks.named_event


class _Responses:
    def event(self, guard: GuardView, raw: bytes, data: bytes | None) -> bytes:
        obj = chunks.json_object(data)
        if obj is None:
            return raw
        rs = _state(guard)
        seq = obj.get("sequence_number")
        if type(seq) is int:
            rs.seq = seq
        kind = obj.get("type")
        index = obj.get("output_index")
        if kind in DELTAS:
            text = obj.get("delta")
            if type(index) is not int or type(text) is not str:
                return raw
            return self._delta(guard, rs, raw, kind, index, obj.get("content_index"), text)
        if kind == "response.output_item.added":
            item = obj.get("item")
            if type(index) is int and isinstance(item, dict):
                rs.items[index] = Item(dict(item))
                if index not in guard.choices:
                    guard.new_block(index)
        elif kind == "response.content_part.added":
            ci = obj.get("content_index")
            part = obj.get("part")
            item_state = rs.items.get(index) if type(index) is int else None
            if item_state is not None and type(ci) is int and isinstance(part, dict):
                item_state.parts[ci] = part
                item_state.order.append((ci, part))
        elif kind == "response.content_part.done":
            item_state = rs.items.get(index) if type(index) is int else None
            if item_state is not None:
                item_state.parts.pop(obj.get("content_index"), None)  # type: ignore[arg-type]
        elif kind == "response.output_item.done":
            item = obj.get("item")
            item_state = rs.items.get(index) if type(index) is int else None
            if item_state is not None and isinstance(item, dict):
                item_state.done = item
        elif kind in ("response.created", "response.in_progress"):
            response = obj.get("response")
            if isinstance(response, dict):
                guard.template = response
        elif kind in TERMINAL:
            ending = self._terminal(guard, rs, obj.get("response"))
            if ending is not None:
                return ending
        elif kind == "error":
            guard.error = {k: v for k, v in obj.items() if k not in ("type", "sequence_number")}
            guard.done = True
        return raw

    def quick(self, guard: GuardView, read: bytes, pos: int) -> tuple[bytes, int] | None:
        """:meth:`event` for a whole text or reasoning delta at ``pos`` of ``read`` in vLLM's
        layout, without parsing its JSON: the same state changes and client bytes, and where the
        event ends; ``None`` before touching anything when :meth:`event` must decide."""
        m = _DELTA_EVENT(read, pos)
        rs = guard.extra
        if m is None or rs is None:
            return None
        text = chunks.json_string(m[2])
        if text is None:
            return None
        end = m.end()
        raw = read if pos == 0 and end == len(read) else read[pos:end]
        rs.seq = int(m[4])
        return self._delta(guard, rs, raw, _KINDS[m[5]], int(m[3]), int(m[1]), text), end

    def _delta(
        self,
        guard: GuardView,
        rs: ResponsesState,
        raw: bytes,
        kind: str,
        index: int,
        content_index: Any,
        text: str,
    ) -> bytes:
        state = guard.choices.get(index) or guard.new_block(index)
        item_state = rs.items.get(index)
        if item_state is None:
            item_state = rs.items[index] = Item({"type": "message", "status": "in_progress"})
        key = ARGUMENTS if kind == "response.function_call_arguments.delta" else content_index
        if type(key) is not int:
            key = 0
        item_state.texts.setdefault(key, []).append(text)
        if not text:
            return raw
        verdict = guard.feed_text(state, text, CHANNELS[kind])
        if verdict is None:
            return raw
        reason = guard.policy.abort_finish_reason
        for st in guard.choices.values():
            if not st.ended:
                st.ended = True
                st.finish_reason = reason if st is state else None
        return raw + guard.ending(functools.partial(self._abort_tail, guard, rs, state))

    def _abort_tail(self, guard: GuardView, rs: ResponsesState, aborted: BlockState) -> bytes:
        out: list[bytes] = []

        def emit(obj: dict[str, Any]) -> None:
            rs.seq += 1
            obj["sequence_number"] = rs.seq
            out.append(encode(obj))

        for index in sorted(rs.items):
            item_state = rs.items[index]
            if item_state.done is not None:
                continue
            item = item_state.item
            item_id = item.get("id")
            if item.get("type") == "function_call":
                emit(
                    {
                        "type": "response.function_call_arguments.done",
                        "arguments": item_state.text(ARGUMENTS),
                        "item_id": item_id,
                        "name": item.get("name"),
                        "output_index": index,
                    }
                )
            else:
                for ci, part in sorted(item_state.parts.items()):
                    for event in part_done_events(item_id, index, ci, part, item_state.text(ci)):
                        emit(event)
                item_state.parts.clear()
            item_state.done = closed_item(item_state, abort_item_status(guard.policy.abort_event))
            emit(item_done_event(item_state.done, index))
        kind = terminal_event("incomplete", guard.policy.abort_event)
        emit({"type": kind, "response": incomplete_response(guard, aborted)})
        return b"".join(out)

    def _terminal(self, guard: GuardView, rs: ResponsesState, response: Any) -> bytes | None:
        """Take the engine's terminal event; the guard's ending instead of it when an item is
        judged degenerate as the response finishes (enforce), else ``None``."""
        guard.done = True
        if not isinstance(response, dict):
            guard.error = {"message": "The upstream ended the response without a body."}
            return None
        rs.final = response
        guard.saw_done = True
        usage = response.get("usage")
        if isinstance(usage, dict):
            guard.usage = usage
            it = usage.get("input_tokens")
            if isinstance(it, int):
                guard.prompt_tokens = it
            ot = usage.get("output_tokens")
            if isinstance(ot, int) and len(guard.choices) == 1:
                # One item: the engine's exact count replaces the one-per-delta estimate.
                next(iter(guard.choices.values())).tokens = ot
        status = response.get("status")
        if status == "failed":
            err = response.get("error")
            guard.error = err if isinstance(err, dict) else {"message": "The response failed."}
            finish = None
        elif status == "incomplete":
            details = response.get("incomplete_details")
            reason = details.get("reason") if isinstance(details, dict) else None
            finish = "length" if reason == "max_output_tokens" else "content_filter"
        else:
            finish = "stop"
        judged = None
        for state in guard.choices.values():
            if not state.ended:
                state.ended = True
                state.finish_reason = finish
                if finish is not None:
                    verdict = guard.judge_finish(state)
                    if verdict is not None and judged is None:
                        judged = state
        if judged is None:
            return None
        judged.finish_reason = guard.policy.abort_finish_reason
        ending = incomplete_response(guard, judged)
        if isinstance(usage, dict):
            ending["usage"] = usage  # the engine's own count: the answer ran to its end
        rs.seq += 1
        kind = terminal_event("incomplete", guard.policy.abort_event)
        return encode({"type": kind, "response": ending, "sequence_number": rs.seq})

    def failure(self, guard: GuardView, error: GuardError) -> bytes:
        rs = _state(guard)
        rs.seq += 1
        err = error.to_dict()["error"]
        return encode(
            {
                "type": "error",
                "code": err.get("type"),
                "message": err.get("message"),
                "param": err.get("param"),
                "sequence_number": rs.seq,
            }
        )

    def response(self, guard: GuardView, trim: bool) -> dict[str, Any]:
        return responses_response(guard, trim=trim)


def part_done_events(
    item_id: Any, output_index: int, content_index: int, part: dict[str, Any], text: str
) -> list[dict[str, Any]]:
    """The two events that close one content part (its text's ``.done``, then
    ``content_part.done``), as vLLM writes them: the one place they are built, by an aborted
    stream's ending here and by heal's chat-route writer."""
    where = {"item_id": item_id, "output_index": output_index, "content_index": content_index}
    if part.get("type") == "reasoning_text":
        done = {"type": "response.reasoning_text.done", **where, "text": text}
    else:
        done = {"type": "response.output_text.done", **where, "text": text, "logprobs": []}
    return [done, {"type": "response.content_part.done", **where, "part": {**part, "text": text}}]


def item_done_event(item: dict[str, Any], output_index: int) -> dict[str, Any]:
    """``response.output_item.done`` for a closed ``item``."""
    return {"type": "response.output_item.done", "output_index": output_index, "item": item}


def closed_item(
    item_state: Item, status: str = "incomplete", cut: int | None = None
) -> dict[str, Any]:
    """The item as ``output_item.done`` would carry it, with the text so far (``cut``: only the
    first ``cut`` characters of the item's text, across its parts in order)."""
    item = dict(item_state.item)
    item["status"] = status
    budget = cut
    if item.get("type") == "function_call":
        args = item_state.text(ARGUMENTS)
        item["arguments"] = args if budget is None else args[:budget]
        return item
    content = []
    for ci, part in item_state.order:
        text = item_state.text(ci)
        if budget is not None:
            text = text[:budget]
            budget = max(0, budget - len(text))
        done = {**part, "text": text}
        if done.get("logprobs") == []:
            done["logprobs"] = None
        content.append(done)
    item["content"] = content
    return item


def incomplete_response(
    guard: GuardView, aborted: BlockState, *, trim: bool = False
) -> dict[str, Any]:
    """The ``response`` object (``status: "incomplete"``) that ends an aborted stream (and the
    non-streamed aborted answer, trimmed at the onset when ``trim``)."""
    rs = _state(guard)
    verdict = aborted.verdict
    out = dict(guard.template or {})
    out["status"] = "incomplete"
    details: dict[str, Any] = {"reason": incomplete_reason(guard.policy.abort_finish_reason)}
    if verdict is not None:
        details["guard"] = chunks.guard_object(verdict, aborted.tokens)
    out["incomplete_details"] = details
    output = []
    for index in sorted(rs.items):
        item_state = rs.items[index]
        status = abort_item_status(guard.policy.abort_event)
        if index == aborted.index and trim and verdict is not None:
            output.append(closed_item(item_state, status, cut=verdict.onset_char))
        elif item_state.done is not None:
            output.append(item_state.done)
        else:
            output.append(closed_item(item_state, status))
    out["output"] = output
    out["usage"] = usage(guard)
    return out


def usage(guard: GuardView) -> dict[str, Any] | None:
    """The Responses ``usage`` for a stream the guard ended: input tokens as the engine
    counted them (vLLM writes its usage only on the terminal event, so the shell asks:
    :mod:`proxy.core.prompt_count`), output tokens counted one per delta; ``None`` when the
    input count is not known (see :func:`responses_usage`)."""
    rs = _state(guard)
    output = sum(s.tokens for s in guard.choices.values())
    reasoning = sum(
        s.tokens
        for i, s in guard.choices.items()
        if i in rs.items and rs.items[i].item.get("type") == "reasoning"
    )
    return responses_usage(guard.prompt_tokens, output, reasoning)


def responses_usage(
    input_tokens: int | None, output_tokens: int, reasoning_tokens: int
) -> dict[str, Any] | None:
    """A ``usage`` written by the proxy, in the shape vLLM 0.32 writes its own (every detail
    field, zero where the proxy has no count): the one place it is built, by this surface and by
    the chat-route writer of heal mode (:mod:`proxy.core.surfaces.via_chat`).

    Why every field: the openai SDK validates each event strictly against its types
    (``cache_write_tokens`` is required) and builds one that fails loosely, through a union
    discriminator map that openai 3.57 computes without a lock: under concurrent first use it
    comes out partial, a ``response.completed`` is built as the wrong event type with its
    response left a dict, and ``responses.stream()`` raises "Lifecycle response identity
    changed." An ending the SDK validates never takes that path, as the engine's never does.

    ``None`` (written ``"usage": null``) where the engine's count of the prompt is not known
    (it sent none, and did not answer when asked): a usage without ``input_tokens`` and
    ``total_tokens`` would claim a count the proxy does not know or fail that validation, while
    a response without usage is valid (the field is optional)."""
    if input_tokens is None:
        return None
    return {
        "input_tokens": input_tokens,
        "input_tokens_details": {
            "cached_tokens": 0,
            "cache_write_tokens": 0,
            "input_tokens_per_turn": [],
            "cached_tokens_per_turn": [],
        },
        "output_tokens": output_tokens,
        "output_tokens_details": {
            "reasoning_tokens": reasoning_tokens,
            "tool_output_tokens": 0,
            "output_tokens_per_turn": [],
            "tool_output_tokens_per_turn": [],
        },
        "total_tokens": input_tokens + output_tokens,
    }


RESPONSES = _Responses()


def responses_response(guard: GuardView, *, trim: bool) -> dict[str, Any]:
    """The Response object: the engine's own (from its terminal event) when the guard let the
    stream finish, else the guard's ``incomplete`` one (trimmed at the onset when ``trim``)."""
    rs = guard.extra
    aborted = next((s for s in guard.choices.values() if s.action == "aborted"), None)
    if aborted is not None:
        return incomplete_response(guard, aborted, trim=trim)
    if isinstance(rs, ResponsesState) and rs.final is not None:
        return rs.final
    out = dict(guard.template or {})
    out["output"] = []
    out["usage"] = usage(guard)
    return out
