"""What heal hands back, judged by the text: heal mode against a real engine on the looping
prompts of the heal set (``tests/e2e/test_heal_vllm.py``), each healed continuation read by a
validator that is stricter than "no second verdict".

Per answer: the ``guard`` object's action (``healed``, ``aborted`` or none: it did not loop), and
for a healed one whether its continuation (the text after ``onset_char``) is coherent:

* the detector, every signal on and the kept answer's language expected (fastText's best guess
  on its last 2 KiB), finds nothing in the continuation alone (loops, floods, salad, gibberish,
  script soup, drift);
* its prose words (:func:`proxy.detect.salad.prose_words`) are mostly words of that language:
  at most 20 % missing from wordfreq's large list (when it has 10 words or more), or no more
  than the kept answer's own share where that was higher;
* it is made of sentences, not a list of words: at least 15 % of its words are among the
  language's 50 most frequent words (function words: "the", "of", "di", "que", ...), which
  running text of any of these languages far exceeds (0.3 to 0.5) and real-word salad
  ("ages desired evaluated presented expertise used provided", seen at high penalties) does not.

Run against a vLLM you started (the e2e engine: ``~/.cache/coherence-guard-e2e/manifest.json``
has its command)::

    python bench/measure/heal/heal_quality.py --engine http://127.0.0.1:8000 --output heal.jsonl \\
        [--set long|fit] [--setting HEAL_FREQUENCY_PENALTY_STEP=0.3 ...]

``--judge OLD.jsonl --output NEW.jsonl`` judges earlier answers again with this validator.
``--setting`` passes ``GUARD_<KEY>=<VALUE>`` to the proxy it starts (heal mode).
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT))

from proxy.detect import Detector  # noqa: E402
from proxy.detect.language import identify_language  # noqa: E402
from proxy.detect.salad import lexicon, prose_words  # noqa: E402

LANGUAGES = {
    "English": "en",
    "Italian": "it",
    "French": "fr",
    "Spanish": "es",
    "German": "de",
    "Portuguese": "pt",
}
LENGTHS = {"long": ((50, 60, 75, 80, 100), 384), "fit": ((3, 4, 5, 6, 8), 1024)}
MIN_FUNCTION_SHARE = 0.15
MAX_UNKNOWN_SHARE = 0.2


def function_words(language: str) -> frozenset[str]:
    import wordfreq

    return frozenset(wordfreq.top_n_list(language, 50))


def unknown_share(text: str, language: str) -> float | None:
    words = prose_words(text)
    lex = lexicon(language)
    if lex is None or len(words) < 10:
        return None
    return sum(lex.unknown(w) for w in words) / len(words)


def judge(text: str, language: str, prefix: str = "") -> list[str]:
    """Why ``text`` (a continuation of ``prefix``) is not coherent; empty when it is. It is
    held to the language the kept answer is written in (a small model often answers a request
    for Italian in English; heal must continue the answer it has, not another one), and to that
    answer's own share of unknown words where it was higher than the bar (the model's usual
    quality in a language is not heal's doing)."""
    found = identify_language(prefix[-2048:]) if prefix else None
    if found is not None and found[0] in LANGUAGES.values():
        language = found[0]  # the best guess, however sure: what the kept answer is
    why = []
    detector = Detector(expected_language=language)
    verdict = None
    for i in range(0, len(text), 4):
        verdict = verdict or detector.feed(text[i : i + 4])
    verdict = verdict or detector.finish().verdict
    if verdict is not None:
        why.append(f"detector:{verdict.signal}")
    unknown = unknown_share(text, language)
    before = unknown_share(prefix, language) if prefix else None
    bar = max(MAX_UNKNOWN_SHARE, before or 0.0)
    if unknown is not None and unknown > bar:
        why.append(f"unknown-words:{unknown:.2f}")
    tokens = [t.strip(".,;:!?\"'()[]«»“”*").lower() for t in text.split()]
    tokens = [t for t in tokens if t.isalpha()]
    if len(tokens) >= 30:
        share = sum(t in function_words(language) for t in tokens) / len(tokens)
        if share < MIN_FUNCTION_SHARE:
            why.append(f"function-words:{share:.2f}")
    return why


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start_proxy(engine: str, settings: dict[str, str]) -> tuple[subprocess.Popen[bytes], str]:
    port = _free_port()
    env = {
        **os.environ,
        "PYTHONPATH": str(ROOT),
        "GUARD_UPSTREAM_URL": engine,
        "GUARD_HOST": "127.0.0.1",
        "GUARD_PORT": str(port),
        "GUARD_MODE": "heal",
        "GUARD_UPSTREAM_METRICS_INTERVAL": "0",
        **{f"GUARD_{k.upper()}": v for k, v in settings.items()},
    }
    proc = subprocess.Popen([sys.executable, "-m", "proxy", "serve"], env=env, cwd=ROOT)
    url = f"http://127.0.0.1:{port}"
    for _ in range(600):
        try:
            # /v1/models is relayed to the engine: it answers once the proxy serves requests.
            if httpx.get(url + "/v1/models", timeout=1).status_code == 200:
                return proc, url
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    proc.terminate()
    raise SystemExit("the proxy did not start")


