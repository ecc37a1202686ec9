"""Golden relay outputs: what the guard sends the client, and what it records, for a fixed set of
upstream streams on all four surfaces, cut into reads in several ways.

The relay's per-event path is rewritten for speed from time to time (byte-level fast paths,
usage handling, framing); whatever the rewrite, the client must get the same bytes and every
verdict must come at the same character. ``tests/data/relay_golden.json`` holds, per case, a
digest of the client bytes and of the guard's end state, written by this module from the code
before such a change (``python tests/relay_golden.py --write``, run with the older tree first on
``PYTHONPATH``); ``tests/test_relay_golden.py`` checks today's code against it.

Streams: the healthy and degenerate texts of ``tests/data/corpus.jsonl`` in vLLM's wire format as
``tests/fakes/vllm.py`` writes it (chat and completions with and without the continuous usage the
proxy asks for, Responses, Messages), and the streams recorded from vLLM in ``tests/streams/``.
Reads: one event per read, two events per read, the whole stream in one read, and 97-byte reads
(events split anywhere, UTF-8 characters included).
"""

from __future__ import annotations

import hashlib
import json
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
if __name__ == "__main__" and str(HERE.parent) not in sys.path:
    sys.path.append(str(HERE.parent))

from proxy.core.guard import GuardPolicy, StreamGuard  # noqa: E402
from proxy.core.records import Endpoint  # noqa: E402
from proxy.detect import Detector, DetectorConfig  # noqa: E402
from tests.fakes.vllm import FakeVLLM, Script, messages_events, responses_events  # noqa: E402

GOLDEN = HERE / "data" / "relay_golden.json"
USAGE = {"include_usage": True, "continuous_usage_stats": True}
STREAMS = HERE / "streams"
#: Recorded streams and the surface each is relayed as.
RECORDED: dict[str, Endpoint] = {
    "chat_crlf_comments.sse": "chat",
    "chat_n2_reasoning_tools.sse": "chat",
    "chat_usage.sse": "chat",
    "chat_vllm_length.sse": "chat",
    "completions.sse": "completions",
    "reasoning/chat.sse": "chat",
    "reasoning/messages.sse": "messages",
    "reasoning/responses.sse": "responses",
    "surfaces/messages_vllm.sse": "messages",
    "surfaces/messages_vllm_length.sse": "messages",
    "surfaces/messages_vllm_loop.sse": "messages",
    "surfaces/responses_vllm.sse": "responses",
    "surfaces/responses_vllm_length.sse": "responses",
    "surfaces/responses_vllm_loop.sse": "responses",
}


def _texts() -> list[tuple[str, str]]:
    rows = [json.loads(line) for line in (HERE / "data" / "corpus.jsonl").read_text().splitlines()]
    # Two degenerate and two healthy texts: enough for aborts and clean ends on every surface.
    return [(f"{row['label']}{i}", row["text"]) for i, row in enumerate(rows) if i in (0, 1, 4, 5)]


def _events(surface: Endpoint, text: str, usage: bool) -> list[bytes]:
    script = Script(texts=[text], finish_reason="length")
    req: dict[str, Any] = {"model": "m", "stream": True, "max_tokens": 4096}
    if surface in ("chat", "completions"):
        if usage:
            req["stream_options"] = USAGE
        raw = FakeVLLM()._events(req, surface == "chat", script)
    elif surface == "responses":
        raw = responses_events(req, script)
    else:
        raw = messages_events(req, script)
    return [e for e in raw if e is not None]


def _split(stream: bytes) -> list[bytes]:
    """The stream's events (LF framing; the CRLF recordings are only cut by size)."""
    parts = stream.split(b"\n\n")
    return [p + b"\n\n" for p in parts[:-1]] + ([parts[-1]] if parts[-1] else [])


READS: dict[str, Callable[[list[bytes]], list[bytes]]] = {
    "event": lambda ev: ev,
    "pairs": lambda ev: [b"".join(ev[i : i + 2]) for i in range(0, len(ev), 2)],
    "whole": lambda ev: [b"".join(ev)],
    "97": lambda ev: [b"".join(ev)[i : i + 97] for i in range(0, len(b"".join(ev)), 97)],
}


