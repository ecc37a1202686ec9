"""Every cap ``calibrate`` writes is checked against the healthy answers it would cut: the
production one (``--from-prometheus``: ``GUARD_MAX_TOKENS_CAP`` and ``GUARD_MAX_TOKENS_DEFAULT``
from the proxy's histograms) and the report's per-cell caps, held to the same budget
(``CAP_BUDGET``, 1 %) as the model's cap of a calibration run."""

from __future__ import annotations

from typing import Any

import pytest

from proxy.cli.calibrate.report import render_env, render_markdown, summarize, summarize_histograms
from proxy.cli.calibrate.stats import (
    healthy_buckets,
    histogram_count_le,
    histogram_share_above,
)

MODEL = "m"
BOUNDS = [16, 32, 64, 128, 256, 512, 1024, 2048, float("inf")]


def _vector(counts: dict[float, float], **labels: str) -> list[dict[str, Any]]:
    """A cumulative histogram as Prometheus's instant vector of ``sum by (model, le)``."""
    out, running = [], 0.0
    for bound in BOUNDS:
        running += counts.get(bound, 0.0)
        le = "+Inf" if bound == float("inf") else str(bound)
        out.append({"metric": {"model": MODEL, "le": le, **labels}, "value": [0, str(running)]})
    return out


def _production(aborts: dict[float, float], healthy: dict[float, float]) -> dict[str, Any]:
    """Aborts at the given buckets; every generation's length (aborted ones at their cut)."""
    lengths = {b: aborts.get(b, 0.0) + healthy.get(b, 0.0) for b in BOUNDS}
    total = sum(lengths.values())
    generations = [{"metric": {"model": MODEL}, "value": [0, str(total)]}]
    return summarize_histograms(
        _vector(aborts), [], generations, [], quantile=0.1, margin=16,
        completions=_vector(lengths),
    )  # fmt: skip


def _env_cap(summary: dict[str, Any]) -> list[str]:
    return [
        line
        for line in render_env(summary).splitlines()
        if line.startswith(("GUARD_MAX_TOKENS_CAP=", "GUARD_MAX_TOKENS_DEFAULT="))
    ]


def test_a_production_cap_that_would_cut_healthy_answers_is_refused() -> None:
    """Loops cut at 32-128 tokens, healthy answers of 256-1024: the 0.1 quantile of the
    aborts (minus the margin) would cut nearly all of them, so no cap is written, and the
    report says how many it would have cut and which cap would be safe."""
    summary = _production({64: 50, 128: 50}, {512: 900, 1024: 100})
    rec = summary["models"][MODEL]["recommendation"]
    assert rec["max_tokens_cap"] is None
    assert rec["truncates_coherent_share"] == pytest.approx(1.0)
    assert "no cap recommended" in rec["cap_reason"]
    assert "of the healthy completions" in rec["cap_reason"]
    assert "GUARD_MODE=heal" in rec["cap_reason"]
    assert _env_cap(summary) == []
    assert "would cut ~100.0% of the healthy completions" in render_markdown(summary, {})


def test_a_production_cap_below_every_healthy_answer_is_written_with_its_share() -> None:
    """Healthy answers all short, loops long: the cap stands, cutting none of them."""
    summary = _production({1024: 40, 2048: 60}, {64: 700, 128: 300})
    rec = summary["models"][MODEL]["recommendation"]
    assert rec["max_tokens_cap"] is not None and rec["max_tokens_cap"] > 128
    assert rec["truncates_coherent_share"] == 0.0
    assert "would cut ~0.0% of the healthy completions" in rec["cap_reason"]
    cap = rec["max_tokens_cap"]
    assert _env_cap(summary) == [f"GUARD_MAX_TOKENS_CAP={cap}", f"GUARD_MAX_TOKENS_DEFAULT={cap}"]


