"""How long ``coherence-guard serve`` takes to answer, in front of an engine that is up.

Starts the fake vLLM (``tests/fakes/vllm.py``), then, ``--runs`` times for each ``--tree`` (a
checkout of the project; runs of the trees alternate, so a busy machine weighs on each alike),
``python -m proxy serve`` from that tree with the default settings, and reports medians of:

* **ready**: seconds from the command to the first ``/health`` 200;
* **first answer**: seconds from then to the whole answer of a chat stream sent at that moment
  (a short English prompt: its rewrite reads the language model, the name index and the
  word-frequency lists; it expects no language, so no salad list) — where the detector's data
  loads beside serving, this includes the rest of the loads it waits for;
* **data loaded**: seconds from the command to the log line that says the detector's data is
  loaded (only where it loads beside serving);
* **slowest /health**: the slowest of the ``/health`` answers polled every 5 ms from ready until
  the data is loaded (the loads hold the interpreter's lock for up to one list's sort at a time).

    python bench/measure/serve/start_time.py --runs 5 --tree ../before --tree .
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT))

from tests.fakes.vllm import FakeVLLM, Script  # noqa: E402
from tests.net import free_port  # noqa: E402

LOADED = "detector data loaded beside serving"
BODY = {
    "model": "fake-model",
    "messages": [{"role": "user", "content": "What is photosynthesis?"}],
    "stream": True,
}


def one_run(tree: Path, upstream: str) -> dict[str, float | None]:
    """One start of the proxy from ``tree``: the figures of the module docstring."""
    port = free_port()
    env = {**os.environ, "PYTHONPATH": str(tree), "GUARD_UPSTREAM_METRICS_INTERVAL": "0"}
    started = time.perf_counter()
    proc = subprocess.Popen(
        [sys.executable, "-m", "proxy", "serve", "--host", "127.0.0.1", "--port", str(port)],
        cwd=tree,
        env={**env, "GUARD_UPSTREAM_URL": upstream},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    loaded = threading.Event()
    loaded_at: list[float] = []

    def read_log() -> None:
        assert proc.stderr is not None
        for line in proc.stderr:
            if LOADED in line and not loaded_at:
                loaded_at.append(time.perf_counter() - started)
                loaded.set()

    threading.Thread(target=read_log, daemon=True).start()
    base = f"http://127.0.0.1:{port}"
    try:
        with httpx.Client(timeout=60) as client:
            while True:
                try:
                    if client.get(base + "/health").status_code == 200:
                        break
                except httpx.TransportError:
                    pass
                time.sleep(0.005)
            ready = time.perf_counter() - started
            answered: list[float] = []

            def ask() -> None:
                with httpx.Client(timeout=60) as own:
                    own.post(base + "/v1/chat/completions", json=BODY).raise_for_status()
                answered.append(time.perf_counter() - started - ready)

            asker = threading.Thread(target=ask)
            asker.start()
            # A tree without the preload has loaded everything before it answered.
            preloads = (tree / "proxy" / "server" / "preload.py").is_file()
            slowest = 0.0
            while (asker.is_alive() or (preloads and not loaded.is_set())) and proc.poll() is None:
                t = time.perf_counter()
                client.get(base + "/health")
                slowest = max(slowest, time.perf_counter() - t)
                time.sleep(0.005)
            asker.join()
    finally:
        proc.terminate()
        proc.wait()
    return {
        "ready": ready,
        "first answer": answered[0],
        "data loaded": loaded_at[0] if loaded_at else None,
        "slowest /health": slowest,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument(
        "--tree", action="append", type=Path, help="a checkout of the project (default: this one)"
    )
    args = parser.parse_args()
    trees = [t.resolve() for t in (args.tree or [ROOT])]
    with FakeVLLM() as fake:
        fake.script = Script(texts=["Photosynthesis turns light into sugar."])
        results: dict[Path, list[dict[str, float | None]]] = {t: [] for t in trees}
        for _ in range(args.runs):
            for tree in trees:
                results[tree].append(one_run(tree, fake.url))
    load = os.getloadavg()[0]
    print(f"medians of {args.runs} runs per tree (load average at the end: {load:.1f})")
    print("| tree | ready (s) | first answer (s) | data loaded (s) | slowest /health (ms) |")
    print("|---|---|---|---|---|")
    for tree, runs in results.items():

        def median(key: str, runs: list[dict[str, float | None]] = runs) -> float | None:
            values = [r[key] for r in runs if r[key] is not None]
            return statistics.median(values) if values else None  # type: ignore[type-var]

        loaded = median("data loaded")
        print(
            f"| {tree.name} | {median('ready'):.2f} | {median('first answer'):.2f} | "
            f"{'-' if loaded is None else f'{loaded:.2f}'} | "
            f"{1000 * (median('slowest /health') or 0):.0f} |"
        )


if __name__ == "__main__":
    main()