def _policies(surface: Endpoint, injected: bool, full: bool) -> dict[str, GuardPolicy]:
    """The app's policies: a client that asked for no usage, a non-streamed answer; with
    ``full`` also monitor mode and clients that asked for usage at the end or in every chunk."""
    base: dict[str, Any] = {"endpoint": surface, "usage_null": surface == "completions"}
    out = {
        "plain": GuardPolicy.create(
            **base,
            strip_chunk_usage=injected,
            strip_final_usage=injected,
            client_wants_usage=False,
        ),
        "collect": GuardPolicy.create(**base, strip_chunk_usage=False, collect=True),
    }
    if not full:
        return out
    out["monitor"] = GuardPolicy.create(
        **base, mode="monitor", strip_chunk_usage=injected, strip_final_usage=injected
    )
    if surface in ("chat", "completions"):
        out["usage-end"] = GuardPolicy.create(**base, strip_chunk_usage=injected)
        out["usage-continuous"] = GuardPolicy.create(**base)
    return out


def cases() -> Iterator[tuple[str, Endpoint, list[bytes], GuardPolicy]]:
    """(name, surface, events, policy) for every case."""
    streams: list[tuple[str, Endpoint, list[bytes], bool, bool]] = []
    for name, text in _texts():
        for surface in ("chat", "completions"):
            usage, bare = _events(surface, text, True), _events(surface, text, False)
            streams.append((f"{surface}/{name}/usage", surface, usage, True, True))
            streams.append((f"{surface}/{name}/bare", surface, bare, False, False))
        for surface in ("responses", "messages"):
            streams.append(
                (f"{surface}/{name}", surface, _events(surface, text, False), False, True)
            )
    for path, surface in RECORDED.items():
        data = (STREAMS / path).read_bytes()
        streams.append((f"recorded/{path}", surface, _split(data), b'"usage":{' in data, True))
    for name, surface, events, injected, full in streams:
        for pname, policy in _policies(surface, injected, full).items():
            yield f"{name}/{pname}", surface, events, policy


def relay(events: list[bytes], policy: GuardPolicy, reads: str) -> dict[str, Any]:
    """Feed the stream cut as ``reads`` says; the client bytes and the end state."""
    config = DetectorConfig()
    guard = StreamGuard(policy, lambda: Detector(config))
    out = []
    for read in READS[reads](events):
        out.append(guard.feed(read))
        if guard.done:
            break
    else:
        out.append(guard.eof())
    state: dict[str, Any] = {
        "outcome": guard.outcome(),
        "prompt_tokens": guard.prompt_tokens,
        "usage": guard.usage,
        "choices": [
            {
                "index": r.index,
                "tokens": r.completion_tokens,
                "finish": r.finish_reason,
                "action": r.detection_action,
                "chars": guard.choices[r.index].chars,
                "verdict": None
                if r.summary is None or r.summary.verdict is None
                else [
                    r.summary.verdict.signal,
                    r.summary.verdict.onset_char,
                    r.summary.verdict.fired_at_char,
                    r.summary.verdict.fired_at_token,
                ],
            }
            for r in guard.records(None)
        ],
    }
    if policy.collect:
        state["response"] = guard.response(trim=True)
    body = b"".join(out)
    return {
        "bytes": hashlib.sha256(body).hexdigest()[:16],
        "length": len(body),
        "state": hashlib.sha256(json.dumps(state, sort_keys=True).encode()).hexdigest()[:16],
        "verdicts": [c["verdict"][:3] for c in state["choices"] if c["verdict"]],
    }


def compute() -> dict[str, dict[str, Any]]:
    out = {}
    for name, _surface, events, policy in cases():
        for reads in READS:
            out[f"{name}/{reads}"] = relay(events, policy, reads)
    return out


if __name__ == "__main__":
    if sys.argv[1:] != ["--write"]:
        raise SystemExit("usage: python tests/relay_golden.py --write")
    GOLDEN.write_text(json.dumps(compute(), indent=0, sort_keys=True) + "\n")
    print(f"wrote {GOLDEN}")
