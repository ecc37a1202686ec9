"""The Detector contract: first verdict once, summary, bounded memory, configuration."""

from __future__ import annotations

import dataclasses

import pytest

from proxy.detect import Detector, DetectorConfig, Summary, Verdict
from proxy.settings import load_detector_config
from tests.detect.conftest import stream
from tests.detect.texts import ENGLISH, as_deltas, varied_words


def test_feed_returns_the_verdict_once_then_none() -> None:
    detector = Detector()
    verdicts = [detector.feed(d) for d in as_deltas(ENGLISH + "again " * 400)]
    fired = [v for v in verdicts if v is not None]
    assert len(fired) == 1
    assert isinstance(fired[0], Verdict)
    assert detector.verdict is fired[0]
    assert detector.feed("more") is None
    summary = detector.finish()
    assert summary.verdict is fired[0]


def test_verdict_positions_count_chars_and_tokens() -> None:
    detector = Detector()
    fed = 0
    for delta in as_deltas(ENGLISH + "again " * 400):
        fed += len(delta)
        verdict = detector.feed(delta, tokens=2)
        if verdict is not None:
            assert verdict.fired_at_char == fed
            assert verdict.fired_at_token == 2 * len(as_deltas((ENGLISH + "again " * 400)[:fed]))
            assert 0 <= verdict.onset_char <= verdict.fired_at_char
            break
    else:
        pytest.fail("no verdict")


def test_summary_of_a_healthy_stream() -> None:
    summary = stream(ENGLISH)
    assert isinstance(summary, Summary)
    assert summary.verdict is None
    assert summary.chars == len(ENGLISH)
    assert summary.tokens == len(as_deltas(ENGLISH))
    assert summary.lexical_diversity is not None and summary.lexical_diversity > 0.4
    assert summary.token_entropy is None


def test_summary_of_a_loop_records_the_worst_repetition() -> None:
    summary = stream(ENGLISH + "the same sentence again. " * 60)
    assert summary.repetition_score is not None and summary.repetition_score >= 4


def test_empty_stream() -> None:
    detector = Detector()
    assert detector.feed("") is None
    assert detector.finish() == Summary(0, 1, None, None, None, None)


def test_finish_judges_the_unchecked_tail() -> None:
    """A short answer that is a loop all the way is judged when the stream ends."""
    text = "I think. " * 16
    detector = Detector()
    assert all(detector.feed(d) is None for d in as_deltas(text)[:3])
    for d in as_deltas(text)[3:]:
        detector.feed(d)
    assert detector.finish().verdict is not None


def test_memory_is_bounded_by_the_window() -> None:
    """After a million characters the detector holds about two windows of text, no more.

    The chunk repeats verbatim (a 12 kB paragraph again and again), which the unit-loop signal
    rightly calls a loop; it is off here so the window signals run for the whole million."""
    config = DetectorConfig(line_loop=False)
    detector = Detector(config)
    words = varied_words(2000, seed=1)
    chunk = " ".join(words) + "\n"
    fed = 0
    while fed < 1_000_000:
        for word in chunk.split(" "):
            detector.feed(word + " ")
        fed += len(chunk)
    state = detector.__dict__ if hasattr(detector, "__dict__") else {}
    held = sum(len(v) for v in state.values() if isinstance(v, str))
    assert held <= 4 * config.window_chars + 4 * config.check_every_chars
    assert len(detector._anchors) <= config.window_chars  # type: ignore[attr-defined]
    assert detector.finish().verdict is None


def test_structured_output_relaxes_repetition() -> None:
    """Eight records that differ only in their id: a loop in prose, data in JSON output (asked
    for, opening with a bracket, or plainly source-like lines)."""
    row = '{"id": %d, "name": "item", "status": "active", "tags": ["a", "b"]},\n'
    rows = "".join(row % i for i in range(1, 9))
    text = "Here are the records you asked for:\n" + rows
    line = "Record %d is the item whose status is active, with the tags a and b.\n"
    prose = "Here are the records you asked for:\n" + "".join(line % i for i in range(1, 9))
    assert stream(prose).verdict is not None
    assert stream(text, structured=True).verdict is None
    assert stream("[\n" + rows).verdict is None  # output that opens with a bracket is JSON
    assert stream(text).verdict is None  # lines of code/data, unfenced


def test_every_knob_is_a_simple_type_and_read_from_guard_env(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    for field in dataclasses.fields(DetectorConfig):
        assert field.type in ("bool", "int", "float", "str"), field.name
    monkeypatch.setenv("GUARD_REPETITION_MIN_REPEATS", "9.5")
    monkeypatch.setenv("GUARD_LANGUAGE_DRIFT", "false")
    config = load_detector_config()
    assert config.repetition_min_repeats == 9.5
    assert config.language_drift is False


def test_no_knob_shares_a_variable_with_the_proxy_settings() -> None:
    """GUARD_LANGUAGE is the request rewriter's; the drift switch is GUARD_LANGUAGE_DRIFT."""
    from proxy.settings import Settings

    knobs = {field.name for field in dataclasses.fields(DetectorConfig)}
    assert knobs.isdisjoint(Settings.model_fields)


def test_one_giant_delta_is_judged_on_its_window() -> None:
    """A whole answer fed at once is evaluated once, on the window: a loop is still found and
    its onset still points into the loop."""
    text = ENGLISH + "the same sentence again. " * 40_000
    detector = Detector()
    verdict = detector.feed(text)
    assert verdict is not None and verdict.signal == "repetition"
    assert verdict.fired_at_char == len(text)
    assert len(ENGLISH) <= verdict.onset_char < len(text)
    healthy = Detector()
    assert healthy.feed(ENGLISH * 3 + " ".join(varied_words(200_000, seed=2))) is None
