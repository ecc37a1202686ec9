"""Whole guarded requests in-process, split into what each costs before, during and after events.

``bench/measure/relay/relay_work.py`` counts the guard's work on each event; what a request costs
besides — reading and rewriting the body, identifying the prompt's language, building the guard and
its detector, the response head, the end of the stream, the records, the metrics and the log set-up
— is paid once per request, whatever the stream's length, and weighs most on short answers. This
script runs that whole path: the real app (``create_app``, every middleware) behind uvicorn's own
HTTP protocol (httptools, the real ``send``, so the relay writes straight onto the transport as it
does when served), and the proxy's own upstream client, whose connection is fed a fake engine's
bytes (the head, then each SSE event as its own read, vLLM's continuous usage in every chat chunk,
the chunked terminator). Only the two sockets are replaced by in-memory transports: their system
calls and the event loop's polling are left out, as they are the same for every request. Requests
run one after another on one kept-alive client connection and one pooled engine connection, as a
benchmark's client and the proxy's pool do.

Each request is split into phases:

* ``setup`` — from the request's bytes to the proxy waiting for the first event: uvicorn's
  parse, the middleware, the body read and rewritten, the upstream request written, the engine's
  response head, the guard and its policy, the client's response head;
* ``first`` — the first event, where the guard builds the block and its detector (a fixed cost
  of every request paid on its first event);
* ``events`` — every later event of the stream, [DONE] included (the per-event work, which
  ``relay_work.py`` measures without the server around it);
* ``end`` — from the end of the engine's body to the endpoint's return: the terminating chunk,
  the guard's end of stream (the detector's last check), the records, metrics and log lines;
* ``after`` — what uvicorn and the event loop do once the endpoint has returned (the response's
  end, the keep-alive timer), until the next request.

Instructions (valgrind's callgrind; they do not move with the machine's load). ``--callgrind``
runs itself under valgrind, dumps the counts at every change of phase and prints instructions
per request for each (start-up and the warm-up requests left out):

    python bench/measure/relay/request_work.py --callgrind --surface chat
    python bench/measure/relay/request_work.py --callgrind --surface responses

Every request asks with the same prompt (as the kit's load generator does), so texts the proxy
reads once per distinct text (``proxy.core.requested_language.TextMemo``) are read once; with
``--distinct-prompts`` every request has a prompt of its own, as a chat service's users do.
Without ``--callgrind`` it prints CPU µs per request per phase (noisy on a busy machine);
``--profile PHASE`` prints a cProfile of that phase over all requests.
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import ctypes
import gc
import hashlib
import json
import os
import pstats
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson

ROOT = Path(__file__).resolve().parents[3]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench.measure.relay.bench_surfaces import healthy_texts  # noqa: E402
from bench.measure.relay.relay_work import events_for  # noqa: E402
from proxy.core.records import Endpoint  # noqa: E402

PHASES = ("setup", "first", "events", "end", "after")
PATHS = {
    "chat": "/v1/chat/completions",
    "completions": "/v1/completions",
    "responses": "/v1/responses",
    "messages": "/v1/messages",
}
MODEL = "m"  # the model the fake engine's events name
ENGINE_HEAD = (
    b"HTTP/1.1 200 OK\r\ndate: Fri, 27 Nov 2026 12:00:00 GMT\r\nserver: uvicorn\r\n"
    b"content-type: text/event-stream; charset=utf-8\r\ntransfer-encoding: chunked\r\n\r\n"
)


_CALLGRIND_C = b"""#include <valgrind/callgrind.h>
void cg_toggle(void) { CALLGRIND_TOGGLE_COLLECT; }
void cg_dump(const char *s) { CALLGRIND_DUMP_STATS_AT(s); }
"""


def callgrind_dump() -> Callable[[bytes], None]:
    """A function that dumps callgrind's counts so far under a name and zeroes them; it also
    switches counting on at its first call (no-ops outside valgrind)."""
    tmp = Path(tempfile.mkdtemp())
    (tmp / "d.c").write_bytes(_CALLGRIND_C)
    subprocess.run(["gcc", "-O2", "-shared", "-fPIC", "-o", tmp / "d.so", tmp / "d.c"], check=True)
    lib = ctypes.CDLL(str(tmp / "d.so"))
    started = False

    def dump(name: bytes) -> None:
        nonlocal started
        if not started:
            started = True
            lib.cg_toggle()
            return
        lib.cg_dump(ctypes.c_char_p(name))

    return dump


class Meter:
    """Which phase the work is in: CPU time per phase, or (under callgrind) one dump of the
    counts per phase change, named after the phase that ended."""

    def __init__(self, dump: Callable[[bytes], None] | None = None) -> None:
        self.dump = dump
        self.phase: str | None = None
        self.since = 0
        self.ns = dict.fromkeys(PHASES, 0)
        self.profile: cProfile.Profile | None = None
        self.profiled: str | None = None
        #: Off during the warm-up requests: phase changes are ignored.
        self.measuring = False

    def enter(self, phase: str | None) -> None:
        if not self.measuring:
            return
        now = time.process_time_ns()
        ended = self.phase
        if ended is not None:
            self.ns[ended] += now - self.since
        if self.dump is not None:
            self.dump(str(ended).encode())
        if self.profile is not None:
            if ended == self.profiled:
                self.profile.disable()
            if phase == self.profiled:
                self.profile.enable()
        self.phase = phase
        self.since = time.process_time_ns()


class MemoryTransport(asyncio.Transport):
    """A socket that is never written to the kernel: what is written is handed to ``sink``."""

    def __init__(self, sink: Callable[[bytes], None]) -> None:
        super().__init__()
        self.sink = sink
        self.closing = False

    def write(self, data: bytes | bytearray | memoryview) -> None:
        self.sink(bytes(data))

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return {"sockname": ("127.0.0.1", 8000), "peername": ("127.0.0.1", 50000)}.get(
            name, default
        )

    def is_closing(self) -> bool:
        return self.closing

    def close(self) -> None:
        self.closing = True

    def abort(self) -> None:
        self.closing = True

    def get_write_buffer_size(self) -> int:
        return 0

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass

    def is_reading(self) -> bool:
        return True


class Engine:
    """The engine's side of the pooled connection: each time the proxy waits for bytes, the next
    piece of the response arrives (from the event loop, as a socket read would)."""

    def __init__(self, meter: Meter) -> None:
        self.meter = meter
        self.pieces: list[bytes] = []
        self.next = 0
        self.conn: Any = None
        self.scheduled = False

    def answer(self, events: list[bytes]) -> None:
        """What the engine answers the next request: the head, each event, the terminator."""
        self.pieces = [ENGINE_HEAD, *(b"%x\r\n%b\r\n" % (len(e), e) for e in events), b"0\r\n\r\n"]
        self.next = 0

    def connect(self, loop: asyncio.AbstractEventLoop) -> Any:
        from proxy.server.upstream_protocol import Connection

        conn = self.conn = Connection(loop)
        conn.connection_made(MemoryTransport(lambda data: None))
        wait = conn.wait

        async def waited(limit: float) -> None:
            self._schedule(loop)
            await wait(limit)

        conn.wait = waited  # type: ignore[method-assign]
        return conn

    def _schedule(self, loop: asyncio.AbstractEventLoop) -> None:
        if not self.scheduled and self.next < len(self.pieces):
            self.scheduled = True
            loop.call_soon(self._deliver, loop)

    def _deliver(self, loop: asyncio.AbstractEventLoop) -> None:
        self.scheduled = False
        i = self.next
        self.next += 1
        if i == 1:
            self.meter.enter("first")
        self.conn.data_received(self.pieces[i])  # the relay reads it from this callback
        if i == 1:
            self.meter.enter("events")
        if i == len(self.pieces) - 2:  # the last event ([DONE]) was handed over
            self.meter.enter("end")
        if self.conn.on_data is not None:  # the relay reads from the callback: no wait
            self._schedule(loop)


def request_bytes(surface: Endpoint, prompt: str, max_tokens: int) -> bytes:
    """A streaming request as the kit's load generator writes it."""
    body: dict[str, Any] = {"model": MODEL, "stream": True, "temperature": 0}
    if surface == "chat":
        body["messages"] = [{"role": "user", "content": prompt}]
        body["max_tokens"] = max_tokens
    elif surface == "completions":
        body["prompt"] = prompt
        body["max_tokens"] = max_tokens
    elif surface == "responses":
        body["input"] = prompt
        body["max_output_tokens"] = max_tokens
    else:
        body["messages"] = [{"role": "user", "content": prompt}]
        body["max_tokens"] = max_tokens
    raw = orjson.dumps(body)
    head = (
        f"POST {PATHS[surface]} HTTP/1.1\r\nhost: 127.0.0.1:8000\r\n"
        "content-type: application/json\r\naccept: text/event-stream\r\n"
        f"authorization: Bearer x\r\ncontent-length: {len(raw)}\r\n\r\n"
    )
    return head.encode() + raw


