"""``coherence-guard serve`` and ``coherence-guard config`` as a user runs them."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.fakes.vllm import FakeVLLM, Script
from tests.net import free_port, wait_healthy

CLI = [sys.executable, "-m", "proxy"]


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GUARD_")}
    env.update(extra)
    return env


def test_config_prints_the_effective_configuration_with_secrets_masked() -> None:
    env = _env(
        GUARD_API_KEYS='["sk-secret-1","sk-secret-2"]',
        GUARD_UPSTREAM_URL="http://user:hunter2@engine:8000",
        GUARD_MODE="monitor",
    )
    out = subprocess.run([*CLI, "config", "--json"], env=env, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    values = json.loads(out.stdout)
    assert values["GUARD_MODE"] == "monitor"
    assert values["GUARD_API_KEYS"] == ["***", "***"]
    assert values["GUARD_UPSTREAM_URL"] == "http://user:***@engine:8000"
    assert "sk-secret" not in out.stdout and "hunter2" not in out.stdout
    lines = subprocess.run([*CLI, "config"], env=env, capture_output=True, text=True).stdout
    assert "GUARD_MODE=monitor" in lines.splitlines()


@pytest.mark.parametrize("command", [["config"], ["serve", "--port", "1"]])
def test_bad_configuration_exits_2_naming_the_variable(command: list[str]) -> None:
    out = subprocess.run(
        [*CLI, *command], env=_env(GUARD_MAX_TOKENS_CAP="lots"), capture_output=True, text=True
    )
    assert out.returncode == 2
    assert "GUARD_MAX_TOKENS_CAP" in out.stderr
    assert "Traceback" not in out.stderr


@pytest.fixture(params=[1, 2], ids=["1-worker", "2-workers"])
def served(fake_upstream: FakeVLLM, request: pytest.FixtureRequest) -> Iterator[str]:
    port = free_port()
    args = ["--host", "127.0.0.1", "--port", str(port), "--upstream", fake_upstream.url]
    proc = subprocess.Popen(
        [*CLI, "serve", *args, "--workers", str(request.param)],
        env=_env(GUARD_UPSTREAM_METRICS_INTERVAL="0"),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 20
        while True:
            try:
                if httpx.get(base + "/health").status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert proc.poll() is None, proc.stderr.read() if proc.stderr else ""
            assert time.monotonic() < deadline, "server did not start"
            time.sleep(0.05)
        yield base
    finally:
        proc.terminate()
        proc.wait(10)
        if proc.stderr:
            proc.stderr.close()


def test_serve_relays_to_the_upstream_given_on_the_command_line(
    fake_upstream: FakeVLLM, served: str
) -> None:
    fake_upstream.script = Script(texts=["Served over the real command."])
    r = httpx.post(
        served + "/v1/chat/completions",
        json={"model": "m", "messages": [{"role": "user", "content": "hi"}]},
    )
    assert r.status_code == 200
    assert r.json()["choices"][0]["message"]["content"] == "Served over the real command."
    assert httpx.get(served + "/ready").status_code == 200
    metrics = httpx.get(served + "/metrics/quality")
    assert metrics.status_code == 200 and metrics.headers["content-type"].startswith("text/plain")


def test_serve_with_workers_removes_the_metrics_directory_it_made(
    fake_upstream: FakeVLLM, tmp_path: Path
) -> None:
    """Several workers share counters through files in a temporary directory the proxy makes;
    stopping the server removes it (restarts would otherwise pile them up)."""
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    port = free_port()
    args = ["--host", "127.0.0.1", "--port", str(port), "--upstream", fake_upstream.url]
    env = _env(GUARD_UPSTREAM_METRICS_INTERVAL="0", TMPDIR=str(tmp))
    env.pop("PROMETHEUS_MULTIPROC_DIR", None)
    proc = subprocess.Popen(
        [*CLI, "serve", *args, "--workers", "2"], env=env, stdout=subprocess.DEVNULL
    )
    try:
        base = f"http://127.0.0.1:{port}"
        assert wait_healthy(base + "/health", timeout=20, alive=lambda: proc.poll() is None)
        assert httpx.get(base + "/metrics").status_code == 200
        assert list(tmp.glob("coherence-guard-metrics-*"))
    finally:
        proc.terminate()
        assert proc.wait(15) == 0
    assert not list(tmp.glob("coherence-guard-metrics-*"))
