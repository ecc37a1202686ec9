"""Record English answers of SmolLM2-135M-Instruct pushed into salad (``salad_en.jsonl``).

Word salad of *real* English words (a run of dictionary words with no syntax: "… placed
expanded extended repelvent filtering upgraded aimed shaped plan matured forever despite
slightest modification …") is what the ``salad`` signal's run shape
(``proxy/detect/word_runs.py``) is for. The labelled real answers hold it only in their
set-aside half, and ``gibberish.jsonl`` has two English examples, so this set adds more from
real engines: twelve AlpacaEval instructions (distinct prompts of at most 300 characters of
``../shared/realanswers/alpacaeval-dev.jsonl``, evenly spaced in sorted order: no choice made
by looking at answers), each under the three sampling settings of ``build_gibberish.py`` that
push a small model off its text (repetition penalty 1.3 / 1.6 / 2.0, frequency penalty 0.9 /
1.5 / 2.0, temperature 0.6 / 0.9 / 1.2), seed 7, 320 tokens, on two engines:

* vLLM 0.32 (CPU) with the end-to-end tests' model (the command in
  ``~/.cache/coherence-guard-e2e/manifest.json``), whose repetition penalty weighs every token
  of the sequence: most answers dissolve;
* llama.cpp (the ``xllamacpp`` wheel of the end-to-end tests, Q4_1), whose ``repeat_penalty``
  looks back 64 tokens: every answer stays sentences, clumsy, looping or wrong.

Labels were given by reading each answer, never by a signal, and added to the rows:
``label`` ``salad`` (the answer turns into words without syntax, real or invented),
``gibberish`` (letters and symbols run together) or ``sentences`` (it stays sentences, however
clumsy, looping or wrong); ``onset``, the first character of the salad or gibberish as read;
``note``, a line on what was read. Run against an engine already serving, once per engine::

    nice -n 19 python bench/data/build_salad_en.py --engine http://127.0.0.1:8000 --name vllm
    nice -n 19 python bench/data/build_salad_en.py --engine http://127.0.0.1:8001 --name llamacpp

(both append to ``salad_en-raw.jsonl``; read each answer, then write ``salad_en.jsonl`` with
``label``, ``onset`` and ``note`` per row).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent

ANSWERS = ROOT.parent / "shared" / "realanswers" / "alpacaeval-dev.jsonl"
RAW = HERE / "salad_en-raw.jsonl"
#: (repeat_penalty, frequency_penalty, temperature), as ``build_gibberish.py``.
SETTINGS = ((1.3, 0.9, 0.6), (1.6, 1.5, 0.9), (2.0, 2.0, 1.2))
MAX_TOKENS = 320


def prompts(count: int = 12) -> list[str]:
    """``count`` distinct short prompts of the real answers, evenly spaced in sorted order (no
    choice made by looking at the answers)."""
    seen: set[str] = set()
    with ANSWERS.open(encoding="utf-8") as fh:
        for line in fh:
            prompt = json.loads(line)["prompt"]
            if len(prompt) <= 300:
                seen.add(prompt)
    ordered = sorted(seen)
    return ordered[:: max(1, len(ordered) // count)][:count]


def generate(engine: str, name: str, out_path: Path) -> None:
    import httpx

    jobs = [(i, p, s) for i, p in enumerate(prompts()) for s in SETTINGS]
    with httpx.Client(base_url=engine, timeout=600) as client, out_path.open("a") as out:
        model = client.get("/v1/models").json()["data"][0]["id"]
        for index, prompt, (rp, fp, t) in jobs:
            body: dict[str, Any] = {
                "model": model,
                "messages": [{"role": "user", "content": prompt}],
                "max_tokens": MAX_TOKENS,
                # vLLM's name, and llama.cpp's (each engine ignores the other's)
                "repetition_penalty": rp,
                "repeat_penalty": rp,
                "frequency_penalty": fp,
                "temperature": t,
                "seed": 7,
            }
            reply = client.post("/v1/chat/completions", json=body)
            reply.raise_for_status()
            choice = reply.json()["choices"][0]
            row = {
                "id": f"salad-en-{name}-{index:02d}-rp{rp}",
                "engine": name,
                "prompt": prompt,
                "repetition_penalty": rp,
                "frequency_penalty": fp,
                "temperature": t,
                "seed": 7,
                "finish_reason": choice.get("finish_reason"),
                "text": choice["message"].get("content") or "",
            }
            out.write(json.dumps(row, ensure_ascii=False) + "\n")
            out.flush()
            print(row["id"], row["finish_reason"], len(row["text"]), flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--engine", required=True, help="base URL of a running engine")
    parser.add_argument(
        "--name", required=True, help="the engine's name in the ids: vllm, llamacpp"
    )
    parser.add_argument("--output", type=Path, default=RAW)
    args = parser.parse_args(argv)
    generate(args.engine, args.name, args.output)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
