"""Socket helpers shared by the tests that start real servers (proxy, Prometheus, engines)."""

from __future__ import annotations

import socket
import time
from collections.abc import Callable

import httpx


def free_port() -> int:
    """An ephemeral loopback port that was free a moment ago (the server binds it next)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def wait_healthy(
    url: str, *, timeout: float, alive: Callable[[], bool] = lambda: True, interval: float = 0.1
) -> bool:
    """Poll ``url`` until it answers 200; False when ``timeout`` passes or ``alive()`` turns
    false (the server process died), so callers can fail with the server's own log."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and alive():
        try:
            if httpx.get(url, timeout=1).status_code == 200:
                return True
        except httpx.TransportError:
            pass
        time.sleep(interval)
    return False
