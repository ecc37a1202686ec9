"""What the guard reads out of an OpenAI/vLLM streaming chunk, and the chunks it writes itself.

Pure: JSON in, plain values out. One ``orjson.loads`` per event; nothing is re-serialised unless
the relay has to change the event (strip usage the client did not ask for, end an aborted
choice).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import orjson

from proxy.detect import Verdict

#: Channels of a chat delta whose text the detector watches, in the order they are fed.
#: ``reasoning_content`` is the pre-PR-#27752 name of vLLM's ``reasoning``; both are accepted.
REASONING_KEYS = ("reasoning", "reasoning_content")


@dataclass(slots=True)
class Piece:
    """A piece of generated text and where it belongs (for reassembling non-streamed answers).

    ``channel`` is ``content``, ``reasoning``/``reasoning_content``, ``text`` (completions) or
    ``tool`` (then ``tool_index`` says which call's arguments).
    """

    channel: str
    text: str
    tool_index: int = 0


def choice_text(choice: dict[str, Any]) -> str:
    """All new text of one choice (the detector's input), fast for vLLM's usual
    ``{"delta": {"content": ...}}``: reasoning, then content, then tool-call arguments."""
    delta = choice.get("delta")
    if delta is None:
        text = choice.get("text")
        return text if type(text) is str else ""
    if type(delta) is not dict:
        return ""
    content = delta.get("content")
    if type(content) is str and len(delta) == 1:
        return content
    pieces = choice_pieces(choice)
    return pieces[0].text if len(pieces) == 1 else "".join(p.text for p in pieces)


def choice_pieces(choice: dict[str, Any]) -> list[Piece]:
    """The new text of one choice by channel (for reassembling a non-streamed answer)."""
    pieces: list[Piece] = []
    delta = choice.get("delta")
    if isinstance(delta, dict):
        for key in REASONING_KEYS:
            value = delta.get(key)
            if isinstance(value, str) and value:
                pieces.append(Piece(key, value))
        content = delta.get("content")
        if isinstance(content, str) and content:
            pieces.append(Piece("content", content))
        calls = delta.get("tool_calls")
        if isinstance(calls, list):
            for call in calls:
                if not isinstance(call, dict):
                    continue
                fn = call.get("function")
                args = fn.get("arguments") if isinstance(fn, dict) else None
                if isinstance(args, str) and args:
                    tool_index = call.get("index", 0)
                    pieces.append(
                        Piece("tool", args, tool_index if isinstance(tool_index, int) else 0)
                    )
    elif delta is None:
        text = choice.get("text")
        if isinstance(text, str) and text:
            pieces.append(Piece("text", text))
    return pieces


def logprobs_content(choice: dict[str, Any]) -> list[Any] | None:
    """The chat ``logprobs.content`` list of a choice, when the upstream sent logprobs."""
    lp = choice.get("logprobs")
    if isinstance(lp, dict):
        content = lp.get("content")
        if isinstance(content, list):
            return content
    return None


def guard_object(
    verdict: Verdict, completion_tokens: int, action: str = "aborted"
) -> dict[str, Any]:
    """The ``guard`` extension object attached to an aborted (or observed) choice."""
    return {
        "action": action,
        "signal": verdict.signal,
        "score": verdict.score,
        "completion_tokens": completion_tokens,
        "onset_char": verdict.onset_char,
    }


def mark_aborted(
    choice: dict[str, Any], verdict: Verdict, finish_reason: str, completion_tokens: int
) -> None:
    """End ``choice`` (a dict from a chunk or a response) as the guard's abort does."""
    choice["finish_reason"] = finish_reason
    choice["stop_reason"] = "coherence_guard:" + verdict.signal
    choice["guard"] = guard_object(verdict, completion_tokens)


def usage_chunk(template: dict[str, Any], usage: dict[str, Any]) -> bytes:
    """The ``choices: []`` usage chunk, with the id/object/created/model of ``template``."""
    keys = ("id", "object", "created", "model")
    out: dict[str, Any] = {k: template[k] for k in keys if k in template}
    out["choices"] = []
    out["usage"] = usage
    return orjson.dumps(out)


def strip_usage(data: bytes, chunk: dict[str, Any], *, null: bool = False) -> bytes:
    """``data`` without its ``usage`` value — the key removed, or set to ``null`` where the
    engine writes it that way (vLLM's completions chunks) — cutting bytes when ``usage`` is the
    last key (vLLM's layout) and re-serialising only otherwise."""
    if next(reversed(chunk)) == "usage":
        cut = data.rfind(b',"usage":')
        if cut > 0 and data[-1:] == b"}":
            return data[:cut] + (b',"usage":null}' if null else b"}")
    if null:
        return orjson.dumps({**chunk, "usage": None})
    return orjson.dumps({k: v for k, v in chunk.items() if k != "usage"})


def dumps(obj: Any) -> bytes:
    return orjson.dumps(obj)
