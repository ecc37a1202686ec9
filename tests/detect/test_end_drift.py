"""The sentence-level drift judgement at the end: left out for a streamed answer
(``end_drift = False``) without changing any verdict while streaming, and left out wherever the
streaming identification leaves it nothing to find."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

import proxy.detect.detector
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
    as drift from English): the detector stops asking fastText then, and the end judgement
    does not ask it again, whether or not the answer is delivered as it streams."""
    calls: list[str] = []
    classify = proxy.detect.language.classify

    def counted(clean: str) -> tuple[str, float] | None:
        calls.append(clean)
        return classify(clean)

    monkeypatch.setattr(proxy.detect.language, "classify", counted)
    rows = [json.loads(line) for line in SAMPLE.read_text(encoding="utf-8").splitlines()]
    [text] = [r["text"] for r in rows if r["id"] == "alpaca-yi-large-preview-320"]  # 4.6 k chars
    for end_drift in (True, False):
        calls.clear()
        detector = Detector()
        detector.end_drift = end_drift
        for delta in split_deltas(text):
            assert detector.feed(delta) is None
        # Only the segments until one establishes English (confidence 0.9).
        assert 1 <= len(calls) <= 3
        streaming = len(calls)
        assert detector.finish().verdict is None
        assert len(calls) == streaming


def _end_judgements(
    text: str, expected: str, monkeypatch: pytest.MonkeyPatch
) -> tuple[int, str | None]:
    """How often the sentence-by-sentence pass ran on ``text``, and the verdict."""
    calls: list[str] = []
    final_drift = proxy.detect.detector.final_drift

    def counted(text: str, *args: Any, **kwargs: Any) -> tuple[float, int] | None:
        calls.append(text)
        return final_drift(text, *args, **kwargs)

    monkeypatch.setattr(proxy.detect.detector, "final_drift", counted)
    detector = Detector(expected_language=expected)
    assert [v for d in as_deltas(text) if (v := detector.feed(d)) is not None] == []
    summary = detector.finish()
    return len(calls), None if summary.verdict is None else summary.verdict.signal


def test_a_short_answer_identified_whole_is_not_judged_again(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A short answer whose every segment the streaming identification found in the expected
    language leaves no foreign ending for the sentence-by-sentence pass: it is skipped."""
    assert _end_judgements(ENGLISH, "en", monkeypatch) == (0, None)
    assert _end_judgements(ITALIAN[:500], "it", monkeypatch) == (0, None)
    # Its last 158 characters fall after a segment sampled out: not seen, so judged.
    assert _end_judgements(ITALIAN, "it", monkeypatch) == (1, None)


def test_a_short_answer_with_an_ending_no_segment_identified_is_judged(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """An Italian answer that goes on in English for its last two sentences, which fall in a
    segment the streaming identification sampled out: no segment was foreign, the ending was
    not seen, so the sentence-by-sentence pass runs and cuts it."""
    text = ITALIAN[:520] + " " + ENGLISH[:160]
    assert _end_judgements(text, "it", monkeypatch) == (1, "language-drift")


def test_a_streamed_answer_in_another_language_is_still_watched() -> None:
    """Only English settles: an Italian answer without an expected language can still drift
    to English (the shape the drift signal looks for), and is identified all along."""
    text = ITALIAN[:300] + ENGLISH * 3
    for end_drift in (True, False):
        detector = Detector()
        detector.end_drift = end_drift
        verdicts = [v for d in as_deltas(text) if (v := detector.feed(d)) is not None]
        assert [v.signal for v in verdicts] == ["language-drift"]
