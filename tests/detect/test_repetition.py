"""Repetition: exact periodic tails of any period, counter loops, floods; code and tables pass."""

from __future__ import annotations

import pytest

from proxy.detect import DetectorConfig
from proxy.detect.repetition import (
    counts_down,
    normalise_numbers,
    periodic_span,
    periodic_tail,
    repeated_ngram_rate,
)
from tests.detect.conftest import stream
from tests.detect.texts import (
    CHINESE,
    ENGLISH,
    ITALIAN,
    JAPANESE,
    MARKDOWN_TABLE,
    PYTHON_CODE,
    beer_song,
    green_bottles,
    twelve_days,
    varied_words,
)


def test_periodic_span_counts_whole_and_partial_copies() -> None:
    """The span covers every full copy of the unit plus the partial copy before them."""
    assert periodic_span("xyz" + "abcd" * 5, 4) == 20
    assert periodic_span("xcd" + "abcd" * 3, 4) == 14  # 'cd' of a fourth copy counts
    assert periodic_span("abcdef", 3) == 3  # one copy only: no repetition


def test_periodic_tail_finds_the_smallest_period_of_a_flood() -> None:
    """A period-1 token flood is found with its word as the unit."""
    tail = periodic_tail("Sure. " + "the " * 50)
    assert tail is not None
    assert tail.period == 4
    assert tail.span >= 200


def test_periodic_tail_of_prose_is_short() -> None:
    """Ordinary text has no periodic tail worth the name."""
    tail = periodic_tail(ENGLISH)
    assert tail is None or tail.repeats < 2


def test_normalised_numbers_make_counter_loops_periodic() -> None:
    """``Paragraph 9`` and ``Paragraph 10`` compare equal once digit runs are normalised."""
    text = "".join(f"Paragraph {i}: the same body again.\n" for i in range(5, 15))
    assert periodic_tail(text) is None or periodic_tail(text).repeats < 2  # type: ignore[union-attr]
    tail = periodic_tail(normalise_numbers(text))
    assert tail is not None and tail.repeats >= 9


def test_repeated_ngram_rate_separates_loops_from_prose() -> None:
    words = ENGLISH.split()
    assert repeated_ngram_rate(words) < 0.05
    assert repeated_ngram_rate(("one two three four five " * 20).split()) > 0.9


@pytest.mark.parametrize(
    "flood",
    [
        "the " * 120,
        "* " * 400,
        "**:**" * 100,
        "\n" * 600,
        "!" * 600,
    ],
    ids=["word", "asterisks", "bold-colon", "blank-lines", "bangs"],
)
def test_token_floods_fire(flood: str) -> None:
    """Floods of one token after a healthy start are stopped, with the onset at the flood."""
    summary = stream(ENGLISH + flood)
    assert summary.verdict is not None
    assert summary.verdict.signal in {"token-flood", "repetition", "low-diversity", "compression"}
    assert len(ENGLISH) - 64 <= summary.verdict.onset_char <= len(ENGLISH) + 64
    assert summary.verdict.fired_at_char <= len(ENGLISH) + 700


@pytest.mark.parametrize(
    ("text", "signal"),
    [
        (CHINESE + "的" * 200, "token-flood"),
        (CHINESE + "谢谢！" * 120, "token-flood"),
        (CHINESE + "我是一个用户，" * 60, "repetition"),  # "I am a user,": a sentence
        (CHINESE + "暴风雪礼赞" * 60, "repetition"),  # "ode to the blizzard"
        (JAPANESE + "評価結果の説明の根拠、" * 40, "repetition"),
        (ENGLISH + " the cat" * 120, "repetition"),
    ],
    ids=["zh-char", "zh-word", "zh-sentence", "zh-phrase", "ja-phrase", "en-two-words"],
)
def test_a_unit_without_spaces_is_named_by_its_words_not_its_spaces(text: str, signal: str) -> None:
    """Chinese and Japanese have no spaces to count words by: a phrase or sentence repeated
    there is a loop, named as an English one would be, and only a word repeated is a flood."""
    verdict = stream(text).verdict
    assert verdict is not None and verdict.signal == signal


