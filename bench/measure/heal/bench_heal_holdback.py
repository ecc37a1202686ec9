"""What heal mode's hold-back window costs a streaming client.

The fake vLLM streams a healthy answer at a fixed pace through the real proxy (uvicorn, real
sockets) in ``enforce`` and in ``heal`` mode with several GUARD_HEAL_HOLDBACK_TOKENS; the client
notes when each content chunk arrives. Reported per setting: the median and p99 gap between
chunks (inter-token latency: the window delays chunks, it must not bunch them), how many chunks
arrive together at the end (the window is released at ``[DONE]``), the time to the first
content chunk and to the last byte. Run::

    python bench/measure/heal/bench_heal_holdback.py [--tokens 200] [--delay 0.02]

With ``--delays`` it prints instead what the default window is chosen from: the detector's delay
(tokens from a loop's first token to the verdict) on loops of 3 to 100 words per period behind
healthy corpus text, in the fake engine's word-sized tokens.

Not a test: timings are reported, never asserted (and depend on the machine's load).
"""

from __future__ import annotations

import argparse
import itertools
import statistics
import time

import httpx

from proxy.server.app import create_app
from proxy.settings import load_settings
from tests.conftest import ProxyServer
from tests.fakes.vllm import FakeVLLM, Script

WORDS = [
    "alpha",
    "river",
    "stone",
    "cloud",
    "seven",
    "garden",
    "lamp",
    "window",
    "orange",
    "silver",
    "tiger",
    "paper",
    "music",
    "forest",
]


def healthy(tokens: int) -> str:
    """A text of ``tokens`` words that never repeats a 3-word phrase in a short window."""
    out = []
    for i in range(tokens):
        out.append(WORDS[(i * 7 + i // len(WORDS)) % len(WORDS)] + str(i))
    return " ".join(out)


def measure(base: str, tokens: int) -> dict[str, float]:
    body = {
        "model": "m",
        "messages": [{"role": "user", "content": "x"}],
        "stream": True,
        "max_tokens": tokens * 2,
    }
    arrivals: list[float] = []
    started = time.perf_counter()
    with httpx.stream("POST", base + "/v1/chat/completions", json=body, timeout=60) as resp:
        for line in resp.iter_lines():
            if line.startswith("data: {") and '"content":"' in line and '"content":""' not in line:
                arrivals.append(time.perf_counter())
    ended = time.perf_counter()
    gaps = sorted(b - a for a, b in itertools.pairwise(arrivals))
    return {
        "chunks": len(arrivals),
        "gap_median_ms": round(statistics.median(gaps) * 1000, 2),
        "gap_p99_ms": round(gaps[int(len(gaps) * 0.99) - 1] * 1000, 2),
        "final_burst_chunks": sum(1 for t in arrivals if arrivals[-1] - t < 0.002),
        "first_content_s": round(arrivals[0] - started, 3),
        "last_byte_s": round(ended - started, 3),
    }


def detection_delays() -> None:
    import json
    import random
    from pathlib import Path

    from proxy.detect import Detector
    from tests.fakes.vllm import tokenize

    corpus = Path(__file__).resolve().parents[3] / "tests" / "data" / "corpus.jsonl"
    rows = [json.loads(line) for line in corpus.read_text().splitlines()]
    intros = [r["text"][:400] for r in rows if r["label"] == "healthy"][:6]
    rng = random.Random(1)
    for period in (3, 6, 12, 25, 50, 100):
        delays = []
        for intro in intros:
            sentence = " ".join(rng.choice(WORDS) for _ in range(period)) + "."
            pieces = tokenize(intro + " " + (sentence + " ") * 400)
            start = len(tokenize(intro))
            detector = Detector()
            for i, piece in enumerate(pieces):
                if detector.feed(piece, tokens=1) is not None:
                    delays.append(i + 1 - start)
                    break
        print(f"period {period:3d} words: delay {sorted(delays)} tokens")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=200)
    parser.add_argument("--delay", type=float, default=0.02, help="seconds between tokens")
    parser.add_argument("--delays", action="store_true", help="detection delays instead")
    args = parser.parse_args()
    if args.delays:
        detection_delays()
        return
    settings_list = [
        ("enforce", {"mode": "enforce"}),
        ("heal, holdback 0", {"mode": "heal", "heal_holdback_tokens": 0}),
        ("heal, holdback 16", {"mode": "heal", "heal_holdback_tokens": 16}),
        ("heal, holdback 64", {"mode": "heal", "heal_holdback_tokens": 64}),
    ]
    with FakeVLLM() as fake:
        fake.script = Script(texts=[healthy(args.tokens)], chunk_delay=args.delay)
        for name, overrides in settings_list:
            settings = load_settings(
                upstream_url=fake.url, upstream_metrics_interval=0, **overrides
            )
            server = ProxyServer(create_app(settings)).start()
            try:
                measure(server.url, 20)  # warm the connection pool
                print(f"{name:20s} {measure(server.url, args.tokens)}")
            finally:
                server.stop()


if __name__ == "__main__":
    main()