def ask(url: str, model: str, prompt: str, max_tokens: int) -> dict[str, Any]:
    body = {
        "model": model,
        "messages": [{"role": "user", "content": prompt}],
        "max_tokens": max_tokens,
        "temperature": 0,
        "repetition_penalty": 1.0,
        "stream": True,
    }
    text = []
    final: dict[str, Any] = {}
    with httpx.stream("POST", url + "/v1/chat/completions", json=body, timeout=900) as resp:
        for line in resp.iter_lines():
            if not line.startswith("data: {"):
                continue
            chunk = json.loads(line[6:])
            for choice in chunk.get("choices") or []:
                text.append((choice.get("delta") or {}).get("content") or "")
                if choice.get("finish_reason") is not None:
                    final = choice
    return {
        "text": "".join(text),
        "finish_reason": final.get("finish_reason"),
        "guard": final.get("guard"),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--engine", default="")
    parser.add_argument("--judge", help="judge the answers of an earlier --output again")
    parser.add_argument("--model", default="SmolLM2-135M-Instruct")
    parser.add_argument("--set", choices=sorted(LENGTHS), default="long")
    parser.add_argument("--concurrency", type=int, default=6)
    parser.add_argument("--output", required=True)
    parser.add_argument("--setting", action="append", default=[])
    parser.add_argument("--languages", default=",".join(LANGUAGES))
    args = parser.parse_args()
    settings = dict(s.split("=", 1) for s in args.setting)
    lengths, max_tokens = LENGTHS[args.set]
    jobs = [
        (language, f"Write a {n}-paragraph story in {language}, numbering each paragraph")
        for language in args.languages.split(",")
        for n in lengths
    ]
    if args.judge:
        rows = [json.loads(line) for line in Path(args.judge).read_text().splitlines()]
    else:
        proc, url = start_proxy(args.engine, settings)
        try:
            with ThreadPoolExecutor(args.concurrency) as pool:
                answers = list(pool.map(lambda job: ask(url, args.model, job[1], max_tokens), jobs))
        finally:
            proc.terminate()
            proc.wait(10)
        rows = [
            {"prompt": prompt, "language": language, "settings": settings, **answer}
            for (language, prompt), answer in zip(jobs, answers, strict=True)
        ]
    counts = {"loops": 0, "healed": 0, "healed_coherent": 0, "healed_degenerate": 0, "aborted": 0}
    with open(args.output, "w") as out:
        for row in rows:
            guard = row["guard"] or {}
            action = guard.get("action")
            why: list[str] = []
            if action is not None:
                counts["loops"] += 1
            if action == "healed":
                counts["healed"] += 1
                onset = int(guard.get("onset_char") or 0)
                text = row["text"]
                why = judge(text[onset:], LANGUAGES[row["language"]], text[:onset])
                counts["healed_degenerate" if why else "healed_coherent"] += 1
            elif action == "aborted":
                counts["aborted"] += 1
            row["incoherent"] = why
            out.write(json.dumps(row, ensure_ascii=False) + "\n")
    print(json.dumps({"settings": rows[0]["settings"] if rows else {}, **counts}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
