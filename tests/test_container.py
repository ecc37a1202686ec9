"""The image really builds and serves: podman runs the image ``scripts/ci-container.sh`` built.

The slow part (a Debian bookworm base from debootstrap, imported into podman because base
images cannot be pulled from a registry here, and the build on it) is in
``scripts/ci-container.sh``, which ``.ci/run`` calls before pytest; these tests only start the
container (a few seconds). The container uses the host network so it can reach the fake vLLM on
127.0.0.1, and runs with the flags this CI's sandbox needs (``--runtime runc`` and explicit
ulimits).
"""

from __future__ import annotations

import json
import os
import subprocess
import uuid
from collections.abc import Iterator

import httpx
import pytest

from tests.deploy_tools import require
from tests.fakes.vllm import FakeVLLM, Script
from tests.net import HANG_GUARD, free_port, wait_healthy

pytestmark = pytest.mark.container

IMAGE = os.environ.get("CG_IMAGE", "localhost/coherence-guard:ci")
RUN_FLAGS = ["--runtime", "runc", "--ulimit", "nofile=1024:1024", "--ulimit", "nproc=1000:1000"]


def podman(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["podman", "--runtime", "runc", *args], capture_output=True, text=True, timeout=timeout
    )


@pytest.fixture(scope="module")
def image() -> str:
    require("podman", "apt-get install -y podman runc")
    if podman("image", "exists", IMAGE).returncode != 0:
        message = f"{IMAGE} not built; run scripts/ci-container.sh first"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
    return IMAGE


@pytest.fixture
def container(image: str, fake_upstream: FakeVLLM) -> Iterator[tuple[str, str]]:
    """(name, base URL) of the proxy image running against the fake vLLM."""
    name = f"cg-test-{uuid.uuid4().hex[:8]}"
    port = free_port()
    started = podman(
        "run", "-d", "--rm", "--name", name, "--network", "host", *RUN_FLAGS[2:],
        "-e", f"GUARD_PORT={port}", "-e", "GUARD_HOST=127.0.0.1",
        "-e", f"GUARD_UPSTREAM_URL={fake_upstream.url}",
        "-e", "GUARD_UPSTREAM_METRICS_INTERVAL=0",
        image,
    )  # fmt: skip
    assert started.returncode == 0, started.stderr
    base = f"http://127.0.0.1:{port}"
    try:
        if not wait_healthy(base + "/health", interval=0.2):
            logs = podman("logs", name).stdout + podman("logs", name).stderr
            pytest.fail(f"container did not become healthy:\n{logs[-3000:]}")
        yield name, base
    finally:
        podman("rm", "-f", "-t", "2", name)


def test_image_metadata(image: str) -> None:
    out = podman("image", "inspect", image)
    assert out.returncode == 0, out.stderr
    (meta,) = json.loads(out.stdout)
    config = meta["Config"]
    assert config["User"] == "10001:10001"
    assert config["Entrypoint"] == ["coherence-guard"]
    assert config["Cmd"] == ["serve"]
    assert "/health" in " ".join(meta["Healthcheck"]["Test"])  # docker format keeps it
    assert "8080/tcp" in config["ExposedPorts"]


def test_container_serves_health_metrics_and_relays(
    container: tuple[str, str], fake_upstream: FakeVLLM
) -> None:
    name, base = container
    # The image's own HEALTHCHECK command, run by podman inside the container.
    assert podman("healthcheck", "run", name).returncode == 0
    assert podman("exec", name, "id", "-u").stdout.strip() == "10001"
    fake_upstream.script = Script(texts=["Hello from the fake engine, through the container."])
    r = httpx.post(
        base + "/v1/chat/completions",
        json={"model": "fake-model", "messages": [{"role": "user", "content": "hi"}]},
        timeout=HANG_GUARD,
    )
    assert r.status_code == 200, r.text
    assert r.json()["choices"][0]["message"]["content"].startswith("Hello from the fake engine")
    quality = httpx.get(base + "/metrics/quality", timeout=HANG_GUARD)
    assert quality.status_code == 200
    completed = 'guard_generations_total{endpoint="chat",model="fake-model",outcome="completed"}'
    assert f"{completed} 1.0" in quality.text
    infra = httpx.get(base + "/metrics", timeout=HANG_GUARD).text
    assert "guard_proxy_requests_total" in infra and "guard_generations_total" not in infra
