"""False alarms of the gibberish and salad signals on real mixed text, and their recall on the
labelled sets, in one table.

    python bench/measure/detector/measure_mixed.py         # every set (a minute or two)
    python bench/measure/detector/measure_mixed.py --show  # also what fired, and where
    # the same data through another version:
    MEASURE_PROXY_ROOT=/path/to/other/checkout python bench/measure/detector/measure_mixed.py

Sets (each text streamed through the real ``Detector`` in token-sized deltas, with every other
signal on too, so a row says what a request would get):

* ``bench/data/mixed_healthy.jsonl``: real healthy text that mixes scripts, formulas, code and
  units, German compounds and lists of names (``bench/data/MIXED_HEALTHY.md``), with its
  language expected: every verdict is a false alarm.
* ``bench/data/gibberish.jsonl``: the answers read as gibberish, with the prompt's language
  expected, and with none.
* ``bench/data/salad_labels.jsonl`` (texts from ``bench/data/realgen.jsonl.gz``): answers read
  as salad and as real, with the prompt's language expected.
* ``../shared/corpus/dev.jsonl`` when present (else ``tests/data/corpus.jsonl``): healthy
  texts with their language expected, per signal.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import sys
from collections import Counter
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, os.environ.get("MEASURE_PROXY_ROOT", str(ROOT)))

from proxy.cli.score import split_deltas  # noqa: E402
from proxy.detect import Detector, DetectorConfig, Verdict  # noqa: E402
from proxy.detect.gibberish import _SWITCH  # noqa: E402
from proxy.detect.salad import SALAD_LANGUAGES, WordSalad  # noqa: E402

DATA = ROOT / "bench" / "data"
LANGUAGE_CODES = {"English": "en", "Italian": "it", "French": "fr", "Spanish": "es", "German": "de"}


def verdict(text: str, expected: str | None) -> Verdict | None:
    detector = Detector(expected_language=expected)
    for delta in split_deltas(text):
        if detector.feed(delta) is not None:
            break
    return detector.finish().verdict


def _jsonl(path: Path) -> list[dict[str, Any]]:
    if path.suffix == ".gz":
        with gzip.open(path, "rt", encoding="utf-8") as fh:
            return [json.loads(line) for line in fh if line.strip()]
    with path.open(encoding="utf-8") as fh:
        return [json.loads(line) for line in fh if line.strip()]


def _count(rows: list[tuple[str, str, str | None]], show: str | None) -> dict[str, Any]:
    """Verdicts per signal over (id, text, expected) rows; ``show`` prints each with a label."""
    signals: Counter[str] = Counter()
    for rid, text, expected in rows:
        found = verdict(text, expected)
        if found is not None:
            signals[found.signal] += 1
            if show:
                at = found.onset_char
                print(f"  {show} {rid} {found.signal}: {text[max(0, at - 20) : at + 80]!r}")
    return {"texts": len(rows), "fired": sum(signals.values()), "signals": dict(signals)}


def measure(show: bool) -> dict[str, Any]:
    out: dict[str, Any] = {}
    mixed = _jsonl(DATA / "mixed_healthy.jsonl")
    by_kind: dict[str, list[tuple[str, str, str | None]]] = {}
    for row in mixed:
        by_kind.setdefault(row["kind"], []).append((row["id"], row["text"], row["lang"]))
    out["mixed_healthy"] = {
        kind: _count(rows, "FALSE ALARM" if show else None)
        for kind, rows in sorted(by_kind.items())
    }
    # What the signals accumulate below their thresholds: script changes the soup shape counts,
    # and the share of prose words the salad signal calls unknown (whole text, one window).
    whole = DetectorConfig(salad_window_words=1_000_000)
    evidence: dict[str, dict[str, float]] = {}
    for kind, rows in sorted(by_kind.items()):
        changes = sum(len(_SWITCH.findall(text)) for _, text, _ in rows)
        words = unknown = 0
        for _, text, lang in rows:
            if lang in SALAD_LANGUAGES:
                salad = WordSalad(whole, lang)
                salad.update(text, final=True)
                words += len(salad._window)
                unknown += salad._unknown
        evidence[kind] = {"script_changes": changes}
        if words:
            evidence[kind]["unknown_word_share"] = round(unknown / words, 4)
    out["mixed_healthy_evidence"] = evidence
    gib = [r for r in _jsonl(DATA / "gibberish.jsonl") if r["label"] == "gibberish"]
    out["gibberish_language_expected"] = _count(
        [(str(i), r["text"], LANGUAGE_CODES[r["language"]]) for i, r in enumerate(gib)], None
    )
    out["gibberish_no_language"] = _count(
        [(str(i), r["text"], None) for i, r in enumerate(gib)], None
    )
    labels = {r["id"]: r["label"] for r in _jsonl(DATA / "salad_labels.jsonl")}
    realgen = {r["id"]: r for r in _jsonl(DATA / "realgen.jsonl.gz")}
    for label in ("salad", "real"):
        rows = [
            (i, realgen[i]["text"], realgen[i]["prompt_language"])
            for i, lab in sorted(labels.items())
            if lab == label
        ]
        out[f"salad_labels_{label}"] = _count(rows, f"salad-label {label}" if show else None)
    corpus = ROOT.parent / "shared" / "corpus" / "dev.jsonl"
    if not corpus.is_file():
        corpus = ROOT / "tests" / "data" / "corpus.jsonl"
    healthy = [
        (r["id"], r["text"], r["lang"] if len(r["lang"]) == 2 else None)
        for r in _jsonl(corpus)
        if r["label"] == "healthy"
    ]
    out["dev_healthy_lang_expected"] = _count(healthy, "DEV FALSE ALARM" if show else None)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--show", action="store_true", help="print every verdict")
    args = parser.parse_args()
    print(json.dumps(measure(args.show), indent=1, ensure_ascii=False))


if __name__ == "__main__":
    main()
