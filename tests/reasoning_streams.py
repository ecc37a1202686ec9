"""Reasoning streams built from the engine's own framing (tests/streams/reasoning/) and real
texts (tests/streams/reasoning/texts.jsonl): the recorded thinking and answer deltas are replaced
by new texts, every other event is kept, with the recorded texts replaced where an event repeats
them whole (Responses' ``*.done`` events, the final response) and Responses' sequence numbers
renumbered. Used by tests/test_channels.py and bench/measure/detector/channels_replay.py.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

STREAMS = Path(__file__).parent / "streams" / "reasoning"
SURFACES = ("chat", "responses", "messages")

_TOKEN = re.compile(r"\s*\S{1,6}|\s+")


def texts() -> dict[str, dict[str, Any]]:
    """The real texts by id (see tests/streams/reasoning/README.md)."""
    rows = (json.loads(line) for line in (STREAMS / "texts.jsonl").read_text().splitlines())
    return {row["id"]: row for row in rows}


def tokens(text: str) -> list[str]:
    """``text`` cut into token-sized deltas (a word, or up to six characters of one)."""
    return _TOKEN.findall(text)


def _events(surface: str) -> list[tuple[bytes, dict[str, Any] | None]]:
    raw = (STREAMS / f"{surface}.sse").read_bytes()
    out: list[tuple[bytes, dict[str, Any] | None]] = []
    for block in raw.split(b"\n\n"):
        if not block:
            continue
        data = next((ln[6:] for ln in block.split(b"\n") if ln.startswith(b"data: ")), None)
        obj = None
        if data is not None and data.startswith(b"{"):
            obj = json.loads(data)
        out.append((block + b"\n\n", obj))
    return out


def _channel(surface: str, obj: dict[str, Any] | None) -> tuple[str, str, str] | None:
    """(``thinking``/``answer``, path to the delta's text) for a delta event, else ``None``."""
    if obj is None:
        return None
    if surface == "chat":
        choices = obj.get("choices") or []
        delta = choices[0].get("delta") if choices else None
        if not isinstance(delta, dict) or "role" in delta:
            return None
        if isinstance(delta.get("reasoning"), str):
            return ("thinking", "delta", "reasoning")
        if isinstance(delta.get("content"), str) and delta["content"]:
            return ("answer", "delta", "content")
        return None
    kind = obj.get("type")
    if surface == "responses":
        if kind == "response.reasoning_text.delta":
            return ("thinking", "", "delta")
        if kind == "response.output_text.delta":
            return ("answer", "", "delta")
        return None
    if kind == "content_block_delta":
        dtype = obj.get("delta", {}).get("type")
        if dtype == "thinking_delta":
            return ("thinking", "delta", "thinking")
        if dtype == "text_delta":
            return ("answer", "delta", "text")
    return None


def _with_text(surface: str, obj: dict[str, Any], where: tuple[str, str], text: str) -> None:
    holder = obj
    if surface == "chat":
        holder = obj["choices"][0]["delta"]
    elif where[0]:
        holder = obj[where[0]]
    holder[where[1]] = text


def _replace(value: Any, old: dict[str, str]) -> Any:
    if isinstance(value, str):
        return old.get(value, value)
    if isinstance(value, list):
        return [_replace(v, old) for v in value]
    if isinstance(value, dict):
        return {k: _replace(v, old) for k, v in value.items()}
    return value


def _encode(block: bytes, obj: dict[str, Any]) -> bytes:
    head = b"".join(ln + b"\n" for ln in block.split(b"\n") if ln.startswith(b"event: "))
    data = json.dumps(obj, ensure_ascii=False, separators=(",", ":")).encode()
    return head + b"data: " + data + b"\n\n"


def build(surface: str, thinking: str, answer: str) -> bytes:
    """The recorded ``surface`` stream with ``thinking`` and ``answer`` as its texts."""
    events = _events(surface)
    recorded = {"thinking": "", "answer": ""}
    for _, obj in events:
        found = _channel(surface, obj)
        if found is not None and obj is not None:
            holder = obj["choices"][0]["delta"] if surface == "chat" else obj
            if surface != "chat" and found[1]:
                holder = obj[found[1]]
            recorded[found[0]] += holder[found[2]]
    new = {"thinking": thinking, "answer": answer}
    old = {recorded[k]: new[k] for k in recorded if recorded[k]}
    out: list[bytes] = []
    seen: set[str] = set()
    seq = 0
    for block, obj in events:
        found = _channel(surface, obj)
        if obj is None:
            out.append(block)
            continue
        if found is not None:
            if found[0] in seen:
                continue
            seen.add(found[0])
            for tok in tokens(new[found[0]]):
                piece = json.loads(json.dumps(obj))
                _with_text(surface, piece, found[1:], tok)
                if "sequence_number" in piece:
                    piece["sequence_number"] = seq
                    seq += 1
                out.append(_encode(block, piece))
            continue
        changed = _replace(obj, old)
        if "sequence_number" in changed:
            changed["sequence_number"] = seq
            seq += 1
        out.append(block if changed == obj else _encode(block, changed))
    return b"".join(out)


def loop(text: str, *, keep: int = 600, unit: int = 160, copies: int = 12) -> str:
    """A real text that starts looping: its first ``keep`` characters, then the ``unit``
    characters before that point over and over (how a model stuck in its thinking reads)."""
    head = text[:keep]
    return head + head[-unit:] * copies
