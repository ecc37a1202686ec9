"""Server child processes for the demo and ``calibrate --demo``: start, wait until ready, stop.

The children run in their own session, so Ctrl-C in a terminal reaches the parent only and the
parent stops them in order; :func:`sigterm_as_interrupt` makes SIGTERM (what ``timeout``,
systemd, Kubernetes and CI send) and SIGHUP (the terminal closed) take the same path, so no
engine or guard outlives the command. A parent that cannot run its ``finally`` (SIGKILL, the
OOM killer) is covered on Linux by the kernel: each child is started with
``PR_SET_PDEATHSIG`` = SIGTERM, so it is told to stop when its parent dies, however it dies.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

#: prctl(2) option: the signal this process gets when its parent dies (linux/prctl.h).
PR_SET_PDEATHSIG = 1
#: What ends the demo like Ctrl-C does: ``timeout``/systemd/CI's SIGTERM, a closed terminal's
#: SIGHUP.
STOP_SIGNALS = (signal.SIGTERM, signal.SIGHUP)


class DemoError(Exception):
    """Something the demo needs is missing or did not start; the message says what to do."""


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
            preexec_fn=die_with_parent(),  # SIGKILL of the demo stops them too (Linux)
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
    tail = child.log_tail()
    raise DemoError(f"{name} not ready after {timeout:.0f} s; the end of its log:\n{tail}")


@contextlib.contextmanager
def log_directory(given: str | None, prefix: str) -> Iterator[Path]:
    """Where the children's logs go: ``given`` (made if missing, kept), else a new temporary
    directory that is removed on the way out, however the command ends (Ctrl-C, SIGTERM, an
    error): every run would otherwise leave one behind. Errors carry the end of a child's log,
    so nothing the user needs is lost with it."""
    if given is not None:
        path = Path(given)
        path.mkdir(parents=True, exist_ok=True)
        yield path
        return
    path = Path(tempfile.mkdtemp(prefix=prefix))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def die_with_parent() -> Callable[[], None] | None:
    """A ``preexec_fn`` that asks the kernel to send the child SIGTERM when its parent dies
    (``prctl(PR_SET_PDEATHSIG)``, Linux only; ``None`` elsewhere or without a C library).

    The parent's ``finally`` stops the children on Ctrl-C, SIGTERM and SIGHUP; after SIGKILL
    nothing of the parent runs, and children in their own session would be re-parented and run
    on (the engine's memory, the guard's port). The request is made after the fork, before the
    child's program starts; a parent that died before it was made is caught by the check of
    ``getppid`` that follows. (The signal follows the parent *thread*: the children are started
    from the main thread, which lives as long as the command.)"""
    if not sys.platform.startswith("linux"):
        return None
    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None
    parent = os.getpid()

    def preexec() -> None:
        if prctl(PR_SET_PDEATHSIG, int(signal.SIGTERM), 0, 0, 0) == 0 and os.getppid() != parent:
            os.kill(os.getpid(), signal.SIGTERM)

    return preexec


class Terminated(KeyboardInterrupt):
    """SIGTERM or SIGHUP, raised like Ctrl-C so that the same ``finally`` blocks stop the
    children."""


@contextlib.contextmanager
def sigterm_as_interrupt() -> Iterator[None]:
    """Within: SIGTERM and SIGHUP raise :class:`Terminated`. Why: the children run in their own
    session (Ctrl-C in a terminal reaches the demo only, and a closed terminal's SIGHUP the
    demo only), so nothing else stops them, and those signals' default action ends the process
    without running a single ``finally``. Once raised, further stop signals are ignored so that
    stopping the children runs to its end."""

    def handler(signum: int, frame: object) -> None:
        for sig in STOP_SIGNALS:
            signal.signal(sig, signal.SIG_IGN)
        raise Terminated

    previous = {sig: signal.signal(sig, handler) for sig in STOP_SIGNALS}
    try:
        yield
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)
