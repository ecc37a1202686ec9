"""A labelled sample of real texts (tests/data/detect/sample.jsonl, copied from the development
corpus with its sources) scored through the same path as ``coherence-guard score``."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from proxy.cli.score import Scored, score_rows
from proxy.detect import SIGNALS

SAMPLE = Path(__file__).resolve().parent.parent / "data" / "detect" / "sample.jsonl"


@pytest.fixture(scope="module")
def scored() -> list[Scored]:
    lines = SAMPLE.read_text(encoding="utf-8").splitlines()
    rows: list[dict[str, Any]] = [json.loads(line) for line in lines]
    assert all(row.get("source") for row in rows), "every sample text names its source"
    return list(score_rows(rows))


def test_no_healthy_text_is_cut(scored: list[Scored]) -> None:
    """Healthy answers, technical text and the repetitive traps all pass."""
    healthy = [s for s in scored if s.row["label"] == "healthy"]
    assert len(healthy) >= 25
    flagged = [(s.row["id"], s.signal) for s in healthy if s.degenerate]
    assert flagged == []


def test_degenerate_texts_are_caught(scored: list[Scored]) -> None:
    degenerate = [s for s in scored if s.row["label"] == "degenerate"]
    assert len(degenerate) >= 15
    caught = [s for s in degenerate if s.degenerate]
    assert len(caught) / len(degenerate) >= 0.9
    kinds = {s.row.get("degen_type") for s in caught}
    assert {"repetition-loop", "token-flood", "language-drift"} <= kinds


def test_detection_is_early(scored: list[Scored]) -> None:
    """Median delay from the labelled onset to the verdict stays within a few hundred chars."""
    delays = sorted(
        s.fired_at_char - s.row["onset_char"]
        for s in scored
        if s.degenerate and s.fired_at_char is not None and s.row.get("onset_char") is not None
    )
    assert delays
    assert delays[len(delays) // 2] <= 400
    for s in scored:
        if s.degenerate:
            assert s.signal in SIGNALS
            assert s.onset_char is not None and s.fired_at_char is not None
            assert 0 <= s.onset_char <= s.fired_at_char <= len(s.row["text"])
