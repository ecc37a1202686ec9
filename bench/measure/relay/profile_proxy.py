"""The whole proxy on a fixed load, in one process: where its time goes, or how many instructions.

Starts the kit's fake engine (``bench/kit/fake_upstream.py``, real healthy text, continuous usage
when asked) as a child, runs the proxy's own served app (``coherence-guard serve``'s factory, on
uvloop and httptools) in this process, and once it is up runs the kit's load generator
(``bench/kit/loadgen.py``) as a child for a fixed number of streams. Only the load is measured:
start-up and shut-down are left out.

* ``--profile`` — cProfile of the event-loop thread during the load, by own time (``-o FILE``
  keeps the stats).
* ``--callgrind`` — instruction counts of the load alone (run under ``valgrind --tool=callgrind
  --collect-atstart=no``; see ``bench/measure/relay/relay_work.py``): instructions do not move
  with the machine's load, so before/after comparisons hold on a busy machine. Two stream lengths
  split the count into a part per request and a part per chunk.

    valgrind --tool=callgrind --collect-atstart=no --callgrind-out-file=/dev/null \\
        "$(python -c 'import sys;print(sys.executable)')" \\
        bench/measure/relay/profile_proxy.py --callgrind \\
        --streams 40 --max-tokens 128 2>&1 | grep -E 'Collected|streams'

Settings come from the environment as for ``coherence-guard serve`` (``GUARD_MODE`` ...); the
upstream URL is set here.
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import json
import os
import pstats
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench.measure.relay.relay_work import callgrind_toggle  # noqa: E402

KIT = ROOT / "bench" / "kit"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


async def wait_up(port: int, path: bytes) -> None:
    for _ in range(36000):  # an hour: under valgrind on a busy machine start-up is slow
        try:
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(b"GET " + path + b" HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n")
            await writer.drain()
            line = await reader.readline()
            writer.close()
            if b" 200 " in line:
                return
        except OSError:
            pass
        await asyncio.sleep(0.1)
    raise SystemExit(f"nothing answers on port {port}")


async def main_async(args: argparse.Namespace, fake: subprocess.Popen[bytes]) -> None:
    import uvicorn

    up_port, port = args.up_port, free_port()
    os.environ["GUARD_UPSTREAM_URL"] = f"http://127.0.0.1:{up_port}"
    os.environ.setdefault("GUARD_UPSTREAM_METRICS_INTERVAL", "0")
    from proxy.cli.serve import create_served_app

    config = uvicorn.Config(
        create_served_app, factory=True, host="127.0.0.1", port=port, loop="none",
        http="httptools", log_level="warning", access_log=False,
    )  # fmt: skip
    server = uvicorn.Server(config)
    serving = asyncio.create_task(server.serve())
    toggle = callgrind_toggle() if args.callgrind else (lambda: None)
    report = Path(tempfile.mkdtemp()) / "load.json"
    try:
        await wait_up(up_port, b"/health")
        await wait_up(port, b"/health")
        load = [
            sys.executable, str(KIT / "loadgen.py"), "--url", f"http://127.0.0.1:{port}/v1",
            "-c", str(args.conc), "-d", "3600", "-w", "0", "--stagger", "0",
            "--max-tokens", str(args.max_tokens), "--max-streams", str(args.streams),
            "--endpoint", args.endpoint, "-o", str(report),
        ]  # fmt: skip
        prof = cProfile.Profile() if args.profile else None
        toggle()
        if prof is not None:
            prof.enable()
        child = await asyncio.create_subprocess_exec(*load, stdout=subprocess.DEVNULL)
        await child.wait()
        if prof is not None:
            prof.disable()
        toggle()
        result = json.loads(report.read_text())
        print(
            f"{args.streams} streams of {args.max_tokens} tokens at {args.delay_ms} ms, "
            f"c={args.conc}: {result.get('chunks_total')} chunks, errors {result.get('errors')}"
        )
        if prof is not None:
            stats = pstats.Stats(prof)
            if args.output:
                stats.dump_stats(args.output)
            stats.sort_stats("tottime").print_stats(args.top)
    finally:
        server.should_exit = True
        await serving
        fake.terminate()
        fake.wait()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--streams", type=int, default=200)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--conc", type=int, default=8)
    ap.add_argument("--delay-ms", type=float, default=0.0)
    ap.add_argument("--endpoint", choices=["chat", "completions"], default="chat")
    ap.add_argument("--text", type=Path, default=ROOT / "tests" / "data" / "corpus.jsonl")
    ap.add_argument("--profile", action="store_true")
    ap.add_argument("--callgrind", action="store_true")
    ap.add_argument("--top", type=int, default=50)
    ap.add_argument("-o", "--output", default="")
    args = ap.parse_args()
    import uvloop

    args.up_port = free_port()
    fake = subprocess.Popen(
        [sys.executable, str(KIT / "fake_upstream.py"), "--port", str(args.up_port),
         "--delay-ms", str(args.delay_ms), "--text-file", str(args.text)],
        stdout=subprocess.DEVNULL,
    )  # fmt: skip
    uvloop.run(main_async(args, fake))


if __name__ == "__main__":
    main()
