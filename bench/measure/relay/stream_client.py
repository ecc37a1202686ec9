"""Two small chat-stream clients for one-off measurements beside the kit's load generator.

``ttft`` sends N streamed requests one after another (after 20 unmeasured ones) and prints the
median, p10 and p90 time to the first content token: the latency a relay adds, unloaded.
``load`` opens N streams at once and counts their events: a fixed amount of work to watch with
``strace -c`` or ``/proc`` while it runs.

    URL=http://127.0.0.1:8080/v1/chat/completions
    python bench/measure/relay/stream_client.py ttft $URL 300 --label after
    python bench/measure/relay/stream_client.py load $URL 32
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time

import httpx

PROMPT = [{"role": "user", "content": "Tell me a story about a cat."}]
WARM_UP = 20


async def _ttft(client: httpx.AsyncClient, url: str) -> float:
    body = {"model": "m", "messages": PROMPT, "max_tokens": 4, "stream": True}
    start = time.perf_counter()
    first: float | None = None
    async with client.stream("POST", url, json=body) as resp:
        async for line in resp.aiter_lines():
            if first is None and '"content":"' in line and '"content":""' not in line:
                first = time.perf_counter() - start
    if first is None:
        raise SystemExit("a stream ended without content")
    return first * 1e3


async def ttft(url: str, n: int, label: str) -> None:
    async with httpx.AsyncClient(timeout=60) as client:
        times = [await _ttft(client, url) for _ in range(n + WARM_UP)][WARM_UP:]
    times.sort()
    print(
        f"{label}: median {statistics.median(times):.3f} ms "
        f"p10 {times[len(times) // 10]:.3f} p90 {times[9 * len(times) // 10]:.3f}"
    )


async def _events(client: httpx.AsyncClient, url: str, tokens: int) -> int:
    body = {"model": "m", "messages": PROMPT, "max_tokens": tokens, "stream": True}
    count = 0
    async with client.stream("POST", url, json=body) as resp:
        async for line in resp.aiter_lines():
            count += line.startswith("data:")
    return count


async def load(url: str, n: int, tokens: int) -> None:
    limits = httpx.Limits(max_connections=n)
    async with httpx.AsyncClient(timeout=60, limits=limits) as client:
        counts = await asyncio.gather(*[_events(client, url, tokens) for _ in range(n)])
    print(f"events {sum(counts)}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("what", choices=["ttft", "load"])
    ap.add_argument("url", help="the chat completions URL")
    ap.add_argument("n", type=int, help="requests (ttft) or concurrent streams (load)")
    ap.add_argument("--label", default="target")
    ap.add_argument("--max-tokens", type=int, default=128, help="tokens per stream (load)")
    args = ap.parse_args()
    if args.what == "ttft":
        asyncio.run(ttft(args.url, args.n, args.label))
    else:
        asyncio.run(load(args.url, args.n, args.max_tokens))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
