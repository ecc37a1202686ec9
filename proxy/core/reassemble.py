"""Non-streamed answers rebuilt from the stream the guard read.

Chat and completions here; the Responses and Messages objects are built by their surfaces
(:mod:`proxy.core.surfaces`). The proxy asks the engine for a stream even when the client did
not, so it can stop a loop early; a non-streaming client then gets the JSON object the engine
would have answered with, built here from what :class:`proxy.core.guard.StreamGuard` collected.
Where the guard aborted, the aborted block is cut at the detector's ``onset_char`` when ``trim``
is set (the loop itself is not worth returning), and ends the way the surface reports a stop it
did not choose.

Pure: state in, dict out.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from proxy.core import chunks
from proxy.core.chunks import ENGINE_REPETITION

if TYPE_CHECKING:
    from proxy.core.channels import BlockState
    from proxy.core.chunks import Piece
    from proxy.core.relay_types import GuardView


def chat_response(guard: GuardView, *, trim: bool) -> dict[str, Any]:
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


def collect_pieces(state: BlockState, pieces: list[Piece]) -> None:
    """Keep a block's pieces (with their offsets) for the non-streamed answer."""
    offset = state.chars
    for p in pieces:
        state.pieces.append((offset, p))
        offset += len(p.text)


def collect_extra(state: BlockState, choice: dict[str, Any], *, strip_logprobs: bool) -> None:
    """Keep what a non-streamed chat/completions answer carries beside its text: tool-call ids,
    types and names, and the logprobs (unless the proxy asked for them itself)."""
    delta = choice.get("delta")
    if isinstance(delta, dict):
        calls = delta.get("tool_calls")
        if isinstance(calls, list):
            for call in calls:
                if not isinstance(call, dict):
                    continue
                ti = call.get("index", 0)
                slot = state.tools.setdefault(ti if isinstance(ti, int) else 0, {})
                for key in ("id", "type"):
                    if call.get(key) is not None:
                        slot[key] = call[key]
                fn = call.get("function")
                if isinstance(fn, dict) and fn.get("name"):
                    slot["name"] = fn["name"]
    lp = None if strip_logprobs else choice.get("logprobs")
    if isinstance(lp, dict):
        content = lp.get("content")
        if isinstance(content, list):
            state.logprobs = (state.logprobs or []) + content
        elif "tokens" in lp:
            acc = state.completion_logprobs or {}
            for key in ("text_offset", "token_logprobs", "tokens", "top_logprobs"):
                val = lp.get(key)
                if isinstance(val, list):
                    acc.setdefault(key, []).extend(val)
            state.completion_logprobs = acc
