"""The demo's children do not outlive it, however it ends: a real parent process runs the
demo's child management (:mod:`proxy.cli.children`) with a real server child in its own
session, and is sent SIGHUP (its terminal closed) or SIGKILL (nothing of it runs); the child
must be gone. Waits are on the events (a line from the parent, the child's pid gone), each
with a hang guard only."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.net import HANG_GUARD, stop_process

ROOT = Path(__file__).resolve().parent.parent

#: The parent: the demo's way of starting a server child and keeping it until a stop signal.
PARENT = """
import sys, time
from pathlib import Path
from proxy.cli.children import free_port, sigterm_as_interrupt, start_child

port = free_port()
argv = [sys.executable, "-m", "http.server", str(port), "--bind", "127.0.0.1"]
child = start_child("server", argv, port, Path(sys.argv[1]), 300.0, ready_path="/")
try:
    with sigterm_as_interrupt():
        print(child.proc.pid, flush=True)
        while True:
            time.sleep(3600)
finally:
    child.stop()
"""


def _gone(pid: int) -> bool:
    """No such process, or a zombie nobody reaps yet (its parent died: it is not running)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return True
    return stat.rpartition(")")[2].split()[0] in ("Z", "X")


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")
@pytest.mark.parametrize("sig", [signal.SIGHUP, signal.SIGKILL], ids=["SIGHUP", "SIGKILL"])
def test_the_child_stops_when_the_demo_is_hung_up_or_killed(
    tmp_path: Path, sig: signal.Signals
) -> None:
    parent = subprocess.Popen(
        [sys.executable, "-c", PARENT, str(tmp_path / "child.log")],
        cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(ROOT)},
        stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    child = 0
    try:
        assert parent.stdout is not None
        line = parent.stdout.readline()  # the child answered: its pid
        assert line.strip().isdigit(), (tmp_path / "child.log").read_text()
        child = int(line)
        assert not _gone(child)
        os.kill(child, 0)
        assert os.getsid(child) == child  # its own session: the terminal's SIGHUP misses it
        parent.send_signal(sig)
        parent.wait(HANG_GUARD)
        deadline = time.monotonic() + HANG_GUARD
        while not _gone(child):
            assert time.monotonic() < deadline, f"the child {child} outlived its parent"
            time.sleep(0.05)
    finally:
        stop_process(parent)
        if child and not _gone(child):
            os.kill(child, signal.SIGKILL)
