"""Compose in front of an engine the user already runs (``docker-compose.external.yml``), read
back with the real ``docker compose config``: the bundled vLLM is left out, the proxy fronts the
engine named in the environment (``.env``), and Prometheus scrapes that engine's metrics with
the same jobs, rules and settings as ``prometheus/prometheus.yml``. The file stands alone (each
service extends docker-compose.yml's) and renders the same stack after docker-compose.yml."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.deploy_tools import COMPOSE, PROMETHEUS_YML, ROOT, compose_command, require
from tests.net import HANG_GUARD

EXTERNAL = ROOT / "docker-compose.external.yml"
ENGINE = {
    "EXTERNAL_ENGINE_URL": "http://10.1.2.3:8000",
    "EXTERNAL_ENGINE_METRICS": "10.1.2.3:8001",
}


#: The file alone, and after docker-compose.yml (the older spelling): both are documented.
SPELLINGS = {"alone": (EXTERNAL,), "after-the-base": (COMPOSE, EXTERNAL)}


def _config(
    env: dict[str, str], files: tuple[Path, ...] = SPELLINGS["alone"]
) -> subprocess.CompletedProcess[str]:
    cmd = [*compose_command()]
    for file in files:
        cmd += ["-f", str(file)]
    cmd += ["--project-directory", str(ROOT), "config", "--format", "json"]
    clean = {k: v for k, v in os.environ.items() if not k.startswith("EXTERNAL_ENGINE_")}
    return subprocess.run(
        cmd, capture_output=True, text=True, timeout=HANG_GUARD, cwd=ROOT, env={**clean, **env}
    )


def _rendered(files: tuple[Path, ...] = SPELLINGS["alone"]) -> dict[str, Any]:
    out = _config(ENGINE, files)
    assert out.returncode == 0, out.stderr
    config: dict[str, Any] = json.loads(out.stdout)
    return config


def _prometheus(config: dict[str, Any]) -> dict[str, Any]:
    mounted = config["services"]["prometheus"]["configs"]
    assert len(mounted) == 1
    source = config["configs"][mounted[0]["source"]]
    flag = "--config.file=" + mounted[0]["target"]
    assert flag in config["services"]["prometheus"]["command"]
    loaded: dict[str, Any] = yaml.safe_load(source["content"])
    return loaded


@pytest.mark.parametrize("spelling", SPELLINGS)
def test_the_bundled_engine_is_left_out_and_the_proxy_fronts_the_users(spelling: str) -> None:
    services = _rendered(SPELLINGS[spelling])["services"]
    assert set(services) == {"proxy", "prometheus", "grafana", "jaeger"}
    proxy = services["proxy"]
    assert proxy["environment"]["GUARD_UPSTREAM_URL"] == ENGINE["EXTERNAL_ENGINE_URL"]
    assert "vllm" not in proxy.get("depends_on", {})
    # The rest of the proxy is docker-compose.yml's: its build, image, traces and port.
    base = _config_of_base()["services"]["proxy"]
    for key in ("build", "image", "ports", "env_file", "restart"):
        assert proxy.get(key) == base.get(key), key
    assert proxy["environment"] == {
        **base["environment"],
        "GUARD_UPSTREAM_URL": ENGINE["EXTERNAL_ENGINE_URL"],
    }


def test_alone_or_after_the_base_it_is_the_same_stack() -> None:
    """``-f docker-compose.external.yml`` alone renders exactly what it renders after
    ``-f docker-compose.yml``: a user who forgets the base file gets the stack, not an error."""
    alone, after = (
        {k: v for k, v in _rendered(files).items() if not k.startswith("x-")}  # YAML anchors
        for files in SPELLINGS.values()
    )
    assert alone == after


def test_prometheus_scrapes_the_users_engine_with_the_stacks_other_jobs() -> None:
    config = _rendered()
    external = _prometheus(config)
    jobs = {job["job_name"]: job for job in external["scrape_configs"]}
    assert jobs["vllm"]["static_configs"] == [{"targets": [ENGINE["EXTERNAL_ENGINE_METRICS"]]}]
    # Everything else as in prometheus/prometheus.yml, so the two files cannot drift apart.
    base = yaml.safe_load(PROMETHEUS_YML.read_text(encoding="utf-8"))
    base_jobs = {job["job_name"]: job for job in base["scrape_configs"]}
    assert jobs.keys() == base_jobs.keys()
    assert {k: v for k, v in jobs.items() if k != "vllm"} == {
        k: v for k, v in base_jobs.items() if k != "vllm"
    }
    assert jobs["vllm"]["metrics_path"] == base_jobs["vllm"]["metrics_path"]
    assert external["global"] == base["global"]
    assert [Path(r).name for r in external["rule_files"]] == base["rule_files"]
    base_cmd = _config_of_base()["services"]["prometheus"]["command"]
    command = config["services"]["prometheus"]["command"]
    assert [c for c in command if "config.file" not in c] == [
        c for c in base_cmd if "config.file" not in c
    ]


def _config_of_base() -> dict[str, Any]:
    cmd = [*compose_command(), "-f", str(COMPOSE), "--project-directory", str(ROOT)]
    out = subprocess.run(
        [*cmd, "config", "--format", "json"], capture_output=True, text=True, timeout=HANG_GUARD
    )
    assert out.returncode == 0, out.stderr
    config: dict[str, Any] = json.loads(out.stdout)
    return config


def test_the_rendered_prometheus_config_is_valid(tmp_path: Path) -> None:
    """promtool checks it (skipped without promtool, a failure under CI, which installs it);
    its rule file is the stack's."""
    promtool = require("promtool", "apt-get install -y --no-install-recommends prometheus")
    external = _prometheus(_rendered())
    external["rule_files"] = [str(PROMETHEUS_YML.parent / "alerts.yml")]
    path = tmp_path / "prometheus.yml"
    path.write_text(yaml.safe_dump(external))
    out = subprocess.run(
        [promtool, "check", "config", str(path)], capture_output=True, text=True,
        timeout=HANG_GUARD,
    )  # fmt: skip
    assert out.returncode == 0, out.stdout + out.stderr


@pytest.mark.parametrize("spelling", SPELLINGS)
@pytest.mark.parametrize("missing", ["EXTERNAL_ENGINE_URL", "EXTERNAL_ENGINE_METRICS"])
def test_without_the_engine_named_compose_refuses_and_says_what_to_set(
    missing: str, spelling: str
) -> None:
    """Each of the two variables, left out alone, stops compose with a message naming it (with
    both left out, compose names whichever it reads first)."""
    out = _config({k: v for k, v in ENGINE.items() if k != missing}, SPELLINGS[spelling])
    assert out.returncode != 0
    assert f"set {missing} in .env" in out.stderr
