"""Server child processes for the demo and ``calibrate --demo``: start, wait until ready, stop.

The children run in their own session, so Ctrl-C in a terminal reaches the parent only and the
parent stops them in order; :func:`sigterm_as_interrupt` makes SIGTERM (what ``timeout``,
systemd, Kubernetes and CI send) take the same path, so no engine or guard outlives the command.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path


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
