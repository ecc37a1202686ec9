"""Measure expectation strength: answers about languages, explicit requests, and ``auto``.

    python bench/measure/language/measure_language_strength.py           # docs/language.md
    python bench/measure/language/measure_language_strength.py --misses  # each miss, wrong cut
    # the same data through another version:
    MEASURE_PROXY_ROOT=/path/to/other/checkout \\
        python bench/measure/language/measure_language_strength.py

The prompts are ``bench/data/language_prompts.py``; the engine answers are
``bench/data/language_answers.jsonl.gz`` (SmolLM2-135M by llama.cpp, ``bench/
build_language_answers.py``). Every answer is streamed through the detector as vLLM streams
it (token-sized deltas), with the expectation ``rewrite_request`` derives, as the proxy does:

* **about**: English prompts about a language, each with the engine's answer: how many answers
  are cut as ``language-drift`` (target 0), and how many are cut by another signal (a small
  model's answer can be garbage: repetition, salad), reported apart.
* **explicit, English answers**: each explicit request (English or native phrasing, the target
  a language the detector judges, not English) with a real English answer: the engine's own
  answer where it is English (fastText on the whole text), and a real English model answer of
  the development corpus: how many are caught as ``language-drift`` (target 95 %).
* **explicit, answers in the requested language**: each request with a real healthy text in
  the requested language (development corpus and realgen; requests for a language without such
  a text are counted apart): how many are cut by any signal (target 0).
* **auto**: with ``GUARD_LANGUAGE=auto``, how many explicit and crosslingual requests get an
  instruction for another language than the requested one (target 0), and how many prompts
  about a language get any instruction (target 0).
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import random
import sys
import time
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, os.environ.get("MEASURE_PROXY_ROOT", str(ROOT)))
sys.path.insert(1, str(ROOT / "bench" / "data"))

from language_prompts import crosslingual_prompts, explicit_prompts  # noqa: E402

from proxy.cli.score import split_deltas  # noqa: E402
from proxy.core.rewrite import RewritePolicy, rewrite_request  # noqa: E402
from proxy.detect import Detector  # noqa: E402
from proxy.detect.drift import source_like  # noqa: E402
from proxy.detect.language import classify, strip_noise  # noqa: E402
from proxy.settings import LANGUAGE_CODES as JUDGED  # noqa: E402

DEFAULT = RewritePolicy()
AUTO = RewritePolicy(language="auto")
ANSWERS = ROOT / "bench" / "data" / "language_answers.jsonl.gz"


def chat(text: str) -> dict[str, Any]:
    return {"model": "m", "messages": [{"role": "user", "content": text}]}


def verdict(text: str, rw: Any) -> str | None:
    """The signal that cuts ``text`` under the rewrite's expectation, or None."""
    accepted = getattr(rw.expectation, "accepted", None)
    kwargs = {"accepted_languages": accepted} if accepted is not None else {}
    detector = Detector(expected_language=rw.expected_language, **kwargs)
    for delta in split_deltas(text):
        if detector.feed(delta) is not None:
            break
    found = detector.finish().verdict
    return None if found is None else found.signal


def language_of(text: str) -> str | None:
    found = classify(strip_noise(text).replace("\n", " "))
    return found[0] if found and found[1] >= 0.8 else None


def prose(text: str) -> bool:
    return len(text) >= 200 and len(strip_noise(text)) >= 0.7 * len(text) and not source_like(text)


def real_texts() -> dict[str, list[str]]:
    """Real healthy prose by language: answers first, then other texts (documentation)."""
    answers: dict[str, list[str]] = defaultdict(list)
    others: dict[str, list[str]] = defaultdict(list)
    corpus = ROOT.parent / "shared" / "corpus" / "dev.jsonl"
    if not corpus.is_file():
        corpus = ROOT / "tests" / "data" / "corpus.jsonl"
    for line in corpus.open(encoding="utf-8"):
        row = json.loads(line)
        if row.get("label") != "healthy" or not prose(row["text"]) or row["lang"] == "mixed":
            continue
        kind = answers if row.get("kind") in ("llm-answer", "qa-answer") else others
        kind[row["lang"]].append(row["text"])
    with gzip.open(ROOT / "bench" / "data" / "realgen.jsonl.gz", "rt", encoding="utf-8") as fh:
        for line in fh:
            row = json.loads(line)
            if row["label"] == "healthy" and prose(row["text"]):
                answers[row["lang"]].append(row["text"])
    return {lang: answers[lang] + others[lang] for lang in set(answers) | set(others)}


def load_answers(path: Path) -> list[dict[str, Any]]:
    with gzip.open(path, "rt", encoding="utf-8") as fh:
        return [json.loads(line) for line in fh]


