"""Measure word-salad signals on the development corpus and the real-engine set.

Word salad (invented words mixing fragments of related languages, which a character-n-gram language
identifier still calls the expected language) needs a signal of its own. Candidates measured here,
per text, for healthy texts of the development corpus and for the real-engine generations read and
labelled ``salad`` / ``real`` in ``bench/data/salad_labels.jsonl`` (procedure in
``bench/data/REALGEN.md``, "Word-salad labels"):

* ``confidence``: mean fastText confidence in the expected language over 128-character
  segments (0 for a segment identified as another language) — the "confidence collapse" idea;
* ``unknown``: share of words of three letters or more that are not in the language's word list
  shipped in the ``pyspellchecker`` wheel (en, de, es, fr, it, nl, pt, ru);
* ``wordfreq``: share of *prose words* (``proxy.detect.salad.prose_words``: lower-case,
  alphabetic, four letters or more, outside code and URLs) absent from wordfreq's large list of
  the expected language — per text, and as the highest share over windows of 60 words; then
  recall and false positives at a few thresholds, and what the shipped ``salad`` signal (the
  real :class:`~proxy.detect.Detector`, every other signal off) fires on.

Run (``pyspellchecker`` is optional: without it the first two candidates are skipped)::

    pip install pyspellchecker   # optional
    python bench/measure/detector/measure_salad.py DEV.jsonl bench/data/realgen.jsonl.gz

(``DEV.jsonl``: the development corpus, ``../shared/corpus/dev.jsonl``.)
"""

from __future__ import annotations

import dataclasses
import functools
import gzip
import json
import os
import re
import statistics
import sys
from pathlib import Path
from typing import Any

from proxy.detect import Detector, DetectorConfig
from proxy.detect.language import classify, strip_noise
from proxy.detect.salad import SALAD_LANGUAGES, lexicon, prose_words

_WORD = re.compile(r"[^\W\d_]{3,}")
_LISTS = {"en", "de", "es", "fr", "it", "nl", "pt", "ru"}
_LABELS = Path(__file__).resolve().parents[3] / "bench" / "data" / "salad_labels.jsonl"
_WINDOW = 60
_THRESHOLDS = (0.15, 0.2, 0.25, 0.3, 0.35)


@functools.cache
def _words(lang: str) -> frozenset[str]:
    import spellchecker

    path = os.path.join(os.path.dirname(spellchecker.__file__), "resources", f"{lang}.json.gz")
    with gzip.open(path, "rt", encoding="utf-8") as fh:
        return frozenset(json.load(fh))


def confidence(text: str, lang: str) -> float | None:
    values = []
    for i in range(0, len(text), 128):
        clean = strip_noise(text[i : i + 128])
        if len(clean) >= 50:
            found = classify(clean)
            values.append(found[1] if found and found[0] == lang else 0.0)
    return statistics.mean(values) if values else None


def unknown(text: str, lang: str) -> float | None:
    words = [w.lower() for w in _WORD.findall(text)]
    if len(words) < 15 or lang not in _LISTS:
        return None
    known = _words(lang)
    return sum(w not in known for w in words) / len(words)


def unknown_flags(text: str, lang: str) -> list[bool] | None:
    """Per prose word: absent from wordfreq's large list of ``lang`` (None: no such list)."""
    known = lexicon(lang)
    if known is None:
        return None
    return [word not in known for word in prose_words(text)]


def text_share(flags: list[bool]) -> float | None:
    return sum(flags) / len(flags) if len(flags) >= 10 else None


def window_share(flags: list[bool]) -> float | None:
    """Highest share over windows of 60 words, stepping by 20 (texts of 40 words or more)."""
    if len(flags) < 40:
        return None
    starts = range(0, max(1, len(flags) - _WINDOW + 1), 20)
    return max(sum(flags[i : i + _WINDOW]) / len(flags[i : i + _WINDOW]) for i in starts)


def shipped(text: str, lang: str) -> str | None:
    """The salad verdict of the real detector (other signals off): 'stream', 'end' or None."""
    off = {
        f.name: False
        for f in dataclasses.fields(DetectorConfig)
        if f.type in (bool, "bool") and f.name not in ("salad", "end_judgement")
    }
    detector = Detector(DetectorConfig(**off), expected_language=lang)
    for i in range(0, len(text), 16):  # deltas of about four tokens
        if detector.feed(text[i : i + 16]) is not None:
            return "stream"
    return "end" if detector.finish().verdict is not None else None


def _line(name: str, values: list[float]) -> str:
    v = sorted(values)
    if not v:
        return f"{name:<44} n=0"
    pick = lambda q: v[min(len(v) - 1, int(q * len(v)))]  # noqa: E731
    return (
        f"{name:<44} n={len(v):>4} p10={pick(0.1):.3f} median={statistics.median(v):.3f}"
        f" p90={pick(0.9):.3f} p99={pick(0.99):.3f} max={v[-1]:.3f}"
    )


