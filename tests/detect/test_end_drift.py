"""A detector set up for a streamed answer (``end_drift = False``): the sentence-level drift
judgement at the end is left out, and so is the language identification that only fed it;
every verdict while streaming stays what it was."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

import proxy.detect.language
from proxy.cli.score import expected_language_of, split_deltas
from proxy.detect import Detector
from tests.detect.texts import ENGLISH, ITALIAN, as_deltas

SAMPLE = Path(__file__).resolve().parent.parent / "data" / "detect" / "sample.jsonl"


def _first_verdict(text: str, expected: str | None, *, end_drift: bool) -> Any:
    detector = Detector(expected_language=expected)
    detector.end_drift = end_drift
    for delta in split_deltas(text):
        verdict = detector.feed(delta)
        if verdict is not None:
            return (verdict.signal, verdict.fired_at_char, verdict.onset_char)
    return None


@pytest.mark.parametrize("expected", ["row", None], ids=["expected-language", "none"])
def test_streaming_verdicts_are_the_same(expected: str | None) -> None:
    """Over the labelled sample of real texts (loops, floods, drift, healthy answers in many
    languages), with and without an expected language: the same verdict at the same place."""
    rows = [json.loads(line) for line in SAMPLE.read_text(encoding="utf-8").splitlines()]
    found = 0
    for row in rows:
        language = expected_language_of(row) if expected == "row" else None
        streamed = _first_verdict(row["text"], language, end_drift=False)
        assert streamed == _first_verdict(row["text"], language, end_drift=True), row["id"]
        found += streamed is not None
    assert found >= 10


def test_english_without_an_expected_language_is_identified_until_established(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Without an expected language, text established as English cannot drift (nothing counts
    as drift from English): a streamed answer stops asking fastText then."""
    calls: list[str] = []
    classify = proxy.detect.language.classify

    def counted(clean: str) -> tuple[str, float] | None:
        calls.append(clean)
        return classify(clean)

    monkeypatch.setattr(proxy.detect.language, "classify", counted)
    rows = [json.loads(line) for line in SAMPLE.read_text(encoding="utf-8").splitlines()]
    [text] = [r["text"] for r in rows if r["id"] == "alpaca-yi-large-preview-320"]  # 4.6 k chars
    counts = []
    for end_drift in (True, False):
        calls.clear()
        detector = Detector()
        detector.end_drift = end_drift
        for delta in split_deltas(text):
            assert detector.feed(delta) is None
        counts.append(len(calls))
    # Every prose segment of the first 512 characters and every other one after; then only the
    # segments until one establishes English (confidence 0.9).
    assert counts[0] >= 6
    assert 1 <= counts[1] <= 3


def test_a_streamed_answer_in_another_language_is_still_watched() -> None:
    """Only English settles: an Italian answer without an expected language can still drift
    to English (the shape the drift signal looks for), and is identified all along."""
    text = ITALIAN[:300] + ENGLISH * 3
    for end_drift in (True, False):
        detector = Detector()
        detector.end_drift = end_drift
        verdicts = [v for d in as_deltas(text) if (v := detector.feed(d)) is not None]
        assert [v.signal for v in verdicts] == ["language-drift"]
