"""Socket helpers shared by the tests that start real servers (proxy, Prometheus, engines)."""

from __future__ import annotations

import socket
import subprocess
import time
from collections.abc import Callable
from typing import Any

import httpx

#: The ceiling of every wait on an event (a server up, a connection closed, a process gone): a
#: guard against a hang, never a margin. Tests wait for the event itself, so on a busy two-core
#: laptop they take longer rather than fail; only a test that would hang forever meets this.
HANG_GUARD = 300.0


def free_port() -> int:
    """An ephemeral loopback port that was free a moment ago (the server binds it next)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def wait_healthy(
    url: str,
    *,
    timeout: float = HANG_GUARD,
    alive: Callable[[], bool] = lambda: True,
    interval: float = 0.1,
) -> bool:
    """Poll ``url`` until it answers 200; False when ``timeout`` (a hang guard) passes or
    ``alive()`` turns false (the server process died), so callers can fail with the server's
    own log."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and alive():
        try:
            if httpx.get(url, timeout=HANG_GUARD).status_code == 200:
                return True
        except httpx.TransportError:
            pass
        time.sleep(interval)
    return False


def stop_process(proc: subprocess.Popen[Any]) -> int:
    """Terminate ``proc`` and reap it (kill it if SIGTERM is not enough within the hang guard),
    closing its pipes: a child left running, or unreaped, surfaces later as a ResourceWarning in
    whichever test the garbage collector happens to run in."""
    if proc.poll() is None:
        proc.terminate()
    try:
        code = proc.wait(HANG_GUARD)
    except subprocess.TimeoutExpired:
        proc.kill()
        code = proc.wait()
    for pipe in (proc.stdin, proc.stdout, proc.stderr):
        if pipe is not None:
            pipe.close()
    return code
