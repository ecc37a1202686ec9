"""Measure candidate word-salad signals on the development corpus and the real-engine set.

Word salad (invented words mixing fragments of related languages, which a character-n-gram
language identifier still calls the expected language) needs a signal of its own. Two cheap
candidates are measured here, per text, for healthy texts of the development corpus and for the
real-engine generations not in English that no labelling rule flags (``realgen.jsonl.gz``,
label ``unsure``: SmolLM2-135M in a language other than English writes a lot of salad, which the
rules do not catch):

* ``confidence``: mean fastText confidence in the expected language over 128-character
  segments (0 for a segment identified as another language) — the "confidence collapse" idea;
* ``unknown``: share of words of three letters or more that are not in the language's word list
  shipped in the ``pyspellchecker`` wheel (en, de, es, fr, it, nl, pt, ru).

Run (``pyspellchecker`` is not a project dependency)::

    pip install pyspellchecker
    python bench/data/measure_salad.py ../shared/corpus/dev.jsonl bench/data/realgen.jsonl.gz
"""

from __future__ import annotations

import functools
import gzip
import json
import os
import re
import statistics
import sys
from typing import Any

from proxy.language import classify, strip_noise

_WORD = re.compile(r"[^\W\d_]{3,}")
_LISTS = {"en", "de", "es", "fr", "it", "nl", "pt", "ru"}


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


def _line(name: str, values: list[float]) -> str:
    v = sorted(values)
    if not v:
        return f"{name:<44} n=0"
    pick = lambda q: v[min(len(v) - 1, int(q * len(v)))]  # noqa: E731
    return (
        f"{name:<44} n={len(v):>4} p10={pick(0.1):.3f} median={statistics.median(v):.3f}"
        f" p90={pick(0.9):.3f}"
    )


def main(dev_path: str, realgen_path: str) -> None:
    def rows(path: str) -> list[dict[str, Any]]:
        with (gzip.open if path.endswith(".gz") else open)(path, "rt", encoding="utf-8") as fh:
            return [json.loads(line) for line in fh if line.strip()]

    dev, real = rows(dev_path), rows(realgen_path)
    groups = {
        "dev healthy llm-answer, not English": [
            r for r in dev if r["label"] == "healthy" and r["kind"] == "llm-answer"
            and r["lang"] not in ("en", "code", "mixed")
        ],
        "dev healthy technical": [
            r for r in dev if r["label"] == "healthy" and r["kind"] == "technical"
        ],
        "realgen not English, no rule flags it": [
            r for r in real if r["label"] == "unsure"
            and "salad not ruled out" in r.get("label_rule", "")
        ],
    }  # fmt: skip
    for signal in (confidence, unknown):
        print(f"-- {signal.__name__}")
        for name, group in groups.items():
            values = [signal(r["text"], r["lang"]) for r in group]
            print(_line(name, [x for x in values if x is not None]))


if __name__ == "__main__":
    main(*sys.argv[1:3])