async def serve(args: argparse.Namespace, meter: Meter) -> tuple[int, str]:
    """Run the requests; returns how many were measured and a digest of the last one's body
    (the same before and after a change that must not change a byte)."""
    import uvicorn
    from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
    from uvicorn.server import ServerState

    from proxy.observability.logs import configure_logging
    from proxy.server.app import create_app
    from proxy.settings import load_settings

    os.environ.setdefault("GUARD_UPSTREAM_URL", "http://127.0.0.1:9")
    os.environ.setdefault("GUARD_UPSTREAM_METRICS_INTERVAL", "0")
    os.environ.setdefault("GUARD_UPSTREAM_CHECK_INTERVAL", "0")
    settings = load_settings()
    configure_logging(settings)
    app = create_app(settings)
    loop = asyncio.get_running_loop()
    engine = Engine(meter)
    app.proxy.fast._connect = lambda: _ready(engine.connect(loop))  # type: ignore[method-assign]
    app.proxy.contexts.update({MODEL: 32768})
    finished: list[asyncio.Future[None]] = []

    async def served(scope: Any, receive: Any, send: Any) -> None:
        try:
            await app(scope, receive, send)
        finally:
            if scope["type"] == "http":
                meter.enter("after")
                finished[0].set_result(None)

    config = uvicorn.Config(served, http="httptools", loop="none", access_log=False, lifespan="off")
    protocol = HttpToolsProtocol(config, ServerState(), {}, loop)
    received: list[bytes] = []
    protocol.connection_made(MemoryTransport(received.append))
    texts = (
        json.loads(args.texts.read_text())
        if args.texts
        else healthy_texts(args.corpus, min(64, args.requests))
    )
    prompts = [
        f"{args.prompt} Chapter {i + 1}." if args.distinct_prompts else args.prompt
        for i in range(args.warmup + args.requests)
    ]
    work = [
        (
            request_bytes(args.surface, prompts[i], args.max_tokens),
            events_for(args.surface, texts[i % len(texts)]),
        )
        for i in range(args.warmup + args.requests)
    ]
    # No lifespan: its warm-up (every word list, minutes under valgrind) is left to the warm-up
    # requests, which load what these requests need and are not counted.
    try:
        for i, (req, events) in enumerate(work):
            measured = i >= args.warmup
            received.clear()
            engine.answer(events)
            finished[:] = [loop.create_future()]
            if measured and i == args.warmup:
                gc.collect()
            meter.measuring = measured
            meter.enter("setup")
            protocol.data_received(req)
            await finished[0]
            await asyncio.sleep(0)  # uvicorn's end of the response, the keep-alive timer
            meter.enter(None)
            tail = b"".join(received)
            if b" 200 OK" not in tail or not tail.endswith(b"0\r\n\r\n"):
                raise SystemExit(f"request {i} did not end well: {tail[:300]!r}")
        protocol.connection_lost(None)
    finally:
        await app.proxy.aclose()
    return args.requests, hashlib.sha256(tail.partition(b"\r\n\r\n")[2]).hexdigest()[:16]


