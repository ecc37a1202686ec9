"""Non-streamed answers rebuilt from the stream the guard read.

The proxy asks the engine for a stream even when the client did not, so it can stop a loop
early; a non-streaming client then gets the JSON object the engine would have answered with,
built here from what :class:`proxy.core.guard.StreamGuard` collected. Where the guard aborted, the
aborted block is cut at the detector's ``onset_char`` when ``trim`` is set (the loop itself is
not worth returning), and ends the way the surface reports a stop it did not choose.

Pure: state in, dict out.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import orjson

from proxy.core import chunks
from proxy.core.guard import ENGINE_REPETITION
from proxy.core.surfaces import messages, responses

if TYPE_CHECKING:
    from proxy.core.guard import StreamGuard


def chat_response(guard: StreamGuard, *, trim: bool) -> dict[str, Any]:
    """The ``chat.completion`` / ``text_completion`` object vLLM would have answered with."""
    endpoint = guard.policy.endpoint
    tpl = guard.template or {}
    choices = []
    for index in range(max(guard.n, max(guard.choices, default=-1) + 1)):
        st = guard.choices.get(index)
        if st is None:
            continue
        cut = None
        if trim and st.action == "aborted" and st.verdict is not None:
            cut = st.verdict.onset_char
        texts: dict[str, list[str]] = {}
        tool_args: dict[int, list[str]] = {}
        for offset, p in st.pieces:
            text = p.text
            if cut is not None:
                if offset >= cut:
                    break
                if offset + len(text) > cut:
                    text = text[: cut - offset]
            if p.channel == "tool":
                tool_args.setdefault(p.tool_index, []).append(text)
            else:
                texts.setdefault(p.channel, []).append(text)
        choice: dict[str, Any] = {"index": index}
        if endpoint == "chat":
            message: dict[str, Any] = {"role": "assistant"}
            message["content"] = "".join(texts["content"]) if "content" in texts else None
            for key in chunks.REASONING_KEYS:
                if key in texts:
                    message[key] = "".join(texts[key])
            calls = []
            for ti in sorted(set(st.tools) | set(tool_args)):
                slot = st.tools.get(ti, {})
                calls.append(
                    {
                        "id": slot.get("id"),
                        "type": slot.get("type", "function"),
                        "function": {
                            "name": slot.get("name"),
                            "arguments": "".join(tool_args.get(ti, [])),
                        },
                    }
                )
            message["tool_calls"] = calls
            choice["message"] = message
            choice["logprobs"] = {"content": st.logprobs} if st.logprobs is not None else None
        else:
            choice["text"] = "".join(texts.get("text", []))
            choice["logprobs"] = st.completion_logprobs
        finish = st.finish_reason
        if finish == ENGINE_REPETITION and guard.policy.map_engine_repetition:
            finish = guard.policy.abort_finish_reason
        choice["finish_reason"] = finish
        choice["stop_reason"] = st.stop_reason
        if st.action == "aborted" and st.verdict is not None:
            choice["guard"] = chunks.guard_object(st.verdict, st.tokens)
        choices.append(choice)
    out: dict[str, Any] = {
        "id": tpl.get("id"),
        "object": "chat.completion" if endpoint == "chat" else "text_completion",
        "created": tpl.get("created"),
        "model": tpl.get("model"),
        "choices": choices,
    }
    if guard.aborted or guard.usage is None:
        out["usage"] = guard.final_usage()
    else:
        out["usage"] = guard.usage
    return out


def responses_response(guard: StreamGuard, *, trim: bool) -> dict[str, Any]:
    """The Response object: the engine's own (from its terminal event) when the guard let the
    stream finish, else the guard's ``incomplete`` one (trimmed at the onset when ``trim``)."""
    rs = guard.extra
    aborted = next((s for s in guard.choices.values() if s.action == "aborted"), None)
    if aborted is not None:
        return responses.incomplete_response(guard, aborted, trim=trim)
    if isinstance(rs, responses.ResponsesState) and rs.final is not None:
        return rs.final
    out = dict(guard.template or {})
    out["output"] = []
    out["usage"] = responses.usage(guard)
    return out


def messages_response(guard: StreamGuard, *, trim: bool) -> dict[str, Any]:
    """The Message object, with its content blocks rebuilt from the deltas."""
    ms = guard.extra
    if not isinstance(ms, messages.MessagesState):
        ms = messages.MessagesState()
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
        delta = messages.abort_delta(guard, state, verdict)["delta"]
        out["stop_reason"] = delta["stop_reason"]
        if "stop_details" in delta:
            out["stop_details"] = delta["stop_details"]
        out["usage"] = messages.usage(guard)
        out["guard"] = delta["guard"]
        return out
    out["stop_reason"] = ms.stop_reason
    if ms.stop_sequence is not None:
        out["stop_sequence"] = ms.stop_sequence
    usage = dict(out.get("usage") or {})
    usage.update(ms.usage or {})
    out["usage"] = usage or messages.usage(guard)
    return out