def test_the_healthy_share_is_read_from_the_histograms_as_prometheus_does() -> None:
    cumulative = [(16.0, 0.0), (32.0, 10.0), (64.0, 30.0), (float("inf"), 40.0)]
    assert histogram_count_le(cumulative, 48) == pytest.approx(20.0)  # half of (32, 64]
    assert histogram_share_above(cumulative, 48) == pytest.approx(0.5)
    assert histogram_share_above(cumulative, 10_000) == pytest.approx(0.25)  # +Inf: beyond
    assert histogram_share_above([], 48) == 0.0
    aborts = [(16.0, 0.0), (32.0, 5.0), (64.0, 5.0), (float("inf"), 5.0)]
    assert healthy_buckets(cumulative, aborts) == [
        (16.0, 0.0), (32.0, 5.0), (64.0, 25.0), (float("inf"), 35.0)
    ]  # fmt: skip


def test_extrapolation_fractions_are_no_healthy_answers() -> None:
    """A short window's ``increase()`` of the same 4 aborted answers, as Prometheus returned it
    for the two histograms (each series extrapolated by its own factor), and 2 healthy answers
    of at most 64 tokens: a cap of 88 cuts none of them."""
    completions = [(64.0, 2.0), (128.0, 6.1), (float("inf"), 6.1)]
    aborts = [(64.0, 0.0), (128.0, 4.05), (float("inf"), 4.05)]
    healthy = healthy_buckets(completions, aborts)
    assert healthy == [(64.0, 2.0), (128.0, 2.0), (float("inf"), 2.0)]
    assert histogram_share_above(healthy, 88) == 0.0


def test_a_shared_extrapolation_makes_no_whole_phantom_answer() -> None:
    """Both histograms read through one window's extrapolation (x 1.09, as Prometheus returned
    it in a failed run: 6 answers as 6.54, the 4 aborted as 4.35, the 2 healthy of at most 64
    tokens as 2.18): rounding each count gave 7 - 4 = 3 answers, one of them a phantom above
    the cap; the difference rounds to the 2 there are."""
    completions = [(64.0, 2.18), (128.0, 6.54), (float("inf"), 6.54)]
    aborts = [(64.0, 0.0), (128.0, 4.35), (float("inf"), 4.35)]
    healthy = healthy_buckets(completions, aborts)
    assert healthy == [(64.0, 2.0), (128.0, 2.0), (float("inf"), 2.0)]
    assert histogram_share_above(healthy, 88) == 0.0


def _record(task: str, tokens: int, at: int | None) -> dict[str, Any]:
    return {
        "model": MODEL, "task": task, "language": "en", "repetition_penalty": 1.0,
        "temperature": 0.0, "seed": 0, "tokens": tokens, "degenerate_at": at,
        "signal": "repetition" if at else None,
    }  # fmt: skip


def test_a_cell_cap_that_would_cut_its_coherent_answers_is_not_recommended() -> None:
    """Cell ``story``: loops from token ~60, coherent answers of 200-560 tokens: its cap would
    cut all of them. Cell ``qa``: loops late, answers short: its cap stands."""
    records = [_record("story", 600, 60 + 10 * i) for i in range(6)]
    records += [_record("story", 200 + 40 * i, None) for i in range(10)]
    records += [_record("qa", 600, 400 + 10 * i) for i in range(6)]
    records += [_record("qa", 50 + 10 * i, None) for i in range(10)]
    summary = summarize(records, quantile=0.1, margin=16, max_tokens=600)
    cells = {c["task"]: c for c in summary["models"][MODEL]["cells"]}
    assert cells["story"]["max_tokens_cap"] is None
    assert cells["story"]["cap_cuts_coherent"] == 1.0
    assert cells["qa"]["max_tokens_cap"] is not None
    assert cells["qa"]["cap_cuts_coherent"] == 0.0
    table = render_markdown({**summary, "source": {"max_tokens": 600}}, {})
    assert "- (would cut 100%)" in table