async def _ready(conn: Any) -> Any:
    return conn


def run(args: argparse.Namespace) -> None:
    meter = Meter(callgrind_dump() if args.under_callgrind else None)
    if args.profile:
        meter.profile = cProfile.Profile()
        meter.profiled = args.profile
    import uvloop

    n, digest = uvloop.run(serve(args, meter))
    print(f"{args.surface}: {n} requests, body digest {digest}")
    for phase in PHASES:
        print(f"  {phase:<7} {meter.ns[phase] / n / 1000:9.1f} µs CPU per request")
    print(f"  total   {sum(meter.ns.values()) / n / 1000:9.1f} µs CPU per request")
    if meter.profile is not None:
        pstats.Stats(meter.profile).sort_stats(args.sort).print_stats(args.top)


def callgrind(args: argparse.Namespace) -> dict[str, float]:
    """Runs this script under valgrind and sums its dumps by phase: instructions per request."""
    out = Path(tempfile.mkdtemp())
    texts = healthy_texts(args.corpus, min(64, args.requests))
    (out / "texts.json").write_text(json.dumps(texts))
    cmd = [
        "valgrind", "--tool=callgrind", "--collect-atstart=no",
        f"--callgrind-out-file={out}/cg.out", os.path.realpath(sys.executable), __file__,
        "--under-callgrind", "--surface", args.surface, "--requests", str(args.requests),
        "--warmup", str(args.warmup), "--max-tokens", str(args.max_tokens),
        "--prompt", args.prompt, *(["--distinct-prompts"] if args.distinct_prompts else []),
        "--texts", str(out / "texts.json"),
    ]  # fmt: skip
    env = {**os.environ, "PYTHONHASHSEED": "0"}
    done = subprocess.run(cmd, capture_output=True, text=True, env=env, check=False)
    if done.returncode != 0:
        raise SystemExit(done.stderr[-3000:])
    counts = dict.fromkeys(PHASES, 0.0)
    (out / "texts.json").unlink()
    for path in out.iterdir():
        phase = total = None
        with path.open(encoding="utf-8", errors="replace") as fh:
            for line in fh:
                if line.startswith("desc: Trigger: Client Request: "):
                    phase = line.rsplit(":", 1)[1].strip()
                elif line.startswith(("summary:", "totals:")) and total is None:
                    total = int(line.split()[1])
        path.unlink()
        if phase in counts and total is not None:
            counts[phase] += total / args.requests
    out.rmdir()
    events = (
        sum(len(events_for(args.surface, texts[i % len(texts)])) for i in range(args.requests))
        / args.requests
    )
    for phase in PHASES:
        print(f"{args.surface} {phase:<7} {counts[phase]:12,.0f} instructions per request")
    per_event = counts["events"] / (events - 1)
    fixed = sum(counts.values()) - per_event * events
    print(
        f"{args.surface}: {per_event:,.0f} instructions per event after the first "
        f"({events:.0f} events); {fixed:,.0f} per request besides (all phases less that per event)"
    )
    return counts


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--surface", choices=list(PATHS), default="chat")
    ap.add_argument("--requests", type=int, default=12)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--prompt", default="Write a long story about a proxy.")
    ap.add_argument("--corpus", type=Path, default=ROOT / "tests" / "data" / "corpus.jsonl")
    ap.add_argument("--callgrind", action="store_true", help="instructions per phase (valgrind)")
    ap.add_argument("--under-callgrind", action="store_true", help="(internal) dump per phase")
    ap.add_argument("--texts", type=Path, help="(internal) the streams' texts, as JSON")
    ap.add_argument(
        "--distinct-prompts", action="store_true", help="a prompt of its own for every request"
    )
    ap.add_argument("--profile", choices=PHASES, help="cProfile of one phase")
    ap.add_argument("--top", type=int, default=30)
    ap.add_argument("--sort", default="tottime", help="the profile's order (cumulative, ...)")
    args = ap.parse_args()
    if args.callgrind:
        callgrind(args)
    else:
        run(args)


if __name__ == "__main__":
    main()
