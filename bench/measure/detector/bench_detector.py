"""Detector throughput and memory per stream, the default signals on.

Streams texts through :class:`proxy.detect.Detector` in the same token-sized deltas the score
CLI uses and reports characters per second of detector time (one core) and the peak memory one
detector holds after a long stream. ``--block-loop`` adds the block-loop signal, which is off by
default; ``--no-turn-leak`` leaves out the turn-leak signal (what it costs is the difference).
Run::

    python bench/measure/detector/bench_detector.py [CORPUS.jsonl] [--limit N] [--repeat R]
        [--block-loop] [--no-turn-leak]

Without a corpus it uses the texts under ``tests/data/detect/``. Not a test: timings are
reported, never asserted.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
import tracemalloc
from collections import deque
from pathlib import Path

from proxy.cli.score import split_deltas
from proxy.detect import Detector, DetectorConfig

_DEFAULT = Path(__file__).resolve().parents[3] / "tests" / "data" / "detect" / "sample.jsonl"


def _texts(path: Path, limit: int | None) -> list[str]:
    texts = []
    with path.open(encoding="utf-8") as fh:
        for line in fh:
            if line.strip():
                texts.append(json.loads(line)["text"])
            if limit and len(texts) >= limit:
                break
    return texts


def _throughput(deltas: list[list[str]], repeat: int, config: DetectorConfig) -> float:
    """Best-of-``repeat`` characters per CPU second of feed()+finish() (process time, so other
    load on a shared machine does not count against the detector)."""
    chars = sum(len(d) for text in deltas for d in text)
    best = float("inf")
    for _ in range(repeat):
        start = time.process_time()
        for text in deltas:
            detector = Detector(config)
            feed = detector.feed
            for delta in text:
                if feed(delta) is not None:
                    break
            detector.finish()
        best = min(best, time.process_time() - start)
    return chars / best


def _deep_size(obj: object, seen: set[int] | None = None) -> int:
    """Bytes held by ``obj`` and what it contains (strings, containers, slotted objects)."""
    seen = set() if seen is None else seen
    if id(obj) in seen:
        return 0
    seen.add(id(obj))
    size = sys.getsizeof(obj)
    if isinstance(obj, dict):
        size += sum(_deep_size(k, seen) + _deep_size(v, seen) for k, v in obj.items())
    elif isinstance(obj, list | tuple | set | frozenset | deque):
        size += sum(_deep_size(item, seen) for item in obj)
    elif hasattr(obj, "__dict__"):
        size += _deep_size(vars(obj), seen)
    elif hasattr(obj, "__slots__"):
        size += sum(_deep_size(getattr(obj, n), seen) for n in obj.__slots__ if hasattr(obj, n))
    return size


def _memory_per_stream(chars: int, shared: DetectorConfig) -> tuple[int, int]:
    """(bytes one detector holds after ``chars`` of varied text, peak bytes allocated while
    streaming them). The text never loops, so the detector keeps watching to the end."""
    rng = random.Random(1)
    letters = "abcdefghijklmnopqrstuvwxyz"
    vocabulary = [
        "".join(rng.choice(letters) for _ in range(rng.randint(2, 9))) for _ in range(5000)
    ]
    detector = Detector(shared)
    detector.feed("warm up the language model and the regular expressions once. ")
    tracemalloc.start()
    base, _ = tracemalloc.get_traced_memory()
    fed = 0
    while fed < chars:
        delta = " " + rng.choice(vocabulary)
        fed += len(delta)
        if detector.feed(delta) is not None:
            raise RuntimeError(f"varied text judged degenerate: {detector.verdict}")
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    held = _deep_size(detector) - _deep_size(shared)
    return held, max(0, peak - base)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("corpus", nargs="?", type=Path, default=_DEFAULT)
    parser.add_argument("--limit", type=int, default=None)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--block-loop", action="store_true", help="the block-loop signal on too")
    parser.add_argument("--no-turn-leak", action="store_true", help="the turn-leak signal off")
    args = parser.parse_args(argv)
    config = DetectorConfig(block_loop=args.block_loop, turn_leak=not args.no_turn_leak)
    texts = _texts(args.corpus, args.limit)
    deltas = [list(split_deltas(t)) for t in texts]
    chars = sum(len(t) for t in texts)
    Detector().feed("x" * 200)  # load fastText and compile patterns outside the timing
    rate = _throughput(deltas, args.repeat, config)
    print(f"texts {len(texts)}, chars {chars}, deltas {sum(len(d) for d in deltas)}")
    print(f"detector throughput: {rate / 1e6:.2f} M chars/s (one core, best of {args.repeat})")
    for size in (10_000, 100_000, 1_000_000):
        held, peak = _memory_per_stream(size, config)
        print(
            f"one detector after {size:>9,} chars: holds {held / 1024:6.1f} KiB"
            f" (peak allocated while streaming {peak / 1024:6.1f} KiB)"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
