"""Salad of real words (the run shape of the salad signal): real answers that dissolve into
dictionary words without syntax are called salad, after their normal start and not before the
salad begins; run-on sentences, product titles, word lists, loops and code are not."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from proxy.detect import Detector, DetectorConfig
from proxy.detect.salad import lexicon
from proxy.detect.word_runs import WordRuns
from tests.detect.conftest import only, stream

RUNS = Path(__file__).resolve().parent.parent / "data" / "salad" / "runs.jsonl"
ROWS: list[dict[str, Any]] = [
    json.loads(line) for line in RUNS.read_text(encoding="utf-8").splitlines()
]
SALAD = [r for r in ROWS if r["expect"] == "salad"]
QUIET = [r for r in ROWS if r["expect"] == "none"]
ONLY_SALAD = only("salad", "end_judgement")
#: The salad of ``gibberish-en-2`` from its first invented word on (SmolLM2-135M on vLLM).
SALAD_RUN = next(r["text"] for r in SALAD if r["id"] == "gibberish-en-2").split("keenened ")[1]
#: An opening in sentences, written for these tests.
OPENING = (
    "Here is what I found when I looked at the question again. The answer depends on a few "
    "things, and I will go through them one at a time. "
)


def _ids(rows: list[dict[str, Any]]) -> list[str]:
    return [row["id"] for row in rows]


@pytest.mark.parametrize("row", SALAD, ids=_ids(SALAD))
def test_real_salad_of_real_words_is_called_salad_after_it_begins(row: dict[str, Any]) -> None:
    """An answer read as turning into dictionary words without syntax gets a salad verdict
    while it streams (not only at the end), after the first word of the salad, within a
    window's reach of it, with an onset no later than that word (the cut keeps no salad)."""
    detector = Detector(ONLY_SALAD, expected_language="en")
    verdict = None
    for delta in row["text"].split(" "):
        verdict = detector.feed(delta + " ")
        if verdict is not None:
            break
    assert verdict is not None and verdict.signal == "salad"
    assert row["onset"] <= verdict.fired_at_char <= row["onset"] + 800
    assert verdict.onset_char <= row["onset"]
    assert detector.evidence["function_word_share"] <= 0.15
    assert verdict.score == 1.0 - detector.evidence["function_word_share"]


@pytest.mark.parametrize("row", QUIET, ids=_ids(QUIET))
def test_runs_of_words_with_syntax_or_a_list_are_not_salad(row: dict[str, Any]) -> None:
    """Long sentences without punctuation (healthy answers of real models; a small model's
    run-on monologues, which keep their function words: "which", "their", "because" are
    among the language's hundred most frequent words), a product title in capitals and a
    foreign stop-word list in a source file pass the salad signal."""
    assert stream(row["text"], ONLY_SALAD, expected_language=row["lang"]).verdict is None


def test_a_run_of_words_that_starts_the_answer_is_not_salad() -> None:
    """Salad is what an answer dissolves into: text that is a run of words from its first
    word on (keywords asked for, a word list) has shown no grammar to lose."""
    assert stream(SALAD_RUN, ONLY_SALAD, expected_language="en").verdict is None
    found = stream(OPENING + SALAD_RUN, ONLY_SALAD, expected_language="en").verdict
    assert found is not None and found.signal == "salad"
    assert found.onset_char >= len(OPENING)


def test_salad_in_a_code_fence_or_broken_by_lines_is_not_judged() -> None:
    """Fenced code is not prose; a line break ends a run (lines of a few words are list
    items or verses)."""
    fenced = OPENING + "\n```text\n" + SALAD_RUN + "\n```\n"
    assert stream(fenced, ONLY_SALAD, expected_language="en").verdict is None
    words = SALAD_RUN.split(" ")
    lines = "\n".join(" ".join(words[i : i + 8]) for i in range(0, len(words), 8))
    assert stream(OPENING + lines, ONLY_SALAD, expected_language="en").verdict is None


