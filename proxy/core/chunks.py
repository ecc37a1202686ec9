"""What the guard reads out of an OpenAI/vLLM streaming chunk, and the chunks it writes itself.

Pure: JSON in, plain values out. One ``orjson.loads`` per event; nothing is re-serialised unless
the relay has to change the event (strip usage the client did not ask for, end an aborted
choice).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

import orjson

from proxy.detect import Verdict

#: vLLM's own loop stop (``repetition_detection``): the finish reason of a choice it ended.
ENGINE_REPETITION = "repetition"

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


# One whole upstream read that is exactly one vLLM text chunk: ``data: {...}\n\n`` with simple
# top-level values (printable ASCII strings without escapes, integers of at most 18 digits), one
# choice whose only news is a text delta (chat ``delta.content`` or completions ``text``), every
# other choice key ``null``, and usage absent, ``null`` or vLLM's three counts (vLLM 0.32 adds
# ``"completion_tokens_details":null`` on chat, ``"prompt_token_ids":null`` on completions).
# The pattern only
# accepts text that ``orjson.loads`` accepts with the same meaning (no duplicate keys that could
# disagree, no control characters in strings, no leading zeros), so a match may skip the parse.
_STR = rb'"[\x20\x21\x23-\x5b\x5d-\x7e]*"'
_INT = rb"(?:0|[1-9][0-9]{0,17})"
_TEXT = rb'"([^"\\\x00-\x1f]*(?:\\.[^"\\\x00-\x1f]*)*)"'
#: The pieces of those patterns, for the surfaces' own byte-level paths: a JSON string of printable
#: ASCII without escapes, a JSON integer ``orjson`` reads as the same int, a JSON string whose body
#: is captured (escapes allowed, no control characters, so no line end).
JSON_STR: bytes = _STR
JSON_INT: bytes = _INT
JSON_TEXT: bytes = _TEXT
_FAST_RE = re.compile(
    rb"data: \{(?:\"(?:id|object|model|system_fingerprint)\":"
    + _STR
    + rb",|\"created\":"
    + _INT
    + rb',)*"choices":\[\{"index":('
    + _INT
    + rb'),(?:"delta":\{"content":'
    + _TEXT
    + rb'\}|"text":'
    + _TEXT
    + rb')(?:,"(?:logprobs|finish_reason|stop_reason|token_ids|prompt_token_ids)":null)*'
    + rb'\}\](?:(,"usage":)(?:null|\{"prompt_tokens":('
    + _INT
    + rb'),"total_tokens":('
    + _INT
    + rb'),"completion_tokens":('
    + _INT
    + rb')((?:,"(?:prompt_tokens_details|completion_tokens_details)":null)*)\}))?\}\n\n',
    re.DOTALL,
)
_FAST_CHUNK = _FAST_RE.fullmatch
#: The same shape at a position of a read that holds several events (``text_event(read, pos)``):
#: the pattern ends at the event's blank line and none of its strings can hold a line end, so a
#: match is exactly one whole event, the one the SSE parser would find there.
text_event = _FAST_RE.match


_NULL_KEY = re.compile(rb'"(\w+)":null').findall


@dataclass(slots=True)
class TextChunk:
    """What :func:`text_chunk` read out of a plain text chunk without parsing its JSON.

    ``usage_at`` is the offset in the read of ``,"usage":`` (for cutting it off), or -1;
    ``usage`` is vLLM's three counts when the chunk carried them (``None`` when absent or
    ``null``).
    """

    index: int
    text: str
    usage_at: int
    usage: dict[str, Any] | None


def text_chunk(read: bytes) -> TextChunk | None:
    """The choice index, new text and usage of ``read`` when it is exactly one plain vLLM text
    chunk (see ``_FAST_CHUNK``), else ``None`` (the caller then parses it the general way).

    This is the relay's per-token fast path: most events of a healthy stream are exactly this
    shape, and a regular-expression match plus a UTF-8 decode cost a fraction of ``orjson.loads``
    and the dict walk after it, which matters most when every chunk wakes the proxy alone. A
    string with escapes is unescaped by ``orjson`` itself (the same rules, surrogates included);
    bytes that are not valid UTF-8 give ``None``, as they make ``orjson.loads`` fail.
    """
    m = _FAST_CHUNK(read)
    if m is None:
        return None
    text = match_text(m)
    if text is None:
        return None
    return TextChunk(int(m[1]), text, m.start(4), None if m[5] is None else match_usage(m))


def match_text(m: re.Match[bytes]) -> str | None:
    """The text of a :data:`text_event` match, or ``None`` when ``orjson.loads`` would fail."""
    raw = m[2]
    if raw is None:
        raw = m[3]
    return json_string(raw)


def json_string(raw: bytes) -> str | None:
    """The value of a JSON string's body as ``orjson.loads`` reads it (``None`` where it fails:
    bytes that are not UTF-8, a bad escape), without parsing when there is no escape."""
    try:
        return raw.decode() if b"\\" not in raw else orjson.loads(b'"' + raw + b'"')
    except (UnicodeDecodeError, orjson.JSONDecodeError):
        return None


def match_usage(m: re.Match[bytes]) -> dict[str, Any]:
    """The ``usage`` object of a :data:`text_event` match that carried vLLM's three counts."""
    usage: dict[str, Any] = {
        "prompt_tokens": int(m[5]),
        "total_tokens": int(m[6]),
        "completion_tokens": int(m[7]),
    }
    if m[8]:
        for key in _NULL_KEY(m[8]):
            usage[key.decode()] = None
    return usage


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


