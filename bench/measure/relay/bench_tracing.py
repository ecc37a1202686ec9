"""What OpenTelemetry tracing costs the relay: per chunk with it off and on, per request with it on.

Two measurements:

* **Per chunk** — instructions per SSE event through :class:`proxy.core.guard.StreamGuard` with
  the real detector (``enforce``, a streamed chat answer, continuous usage), counted by
  ``valgrind --tool=callgrind`` (instructions, not seconds: the same on a busy machine). Each tree
  runs twice with a different number of streams, and the difference divided by the difference in
  events is the per-event count, start-up and imports cancelling out. ``--baseline DIR`` counts
  a second checkout (the code before tracing) in the same run; ``traced`` is this tree with a
  verdict hook set on every guard, as the proxy does with traces on (its other hook, the first
  chunk's, is the detector maker's: once per request, none per event).
* **Per request, traces on** — the span work a guarded request adds (its two spans started
  with the client's ``traceparent`` extracted, the engine's headers, the hooks, one verdict,
  attributes and the event at the end), with the SDK's batch processor and its OTLP/HTTP
  exporter sending to a receiver on 127.0.0.1: microseconds of the request's own thread, and
  process CPU including the exporter's thread, per request.

    python bench/measure/relay/bench_tracing.py                               # this tree
    git worktree add /tmp/before <rev>
    python bench/measure/relay/bench_tracing.py --baseline /tmp/before

A benchmark, not a test: figures go to docs/performance.md; nothing asserts on them.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]

#: Run in a child with PYTHONPATH=<tree>: feeds N streams through enforce guards, interleaved.
CHILD = r"""
import json, sys
from pathlib import Path
from proxy.core.guard import GuardPolicy, StreamGuard
from proxy.detect import Detector, DetectorConfig
from tests.fakes.vllm import FakeVLLM, Script, tokenize

n, traced = int(sys.argv[1]), sys.argv[2] == "1"
texts = [json.loads(l)["text"] for l in Path(sys.argv[3]).open() if '"healthy"' in l]
texts = [t for t in texts if len(tokenize(t)) >= 96]
req = {"stream_options": {"include_usage": True, "continuous_usage_stats": True}}
def events(text):
    cut = "".join(tokenize(text)[:96])
    evs = FakeVLLM()._events(req, True, Script(texts=[cut], finish_reason="length"))
    return [e for e in evs if e is not None]
config = DetectorConfig()
policy = GuardPolicy.create(mode="enforce", strip_chunk_usage=True, strip_final_usage=True,
                            client_wants_usage=False)
def guard():
    g = StreamGuard(policy, lambda: Detector(config))
    if traced:
        g.on_verdict = lambda state: None
    return g
warm = guard()
for e in events(texts[0]):
    warm.feed(e)
streams = [events(texts[i % len(texts)]) for i in range(n)]
guards = [guard() for _ in streams]
for step in range(max(map(len, streams))):
    for g, evs in zip(guards, streams):
        if step < len(evs):
            g.feed(evs[step])
