"""English salad and gibberish of real engines, read and labelled, through the detector.

Two labelled sets of SmolLM2-135M-Instruct answers pushed off their text by raised penalties:
``bench/data/salad_en.jsonl`` (twelve AlpacaEval prompts under three settings on vLLM and on
llama.cpp; ``bench/data/build_salad_en.py``) and the English rows of
``bench/data/gibberish.jsonl``. Each answer is judged as the relay judges a streamed answer to
its prompt (the expectation the default settings derive from the prompt: English; the fake
engine's word-sized deltas; the end-of-answer judgement at the finish).

Reported per label: answers with a verdict, by signal; for ``salad`` and ``gibberish``, the
characters from the reader's onset to the verdict (median, p90) and verdicts before the onset;
for ``sentences`` (clumsy or looping, but sentences), every ``salad`` or ``gibberish``
verdict, each a false alarm of those signals. ``--list`` prints every answer's verdict::

    python bench/measure/detector/measure_salad_en.py [--list]
    MEASURE_PROXY_ROOT=/path/to/previous/checkout python bench/measure/detector/measure_salad_en.py
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
sys.path.insert(1, str(ROOT / "bench" / "measure" / "detector"))

from measure_realanswers import judge  # noqa: E402  (the relay's judgement of an answer)

DATA = ROOT / "bench" / "data"


def rows() -> list[dict[str, Any]]:
    out = []
    for line in (DATA / "salad_en.jsonl").read_text(encoding="utf-8").splitlines():
        out.append(json.loads(line))
    for i, line in enumerate((DATA / "gibberish.jsonl").read_text(encoding="utf-8").splitlines()):
        row = json.loads(line)
        if row["language"] != "English":
            continue
        # Its prompt (build_gibberish.py) and its label: "gibberish" rows were read as such
        # from their first paragraph on; the others are left unlabelled there.
        prompt = f"Write a {row['paragraphs']}-paragraph story in English, numbering each paragraph"
        label = "gibberish" if row["label"] == "gibberish" else "unlabelled"
        out.append({"id": f"gibberish-{i:02d}", "prompt": prompt, "text": row["text"],
                    "label": label, "onset": None, "engine": "vllm"})  # fmt: skip
    return out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--list", action="store_true", help="print every answer's verdict")
    args = parser.parse_args(argv)
    by_label: dict[str, Counter[str]] = {}
    total: Counter[str] = Counter()
    after: dict[str, list[int]] = {}
    early = 0
    for row in rows():
        found = judge(row["prompt"], row["text"])
        label = row["label"]
        total[label] += 1
        signal = found["signal"] if found else "none"
        by_label.setdefault(label, Counter())[signal] += 1
        if found and row.get("onset") is not None:
            delay = found["at"] - row["onset"]
            early += delay < 0
            after.setdefault(label, []).append(max(0, delay))
        if args.list:
            print(f"{row['id']:28} {label:10} {signal:16} at {found['at'] if found else '-'}")
    for label in sorted(by_label):
        counts = by_label[label]
        caught = total[label] - counts["none"]
        signals = " ".join(f"{k}={v}" for k, v in counts.most_common() if k != "none")
        print(f"{label:10} {total[label]:3} answers, verdict on {caught:3}: {signals}")
        if label in after:
            values = sorted(after[label])
            p90 = values[min(len(values) - 1, int(0.9 * len(values)))]
            print(f"{'':10} from the onset to the verdict: median "
                  f"{statistics.median(values):.0f}, p90 {p90}")  # fmt: skip
    print(f"verdicts before the reader's onset: {early}")


if __name__ == "__main__":
    main()
