"""Real text that mixes scripts, formulas, code and units, German compounds and lists of names
passes the gibberish and salad signals; real answers that leave their language late are caught.

Every text is real and keeps its source (``tests/data/mixed/samples.jsonl``): answers of the
development corpus with formulas in Chinese and Japanese, translation catalogues of Debian
packages (Thai, Korean and Japanese with options and code, German with long compounds,
Portuguese with a list of program names), formulas and a phrase quoted from real answers in the
project's issue 27, and real answers in Spanish and English for the drift splices.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest

from proxy.detect import DetectorConfig
from proxy.detect.ending import identified_units
from proxy.detect.gibberish import script_changes
from proxy.detect.salad import ProseWords, WordSalad, lexicon
from tests.detect.conftest import stream

SAMPLES = Path(__file__).resolve().parent.parent / "data" / "mixed" / "samples.jsonl"
ROWS: dict[str, dict[str, Any]] = {
    row["id"]: row for row in map(json.loads, SAMPLES.read_text(encoding="utf-8").splitlines())
}
FORMULAS = [r for r in ROWS.values() if r["kind"] == "cjk-formula"]
HEALTHY = [r for r in ROWS.values() if r["use"] == "healthy"]


def _ids(rows: list[dict[str, Any]]) -> list[str]:
    return [row["id"] for row in rows]


def test_every_sample_names_its_source() -> None:
    assert all(row["source"] and row["text"] for row in ROWS.values())


@pytest.mark.parametrize("row", FORMULAS, ids=_ids(FORMULAS))
def test_formulas_against_cjk_letters_are_no_script_change(row: dict[str, Any]) -> None:
    """``μ是``, ``8πです``, ``→有``: a formula inside Chinese or Japanese is a context, not a
    change of script (each of these counted as soup before)."""
    assert script_changes(row["text"]) == 0


def test_soup_still_changes_script() -> None:
    """What the soup signal is for still counts: Hebrew into Arabic, Cyrillic into a Latin
    ligature, a technical symbol into a letterlike one, enclosed digits into Greek."""
    assert script_changes("אل ѕﬂе ⍸ℳ ③Χ") == 5


@pytest.mark.parametrize("row", HEALTHY, ids=_ids(HEALTHY))
def test_real_mixed_text_gets_no_verdict(row: dict[str, Any]) -> None:
    """Streamed with its language expected and every signal on."""
    assert stream(row["text"], expected_language=row["lang"]).verdict is None


def test_german_compounds_are_words() -> None:
    """Closed compounds of two listed words are German, not salad: the phrase from real
    technical prose that fired the signal, and compounds from Debian's German catalogues."""
    words = lexicon("de")
    assert words is not None
    texts = [ROWS["issue-27-german"]["text"]]
    texts += [r["text"] for r in ROWS.values() if r["id"].startswith("mo-de-")]
    found = [w for text in texts for w, _, _ in ProseWords().feed(text, final=True)]
    unknown = [w for w in found if words.unknown(w) and not words.compound(w)]
    assert unknown == [] and len(found) > 20
    assert words.compound("krankheitsrelevanten") and words.compound("transkriptomischen")
    # Invented words of a 135M model's German salad do not split into two real ones.
    assert not any(words.compound(w) for w in ("vergadspunkten", "haupseitstufen"))


def test_items_of_an_enumeration_do_not_count_as_salad() -> None:
    """``como msgfmt, msgmerge, msgcat.``: a word between two commas is an item of a list (a
    name or a term); salad is invented words in running sentences."""
    text = ROWS["mo-pt_BR-gettext-tools"]["text"]
    listed = {w for w, _, flag in ProseWords().feed(text, final=True) if flag}
    assert listed == {"msgmerge"}
    salad = WordSalad(DetectorConfig(), "pt")
    salad.update(text, final=True)
    assert "msgmerge" not in {w for w, unknown, _ in salad._window if unknown}


def test_enumeration_is_seen_across_deltas() -> None:
    text = "as línguas locais: emakhuwa, xichangana, cisena, elomwe e outras. "
    whole = ProseWords().feed(text, final=True)
    words = ProseWords()
    pieces = [words.feed(text[i : i + 3]) for i in range(0, len(text), 3)]
    assert [w for piece in pieces for w in piece] == whole
    assert [w for w, _, flag in whole if flag] == ["xichangana", "cisena"]


ONLY_DRIFT = DetectorConfig(
    **{
        f.name: False
        for f in dataclasses.fields(DetectorConfig)
        if f.type in (bool, "bool") and f.name not in ("language_drift", "end_judgement")
    }
)


def _english_ending(tail_id: str) -> str:
    """A real English answer's start, cut at its first sentence end after 150 characters."""
    tail: str = ROWS[tail_id]["text"]
    return tail[: tail.find(". ", 150) + 1]


@pytest.mark.parametrize(
    ("start_id", "lang", "tail_id"),
    [
        ("dev-fc-ja-gpt-4-31-t1", "ja", "dev-lcb-llama-3-instruct-en-okapi-39"),
        ("dev-fc-ja-gpt-4-31-t1", "ja", "dev-lcb-mistral-large-en-okapi-62"),
        (
            "dev-lcb-llama-3-instruct-es-native_prompts-56",
            "es",
            "dev-lcb-mistral-large-en-okapi-62",
        ),
    ],
)
def test_a_short_english_ending_after_a_whole_answer_is_drift(
    start_id: str, lang: str, tail_id: str
) -> None:
    """A real answer, then one or two real English sentences to the end (a model that drifts
    late in a length-capped answer): the English is under a third of the text, so the share
    alone missed it, but it is more than a title or a quotation. The Japanese answer's formula
    lines used to swallow the English after them (one code-like unit, dropped)."""
    start = ROWS[start_id]["text"]
    text = start + "\n\n" + _english_ending(tail_id)
    verdict = stream(text, ONLY_DRIFT, expected_language=lang).verdict
    assert verdict is not None and verdict.signal == "language-drift"
    assert len(start) - 60 <= verdict.onset_char <= len(start) + 2


def test_an_english_title_at_the_end_is_not_drift() -> None:
    """One short foreign unit at the end (a title, a quotation) stays below the bar."""
    start = ROWS["dev-lcb-llama-3-instruct-es-native_prompts-56"]["text"]
    title = ROWS["dev-lcb-mistral-large-en-okapi-62"]["text"].split("\n")[0]
    text = start[: start.rfind(". ", 0, 400) + 2] + "\n\n" + title
    assert stream(text, ONLY_DRIFT, expected_language="es").verdict is None


def test_a_japanese_sentence_that_goes_on_in_english_is_two_units() -> None:
    """A model that leaves Japanese in the middle of a sentence: the Japanese part and the
    English part are identified apart (as one unit the mixture identified as neither)."""
    head = ROWS["dev-fc-ja-gpt-4-31-t1"]["text"].split("\n")[0]
    head = head[: head.index("用いて") + 3]
    english: str = ROWS["dev-lcb-llama-3-instruct-en-okapi-39"]["text"]
    body = english[english.index("proponents") : english.index(". ") + 1]
    units = identified_units(head + body)
    assert [u.code for u in units] == ["ja", "en"]
    assert units[1].start == len(head)
