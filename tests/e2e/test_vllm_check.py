"""`coherence-guard check` against the real engine: exit codes and report, direct and via proxy."""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Any

import httpx
import pytest

from tests.e2e.support import ROOT, ProxyFactory, Server, free_port, record_figure

pytestmark = pytest.mark.e2e

TIERS = ["factual", "story", "code"]


def run_check(url: str, *args: str) -> tuple[int, str, str]:
    """The real command line, as an operator runs it."""
    done = subprocess.run(
        [sys.executable, "-m", "proxy", "check", "--url", url, *args],
        capture_output=True,
        text=True,
        timeout=400,
        cwd=ROOT,
    )
    return done.returncode, done.stdout, done.stderr


def flood_bias(engine: Server, model: str) -> str:
    """``--extra-body`` that makes the real model emit one word forever (a token flood)."""
    response = httpx.post(engine.url + "/tokenize", json={"model": model, "prompt": " loop"})
    (token,) = response.json()["tokens"]
    return json.dumps({"logit_bias": {str(token): 100}})


def test_check_through_the_proxy_reports_each_tier(
    vllm_engine: Server, start_proxy: ProxyFactory, model_name: str
) -> None:
    """The model is discovered, each tier is reported, and the exit code follows the verdicts."""
    proxy = start_proxy(vllm_engine)
    code, out, err = run_check(proxy.url, "--json")
    assert code in (0, 1), err
    report: dict[str, Any] = json.loads(out)
    assert report["model"] == model_name  # discovered from /v1/models
    tiers = {t["name"]: t for t in report["tiers"]}
    assert list(tiers) == TIERS
    # Greedy SmolLM2 knows this one; the guard passed it through untouched.
    assert tiers["factual"]["verdict"] == "coherent", tiers["factual"]
    assert "Paris" in tiers["factual"]["text"] and tiers["factual"]["finish_reason"] == "stop"
    for tier in report["tiers"]:
        assert tier["tokens"] > 0 and tier["text"]
        assert (tier["verdict"] == "coherent") == (not tier["problems"]), tier
    all_coherent = all(t["verdict"] == "coherent" for t in report["tiers"])
    assert code == (0 if all_coherent else 1)
    record_figure("check_real_verdicts", {t["name"]: t["verdict"] for t in report["tiers"]})


def test_check_flags_a_real_degenerate_model_and_exits_1(
    vllm_engine: Server, model_name: str
) -> None:
    """A logit bias turns the real model into a token flood: every tier is degenerate, the
    report says why, and check hangs up so the engine stops generating."""
    code, out, _ = run_check(vllm_engine.url, "--extra-body", flood_bias(vllm_engine, model_name))
    assert code == 1, out
    rows = {line.split()[0]: line for line in out.splitlines() if line.split(" ", 1)[0] in TIERS}
    assert set(rows) == set(TIERS)
    assert all("DEGENERATE" in row and "detector:" in row for row in rows.values()), out
    assert "[1] factual: loop loop loop" in out
    assert "3 of 3 tiers not coherent" in out
    assert vllm_engine.metrics().get("vllm:num_requests_running") == 0


def test_check_through_the_proxy_of_a_dead_engine_exits_2(start_proxy: ProxyFactory) -> None:
    """The proxy is up but its engine is not: there is nothing to trust, exit 2."""
    proxy = start_proxy(f"http://127.0.0.1:{free_port()}")
    code, out, err = run_check(proxy.url, "--model", "any")
    assert code == 2
    assert out == ""
    assert "cannot check" in err and "HTTP 5" in err
