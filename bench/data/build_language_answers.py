"""Build ``bench/data/language_answers.jsonl.gz``: real engine answers to the prompts of
``bench/data/language_prompts.py`` (English prompts about languages, explicit requests), for
``bench/measure/language/measure_language_strength.py``.

The engine is SmolLM2-135M-Instruct (Q4_1 GGUF) served by llama.cpp's server (the one
``scripts/prepare-e2e.sh`` installs; ``python -m tests.e2e.llama_server``), asked through its
OpenAI-compatible chat route, so the model's own chat template applies. Sampling: temperature
0.7, top_p 0.9, a seed per prompt, at most 200 tokens; eight requests at a time.

    python -m tests.e2e.llama_server --model SmolLM2-135M-Instruct.Q4_1.gguf --port 8093 \\
        --parallel 8 --threads 1       # in the llama.cpp venv
    python bench/data/build_language_answers.py --url http://127.0.0.1:8093
"""

from __future__ import annotations

import argparse
import gzip
import json
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
from language_prompts import about_prompts, explicit_prompts

OUT = Path(__file__).resolve().parent / "language_answers.jsonl.gz"


def ask(client: httpx.Client, url: str, row: dict[str, Any], seed: int) -> dict[str, Any]:
    body = {
        "model": "smollm2",
        "messages": [{"role": "user", "content": row["prompt"]}],
        "max_tokens": 200,
        "temperature": 0.7,
        "top_p": 0.9,
        "seed": seed,
    }
    reply = client.post(url + "/v1/chat/completions", json=body, timeout=3600).json()
    choice = reply["choices"][0]
    return {**row, "answer": choice["message"]["content"], "finish_reason": choice["finish_reason"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", default="http://127.0.0.1:8093")
    parser.add_argument(
        "--explicit", action="store_true", help="also answer the explicit requests (slow on CPU)"
    )
    args = parser.parse_args()
    rows = [{**r, "set": "about"} for r in about_prompts()]
    if args.explicit:
        rows += [{**r, "set": "explicit"} for r in explicit_prompts()]
    # Resumable: answers already in the partial file are kept (the machine may be slow).
    partial = OUT.with_suffix(".partial")
    have = {}
    if partial.exists():
        for line in partial.open(encoding="utf-8"):
            row = json.loads(line)
            have[(row["set"], row["prompt"])] = row
    todo = [(i, r) for i, r in enumerate(rows) if (r["set"], r["prompt"]) not in have]
    with httpx.Client() as client, ThreadPoolExecutor(8) as pool, partial.open("a") as out:
        for row in pool.map(lambda ir: ask(client, args.url, ir[1], ir[0]), todo):
            out.write(json.dumps(row, ensure_ascii=False) + "\n")
            out.flush()
            have[(row["set"], row["prompt"])] = row
    with gzip.open(OUT, "wt", encoding="utf-8") as fh:
        for r in rows:
            fh.write(json.dumps(have[(r["set"], r["prompt"])], ensure_ascii=False) + "\n")
    print(f"{OUT}: {len(rows)} answers")


if __name__ == "__main__":
    main()
