"""A fixed amount of the relay's per-event and per-stream work, in-process, for instruction counts.

Wall-clock and CPU-time figures move with the machine's load; the number of instructions a fixed
piece of work executes does not. This script does a fixed piece of work — N healthy streams of
the kit's real text (128 tokens), on chat, completions, Responses and Messages, each event fed to
its own :class:`~proxy.core.guard.StreamGuard` as one upstream read, round-robin across the
streams as when every token arrives alone — so that ``valgrind --tool=callgrind`` can count it.
Chat and completions carry vLLM's continuous usage (what the proxy asks for), stripped for a
client that did not ask; every stream is built, fed, ended (``records()``) and recorded in the
metrics, as the app does per request.

Instructions for the work alone (``--callgrind`` builds a two-line C helper with the system's
``gcc`` and ``valgrind/callgrind.h`` and switches callgrind's counting on around the work only,
so imports, start-up and building the events are left out):

    valgrind --tool=callgrind --collect-atstart=no --callgrind-out-file=/dev/null \\
        "$(python -c 'import sys;print(sys.executable)')" \\
        bench/measure/relay/relay_work.py --callgrind \\
        --surface chat --detector null 2>&1 | grep -E 'Collected|event'

(the real interpreter, not a shell shim, or valgrind counts the shim).

``--profile`` prints a cProfile of one repetition instead (where the time goes).
"""

from __future__ import annotations

import argparse
import cProfile
import ctypes
import gc
import pstats
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
#: ``--installed``: the proxy installed in this environment (a compiled wheel, see
#: ``bench/measure/relay/compiled_work.sh``) rather than this checkout's sources; the checkout
#: still gives ``bench`` and ``tests``.
INSTALLED = "--installed" in sys.argv
if INSTALLED:
    sys.path.append(str(ROOT))
elif str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench.measure.relay.bench_surfaces import healthy_texts  # noqa: E402
from bench.measure.relay.mypyc.modules import MODULES, compiled_count  # noqa: E402
from bench.measure.relay.null_detector import NullDetector  # noqa: E402
from proxy.core.guard import GuardPolicy, StreamGuard  # noqa: E402
from proxy.core.records import Endpoint, GenerationRecord  # noqa: E402
from proxy.detect import Detector, DetectorConfig  # noqa: E402
from proxy.observability.metrics import Metrics  # noqa: E402
from tests.fakes.vllm import FakeVLLM, Script, messages_events, responses_events  # noqa: E402

SURFACES: tuple[Endpoint, ...] = ("chat", "completions", "responses", "messages")
#: What the proxy asks a vLLM engine for on chat and completions (proxy.core.rewrite).
USAGE = {"include_usage": True, "continuous_usage_stats": True}


def events_for(surface: Endpoint, text: str, *, usage: bool = True) -> list[bytes]:
    """One stream's upstream events on ``surface``, as vLLM writes them."""
    script = Script(texts=[text], finish_reason="length")
    req: dict[str, object] = {"model": "m", "stream": True, "max_tokens": 4096}
    if surface in ("chat", "completions"):
        if usage:
            req["stream_options"] = USAGE
        raw = FakeVLLM()._events(req, surface == "chat", script)
    elif surface == "responses":
        raw = responses_events(req, script)
    else:
        raw = messages_events(req, script)
    return [e for e in raw if e is not None]


def policy_for(surface: Endpoint, *, usage: bool = True) -> GuardPolicy:
    """The app's policy for a streaming ``enforce`` request whose client asked for no usage."""
    injected = usage and surface in ("chat", "completions")
    return GuardPolicy.create(
        endpoint=surface,
        mode="enforce",
        strip_chunk_usage=injected,
        strip_final_usage=injected,
        client_wants_usage=False,
        usage_null=surface == "completions",
    )