def test_exact_loop_of_period_one_token_fires_within_a_few_hundred_chars() -> None:
    summary = stream(ITALIAN + " ciao" * 200)
    assert summary.verdict is not None
    assert summary.verdict.fired_at_char - len(ITALIAN) <= 400


def test_exact_loop_of_period_300_tokens_fires() -> None:
    """A unit of 300 varied words repeated is a loop, found after a few copies."""
    unit = " ".join(varied_words(300, seed=7)) + ".\n"
    summary = stream(ENGLISH + unit * 6)
    assert summary.verdict is not None
    assert summary.verdict.signal == "repetition"
    assert summary.verdict.fired_at_char <= len(ENGLISH) + 5 * len(unit)
    # onset: the loop region starts at or before the second copy
    assert summary.verdict.onset_char <= len(ENGLISH) + len(unit) + 64


def test_a_unit_seen_only_twice_is_not_a_loop() -> None:
    """Hysteresis: a paragraph quoted twice is not degeneration."""
    unit = " ".join(varied_words(120, seed=3)) + ".\n"
    assert stream(ENGLISH + unit * 2 + ITALIAN).verdict is None


def test_counter_loop_fires() -> None:
    """Paragraph 17… Paragraph 18… with the same body is a loop once numbers are normalised."""
    body = "This paragraph explains the same idea once more in the same words."
    text = ENGLISH + "".join(f"Paragraph {i}. {body}\n" for i in range(1, 60))
    summary = stream(text)
    assert summary.verdict is not None
    assert summary.verdict.signal == "repetition"
    assert summary.verdict.onset_char <= len(ENGLISH) + 200


def test_code_and_tables_pass() -> None:
    assert stream(PYTHON_CODE * 2).verdict is None  # a file quoted twice is not a loop
    assert stream(ENGLISH + "\n\n" + MARKDOWN_TABLE + "\n" + ENGLISH).verdict is None


def test_fenced_code_relaxes_repetition() -> None:
    """Four identical lines inside a code fence are data; outside one they would fire."""
    rows = "    assert frame.read(4) == b'\\x00\\x00\\x00\\x01'\n" * 6
    inside = ENGLISH + "```python\n" + rows + "```\n" + ENGLISH
    assert stream(inside).verdict is None
    assert stream(ENGLISH + rows + ENGLISH).verdict is not None


def test_markdown_separator_rows_pass() -> None:
    """A long dash rule in a table separator is layout, not a flood."""
    table = "| a | b |\n|" + "-" * 300 + "|" + "-" * 30 + "|\n| 1 | 2 |\n"
    assert stream(ENGLISH + table + ENGLISH).verdict is None


def test_repetition_can_be_switched_off() -> None:
    config = DetectorConfig(
        repetition=False, ngram=False, diversity=False, compression=False, entropy=False
    )
    assert stream(ENGLISH + "the " * 300, config).verdict is None


def test_counts_down_tells_countdowns_from_runaway_counters() -> None:
    assert counts_down("99 x 98 y\n98 x 97 y\n97 x 96 y\n", 2) is True
    assert counts_down("Paragraph 17 a\nParagraph 18 a\nParagraph 19 a\n", 1) is False
    assert counts_down("7 a 7 a 7 a", 1) is False  # constant numbers: an exact loop
    assert counts_down("no numbers", 1) is False


@pytest.mark.parametrize(
    "song",
    [beer_song(), green_bottles(), twelve_days()],
    ids=["99-bottles", "ten-green-bottles", "twelve-days"],
)
def test_songs_with_refrains_pass(song: str) -> None:
    """Counting-down and cumulative songs are repetitive by design, not degenerate."""
    assert stream(song).verdict is None


def test_counting_up_the_same_verse_fires() -> None:
    """The same song counting up has no end in sight: a runaway counter loop."""
    up = "".join(
        f"{n} bottles of beer on the wall, {n} bottles of beer.\n"
        f"Put one up and pass it around, {n + 1} bottles of beer on the wall.\n\n"
        for n in range(1, 40)
    )
    summary = stream(up)
    assert summary.verdict is not None and summary.verdict.signal == "repetition"