def _rows(path: str | Path) -> list[dict[str, Any]]:
    with (gzip.open if str(path).endswith(".gz") else open)(path, "rt", encoding="utf-8") as fh:
        return [json.loads(line) for line in fh if line.strip()]


def _groups(dev_path: str, realgen_path: str) -> dict[str, list[tuple[str, str]]]:
    """(text, expected language) per group; dev answers are every healthy non-technical kind."""
    dev, real = _rows(dev_path), _rows(realgen_path)
    by_id = {r["id"]: r for r in real}
    labels = {r["id"]: r["label"] for r in _rows(_LABELS)}
    answer_kinds = {"technical", "code", "json", "table"}
    groups: dict[str, list[tuple[str, str]]] = {}
    for lang in sorted(SALAD_LANGUAGES):
        groups[f"dev healthy answers, {lang}"] = [
            (r["text"], lang) for r in dev
            if r["label"] == "healthy" and r["kind"] not in answer_kinds and r["lang"] == lang
        ]  # fmt: skip
    groups["dev healthy answers, all of these"] = [
        item for lang in sorted(SALAD_LANGUAGES) for item in groups[f"dev healthy answers, {lang}"]
    ]
    groups["dev healthy technical (de es fr it nl pl pt ru)"] = [
        (r["text"], r["lang"]) for r in dev
        if r["label"] == "healthy" and r["kind"] == "technical" and r["lang"] in SALAD_LANGUAGES
    ]  # fmt: skip
    groups["dev healthy answers, en (signal off)"] = [
        (r["text"], "en") for r in dev
        if r["label"] == "healthy" and r["kind"] not in answer_kinds and r["lang"] == "en"
    ]  # fmt: skip
    groups["dev healthy technical+code, en (signal off)"] = [
        (r["text"], "en") for r in dev
        if r["label"] == "healthy" and r["kind"] in answer_kinds and r["lang"] in ("en", "code")
    ]  # fmt: skip
    groups["realgen healthy en (signal off)"] = [
        (r["text"], "en") for r in real if r["label"] == "healthy"
    ]
    for label in ("salad", "real"):
        picked = [by_id[i] for i, lab in labels.items() if lab == label]
        groups[f"realgen labelled {label}, de es fr it nl pl pt ru"] = [
            (r["text"], r["prompt_language"]) for r in picked
            if r["prompt_language"] in SALAD_LANGUAGES
        ]  # fmt: skip
        groups[f"realgen labelled {label}, id tr vi (no large list)"] = [
            (r["text"], r["prompt_language"]) for r in picked
            if r["prompt_language"] not in SALAD_LANGUAGES
        ]  # fmt: skip
    return groups


def main(dev_path: str, realgen_path: str) -> None:
    groups = _groups(dev_path, realgen_path)
    try:
        import spellchecker  # noqa: F401

        legacy = True
    except ImportError:
        legacy = False
        print("(pyspellchecker not installed: confidence and unknown skipped)")
    for signal in (confidence, unknown) if legacy else ():
        print(f"-- {signal.__name__}")
        for name, group in groups.items():
            values = [signal(text, lang) for text, lang in group]
            print(_line(name, [x for x in values if x is not None]))

    flags = {
        name: [f for f in (unknown_flags(text, lang) for text, lang in group) if f is not None]
        for name, group in groups.items()
    }
    print("-- wordfreq: share of prose words absent from the expected language's large list")
    print("   per text (texts of 10+ prose words)")
    for name, per in flags.items():
        print(_line(name, [s for s in map(text_share, per) if s is not None]))
    print("   highest 60-word window (texts of 40+ prose words)")
    for name, per in flags.items():
        print(_line(name, [s for s in map(window_share, per) if s is not None]))
    print("-- wordfreq: texts at or above each threshold (text / highest window)")
    print(f"{'group':<48}" + "".join(f"{t:>14}" for t in _THRESHOLDS))
    for name, per in flags.items():
        texts = [s for s in map(text_share, per) if s is not None]
        windows = [s for s in map(window_share, per) if s is not None]
        cells = [
            f"{sum(s >= t for s in texts)}/{len(texts)}"
            f" {sum(s >= t for s in windows)}/{len(windows)}"
            for t in _THRESHOLDS
        ]
        print(f"{name:<48}" + "".join(f"{c:>14}" for c in cells))
    print("-- shipped salad signal (DetectorConfig defaults, other signals off)")
    for name, group in groups.items():
        if "signal off" in name or "no large list" in name:
            continue
        results = [shipped(text, lang) for text, lang in group]
        fired = sum(r is not None for r in results)
        share = fired / len(results) if results else 0.0
        print(
            f"{name:<48} fired {fired:>3}/{len(results):<4} ({share:.1%};"
            f" streaming {results.count('stream')}, at the end {results.count('end')})"
        )


if __name__ == "__main__":
    main(*sys.argv[1:3])
