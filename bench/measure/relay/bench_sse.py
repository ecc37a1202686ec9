"""SSE parser cost: one large event fed in small reads (linear vs rescanning), and the usual
one-event-per-read path.

    python bench/measure/relay/bench_sse.py [--sizes 1,4,6] [--read 1024] [--baseline FILE]

``--baseline`` loads another ``sse.py`` (e.g. ``git show <rev>:proxy/core/sse.py >
/tmp/old_sse.py``) and times it on the same input, so the two parsers are compared on the same
machine.
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
import time
from typing import Any

from proxy.core.sse import SSEParser


def big_event(mib: int, read: int, parser: Any) -> float:
    event = b"data: " + b"x" * ((mib << 20) - 8) + b"\n\n"
    started = time.perf_counter()
    for i in range(0, len(event), read):
        parser.feed(event[i : i + read])
    return time.perf_counter() - started


def small_events(parser_cls: Any, per_read: int = 1, n: int = 200_000) -> float:
    """µs per event, ``per_read`` vLLM-sized events per read (cut mid-event when > 1)."""
    event = b'data: {"id":"c","choices":[{"index":0,"delta":{"content":" word"}}]}\n\n'
    stream = event * per_read
    reads = [stream] if per_read == 1 else [stream[:-7], stream[-7:]]
    parser = parser_cls()
    started = time.perf_counter()
    for _ in range(n // per_read):
        for read in reads:
            parser.feed(read)
    return (time.perf_counter() - started) / n * 1e6


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--sizes", default="1,4,6", help="event sizes, MiB")
    ap.add_argument("--read", type=int, default=1024, help="bytes per read")
    ap.add_argument("--baseline", help="path of another sse.py to time alongside")
    args = ap.parse_args()
    parsers: list[tuple[str, Any]] = [("current", SSEParser)]
    if args.baseline:
        spec = importlib.util.spec_from_file_location("baseline_sse", args.baseline)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules["baseline_sse"] = module  # dataclasses look their module up
        spec.loader.exec_module(module)
        parsers.append(("baseline", module.SSEParser))
    for name, cls in parsers:
        for per_read in (1, 8):
            cost = small_events(cls, per_read)
            print(f"{name}: {per_read} small event(s) per read: {cost:.2f} µs/event")
        for mib in (int(s) for s in args.sizes.split(",")):
            try:
                parser = cls(max_event_bytes=(mib << 20) + 1)
            except TypeError:
                parser = cls()
            seconds = big_event(mib, args.read, parser)
            print(f"{name}: {mib} MiB event in {args.read}-byte reads: {seconds:.3f} s")


if __name__ == "__main__":
    main()
