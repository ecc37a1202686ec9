"""Entropy collapse from top_logprobs."""

from __future__ import annotations

import math
from typing import Any

import pytest

from proxy.detect import Detector, DetectorConfig
from proxy.detect.entropy import EntropyWindow, token_entropy
from tests.detect.texts import ENGLISH, ITALIAN, as_deltas, varied_words

ENTROPY_ONLY = DetectorConfig(
    repetition=False,
    ngram=False,
    diversity=False,
    script=False,
    language_drift=False,
    compression=False,
    entropy_window_tokens=64,
)


def _entry(chosen: float, alternatives: list[float]) -> dict[str, Any]:
    return {
        "token": "x",
        "logprob": chosen,
        "bytes": [120],
        "top_logprobs": [{"token": "x", "logprob": lp, "bytes": [120]} for lp in alternatives],
    }


def test_token_entropy_of_a_uniform_top_k() -> None:
    entropy, chosen = token_entropy(_entry(math.log(0.25), [math.log(0.25)] * 4)) or (0, 0)
    assert entropy == pytest.approx(math.log(4))
    assert chosen == pytest.approx(math.log(0.25))


def test_token_entropy_counts_the_missing_mass() -> None:
    entropy, _ = token_entropy(_entry(math.log(0.5), [math.log(0.5)])) or (0, 0)
    assert entropy == pytest.approx(math.log(2))  # 0.5 seen + 0.5 unseen


def test_token_entropy_rejects_malformed_entries() -> None:
    assert token_entropy(None) is None
    assert token_entropy({"token": "x"}) is None
    entropy, _ = token_entropy({"logprob": 0.0, "top_logprobs": None}) or (1, 1)
    assert entropy == 0.0


def test_entropy_window_is_a_rolling_mean() -> None:
    window = EntropyWindow(3)
    for value in (3.0, 0.0, 0.0, 0.0):
        window.add(value)
    assert window.full and window.mean == pytest.approx(0.0)


def _feed(text: str, logprob_entry: dict[str, Any] | None) -> Detector:
    detector = Detector(ENTROPY_ONLY)
    for delta in as_deltas(text):
        lp = [logprob_entry] if logprob_entry is not None else None
        if detector.feed(delta, logprobs=lp) is not None:
            break
    detector.finish()
    return detector


def test_certain_model_on_repetitive_text_fires() -> None:
    certain = _entry(-1e-4, [-1e-4, -12.0, -13.0])
    detector = _feed(ENGLISH + "and so on and so on " * 80, certain)
    assert detector.verdict is not None
    assert detector.verdict.signal == "entropy-collapse"


def test_certain_model_on_varied_text_passes() -> None:
    """Low entropy alone is normal (boilerplate, code): it needs compressible text too."""
    certain = _entry(-1e-4, [-1e-4, -12.0])
    assert _feed(ENGLISH + ITALIAN + " ".join(varied_words(150, seed=5)), certain).verdict is None


def test_no_logprobs_means_no_entropy_value() -> None:
    detector = Detector()
    for delta in as_deltas(ENGLISH):
        detector.feed(delta)
    assert detector.finish().token_entropy is None