def test_words_in_source_code_are_not_judged() -> None:
    """Unfenced source code (a comment of words in a module) is not prose, as for the
    repetition signals: a comment may list words without syntax."""
    code = (
        "import json\nfrom pathlib import Path\n\nCACHE = {}\n\n\n"
        "def load(path):\n"
        '    """Read the file at the path and return the list of the words that it holds."""\n'
        "    words = Path(path).read_text().split()\n"
        "    CACHE[path] = words\n"
        "    return words\n\n"
        "# " + SALAD_RUN[:400] + "\n"
    )
    assert stream(code, ONLY_SALAD, expected_language="en").verdict is None


def test_a_sorted_list_is_not_salad() -> None:
    """Words in alphabetical order are an index or a word list, not a heap of words."""
    words = sorted(set(SALAD_RUN.split(" ")[:120]))
    sorted_run = OPENING + " ".join(w for w in words if w.isalpha() and w.islower())
    assert stream(sorted_run, ONLY_SALAD, expected_language="en").verdict is None


def test_a_loop_of_two_words_is_not_salad() -> None:
    """A run that repeats a word or two is a loop (the repetition signals' business): salad
    brings new words. The loop of a real answer of the tuning half (``ae-tulu-2-dpo-7b-77``,
    a recipe's ingredient list that ends in "chopped freshly" until the token limit)."""
    loop = (
        "* 1/4 cup chopped lemongrass stalks\n* 1/4 cup chopped lemongrass\n"
        "* 1/4 cup chopped freshly chopped freshly\n* 1/4 cup" + " chopped freshly" * 60
    )
    text = OPENING + loop
    assert stream(text, ONLY_SALAD, expected_language="en").verdict is None


def test_words_of_another_language_are_not_salad_of_this_one() -> None:
    """The Swedish stop-word list of ``lunr.sv.js`` (real-file set, in any order): words
    without syntax too, but not English words (most are rarer than one in a million in
    English), so not English salad."""
    (row,) = [r for r in QUIET if r["id"] == "realfile-lunr-sv"]
    words = row["text"].split("generateStopWordFilter('")[1].split("'")[0].split(" ")
    shuffled = " ".join(words[i] for i in sorted(range(len(words)), key=lambda i: (i * 37) % 113))
    text = OPENING + shuffled + "."
    assert stream(text, ONLY_SALAD, expected_language="en").verdict is None


def test_only_languages_with_a_word_list_are_judged() -> None:
    """No expected language, or one without a large word list: the shape stays off."""
    config = DetectorConfig()
    assert not WordRuns(config, None).active
    assert not WordRuns(config, "tr").active
    assert WordRuns(config, "en").active
    assert not WordRuns(dataclasses.replace(config, salad=False), "en").active


def test_function_words_and_common_words_come_from_the_word_list() -> None:
    """The language's hundred most frequent words are its function words (no digit tokens);
    a common word is one of at least one in a million."""
    english = lexicon("en")
    assert english is not None
    assert {"the", "of", "and", "which", "their", "because"} <= english.function_words
    assert len(english.function_words) == 100
    assert all(w.isalpha() for w in english.function_words)
    assert english.is_common("happiness") and english.is_common("filtering")
    assert not english.is_common("keenened") and not english.is_common("edifiratory")


@settings(max_examples=25, deadline=None)
@given(st.lists(st.integers(min_value=1, max_value=40), min_size=1, max_size=30))
def test_the_verdict_does_not_depend_on_how_the_text_is_cut(sizes: list[int]) -> None:
    """Deltas of any size (split inside words, across line breaks) give the same onset: a word
    is judged only once the whitespace after it has arrived."""
    text = OPENING + SALAD_RUN[:900]
    whole = stream(text, ONLY_SALAD, expected_language="en").verdict
    assert whole is not None
    detector = Detector(ONLY_SALAD, expected_language="en")
    at, i = 0, 0
    verdict = None
    while at < len(text) and verdict is None:
        size = sizes[i % len(sizes)]
        verdict = detector.feed(text[at : at + size])
        at += size
        i += 1
    verdict = verdict or detector.finish().verdict
    assert verdict is not None and verdict.onset_char == whole.onset_char
