"""CPU per SSE event inside the guard itself, with no sockets and no event loop.

The relay benchmark (``bench_relay.py``, the shared kit) measures the whole proxy process; this
one isolates what :class:`proxy.core.guard.StreamGuard` and the detector cost per event, so the
share of the event-loop wake-up, the upstream read and the client write can be told apart from the
guard's own work. N guards are fed round-robin, one upstream read per event (as when every token
arrives alone), from real healthy texts in vLLM's wire format (``tests/fakes/vllm.py`` builds the
events, with the continuous usage the proxy asks for in ``enforce``).

Variants, per event:

* ``passthrough`` — what ``GUARD_MODE=off`` does per event in the app: hand the bytes on.
* ``parse`` — the StreamGuard with a detector that does nothing: SSE split, ``orjson.loads``,
  usage stripping, bookkeeping.
* ``enforce`` — the real thing, the detector included.
* ``enforce-batched`` — the same work with each stream's events fed back to back (all streams'
  state hot in cache), to tell cache effects of interleaving from the work itself.
* ``enforce-logprobs`` — ``enforce`` on the events vLLM writes for GUARD_REQUEST_LOGPROBS
  (``logprobs: true, top_logprobs: 0``: one ``{"token", "logprob", "bytes", "top_logprobs"}``
  entry per chunk), fed to the detector and written ``null`` for the client.

Per stream, separately: construction of the guard and its detector, and the end of the stream
(``records()``: the detector's ``finish()``).

    python bench/measure/relay/bench_guard_events.py                        # N = 32 and 256
    python bench/measure/relay/bench_guard_events.py --streams 256 --profile   # cProfile of enforce
"""

from __future__ import annotations

import argparse
import cProfile
import gc
import json
import pstats
import sys
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT))

from bench.measure.relay.null_detector import NullDetector  # noqa: E402
from proxy.core.guard import GuardPolicy, StreamGuard  # noqa: E402
from proxy.core.records import GenerationRecord  # noqa: E402
from proxy.detect import Detector, DetectorConfig  # noqa: E402
from proxy.observability.metrics import Metrics  # noqa: E402
from tests.fakes.vllm import FakeVLLM, Script, tokenize  # noqa: E402

MAX_TOKENS = 128
_REQ = {"stream_options": {"include_usage": True, "continuous_usage_stats": True}}


def load_texts(path: Path, limit: int) -> list[str]:
    texts = []
    with path.open(encoding="utf-8") as fh:
        for line in fh:
            row = json.loads(line)
            text = row.get("text") or ""
            if row.get("label") == "healthy" and len(tokenize(text)) >= MAX_TOKENS and passes(text):
                texts.append(row["text"])
                if len(texts) >= limit:
                    break
    if not texts:
        raise SystemExit(f"no healthy text of {MAX_TOKENS}+ tokens in {path}")
    return texts


def passes(text: str) -> bool:
    """Whether the detector lets the (cut) text through, so every stream runs to its end."""
    det = Detector(DetectorConfig())
    pieces = tokenize(text)[:MAX_TOKENS]
    return all(det.feed(p) is None for p in pieces) and det.finish().verdict is None


def stream_events(text: str) -> list[bytes]:
    """One stream's upstream events as vLLM writes them, cut at max_tokens like the kit's."""
    cut = "".join(tokenize(text)[:MAX_TOKENS])
    events = FakeVLLM()._events(_REQ, True, Script(texts=[cut], finish_reason="length"))
    return [e for e in events if e is not None]


def with_logprobs(events: list[bytes]) -> list[bytes]:
    """``events`` as vLLM writes them when asked for the chosen token's logprob only."""
    out = []
    for i, event in enumerate(events):
        chunk = json.loads(event[6:]) if event.startswith(b"data: {") else None
        choices = chunk.get("choices") if chunk else None
        if not choices or b'"logprobs":null' not in event:
            out.append(event)
            continue
        token = choices[0].get("delta", {}).get("content") or ""
        entry = {
            "token": token,
            "logprob": -(i % 7) * 0.3141592653589793,
            "bytes": list(token.encode()),
            "top_logprobs": [],
        }
        lp = b'"logprobs":' + json.dumps({"content": [entry]}, separators=(",", ":")).encode()
        out.append(event.replace(b'"logprobs":null', lp, 1))
    return out


def make_guard(make_detector: Callable[[], Detector], logprobs: bool = False) -> StreamGuard:
    # What the app builds for a streaming chat request in enforce mode whose client did not ask
    # for usage: the injected per-chunk and final usage are stripped (and the logprobs, when
    # the proxy asked for them).
    policy = GuardPolicy.create(
        mode="enforce",
        strip_chunk_usage=True,
        strip_final_usage=True,
        client_wants_usage=False,
        strip_logprobs=logprobs,
    )
    return StreamGuard(policy, make_detector)


