"""Record what SmolLM2-135M-Instruct writes on vLLM when its sampling is pushed as heal's raised
penalties push it: ``bench/data/gibberish.jsonl``, the labelled gibberish the ``gibberish`` and
English ``salad`` signals are measured on (docs/heal.md, "Gibberish and salad").

Five of the heal set's languages, a 5- and a 60-paragraph story each, under four settings of
(repetition_penalty, frequency_penalty, temperature) from mild to the vLLM maximum, seed 7,
320 tokens. Labels were given by reading each text, never by a signal: every answer at
repetition_penalty >= 1.6 ends in invented tokens, letter runs without spaces or mixed scripts
(``gibberish``); the milder settings are left ``unlabelled`` (clumsy, sometimes real-word salad,
sometimes fine). Run against the e2e engine (``~/.cache/coherence-guard-e2e/manifest.json``)::

    python bench/data/build_gibberish.py --engine http://127.0.0.1:8000 > bench/data/gibberish.jsonl
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import json
import sys

import httpx

LANGUAGES = ("English", "Italian", "French", "Spanish", "German")
SETTINGS = ((1.1, 0.3, 0.3), (1.3, 0.9, 0.6), (1.6, 1.5, 0.9), (2.0, 2.0, 1.2))


def generate(engine: str, model: str, job: tuple[str, int, tuple[float, float, float]]) -> dict:
    language, n, (rp, fp, t) = job
    prompt = f"Write a {n}-paragraph story in {language}, numbering each paragraph"
    body = {
        "model": model,
        "messages": [{"role": "user", "content": prompt}],
        "max_tokens": 320,
        "repetition_penalty": rp,
        "frequency_penalty": fp,
        "temperature": t,
        "seed": 7,
    }
    resp = httpx.post(engine + "/v1/chat/completions", json=body, timeout=600)
    choice = resp.json()["choices"][0]
    return {
        "language": language,
        "paragraphs": n,
        "repetition_penalty": rp,
        "frequency_penalty": fp,
        "temperature": t,
        "seed": 7,
        "finish_reason": choice["finish_reason"],
        "label": "gibberish" if rp >= 1.6 else "unlabelled",
        "text": choice["message"]["content"],
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--engine", required=True)
    parser.add_argument("--model", default="SmolLM2-135M-Instruct")
    args = parser.parse_args()
    jobs = [(lang, n, s) for lang in LANGUAGES for n in (5, 60) for s in SETTINGS]
    with cf.ThreadPoolExecutor(6) as pool:
        for row in pool.map(lambda job: generate(args.engine, args.model, job), jobs):
            sys.stdout.write(json.dumps(row, ensure_ascii=False) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
