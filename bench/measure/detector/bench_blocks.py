"""Cost of the block-loop state per 128-character check, two versions alternating in one process.

The block-loop signal is the detector's dearest repetition check; this times its
:class:`BlockLoop` alone (the rest of the detector is unchanged by a change to it) on the first
texts of a corpus, streamed in 128-character checks as the relay does, alternating the two
versions round after round so the shared machine's load hits both alike::

    git show main:proxy/detect/blocks.py > /tmp/blocks_before.py
    python bench/measure/detector/bench_blocks.py /tmp/blocks_before.py ../shared/corpus/dev.jsonl

Prints the minimum and median process time per check of each version over the rounds.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import sys
import time
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parents[3]


def _load(path: Path, name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def _per_check(module: ModuleType, texts: list[str], checks: int) -> float:
    started = time.process_time()
    for text in texts:
        loop = module.BlockLoop()
        end = 0
        for i in range(0, len(text), 128):
            end += len(text[i : i + 128])
            loop.update(text[i : i + 128], end=end)
        loop.update("", end=end, final=True)
    return (time.process_time() - started) / checks * 1e6


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("before", type=Path, help="the other version's blocks.py")
    ap.add_argument("corpus", type=Path, help="JSONL with a text field")
    ap.add_argument("--texts", type=int, default=300)
    ap.add_argument("--rounds", type=int, default=7)
    args = ap.parse_args()
    with args.corpus.open(encoding="utf-8") as fh:
        texts = [json.loads(line)["text"] for line, _ in zip(fh, range(args.texts), strict=False)]
    checks = sum((len(t) + 127) // 128 for t in texts)
    versions = {
        "before": _load(args.before, "blocks_before"),
        "after": _load(ROOT / "proxy" / "detect" / "blocks.py", "blocks_after"),
    }
    times: dict[str, list[float]] = {name: [] for name in versions}
    for _ in range(args.rounds):
        for name, module in versions.items():
            times[name].append(_per_check(module, texts, checks))
    for name, values in times.items():
        values.sort()
        print(f"{name:<7} min {values[0]:.1f} median {values[len(values) // 2]:.1f} µs per check")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