def has_side_text(choice: dict[str, Any]) -> bool:
    """Whether the choice's delta writes text outside the answer (thinking, tool arguments),
    which the relay then feeds channel by channel (see :mod:`proxy.core.channels`)."""
    delta = choice.get("delta")
    if type(delta) is not dict or (len(delta) == 1 and "content" in delta):
        return False
    return any(delta.get(key) for key in (*REASONING_KEYS, "tool_calls"))


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


def logprobs_entries(lp: Any) -> list[Any] | None:
    """A choice's ``logprobs`` value as chat ``logprobs.content`` entries (``{"logprob": x,
    "top_logprobs": [{"logprob": y}, ...]}``), the shape the detector reads: chat's list as it
    is, the completions columns (``token_logprobs``, ``top_logprobs`` dicts) turned into it."""
    if not isinstance(lp, dict):
        return None
    content = lp.get("content")
    if isinstance(content, list):
        return content
    chosen = lp.get("token_logprobs")
    if not isinstance(chosen, list):
        return None
    tops = lp.get("top_logprobs")
    if not isinstance(tops, list) or len(tops) != len(chosen):
        tops = [None] * len(chosen)
    return [
        {
            "logprob": value,
            "top_logprobs": [{"logprob": v} for v in top.values()] if isinstance(top, dict) else [],
        }
        for value, top in zip(chosen, tops, strict=True)
    ]


# What may follow ``"logprobs":{`` up to its closing brace: strings (escapes included) are
# skipped whole, so a brace inside a token's text does not count.
_LP_TOKENS = re.compile(rb'"(?:[^"\\]|\\.)*"|[{}]', re.DOTALL)


def null_logprobs(data: bytes) -> bytes | None:
    """``data`` (one chunk's JSON) with every ``"logprobs":{...}`` value cut to ``null`` — the
    bytes the engine writes when no logprobs were asked for — or ``None`` when the braces do not
    balance (the caller then re-serialises). A key is ``"logprobs"`` only outside strings: in a
    string its quotes would be escaped, and completions' ``"token_logprobs"`` and the entries'
    ``"top_logprobs"`` do not end in the five bytes ``"logprobs":{``."""
    out: list[bytes] = []
    pos = 0
    key = b'"logprobs":{'
    while (at := data.find(key, pos)) >= 0:
        start = at + len(key) - 1
        depth = 0
        end = -1
        for m in _LP_TOKENS.finditer(data, start):
            tok = m[0]
            if tok == b"{":
                depth += 1
            elif tok == b"}":
                depth -= 1
                if depth == 0:
                    end = m.end()
                    break
        if end < 0:
            return None
        out.append(data[pos:start])
        out.append(b"null")
        pos = end
    if not out:
        return data
    out.append(data[pos:])
    return b"".join(out)


def guard_object(
    verdict: Verdict, completion_tokens: int, action: str = "aborted"
) -> dict[str, Any]:
    """The ``guard`` extension object attached to an aborted (or observed) choice; a language
    verdict also says which language was expected and where that came from."""
    out: dict[str, Any] = {
        "action": action,
        "signal": verdict.signal,
        "score": verdict.score,
        "completion_tokens": completion_tokens,
        "onset_char": verdict.onset_char,
        "channel": verdict.channel,
    }
    if verdict.language_source is not None:
        out["expected_language"] = verdict.expected_language
        out["language_source"] = verdict.language_source
    return out


def mark_aborted(
    choice: dict[str, Any], verdict: Verdict, finish_reason: str, completion_tokens: int
) -> None:
    """End ``choice`` (a dict from a chunk or a response) as the guard's abort does."""
    choice["finish_reason"] = finish_reason
    choice["stop_reason"] = "coherence_guard:" + verdict.signal
    choice["guard"] = guard_object(verdict, completion_tokens)


def chat_usage(prompt_tokens: int | None, completion_tokens: int) -> dict[str, int]:
    """The ``usage`` object of chat and completions, in vLLM's key order: the one place it is
    built, by the relay, heal and the reassembled answers alike.

    ``prompt_tokens`` is the engine's count, or ``None`` where the engine gave none (and did not
    answer when asked: :mod:`proxy.core.prompt_count`): then ``prompt_tokens`` and
    ``total_tokens`` are left out, never written as a count the proxy does not know."""
    if prompt_tokens is None:
        return {"completion_tokens": completion_tokens}
    return {
        "prompt_tokens": prompt_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
        "completion_tokens": completion_tokens,
    }


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


def json_object(data: bytes | None) -> dict[str, Any] | None:
    """The JSON object an event's data holds, or ``None`` (no data, not JSON, not an object):
    what a surface's reader relays untouched."""
    if data is None:
        return None
    try:
        obj = orjson.loads(data)
    except orjson.JSONDecodeError:
        return None
    return obj if type(obj) is dict else None


def named_event(obj: dict[str, Any]) -> bytes:
    """One named SSE event (``event: <type>``), as the Responses and Messages streams write
    them: the event name is the object's own ``type``."""
    kind: str = obj["type"]
    return b"event: " + kind.encode() + b"\ndata: " + orjson.dumps(obj) + b"\n\n"
