"""Load and fault suite: many streams, hang-ups, guard aborts, and a soak — nothing left running.

Starts the fast fake engine (``bench/kit/fake_upstream.py``, which counts streams started,
completed, disconnected and still active) and the real proxy (``python -m proxy serve``, one
worker) as separate processes, then drives the proxy with a raw asyncio HTTP/1.1 client:

    python bench/measure/serve/bench_faults.py concurrent --streams 1000      # 1,000 at once
    python bench/measure/serve/bench_faults.py chaos --streams 10000 --conc 250  # hang-ups, aborts
    python bench/measure/serve/bench_faults.py soak --minutes 30 --conc 64       # RSS over time

* ``concurrent``: N streams opened together, 64 tokens each at 20 ms/token; every one must end
  with ``[DONE]`` (errors = anything else).
* ``chaos``: N streams, C at a time; each is healthy, or loops after 10 tokens (the guard must
  abort it: the client sees the guard's finish chunk), or hangs up after a random number of
  events. At the end the fake engine must report **0 active generations** — every upstream
  stream completed or was closed by the proxy.
* ``soak``: the chaos mix at a steady concurrency for M minutes; the proxy's RSS is sampled
  every 10 s; reported: after warm-up, at the end, the maximum, and the change.

A benchmark, not a test: it prints figures (and ``--json``); the README quotes them.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parents[3]
PAGE = os.sysconf("SC_PAGE_SIZE")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def rss_bytes(pid: int) -> int:
    return int(Path(f"/proc/{pid}/statm").read_text().split()[1]) * PAGE


def wait_ready(url: str, proc: subprocess.Popen[bytes], timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{proc.args!r} exited with {proc.returncode}")
        try:
            if httpx.get(url, timeout=1).status_code < 500:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.1)
    raise RuntimeError(f"{url} did not come up")


@dataclass
class Tally:
    sent: int = 0
    done: int = 0
    guard_aborted: int = 0
    hung_up: int = 0
    errors: int = 0
    error_samples: list[str] = field(default_factory=list)

    def error(self, why: str) -> None:
        self.errors += 1
        if len(self.error_samples) < 5:
            self.error_samples.append(why)


def request_bytes(port: int, kind: str, tokens: int, delay_ms: int) -> bytes:
    body = json.dumps(
        {
            "model": "fake",
            "messages": [{"role": "user", "content": "Tell me about rivers."}],
            "stream": True,
            "max_tokens": tokens,
        }
    ).encode()
    headers = [
        "POST /v1/chat/completions HTTP/1.1",
        f"Host: 127.0.0.1:{port}",
        "Content-Type: application/json",
        f"Content-Length: {len(body)}",
        f"x-fake-delay-ms: {delay_ms}",
    ]
    if kind == "loop":
        headers.append("x-fake-loop-after: 10")
    return ("\r\n".join(headers) + "\r\n\r\n").encode() + body


async def one_stream(
    port: int, kind: str, tally: Tally, *, tokens: int = 64, delay_ms: int = 20
) -> None:
    """One streaming request; ``kind`` is healthy | loop | hangup."""
    tally.sent += 1
    hang_after = random.randint(1, 30) if kind == "hangup" else -1
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
    except OSError as exc:
        tally.error(f"connect: {exc}")
        return
    try:
        writer.write(request_bytes(port, kind, 200 if kind == "loop" else tokens, delay_ms))
        seen = b""
        events = 0
        async with asyncio.timeout(60):
            while True:
                data = await reader.read(65536)
                if not data:
                    tally.error(f"{kind}: connection closed before [DONE]")
                    return
                seen = (seen + data)[-4096:]
                if hang_after > 0:
                    events += data.count(b"\n\n")
                    if events >= hang_after:
                        tally.hung_up += 1
                        writer.transport.abort()
                        return
                if b"data: [DONE]" in seen:
                    tally.done += 1
                    if b'"guard"' in seen and b'"aborted"' in seen:
                        tally.guard_aborted += 1
                    elif kind == "loop":
                        tally.error("loop: ended without the guard's abort")
                    return
    except TimeoutError:
        tally.error(f"{kind}: no end within 60 s")
    except OSError as exc:
        tally.error(f"{kind}: {exc}")
    finally:
        writer.transport.abort()


def pick_kind(rng: random.Random) -> str:
    r = rng.random()
    return "healthy" if r < 0.4 else "loop" if r < 0.7 else "hangup"


async def run_pool(port: int, total: int, conc: int, tally: Tally, seed: int) -> None:
    rng = random.Random(seed)
    kinds = [pick_kind(rng) for _ in range(total)]
    it = iter(kinds)

    async def worker() -> None:
        for kind in it:
            await one_stream(port, kind, tally)

    await asyncio.gather(*(worker() for _ in range(conc)))


async def upstream_stats(port: int, wait_idle: float = 10.0) -> dict[str, Any]:
    """The fake engine's counters, once no stream is active (or after ``wait_idle`` s)."""
    deadline = time.monotonic() + wait_idle
    async with httpx.AsyncClient() as client:
        while True:
            stats: dict[str, Any] = (await client.get(f"http://127.0.0.1:{port}/stats")).json()
            if stats["active"] == 0 or time.monotonic() > deadline:
                return stats
            await asyncio.sleep(0.1)


