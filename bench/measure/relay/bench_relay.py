"""Relay cost: CPU microseconds per relayed chunk and added inter-token latency.

Starts the fake vLLM (``tests/fakes/vllm.py``, streaming a healthy corpus answer) and the real
proxy (``coherence-guard serve``, one worker, pinned to one core when ``taskset`` exists) as
separate processes, drives them with a small asyncio load generator over keep-alive
connections, and reads the proxy's CPU time from ``/proc/<pid>/stat``.

    python bench/measure/relay/bench_relay.py                 # enforce, off, direct; defaults below
    python bench/measure/relay/bench_relay.py --conc 32 --seconds 8 --delay-ms 0
    python bench/measure/relay/bench_relay.py --conc 256 --delay-ms 20 --modes direct,enforce

CPU per chunk = proxy CPU seconds / chunks the clients received. Added ITL = the p50/p99 of
the gaps between chunk arrivals through the proxy minus those of the direct run (same load).
A benchmark, not a test: figures go to the README; nothing asserts on them.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[3]
CLK_TCK = os.sysconf("SC_CLK_TCK")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def wait_ready(url: str, proc: subprocess.Popen[bytes], timeout: float = 20) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{proc.args!r} exited with {proc.returncode}")
        try:
            httpx.get(url, timeout=1)
            return
        except httpx.TransportError:
            time.sleep(0.05)
    raise RuntimeError(f"{url} did not come up")


def pinned(cmd: list[str], core: str | None) -> list[str]:
    if core is not None and shutil.which("taskset"):
        return ["taskset", "-c", core, *cmd]
    return cmd


def start_upstream(
    text_file: Path, delay_ms: float, core: str | None
) -> tuple[subprocess.Popen[bytes], int]:
    port = free_port()
    cmd = [sys.executable, "-m", "tests.fakes.vllm", "--port", str(port), "--text-file",
           str(text_file), "--chunk-delay", str(delay_ms / 1000)]  # fmt: skip
    proc = subprocess.Popen(pinned(cmd, core), cwd=ROOT, stdout=subprocess.DEVNULL)
    wait_ready(f"http://127.0.0.1:{port}/health", proc)
    return proc, port


def start_proxy(
    upstream_port: int, mode: str, core: str | None
) -> tuple[subprocess.Popen[bytes], int]:
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("GUARD_")}
    env.update(GUARD_MODE=mode, GUARD_UPSTREAM_METRICS_INTERVAL="0", GUARD_LOG_LEVEL="warning")
    cmd = [sys.executable, "-m", "proxy", "serve", "--host", "127.0.0.1", "--port", str(port),
           "--upstream", f"http://127.0.0.1:{upstream_port}"]  # fmt: skip
    proc = subprocess.Popen(pinned(cmd, core), cwd=ROOT, env=env, stdout=subprocess.DEVNULL)
    wait_ready(f"http://127.0.0.1:{port}/health", proc)
    return proc, port


async def client(
    port: int, body: bytes, until: float, gaps: list[float], counts: list[int]
) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    request = (
        b"POST /v1/chat/completions HTTP/1.1\r\nhost: bench\r\ncontent-type: application/json\r\n"
        b"content-length: %d\r\n\r\n%s" % (len(body), body)
    )
    try:
        while time.perf_counter() < until:
            writer.write(request)
            last: float | None = None
            tail = b""
            while True:
                data = await reader.read(65536)
                if not data:
                    return
                now = time.perf_counter()
                n = data.count(b"data: ")
                if n:
                    if last is not None:
                        gaps.append(now - last)
                    last = now
                    counts[0] += n
                tail = (tail + data)[-5:]
                if tail == b"0\r\n\r\n":
                    break
            counts[1] += 1
    finally:
        writer.close()


async def load(port: int, conc: int, seconds: float) -> tuple[list[float], int, int]:
    body = json.dumps(
        {
            "model": "m",
            "messages": [{"role": "user", "content": "hi"}],
            "stream": True,
            "max_tokens": 4096,
        }
    ).encode()
    gaps: list[float] = []
    counts = [0, 0]
    until = time.perf_counter() + seconds
    await asyncio.gather(*(client(port, body, until, gaps, counts) for _ in range(conc)))
    return gaps, counts[0], counts[1]


def pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def run_cell(args: argparse.Namespace, mode: str, upstream_port: int) -> dict[str, float | str]:
    proxy = None
    port = upstream_port
    if mode != "direct":
        proxy, port = start_proxy(upstream_port, mode, args.proxy_core)
    try:
        asyncio.run(load(port, min(args.conc, 8), 1.0))  # warm-up (imports, pools, JIT caches)
        before = cpu_seconds(proxy.pid) if proxy else 0.0
        gaps, chunks, streams = asyncio.run(load(port, args.conc, args.seconds))
        cpu = (cpu_seconds(proxy.pid) - before) if proxy else 0.0
    finally:
        if proxy is not None:
            proxy.send_signal(signal.SIGTERM)
            proxy.wait(10)
    return {
        "mode": mode,
        "conc": args.conc,
        "delay_ms": args.delay_ms,
        "streams": streams,
        "chunks": chunks,
        "chunks_per_s": round(chunks / args.seconds),
        "cpu_us_per_chunk": round(cpu / chunks * 1e6, 1) if proxy and chunks else 0.0,
        "itl_p50_ms": round(statistics.median(gaps) * 1000, 3) if gaps else float("nan"),
        "itl_p99_ms": round(pct(gaps, 0.99) * 1000, 3),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--modes", default="direct,off,enforce")
    parser.add_argument("--conc", type=int, default=32)
    parser.add_argument("--seconds", type=float, default=6.0)
    parser.add_argument("--delay-ms", type=float, default=0.0, help="upstream delay per token")
    parser.add_argument("--proxy-core", default="0", help="core to pin the proxy to ('' = none)")
    parser.add_argument("--upstream-core", default="1", help="core for the fake upstream")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    args.proxy_core = args.proxy_core or None
    rows = [
        json.loads(line) for line in (ROOT / "tests/data/corpus.jsonl").read_text().splitlines()
    ]
    text = next(r["text"] for r in rows if r["label"] == "healthy")
    text_file = Path("/tmp") / "coherence-guard-bench.txt"
    text_file.write_text(text, encoding="utf-8")
    upstream, up_port = start_upstream(text_file, args.delay_ms, args.upstream_core or None)
    results = []
    try:
        for mode in args.modes.split(","):
            results.append(run_cell(args, mode, up_port))
            print(json.dumps(results[-1]) if args.json else results[-1], flush=True)
    finally:
        upstream.send_signal(signal.SIGINT)
        upstream.wait(10)
    direct = next((r for r in results if r["mode"] == "direct"), None)
    if direct and not args.json:
        for r in results:
            if r["mode"] != "direct":
                print(
                    f"{r['mode']}: {r['cpu_us_per_chunk']} µs CPU/chunk; added ITL "
                    f"p50 {float(r['itl_p50_ms']) - float(direct['itl_p50_ms']):+.3f} ms, "
                    f"p99 {float(r['itl_p99_ms']) - float(direct['itl_p99_ms']):+.3f} ms"
                )


if __name__ == "__main__":
    main()