def run_interleaved(
    streams: list[list[bytes]], variant: str, metrics: Metrics | None = None
) -> tuple[float, int, tuple[float, float]]:
    """Seconds spent feeding events, the event count and the seconds spent ending the streams:
    ``records()`` (the detector's ``finish()``) and the metrics the app records."""
    n = len(streams)
    if variant == "passthrough":
        sink: list[bytes] = []
        t0 = time.process_time()
        for step in range(max(map(len, streams))):
            for events in streams:
                if step < len(events):
                    sink.append(events[step])
            sink.clear()
        return time.process_time() - t0, sum(map(len, streams)), (0.0, 0.0)
    config = DetectorConfig()

    def real() -> Detector:
        return Detector(config)

    lp = variant == "enforce-logprobs"
    if lp:
        streams = [with_logprobs(events) for events in streams]
    guards = [make_guard(NullDetector if variant == "parse" else real, lp) for _ in range(n)]
    count = 0
    t0 = time.process_time()
    if variant == "enforce-batched":
        for guard, events in zip(guards, streams, strict=True):
            for ev in events:
                guard.feed(ev)
            count += len(events)
    else:
        for step in range(max(map(len, streams))):
            for guard, events in zip(guards, streams, strict=True):
                if step < len(events):
                    guard.feed(events[step])
                    count += 1
    elapsed = time.process_time() - t0
    for guard in guards:
        assert guard.saw_done and not guard.aborted, "every stream must run to [DONE]"
    t1 = time.process_time()
    records = [guard.records(MAX_TOKENS) for guard in guards]
    t2 = time.process_time()
    if metrics is not None:
        for guard, choices in zip(guards, records, strict=True):
            record = GenerationRecord("bench", "chat", guard.outcome(), choices)
            metrics.record_generation(record)
            metrics.request_finished("/v1/chat/completions", 200, 1.0)
    return elapsed, count, (t2 - t1, time.process_time() - t2)


def run_setup(n: int, rounds: int) -> float:
    """µs per stream for building the guard and its detector (on the first choice)."""
    config = DetectorConfig()
    role = stream_events("Hello.")[0]
    setup = 0.0
    for _ in range(rounds):
        t0 = time.process_time()
        guards = [make_guard(lambda: Detector(config)) for _ in range(n)]
        for g in guards:
            g.feed(role)
        setup += time.process_time() - t0
    return setup / (n * rounds) * 1e6


def run_cold(streams: list[list[bytes]], variant: str, limit: int, evict: int) -> float:
    """µs per event when the caches are cold, as between two reads of a real proxy: ``evict``
    bytes are copied between events (not timed) and each ``feed`` is timed on its own."""
    config = DetectorConfig()
    lp = variant == "enforce-logprobs"
    if lp:
        streams = [with_logprobs(events) for events in streams]
    guards = [
        make_guard(NullDetector if variant == "parse" else lambda: Detector(config), lp)
        for _ in streams
    ]
    junk = bytearray(evict)
    total = count = 0
    clock = time.perf_counter_ns
    for step in range(max(map(len, streams))):
        for guard, events in zip(guards, streams, strict=True):
            if step < len(events):
                bytes(junk)  # pushes code and data out of L1/L2 (and much of L3)
                t0 = clock()
                guard.feed(events[step])
                total += clock() - t0
                count += 1
                if count >= limit:
                    return total / count / 1e3
    return total / count / 1e3


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    shared = ROOT.parent / "shared/corpus/dev.jsonl"
    default = shared if shared.exists() else ROOT / "tests/data/corpus.jsonl"
    ap.add_argument("--corpus", type=Path, default=default, help="JSONL with label/text rows")
    ap.add_argument("--streams", default="32,256", help="comma-separated stream counts")
    ap.add_argument("--repeat", type=int, default=3, help="best of this many runs")
    ap.add_argument(
        "--cold", type=int, default=0, help="also time this many events with cold caches"
    )
    ap.add_argument("--evict-mib", type=int, default=8, help="bytes copied between cold events")
    ap.add_argument("--profile", action="store_true", help="cProfile the enforce variant")
    args = ap.parse_args()
    texts = load_texts(args.corpus, 512)
    variants = ("passthrough", "parse", "enforce", "enforce-batched", "enforce-logprobs")
    run_interleaved([stream_events(texts[0])] * 4, "enforce")  # load fastText once
    print(f"{len(texts)} healthy texts, {MAX_TOKENS} tokens per stream; best of {args.repeat}")
    print(f"{'N':>4} {'variant':<16} {'µs/event':>9}")
    for n in (int(x) for x in args.streams.split(",")):
        streams = [stream_events(texts[i % len(texts)]) for i in range(n)]
        finish = record = float("inf")
        for variant in variants:
            best = float("inf")
            for _ in range(args.repeat):
                gc.collect()
                metrics = Metrics() if variant == "enforce" else None
                elapsed, count, ended = run_interleaved(streams, variant, metrics)
                best = min(best, elapsed / count * 1e6)
                if metrics is not None:
                    finish = min(finish, ended[0] / n * 1e6)
                    record = min(record, ended[1] / n * 1e6)
            print(f"{n:>4} {variant:<16} {best:9.2f}")
        if args.cold:
            for variant in ("parse", "enforce", "enforce-logprobs"):
                cold = run_cold(streams, variant, args.cold, args.evict_mib << 20)
                print(f"{n:>4} {variant + '-cold':<16} {cold:9.2f}")
        setup = run_setup(n, args.repeat)
        events = sum(map(len, streams)) / n
        print(
            f"{n:>4} per stream: set-up {setup:.1f} µs, finish {finish:.1f} µs, metrics "
            f"{record:.1f} µs = {(setup + finish + record) / events:.2f} µs per event "
            f"over {events:.0f} events"
        )
        if args.profile:
            prof = cProfile.Profile()
            prof.enable()
            run_interleaved(streams, "enforce")
            prof.disable()
            pstats.Stats(prof).sort_stats("tottime").print_stats(18)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
