"""When a streamed answer's verdict comes, and which verdicts a stream records, on a corpus.

``coherence-guard score`` reports the detector's final decision per text (the checks while
streaming, then the checks after the end). A streamed answer sees less: the client's stream can
only be cut by a verdict that fires *while it streams*; the relay no longer runs the
sentence-by-sentence drift judgement when a streamed answer ends (its text has reached the
client whole, see ``Detector.finish(end_drift=...)``), so the metrics see the streaming
verdicts, the other end-of-stream checks, and no end-of-stream drift. This script
feeds every text the way the scorer does (same deltas, same expected language, the engine's
tokens and logprobs where a row has them) and writes, per text, where the verdict fired while
streaming and where the full decision fired::

    python bench/measure/detector/stream_verdicts.py ../shared/corpus/dev.jsonl -o after.json
    python bench/measure/detector/stream_verdicts.py --compare before.json after.json

``--compare`` takes two such files made from two trees (the code before and after a change to
the streaming checks) and prints how many characters later (or earlier) each mid-stream verdict
came, median and p90, and which texts gained or lost one. Without ``--compare`` it prints, per
label, how many texts the full decision calls degenerate, how many of them a stream catches
while it streams, and how many a streamed answer's record (the metrics) holds a verdict for.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT))

from proxy.cli.score import (  # noqa: E402
    expected_language_of,
    open_text,
    read_jsonl,
    split_deltas,
    token_stream,
)


def judge(row: dict[str, Any], keys: tuple[str, ...]) -> dict[str, Any]:
    """Where the verdict fired while streaming and what a streamed answer records (the detector
    set up as the relay sets it up for a streamed answer), and where the full decision fired
    (as ``proxy.cli.score.score_text`` decides); ``None``: no verdict."""
    from proxy.detect import Detector

    expected = expected_language_of(row, keys=keys)
    tokens = token_stream(row)
    pairs = tokens if tokens is not None else [(d, None) for d in split_deltas(row["text"])]
    relay = Detector(expected_language=expected)
    if hasattr(relay, "end_drift"):
        relay.end_drift = False  # as the relay sets it for a streamed answer
    streamed = None
    for delta, logprobs in pairs:
        streamed = relay.feed(delta, tokens=1, logprobs=logprobs)
        if streamed is not None:
            break
    relayed = streamed if streamed is not None else finish_streamed(relay)
    full = Detector(expected_language=expected)
    for delta, logprobs in pairs:
        if full.feed(delta, tokens=1, logprobs=logprobs) is not None:
            break
    final = full.finish().verdict
    return {
        "id": row.get("id"),
        "label": row.get("label"),
        "streamed_at": None if streamed is None else streamed.fired_at_char,
        "streamed_signal": None if streamed is None else streamed.signal,
        "final_at": None if final is None else final.fired_at_char,
        "final_signal": None if final is None else final.signal,
        "relayed_at": None if relayed is None else relayed.fired_at_char,
    }


def finish_streamed(detector: Any) -> Any:
    """The verdict the relay records when a streamed answer ends; a tree from before
    ``end_drift`` existed ran the whole end judgement."""
    if hasattr(detector, "end_drift"):
        return detector.finish().verdict
    try:
        return detector.finish(end_drift=False).verdict
    except TypeError:
        return detector.finish().verdict


def percentile(values: list[int], q: float) -> float:
    ordered = sorted(values)
    return float(ordered[min(len(ordered) - 1, int(q * len(ordered)))])


def summary(rows: list[dict[str, Any]]) -> str:
    out = [
        f"{'label':<12} {'texts':>6} {'degenerate (full)':>18} {'while streaming':>16}"
        f" {'recorded on a stream':>21}"
    ]
    for label in sorted({str(r["label"]) for r in rows}):
        group = [r for r in rows if str(r["label"]) == label]
        full = sum(r["final_at"] is not None for r in group)
        live = sum(r["streamed_at"] is not None for r in group)
        relayed = sum(r["relayed_at"] is not None for r in group)
        out.append(f"{label:<12} {len(group):>6} {full:>18} {live:>16} {relayed:>21}")
    return "\n".join(out)


def compare(before: list[dict[str, Any]], after: list[dict[str, Any]]) -> str:
    if [r["id"] for r in before] != [r["id"] for r in after]:
        raise SystemExit("the two files judge different texts")
    shifts: list[int] = []
    gained, lost, changed = [], [], []
    for b, a in zip(before, after, strict=True):
        if b["streamed_at"] is not None and a["streamed_at"] is not None:
            shifts.append(a["streamed_at"] - b["streamed_at"])
            if b["streamed_signal"] != a["streamed_signal"]:
                changed.append(a["id"])
        elif a["streamed_at"] is not None:
            gained.append((a["id"], a["label"]))
        elif b["streamed_at"] is not None:
            lost.append((b["id"], b["label"]))
    lines = [f"mid-stream verdicts in both: {len(shifts)}"]
    if shifts:
        later = [s for s in shifts if s > 0]
        lines.append(
            f"characters later (after - before): median {statistics.median(shifts):g}, "
            f"p90 {percentile(shifts, 0.9):g}, max {max(shifts)}, min {min(shifts)}; "
            f"later in {len(later)}, earlier in {sum(s < 0 for s in shifts)}"
        )
        if later:
            lines.append(
                f"  of those later: median {statistics.median(later):g}, "
                f"p90 {percentile(later, 0.9):g}"
            )
    lines.append(f"another signal: {len(changed)} {changed[:10]}")
    lines.append(f"gained a mid-stream verdict: {len(gained)} {gained[:10]}")
    lines.append(f"lost a mid-stream verdict: {len(lost)} {lost[:10]}")
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("corpus", nargs="*", help="JSONL (.gz too) with id/text[/label] per line")
    ap.add_argument("-o", "--output", help="write the per-text results here (JSON)")
    ap.add_argument("--prompt-language-only", action="store_true", help="as score's option")
    ap.add_argument("--compare", nargs=2, metavar=("BEFORE", "AFTER"))
    args = ap.parse_args()
    if args.compare:
        before, after = (json.loads(Path(p).read_text()) for p in args.compare)
        print(compare(before, after))
        return 0
    keys = ("prompt_language",) if args.prompt_language_only else ("prompt_language", "lang")
    rows: list[dict[str, Any]] = []
    for path in args.corpus:
        with open_text(path) as fh:
            rows += [judge(row, keys) for row in read_jsonl(fh)]
    print(summary(rows))
    if args.output:
        Path(args.output).write_text(json.dumps(rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