def measure_about(rows: list[dict[str, Any]], show: bool) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for setting, policy in (("default", DEFAULT), ("auto", AUTO)):
        drift = other = 0
        languages: Counter[str] = Counter()
        signals: Counter[str] = Counter()
        for row in rows:
            rw = rewrite_request(chat(row["prompt"]), "chat", policy)
            signal = verdict(row["answer"], rw)
            languages[language_of(row["answer"]) or "unsure"] += 1
            if signal == "language-drift":
                drift += 1
                if show:
                    print(f"  about cut ({setting}): {row['prompt']!r} -> {row['answer'][:70]!r}")
            elif signal is not None:
                other += 1
                signals[signal] += 1
        out[setting] = {
            "answers": len(rows),
            "cut_language_drift": drift,
            "cut_other_signal": other,
            "other_signals": dict(signals),
        }
        out["answer_languages"] = dict(languages.most_common(8))
    return out


def measure_explicit(rows: list[dict[str, Any]], show: bool) -> dict[str, Any]:
    rng = random.Random(27)
    texts = real_texts()
    english = [t for t in texts["en"] if prose(t)]
    caught = total = engine_english = 0
    missed: Counter[str] = Counter()
    cut = judged = 0
    no_text: Counter[str] = Counter()
    cut_by: Counter[str] = Counter()
    for row in rows:
        target = row["language"]
        rw = rewrite_request(chat(row["prompt"]), "chat", DEFAULT)
        candidates = [rng.choice(english)]
        if language_of(row["answer"]) == "en" and len(row["answer"]) >= 150:
            candidates.append(row["answer"])
            engine_english += 1
        for answer in candidates:
            total += 1
            if verdict(answer, rw) == "language-drift":
                caught += 1
            else:
                missed[row["template"]] += 1
                if show:
                    print(f"  English answer missed: {row['prompt'][:70]!r}")
        pool = texts.get(target, [])
        if not pool:
            no_text[target] += 1
            continue
        judged += 1
        signal = verdict(rng.choice(pool), rw)
        if signal is not None:
            cut += 1
            cut_by[signal] += 1
            if show:
                print(f"  answer in {target} cut ({signal}): {row['prompt'][:70]!r}")
    return {
        "prompts": len(rows),
        "languages": len({r["language"] for r in rows}),
        "english_answers": total,
        "of_which_engine": engine_english,
        "english_caught": caught,
        "english_missed_by_template": dict(missed),
        "answers_in_requested_language": judged,
        "requested_language_cut": cut,
        "cut_by": dict(cut_by),
        "no_real_text_for": dict(no_text),
    }


def measure_auto(about: list[dict[str, Any]], show: bool) -> dict[str, Any]:
    requests = explicit_prompts() + crosslingual_prompts()
    contradictions = injected = silent = 0
    for row in requests:
        rw = rewrite_request(chat(row["prompt"]), "chat", AUTO)
        if rw.injected_language == row["language"]:
            injected += 1
        elif rw.injected_language is not None:
            contradictions += 1
            if show:
                print(f"  auto contradicts {row['language']}: {rw.injected_language}")
        else:
            silent += 1
    about_injected = 0
    for row in about:
        rw = rewrite_request(chat(row["prompt"]), "chat", AUTO)
        if rw.injected_language is not None:
            about_injected += 1
            if show:
                print(f"  auto instructs {rw.injected_language}: {row['prompt']!r}")
    return {
        "requests": len(requests),
        "contradictions": contradictions,
        "requested_injected": injected,
        "nothing_injected": silent,
        "about_prompts": len(about),
        "about_prompts_instructed": about_injected,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--misses", action="store_true", help="print misses and wrong cuts")
    parser.add_argument("--answers", type=Path, default=ANSWERS, help="answers (.jsonl.gz)")
    args = parser.parse_args()
    rows = load_answers(args.answers)
    about = [r for r in rows if r["set"] == "about"]
    engine = {r["prompt"]: r["answer"] for r in rows if r["set"] == "explicit"}
    explicit = [
        {**r, "answer": engine.get(r["prompt"], "")}
        for r in explicit_prompts()
        if r["language"] != "en" and r["language"] in JUDGED
    ]
    prompts = [r["prompt"] for r in about + explicit]
    for text in prompts:  # loads fastText and the word lists once
        rewrite_request(chat(text), "chat", DEFAULT)
    start = time.perf_counter()
    for text in prompts:
        rewrite_request(chat(text), "chat", DEFAULT)
    per_prompt = (time.perf_counter() - start) / len(prompts) * 1000
    result = {
        "about": measure_about(about, args.misses),
        "explicit": measure_explicit(explicit, args.misses),
        "auto": measure_auto(about, args.misses),
        "rewrite_ms_per_prompt": round(per_prompt, 3),
    }
    print(json.dumps(result, indent=1, ensure_ascii=False))


if __name__ == "__main__":
    main()
