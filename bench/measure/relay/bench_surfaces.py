"""The guard's own CPU per upstream event on each surface: chat, Responses, Messages.

No sockets, no event loop: N ``StreamGuard``s (``enforce``, streaming, the app's set-up for each
route) are fed one upstream read per SSE event, round-robin across the streams, as when every
token arrives alone. The streams carry the same healthy texts (``tests/data/corpus.jsonl`` or
``--corpus``), cut at 128 tokens, written in each surface's wire format by the fake engine
(``tests/fakes/vllm.py``: chat as vLLM writes it, Responses and Messages in the shapes recorded
from vLLM 0.32). Per surface: µs per event with a detector that does nothing (``parse``: the
relay's own work) and with the real one (``enforce``); best of ``--repeat``.

    python bench/measure/relay/bench_surfaces.py                 # 256 streams, best of 3
    python bench/measure/relay/bench_surfaces.py --streams 32 --repeat 5

A benchmark, not a test: figures go to the README.
"""

from __future__ import annotations

import argparse
import gc
import json
import sys
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench.measure.relay.null_detector import NullDetector  # noqa: E402
from proxy.core.guard import GuardPolicy, StreamGuard  # noqa: E402
from proxy.core.records import Endpoint  # noqa: E402
from proxy.detect import Detector, DetectorConfig  # noqa: E402
from tests.fakes.vllm import (  # noqa: E402
    FakeVLLM,
    Script,
    messages_events,
    responses_events,
    tokenize,
)

MAX_TOKENS = 128
SURFACES: tuple[Endpoint, ...] = ("chat", "responses", "messages")


def healthy_texts(path: Path, limit: int) -> list[str]:
    """Healthy texts long enough to fill a stream that the detector lets through."""
    texts: list[str] = []
    config = DetectorConfig()
    with path.open(encoding="utf-8") as fh:
        for line in fh:
            row = json.loads(line)
            if row.get("label") != "healthy":
                continue
            pieces = tokenize(row.get("text") or "")[:MAX_TOKENS]
            if len(pieces) < MAX_TOKENS:
                continue
            det = Detector(config)
            if all(det.feed(p) is None for p in pieces) and det.finish().verdict is None:
                texts.append("".join(pieces))
            if len(texts) >= limit:
                break
    if not texts:
        raise SystemExit(f"no healthy text of {MAX_TOKENS}+ tokens in {path}")
    return texts


def events_for(surface: Endpoint, text: str) -> list[bytes]:
    """One stream's upstream events on ``surface``."""
    script = Script(texts=[text], finish_reason="stop")
    if surface == "chat":
        req = {"model": "m", "stream": True}
        raw = FakeVLLM()._events(req, True, script)
    elif surface == "responses":
        raw = responses_events({"model": "m", "stream": True}, script)
    else:
        raw = messages_events({"model": "m", "stream": True, "max_tokens": 4096}, script)
    return [e for e in raw if e is not None]


def run(surface: Endpoint, streams: list[list[bytes]], make: Callable[[], Detector]) -> float:
    """CPU µs per event, feeding the streams round-robin one event at a time."""
    policy = GuardPolicy.create(endpoint=surface, mode="enforce", client_wants_usage=False)
    guards = [StreamGuard(policy, make) for _ in streams]
    count = 0
    gc.collect()
    t0 = time.process_time()
    for step in range(max(map(len, streams))):
        for guard, events in zip(guards, streams, strict=True):
            if step < len(events):
                guard.feed(events[step])
                count += 1
    elapsed = time.process_time() - t0
    for guard in guards:
        assert not guard.aborted, "a healthy stream was aborted"
    return elapsed / count * 1e6


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--streams", type=int, default=256)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--corpus", type=Path, default=ROOT / "tests" / "data" / "corpus.jsonl")
    args = ap.parse_args()
    texts = healthy_texts(args.corpus, 64)
    config = DetectorConfig()
    print(f"{args.streams} streams of {MAX_TOKENS} tokens, µs CPU per upstream event (best of "
          f"{args.repeat})")  # fmt: skip
    print(f"{'surface':10} {'events/stream':>13} {'parse':>8} {'enforce':>8}")
    for surface in SURFACES:
        streams = [events_for(surface, texts[i % len(texts)]) for i in range(args.streams)]
        parse = min(run(surface, streams, NullDetector) for _ in range(args.repeat))
        enforce = min(run(surface, streams, lambda: Detector(config)) for _ in range(args.repeat))
        per_stream = sum(map(len, streams)) / len(streams)
        print(f"{surface:10} {per_stream:13.0f} {parse:8.2f} {enforce:8.2f}")


if __name__ == "__main__":
    main()
