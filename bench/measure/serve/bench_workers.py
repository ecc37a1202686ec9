"""How many cores one GPU's traffic needs: ``coherence-guard serve --workers N`` for N = 1..nproc.

One GPU running a 7-8B model serves on the order of 256 concurrent streams at ~50 tokens/s each
(20 ms between tokens): 12,800 SSE events per second through the proxy. This benchmark offers
exactly that load to the real proxy with 1, 2, ... N uvicorn workers and reports, per N:

* chunks/s the clients received and the p50/p99 inter-token gap they saw (against the 20 ms the
  upstream paces);
* the CPU the proxy's processes used (all workers and the parent, from ``/proc``), as cores busy,
  and their resident memory after the run: the figures behind the Kubernetes requests/limits;
* metrics exactness across workers: ``guard_generations_total`` summed over one scrape of
  ``/metrics/quality`` must equal the requests the load generator sent, on every scrape
  (several scrapes, so that different workers answer), because prometheus-client's
  multiprocess mode aggregates every worker's counts whichever worker is asked.

The upstream and the load generator are the vendored benchmark kit's (``bench/kit``:
``fake_upstream.py``, a fast asyncio fake vLLM, and ``loadgen.py``, an aiohttp client; run its
``setup.sh`` once for ``/tmp/bench/venv``). They share the machine with the proxy: on a small
machine they take a core's worth of CPU themselves, so read the table as "what N workers give
when the cores are contended", and quote it with the machine it was taken on.

    python bench/measure/serve/bench_workers.py                    # N = 1..nproc, 256 x 20 ms
    python bench/measure/serve/bench_workers.py --workers 1,2,4 --duration 20 --json results.json
    # a larger node:
    python bench/measure/serve/bench_workers.py --workers 1,2,4,8 --proxy-cores 0-7 --kit-cores 8-15

A benchmark, not a test: nothing asserts on the figures (the exactness check is reported, and
the exit status is 1 when it fails).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parents[3]
KIT = ROOT / "bench" / "kit"
KIT_PYTHON = Path("/tmp/bench/venv/bin/python")
#: Healthy texts the fake engine streams (any JSONL with ``text`` fields works: ``--corpus``).
CORPUS = ROOT / "tests" / "data" / "corpus.jsonl"
_GENERATIONS = re.compile(r"^guard_generations_total\{[^}]*\}\s+([0-9.e+]+)\s*$", re.M)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_ok(url: str, proc: subprocess.Popen[bytes], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{proc.args!r} exited with {proc.returncode}")
        try:
            if httpx.get(url, timeout=2).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.1)
    raise RuntimeError(f"{url} did not answer 200 within {timeout:.0f} s")


def stop(proc: subprocess.Popen[bytes]) -> None:
    """SIGTERM the process group (uvicorn's parent and its workers), SIGKILL after 15 s."""
    if proc.poll() is not None:
        return
    os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(15)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def tree_pids(root: int) -> list[int]:
    """``root`` and all its descendants (uvicorn's workers are children of its parent)."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        children.setdefault(ppid, []).append(int(entry))
    out, frontier = [], [root]
    while frontier:
        pid = frontier.pop()
        out.append(pid)
        frontier.extend(children.get(pid, ()))
    return out


def rss_mib(pids: list[int]) -> float:
    """Resident memory of the processes, MiB (shared pages counted once per process)."""
    total = 0
    for pid in pids:
        try:
            status = Path(f"/proc/{pid}/status").read_text()
        except OSError:
            continue
        match = re.search(r"^VmRSS:\s+(\d+) kB", status, re.M)
        if match:
            total += int(match.group(1))
    return round(total / 1024, 1)


def generations_total(port: int) -> float:
    body = httpx.get(f"http://127.0.0.1:{port}/metrics/quality", timeout=5).text
    return sum(float(v) for v in _GENERATIONS.findall(body))


def scrape_until(port: int, expected: int, scrapes: int, settle: float) -> list[float]:
    """Wait (up to ``settle`` s) until a scrape counts ``expected`` generations, then take
    ``scrapes`` more: a stream is recorded after its last byte, so the first scrape may be a
    few milliseconds early; after that every scrape, whichever worker answers, must agree."""
    deadline = time.monotonic() + settle
    while generations_total(port) != expected and time.monotonic() < deadline:
        time.sleep(0.2)
    return [generations_total(port) for _ in range(scrapes)]


def pinned(cores: str | None, cmd: list[str]) -> list[str]:
    """``cmd`` restricted to ``cores`` (a taskset list such as ``0-7``) when one is given."""
    return ["taskset", "-c", cores, *cmd] if cores else cmd


def loadgen(args: argparse.Namespace, url: str, label: str, cpu: list[str]) -> dict[str, Any]:
    out = subprocess.run(
        pinned(args.kit_cores, [
            str(args.kit_python), str(args.kit / "loadgen.py"), "--url", url,
            "-c", str(args.conc), "-d", str(args.duration), "-w", str(args.warmup),
            "--max-tokens", str(args.max_tokens), "--label", label, *cpu,
        ]),
        capture_output=True, text=True, check=True, timeout=args.duration * 4 + 300,
    )  # fmt: skip
    result: dict[str, Any] = json.loads(out.stdout)
    return result


def run_direct(args: argparse.Namespace, upstream: str) -> dict[str, Any]:
    """The same load straight at the upstream: the gaps the proxy's rows are compared with."""
    result = loadgen(args, f"{upstream}/v1", "direct", [])
    itl = result["itl_ms"]
    return {
        "workers": 0,
        "chunks_per_s": result["chunks_per_s"],
        "itl_p50_ms": itl.get("p50"),
        "itl_p99_ms": itl.get("p99"),
        "ttft_p99_ms": result["ttft_ms"].get("p99"),
        "requests_sent": int(result["streams_started"]),
        "errors": result["errors"],
        "host_cpu_busy": result["host_cpu_busy"],
    }


def run_cell(args: argparse.Namespace, workers: int, upstream: str, text: str) -> dict[str, Any]:
    port = free_port()
    env = {
        **os.environ,
        "PYTHONPATH": str(ROOT),
        "GUARD_UPSTREAM_URL": upstream,
        "GUARD_MODE": args.mode,
        "GUARD_UPSTREAM_METRICS_INTERVAL": "0",
        "GUARD_LOG_LEVEL": "warning",
    }
    env.pop("PROMETHEUS_MULTIPROC_DIR", None)  # the proxy makes a fresh one per run
    cmd = [sys.executable, "-m", "proxy", "serve", "--host", "127.0.0.1", "--port", str(port)]
    cmd = pinned(args.proxy_cores, [*cmd, "--workers", str(workers)])
    with tempfile.TemporaryFile() as log:
        proxy = subprocess.Popen(
            cmd, env=env, cwd=ROOT, stdout=log, stderr=log, start_new_session=True
        )
        try:
            wait_ok(f"http://127.0.0.1:{port}/ready", proxy, timeout=60)
            time.sleep(1.0)  # every worker has imported the detector and loaded fastText
            idle_rss = rss_mib(tree_pids(proxy.pid))
            base = generations_total(port)
            result = loadgen(
                args,
                f"http://127.0.0.1:{port}/v1",
                f"workers={workers}",
                ["--cpu", f"proxy=pid:{proxy.pid}"],
            )
            loaded_rss = rss_mib(tree_pids(proxy.pid))
            sent = int(result["streams_started"])
            counts = scrape_until(port, int(base) + sent, args.scrapes, settle=10)
        except Exception:
            log.seek(0)
            sys.stderr.write(log.read().decode(errors="replace")[-4000:])
            raise
        finally:
            stop(proxy)
    cpu = result["cpu"]["proxy"]
    itl = result["itl_ms"]
    return {
        "workers": workers,
        "chunks_per_s": result["chunks_per_s"],
        "itl_p50_ms": itl.get("p50"),
        "itl_p99_ms": itl.get("p99"),
        "ttft_p99_ms": result["ttft_ms"].get("p99"),
        "proxy_cores_busy": cpu["util"],
        "proxy_us_per_chunk": cpu["us_per_chunk"],
        "loadgen_cores_busy": result["cpu"]["loadgen"]["util"],
        "host_cpu_busy": result["host_cpu_busy"],
        "rss_idle_mib": idle_rss,
        "rss_loaded_mib": loaded_rss,
        "requests_sent": sent,
        "errors": result["errors"],
        "generations_scraped": [c - base for c in counts],
        "metrics_exact": all(c - base == sent for c in counts),
        "text": text,
    }


def parse_workers(spec: str | None) -> list[int]:
    if not spec:
        return list(range(1, (os.cpu_count() or 1) + 1))
    return [int(n) for n in spec.split(",")]


def table(rows: list[dict[str, Any]]) -> str:
    lines = [
        "| workers | chunks/s | ITL p50 | ITL p99 | proxy CPU (cores) | CPU µs/chunk "
        "| RSS idle → loaded | metrics exact (requests / scraped) |",
        "|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for r in rows:
        if r["workers"] == 0:
            lines.append(
                f"| direct (no proxy) | {r['chunks_per_s']:,.0f} | {r['itl_p50_ms']:.1f} ms "
                f"| {r['itl_p99_ms']:.1f} ms | | | | |"
            )
            continue
        scraped = sorted({int(c) for c in r["generations_scraped"]})
        lines.append(
            f"| {r['workers']} | {r['chunks_per_s']:,.0f} | {r['itl_p50_ms']:.1f} ms "
            f"| {r['itl_p99_ms']:.1f} ms | {r['proxy_cores_busy']:.2f} "
            f"| {r['proxy_us_per_chunk']:.0f} | {r['rss_idle_mib']:.0f} → "
            f"{r['rss_loaded_mib']:.0f} MiB | {'yes' if r['metrics_exact'] else 'NO'} "
            f"({r['requests_sent']} / {', '.join(map(str, scraped))}) |"
        )
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workers", help="comma-separated worker counts (default 1..nproc)")
    parser.add_argument("--conc", type=int, default=256, help="concurrent streams (256)")
    parser.add_argument("--delay-ms", type=float, default=20.0, help="upstream ms per token (20)")
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--duration", type=float, default=15.0, help="measured seconds per N")
    parser.add_argument("--warmup", type=float, default=3.0)
    parser.add_argument("--scrapes", type=int, default=8, help="scrapes checked per N")
    parser.add_argument("--mode", default="enforce", choices=("enforce", "monitor", "off"))
    parser.add_argument("--kit", type=Path, default=KIT, help="the benchmark kit (bench/kit)")
    parser.add_argument("--kit-python", type=Path, default=KIT_PYTHON)
    parser.add_argument("--upstream-text", type=Path, default=CORPUS if CORPUS.is_file() else None)
    parser.add_argument("--no-direct", action="store_true", help="skip the no-proxy baseline")
    parser.add_argument("--proxy-cores", help="taskset core list for the proxy, e.g. 0-7")
    parser.add_argument("--kit-cores", help="taskset core list for the upstream and load generator")
    parser.add_argument("--json", type=Path, help="also write the rows here")
    args = parser.parse_args()
    if not args.kit_python.exists():
        parser.error(f"{args.kit_python} missing: run {args.kit / 'setup.sh'} first")

    upstream_port = free_port()
    cmd = pinned(args.kit_cores, [
        str(args.kit_python), str(args.kit / "fake_upstream.py"), "--port", str(upstream_port),
        "--delay-ms", str(args.delay_ms),
    ])  # fmt: skip
    text = "cycling word list"
    if args.upstream_text:
        cmd += ["--text-file", str(args.upstream_text)]
        text = args.upstream_text.name
    upstream = subprocess.Popen(
        cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True
    )
    rows = []
    try:
        wait_ok(f"http://127.0.0.1:{upstream_port}/health", upstream, timeout=30)
        if not args.no_direct:
            rows.append(run_direct(args, f"http://127.0.0.1:{upstream_port}"))
            print(json.dumps(rows[-1]), file=sys.stderr, flush=True)
        for n in parse_workers(args.workers):
            row = run_cell(args, n, f"http://127.0.0.1:{upstream_port}", text)
            rows.append(row)
            print(json.dumps(row), file=sys.stderr, flush=True)
    finally:
        stop(upstream)
    print(
        f"{args.conc} streams x {1000 / args.delay_ms:.0f} tokens/s, {args.max_tokens}-token "
        f"streams, GUARD_MODE={args.mode}, {args.duration:.0f} s measured per row, "
        f"{os.cpu_count()} cores shared by proxy, upstream and load generator"
    )
    print(table(rows))
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2))
    return 0 if all(r.get("metrics_exact", True) for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
