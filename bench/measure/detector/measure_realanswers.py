"""The detector on real answers of real models, against what readers found in them.

``../shared/realanswers/alpacaeval-dev.jsonl`` holds 18,404 answers of 40 models. Two readers
who never saw the detector read them (one per half of ``bench/data/realanswers_split.json``,
by model) and labelled every degeneration they found, with the offset where it starts, and the
healthy answers that look degenerate (``bench/data/realanswers_labels.jsonl``, how it was made:
``bench/data/REALANSWERS.md``). Every answer a reader did not label degenerate counts as healthy.

Each answer is judged as the relay judges a streamed answer: the expectation
:func:`proxy.core.rewrite.rewrite_request` derives from the real prompt (default settings), the
answer fed in the fake engine's word-sized deltas, and the end-of-answer judgement at its
finish. ``--proxy`` replays the answers through a running proxy instead
(``bench/measure/detector/replay_realanswers.py``; same verdicts, slower)::

    python bench/measure/detector/measure_realanswers.py --half tune           # rules tuned on it
    python bench/measure/detector/measure_realanswers.py --half held --misses  # the set-aside half
    python bench/measure/detector/measure_realanswers.py --half tune --cuts    # each healthy cut

Figures: healthy answers cut (by signal), degenerations caught by kind, characters from the
reader's onset to the verdict (median, p90; a verdict at the finish counts the whole answer),
verdicts before the onset. The kind ``other`` (an invented next turn, a spliced document) is
reported apart: nothing repeats and the language holds, so no signal of this detector is meant
for it.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from collections import Counter
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, os.environ.get("MEASURE_PROXY_ROOT", str(ROOT)))

DATA = ROOT.parent / "shared" / "realanswers" / "alpacaeval-dev.jsonl"
SPLIT = ROOT / "bench" / "data" / "realanswers_split.json"
LABELS = ROOT / "bench" / "data" / "realanswers_labels.jsonl"


#: The detector's settings (``--block-loop`` turns on the block-loop signal, off by default).
CONFIG: Any = None


def judge(prompt: str, answer: str) -> dict[str, Any] | None:
    """The verdict the relay reaches on ``answer`` to ``prompt``: ``at`` is where the client's
    stream was cut (the answer's length for a verdict at its finish), ``onset`` the detector's."""
    from proxy.core.rewrite import RewritePolicy, rewrite_request
    from proxy.detect import Detector
    from tests.fakes.vllm import tokenize

    body = {"model": "m", "messages": [{"role": "user", "content": prompt}]}
    rw = rewrite_request(body, "chat", RewritePolicy())
    detector = Detector(
        CONFIG,
        expected_language=rw.expected_language,
        structured=rw.structured,
        language_source=rw.expectation.source,
        accepted_languages=rw.expectation.accepted,
        # a tree before the turn-leak signal has no such field (MEASURE_PROXY_ROOT)
        **({"quoted_turns": rw.quotes_turns} if hasattr(rw, "quotes_turns") else {}),
    )
    for piece in tokenize(answer):
        verdict = detector.feed(piece, tokens=1)
        if verdict is not None:
            return {"signal": verdict.signal, "at": verdict.fired_at_char,
                    "onset": verdict.onset_char, "end": False}  # fmt: skip
    verdict = detector.finish(end_drift=True).verdict
    if verdict is None:
        return None
    return {"signal": verdict.signal, "at": len(answer), "onset": verdict.onset_char, "end": True}


def load(half: str) -> tuple[list[dict[str, Any]], dict[str, dict[str, Any]]]:
    split = json.loads(SPLIT.read_text(encoding="utf-8"))
    models = set(split["tune"]) | set(split["held"]) if half == "all" else set(split[half])
    rows = []
    with DATA.open(encoding="utf-8") as f:
        for line in f:
            row = json.loads(line)
            if row["model"] in models:
                rows.append(row)
    labels = {}
    for line in LABELS.read_text(encoding="utf-8").splitlines():
        label = json.loads(line)
        labels[label["id"]] = label
    return rows, labels


def _replayed(path: Path) -> dict[str, dict[str, Any] | None]:
    """Verdicts as a client of the proxy saw them: the guard's signal, and where its stream
    ended (the whole answer when the verdict came with the finish)."""
    out: dict[str, dict[str, Any] | None] = {}
    for line in path.read_text(encoding="utf-8").splitlines():
        row = json.loads(line)
        signal = row.get("signal")
        out[row["id"]] = None if signal is None else {"signal": signal, "at": row["chars"]}
    return out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--half", choices=("tune", "held", "all"), default="tune")
    parser.add_argument("--misses", action="store_true", help="print every degeneration missed")
    parser.add_argument("--cuts", action="store_true", help="print every healthy answer cut")
    parser.add_argument("--json", type=Path, help="write every verdict to this file")
    parser.add_argument("--ids", nargs="*", help="judge only these answers and print them")
    parser.add_argument(
        "--replay",
        type=Path,
        help="take the verdicts from a bench/measure/detector/replay_realanswers.py file (what a "
        "client of a running proxy got) instead of judging here",
    )
    parser.add_argument(
        "--block-loop", action="store_true", help="the block-loop signal on (off by default)"
    )
    args = parser.parse_args(argv)
    if args.block_loop:
        from proxy.detect import DetectorConfig

        global CONFIG
        CONFIG = DetectorConfig(block_loop=True)
    rows, labels = load(args.half)
    replayed = _replayed(args.replay) if args.replay else None
    if args.ids:
        rows = [r for r in rows if r["id"] in args.ids]
    healthy_cut: list[tuple[str, str, str]] = []
    caught: Counter[str] = Counter()
    present: Counter[str] = Counter()
    after: list[int] = []
    early = 0
    misses: list[str] = []
    verdicts: dict[str, Any] = {}
    for row in rows:
        found = (
            replayed.get(row["id"]) if replayed is not None else judge(row["prompt"], row["answer"])
        )
        verdicts[row["id"]] = found
        label = labels.get(row["id"], {})
        if args.ids:
            print(row["id"], label.get("label"), label.get("kind"), found)
        degenerate = label.get("label") == "degenerate"
        if not degenerate:
            if found is not None:
                trap = "trap" if label.get("label") == "healthy-trap" else "healthy"
                healthy_cut.append((row["id"], found["signal"], trap))
            continue
        kind = label.get("kind", "other")
        present[kind] += 1
        if found is None:
            misses.append(f"MISS {row['id']} {kind} onset {label.get('onset')}")
            continue
        caught[kind] += 1
        onset = int(label.get("onset") or 0)
        if found["at"] < onset:
            early += 1
        if kind != "other":
            after.append(max(0, found["at"] - onset))
    other = present.pop("other", 0)
    other_caught = caught.pop("other", 0)
    total = sum(present.values())
    hit = sum(caught.values())
    print(f"{len(rows)} answers ({args.half}); labels from {LABELS.relative_to(ROOT)}")
    signals = Counter(s for _, s, _ in healthy_cut)
    traps = sum(1 for *_, t in healthy_cut if t == "trap")
    print(
        f"healthy answers cut: {len(healthy_cut)} ({traps} of them traps) "
        + " ".join(f"{k}={v}" for k, v in signals.most_common())
    )
    print(f"degenerations caught: {hit} / {total} ({100 * hit / max(1, total):.1f} %)")
    for kind in sorted(present):
        print(f"  {kind:16} {caught[kind]:4} / {present[kind]:4}")
    print(f"  (other: invented turns, spliced text: {other_caught} / {other})")
    if after:
        after.sort()
        p90 = after[min(len(after) - 1, int(0.9 * len(after)))]
        print(f"characters from the onset to the verdict: median {statistics.median(after):.0f}, "
              f"p90 {p90}; verdicts before the onset: {early}")  # fmt: skip
    if args.cuts:
        for rid, signal, trap in healthy_cut:
            print(f"CUT  {rid} {signal} {trap}")
    if args.misses:
        for line in misses:
            print(line)
    if args.json:
        args.json.write_text(json.dumps(verdicts, indent=0), encoding="utf-8")


if __name__ == "__main__":
    main()
