"""Lexical diversity, n-gram repetition and compression: near-duplicate loops and babble."""

from __future__ import annotations

from proxy.detect import DetectorConfig
from proxy.detect.diversity import compression_ratio, distinct_ratio, mattr, words_of
from tests.detect.conftest import stream
from tests.detect.texts import ENGLISH, ITALIAN, MARKDOWN_TABLE, varied_words

NO_EXACT = DetectorConfig(repetition=False, language_drift=False, script=False, entropy=False)


def test_words_of_keeps_words_with_letters_only() -> None:
    assert words_of("The 3 cats, 42 and x2!") == ["the", "cats", "and", "x2"]


def test_distinct_ratio_and_mattr() -> None:
    assert distinct_ratio(["a"] * 10) is None  # too few words to say anything
    assert distinct_ratio(["a", "b"] * 20) == 2 / 40
    prose = words_of(ENGLISH * 2)
    assert 0.4 < (mattr(prose) or 0) <= 1.0
    assert (mattr(["w"] * 120) or 1) < 0.05


def test_compression_ratio_ignores_alignment_whitespace() -> None:
    assert compression_ratio(ENGLISH) < 2.5
    assert compression_ratio("loop again " * 200) > 10
    padded = "| a" + " " * 60 + "| b" + " " * 60 + "|\n"
    assert compression_ratio(padded) < compression_ratio("|a|b|\n" * 1) + 1


def test_near_duplicate_list_loop_fires() -> None:
    """A list whose items differ in one word is not exactly periodic but is a loop."""
    items = varied_words(80, seed=11)
    text = ENGLISH + "".join(
        f"{i}. Python decorators versus {items[i]} decorators: a short comparison of the two "
        "approaches, with examples of when to use each one in modern production code\n"
        for i in range(1, 80)
    )
    summary = stream(text, NO_EXACT)
    assert summary.verdict is not None
    assert summary.verdict.signal in {"near-repetition", "low-diversity", "compression"}
    assert summary.verdict.fired_at_char < len(text)


def test_word_babble_fires_low_diversity() -> None:
    text = ITALIAN + " ".join(["molto", "bene", "sì"][i % 3 if i % 7 else 1] for i in range(400))
    summary = stream(text, NO_EXACT)
    assert summary.verdict is not None
    assert summary.lexical_diversity is not None and summary.lexical_diversity < 0.1


def test_healthy_prose_and_tables_pass() -> None:
    assert stream(ENGLISH * 2 + ITALIAN * 2, NO_EXACT).verdict is None
    summary = stream(ENGLISH + MARKDOWN_TABLE + ENGLISH, NO_EXACT)
    assert summary.verdict is None
    assert summary.lexical_diversity is not None and summary.lexical_diversity > 0.3