assert all(g.saw_done and not g.aborted for g in guards)
print(sum(map(len, streams)))
"""


def instructions(tree: Path, streams: int, traced: bool, corpus: Path) -> tuple[int, int]:
    """(instructions, events) of one child run under callgrind."""
    with tempfile.TemporaryDirectory() as tmp:
        out = subprocess.run(
            [
                "valgrind",
                "--tool=callgrind",
                f"--callgrind-out-file={tmp}/cg.out",
                sys.executable,
                "-c",
                CHILD,
                str(streams),
                "1" if traced else "0",
                str(corpus),
            ],
            # A fixed hash seed: set and dict orders, hence instruction counts, repeat.
            env={**os.environ, "PYTHONPATH": str(tree), "PYTHONHASHSEED": "0"},
            capture_output=True,
            text=True,
            check=True,
        )
    collected = re.search(r"Collected : (\d+)", out.stderr)
    assert collected, out.stderr[-2000:]
    return int(collected.group(1)), int(out.stdout.split()[-1])


def per_event(tree: Path, traced: bool, corpus: Path, small: int, large: int) -> float:
    i1, e1 = instructions(tree, small, traced, corpus)
    i2, e2 = instructions(tree, large, traced, corpus)
    return (i2 - i1) / (e2 - e1)


def per_request(requests: int) -> tuple[float, float]:
    """(µs of CPU in the request's thread, µs of process CPU with the exporter's thread) per
    request."""
    sys.path.insert(0, str(ROOT))
    from proxy.core.guard import GuardPolicy, StreamGuard
    from proxy.core.rewrite import RewritePolicy, rewrite_request
    from proxy.detect import Detector, DetectorConfig
    from proxy.observability.tracing import Tracing
    from tests.fakes.vllm import FakeVLLM, Script
    from tests.otlp_receiver import otlp_receiver

    loop = "Photosynthesis starts with light. " + "I will check the file again. " * 30
    events = [e for e in FakeVLLM()._events({}, True, Script(texts=[loop])) if e is not None]
    config = DetectorConfig()
    headers = {b"traceparent": b"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"}
    body = {
        "model": "bench",
        "messages": [{"role": "user", "content": "Tell me about photosynthesis."}],
        "max_tokens": 1024,
        "temperature": 0.7,
        "top_p": 0.9,
        "stream": True,
    }
    rw = rewrite_request(body, "chat", RewritePolicy())
    with otlp_receiver() as receiver:
        env = {"OTEL_EXPORTER_OTLP_ENDPOINT": receiver.url, "OTEL_BSP_MAX_QUEUE_SIZE": "100000"}
        os.environ.update(env)  # the exporter reads its own variables
        tracing = Tracing.from_env(env=env, upstream_url="http://127.0.0.1:8000")
        assert tracing is not None
        guards = []
        for _ in range(requests):
            guard = StreamGuard(GuardPolicy.create(mode="enforce"), lambda: Detector(config))
            for event in events:
                guard.feed(event)
                if guard.done:
                    break
            assert guard.aborted
            guards.append((guard, guard.records(1024)))  # the app computes these anyway
        spent = 0.0
        cpu0 = time.process_time()
        for guard, choices in guards:
            t0 = time.thread_time()
            trace = tracing.start(
                headers,
                endpoint="chat",
                rw=rw,
                body=body,
                mode="enforce",
                started=time.perf_counter(),
                request_id="bench",
                path="/v1/chat/completions",
                engine="vllm",
            )
            trace.upstream_headers([(b"content-type", b"application/json")])
            trace.watch(guard)
            trace.first_chunk()
            state = guard.choices[0]
            trace.verdict(guard, state)
            trace.end(guard, outcome="aborted", choices=choices, rw=rw, status=200)
            spent += time.thread_time() - t0
        tracing.provider.force_flush()
        cpu = time.process_time() - cpu0
        receiver.wait_for(lambda spans: len(spans) >= 2 * requests, timeout=120)
        tracing.shutdown()
    return spent / requests * 1e6, cpu / requests * 1e6


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--baseline", type=Path, help="a checkout of the code before tracing")
    ap.add_argument("--streams", default="4,20", help="the two stream counts (96 tokens each)")
    ap.add_argument("--requests", type=int, default=2000, help="spans for the per-request cost")
    ap.add_argument("--skip-instructions", action="store_true")
    args = ap.parse_args()
    corpus = ROOT / "tests/data/corpus.jsonl"
    if not args.skip_instructions:
        if shutil.which("valgrind") is None:
            raise SystemExit("valgrind not found: apt-get install valgrind")
        small, large = (int(x) for x in args.streams.split(","))
        rows = []
        if args.baseline is not None:
            rows.append(("before (baseline)", args.baseline, False))
        rows += [("traces off", ROOT, False), ("traces on (hook set)", ROOT, True)]
        print(f"instructions per SSE event, enforce, real detector ({large - small} streams)")
        for name, tree, traced in rows:
            print(f"  {name:<22} {per_event(tree, traced, corpus, small, large):12.0f}", flush=True)
    thread, cpu = per_request(args.requests)
    print(f"traces on, per request: {thread:.1f} µs CPU in the request, {cpu:.1f} µs in all")
    return 0


if __name__ == "__main__":
    sys.exit(main())