def run_once(
    surface: Endpoint,
    streams: list[list[bytes]],
    make: Callable[[], Detector],
    metrics: Metrics,
    *,
    usage: bool = True,
    per_read: int = 1,
) -> int:
    """Build, feed, end and record one guard per stream; the bytes the clients got.
    ``per_read`` events go in one upstream read (the engine ran ahead of the relay)."""
    policy = policy_for(surface, usage=usage)
    if per_read > 1:
        streams = [
            [b"".join(e[i : i + per_read]) for i in range(0, len(e), per_read)] for e in streams
        ]
    guards = [StreamGuard(policy, make) for _ in streams]
    sent = 0
    for step in range(max(map(len, streams))):
        for guard, events in zip(guards, streams, strict=True):
            if step < len(events):
                sent += len(guard.feed(events[step]))
    for guard in guards:
        assert not guard.aborted, "a healthy stream was aborted"
        metrics.record_generation(
            GenerationRecord("m", surface, guard.outcome(), guard.records(None))
        )
        metrics.request_finished("/v1/chat/completions", 200, 0.5)
    return sent


_TOGGLE_C = b"""#include <valgrind/callgrind.h>
void cg_toggle(void) { CALLGRIND_TOGGLE_COLLECT; }
"""


def callgrind_toggle() -> Callable[[], None]:
    """A function that switches callgrind's counting on or off (a no-op outside valgrind)."""
    tmp = Path(tempfile.mkdtemp())
    (tmp / "t.c").write_bytes(_TOGGLE_C)
    subprocess.run(["gcc", "-O2", "-shared", "-fPIC", "-o", tmp / "t.so", tmp / "t.c"], check=True)
    toggle: Callable[[], None] = ctypes.CDLL(str(tmp / "t.so")).cg_toggle
    return toggle


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--streams", type=int, default=32)
    ap.add_argument("--reps", type=int, default=1)
    ap.add_argument("--surface", choices=[*SURFACES, "all"], default="all")
    ap.add_argument("--detector", choices=["null", "real"], default="real")
    ap.add_argument("--no-usage", action="store_true", help="chat/completions without usage")
    ap.add_argument("--per-read", type=int, default=1, help="events per upstream read")
    ap.add_argument("--corpus", type=Path, default=ROOT / "tests" / "data" / "corpus.jsonl")
    ap.add_argument("--profile", action="store_true")
    ap.add_argument("--callgrind", action="store_true", help="count only the work (see above)")
    ap.add_argument("--installed", action="store_true", help="the installed proxy (see above)")
    ap.add_argument(
        "--expected",
        help="the detector's expected language (an English prompt expects en: the proxy's usual "
        "case since the conversation's own language is expected)",
    )
    args = ap.parse_args()
    toggle = callgrind_toggle() if args.callgrind else (lambda: None)
    texts = healthy_texts(args.corpus, min(64, args.streams))
    config = DetectorConfig()
    if args.expected:
        # The word list of the expected language, which the server loads beside serving at
        # start-up (proxy.server.preload): not part of any request's work.
        from proxy.detect.salad import lexicon

        lexicon(args.expected)
    make: Callable[[], Detector] = (
        NullDetector
        if args.detector == "null"
        else (lambda: Detector(config, expected_language=args.expected))
    )
    metrics = Metrics()
    usage = not args.no_usage
    surfaces = SURFACES if args.surface == "all" else (args.surface,)
    work = {
        s: [events_for(s, texts[i % len(texts)], usage=usage) for i in range(args.streams)]
        for s in surfaces
    }
    events = sum(len(e) for streams in work.values() for e in streams)
    gc.collect()
    prof = cProfile.Profile() if args.profile else None
    toggle()
    t0 = time.process_time()
    for _ in range(args.reps):
        for surface, streams in work.items():
            if prof is not None:
                prof.enable()
            run_once(surface, streams, make, metrics, usage=usage, per_read=args.per_read)
            if prof is not None:
                prof.disable()
    cpu = time.process_time() - t0
    toggle()
    print(
        f"{','.join(surfaces)} detector={args.detector} streams={args.streams} "
        f"events/rep={events} reps={args.reps}: {cpu / (events * args.reps) * 1e6:.2f} µs/event"
    )
    print(f"compiled modules: {compiled_count()} of {len(MODULES)}")
    if prof is not None:
        pstats.Stats(prof).sort_stats("tottime").print_stats(30)


if __name__ == "__main__":
    main()
