"""Measure the expectation derived from short questions that are not the measured dev questions.

    python bench/measure/language/measure_short_prompts.py           # figures (a few seconds)
    python bench/measure/language/measure_short_prompts.py --misses  # each miss, false expectation
    # the same data through another version:
    MEASURE_PROXY_ROOT=/path/to/other/checkout \\
        python bench/measure/language/measure_short_prompts.py

The data is ``bench/data/short_questions.jsonl``: short questions (2 to 8 words) in 16
languages and short English questions, many of them naming foreign things ("What is a Japanese
tea ceremony?", "Who was Simon Bolivar?"). They were written for this project from general
knowledge, across many topics, before the word-frequency rules were set (one rule changed
after a first run on them; docs/language.md says which). ``measure_language.py`` beside this
script has the development questions.

Figures, with default settings (``GUARD_LANGUAGE=off``, ``GUARD_EXPECT_LANGUAGE=prompt``), the
expectation exactly as ``rewrite_request`` derives it for a chat request:

* **derived**: a question in language L expects L (Malay scored as Indonesian);
* **wrong**: it expects another language (worse than none: a correct answer is aborted);
* **English set, non-English expectation**: an English question that expects another language.

The same figures on real prompts: the prompts of ``bench/data/realgen.jsonl.gz`` (prompts in 14
languages sent to a real engine, ``prompt_language`` their language) and the English
instructions of the development corpus (``../shared/corpus/dev.jsonl``, else
``tests/data/corpus.jsonl``), which must not expect another language.

Also the cost: milliseconds per prompt (after the first, which loads word lists) and the
memory the derivation's word lists take.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import sys
import time
import tracemalloc
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, os.environ.get("MEASURE_PROXY_ROOT", str(ROOT)))

from proxy.core.rewrite import RewritePolicy, rewrite_request  # noqa: E402

DATA = ROOT / "bench" / "data" / "short_questions.jsonl"


def expectation(text: str) -> str | None:
    body = {"model": "m", "messages": [{"role": "user", "content": text}]}
    return rewrite_request(body, "chat", RewritePolicy()).expected_language


def real_prompts() -> dict[str, int]:
    """Real prompts: realgen's (each expects its language; English none or English) and the
    corpus's English instructions (none may expect another language)."""
    seen: set[tuple[str, str]] = set()
    right = wrong = 0
    with gzip.open(ROOT / "bench" / "data" / "realgen.jsonl.gz", "rt", encoding="utf-8") as fh:
        for line in fh:
            row = json.loads(line)
            key = (row["prompt_language"], row["prompt"])
            if key in seen:
                continue
            seen.add(key)
            code = expectation(row["prompt"])
            lang = row["prompt_language"]
            if code == lang or (lang == "en" and code is None):
                right += 1
            elif code is not None:
                wrong += 1
    corpus = ROOT.parent / "shared" / "corpus" / "dev.jsonl"
    if not corpus.is_file():
        corpus = ROOT / "tests" / "data" / "corpus.jsonl"
    english = non_english = 0
    for line in corpus.open(encoding="utf-8"):
        row = json.loads(line)
        if row.get("instruction") and row.get("lang") == "en":
            english += 1
            non_english += expectation(row["instruction"]) not in (None, "en")
    return {
        "realgen_prompts": len(seen),
        "realgen_expected_right": right,
        "realgen_expected_wrong": wrong,
        "corpus_english_instructions": english,
        "corpus_english_non_english_expectation": non_english,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--misses", action="store_true", help="print misses and false expectations")
    args = parser.parse_args()
    rows = [json.loads(line) for line in DATA.open(encoding="utf-8")]
    tracemalloc.start()
    started = time.perf_counter()
    got = [expectation(row["text"]) for row in rows]
    first_pass = time.perf_counter() - started
    memory = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    started = time.perf_counter()
    for row in rows:
        expectation(row["text"])
    warm_ms = (time.perf_counter() - started) * 1000 / len(rows)

    derived = wrong = n = 0
    false_english = n_english = 0
    per: Counter[str] = Counter()
    per_n: Counter[str] = Counter()
    for row, code in zip(rows, got, strict=True):
        lang = row["lang"]
        if lang == "en":
            n_english += 1
            if code not in (None, "en"):
                false_english += 1
                if args.misses:
                    print(f"  English question expects {code}: {row['text']!r}")
            continue
        n += 1
        per_n[lang] += 1
        if code == lang:
            derived += 1
            per[lang] += 1
        else:
            wrong += code is not None
            if args.misses:
                print(f"  {lang} question expects {code}: {row['text']!r}")
    result = {
        "questions": n,
        "derived": derived,
        "wrong": wrong,
        "by_language": {lang: f"{per[lang]}/{per_n[lang]}" for lang in per_n},
        "english_questions": n_english,
        "english_non_english_expectation": false_english,
        "ms_per_prompt_warm": round(warm_ms, 3),
        "first_pass_s": round(first_pass, 2),
        "peak_traced_memory_mb": round(memory / 2**20, 1),
        **real_prompts(),
    }
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
