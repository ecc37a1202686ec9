"""Detector speed with and without an expected language: every text of a corpus with no language
expected (``bench/measure/detector/bench_detector.py``'s case, the gibberish signal on), and the
English texts with English expected (the English salad signal on). Process time, 4-character deltas.

Run it once per source tree to compare two versions, alternating on the same machine::

    PYTHONPATH=. python bench/measure/detector/bench_detector_expected.py ../shared/corpus/dev.jsonl
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

from proxy.detect import Detector
from proxy.detect.salad import lexicon


def run(rows: list[dict[str, str]], language: str | None) -> float:
    chars = 0
    started = time.process_time()
    for row in rows:
        if language is not None and row.get("lang") != language:
            continue
        detector = Detector(expected_language=language)
        text = row["text"]
        for i in range(0, len(text), 4):
            detector.feed(text[i : i + 4])
        detector.finish()
        chars += len(text)
    return chars / (time.process_time() - started) / 1e6


def main() -> int:
    path = Path(sys.argv[1] if len(sys.argv) > 1 else "../shared/corpus/dev.jsonl")
    rows = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]
    lexicon("en")
    Detector().feed("x" * 200)  # load fastText and compile patterns outside the timing
    print(f"all texts, no expected language: {run(rows, None):.2f} M chars/s")
    print(f"English texts, English expected: {run(rows, 'en'):.2f} M chars/s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