async def scenario(
    args: argparse.Namespace, proxy_port: int, up_port: int, pid: int
) -> dict[str, Any]:
    tally = Tally()
    started = time.monotonic()
    rss: list[tuple[float, int]] = []
    if args.scenario == "concurrent":
        await asyncio.gather(
            *(one_stream(proxy_port, "healthy", tally) for _ in range(args.streams))
        )
    elif args.scenario == "chaos":
        await run_pool(proxy_port, args.streams, args.conc, tally, args.seed)
    else:
        stop_at = started + args.minutes * 60
        seed = args.seed

        async def sample() -> None:
            while time.monotonic() < stop_at:
                rss.append((time.monotonic() - started, rss_bytes(pid)))
                await asyncio.sleep(10)

        sampler = asyncio.create_task(sample())
        while time.monotonic() < stop_at:
            await run_pool(proxy_port, args.conc * 4, args.conc, tally, seed)
            seed += 1
        await sampler
    elapsed = time.monotonic() - started
    stats = await upstream_stats(up_port)
    out: dict[str, Any] = {
        "scenario": args.scenario,
        "seconds": round(elapsed, 1),
        "streams": tally.sent,
        "completed_with_done": tally.done,
        "guard_aborted": tally.guard_aborted,
        "client_hang_ups": tally.hung_up,
        "errors": tally.errors,
        "error_samples": tally.error_samples,
        "upstream_started": stats["started"],
        "upstream_completed": stats["completed"],
        "upstream_disconnected": stats["disconnected"],
        "upstream_active_after": stats["active"],
        "proxy_rss_mib_end": round(rss_bytes(pid) / 2**20, 1),
    }
    if rss:
        warm = [b for t, b in rss if t >= 60] or [b for _, b in rss]
        out["rss_mib_after_warmup"] = round(warm[0] / 2**20, 1)
        out["rss_mib_max"] = round(max(warm) / 2**20, 1)
        out["rss_change_pct"] = round(100 * (warm[-1] - warm[0]) / warm[0], 1)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("scenario", choices=["concurrent", "chaos", "soak"])
    ap.add_argument("--streams", type=int, default=1000)
    ap.add_argument("--conc", type=int, default=250)
    ap.add_argument("--minutes", type=float, default=30)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--mode", default="enforce")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()

    import resource

    # 1,000 streams are 2,000+ sockets in the proxy: raise the limit its process inherits.
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, min(hard, 65536)), hard))
    up_port, proxy_port = free_port(), free_port()
    text = ROOT / "tests" / "data" / "corpus.jsonl"
    upstream = subprocess.Popen(
        [sys.executable, str(ROOT / "bench" / "kit" / "fake_upstream.py"), "--port", str(up_port),
         "--text-file", str(text), "--model", "fake"],
        stdout=subprocess.DEVNULL,
    )  # fmt: skip
    env = {
        **os.environ,
        "GUARD_UPSTREAM_URL": f"http://127.0.0.1:{up_port}",
        "GUARD_MODE": args.mode,
        "GUARD_UPSTREAM_METRICS_INTERVAL": "0",
    }
    proxy = subprocess.Popen(
        [sys.executable, "-m", "proxy", "serve", "--host", "127.0.0.1", "--port", str(proxy_port)],
        cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        wait_ready(f"http://127.0.0.1:{up_port}/health", upstream)
        wait_ready(f"http://127.0.0.1:{proxy_port}/health", proxy)
        result = asyncio.run(scenario(args, proxy_port, up_port, proxy.pid))
    finally:
        for p in (proxy, upstream):
            p.send_signal(signal.SIGTERM)
            try:
                p.wait(10)
            except subprocess.TimeoutExpired:
                p.kill()
    if args.json:
        print(json.dumps(result))
    else:
        for k, v in result.items():
            print(f"{k:28} {v}")


if __name__ == "__main__":
    main()
