"""The word-salad signal: real salad from a 135M model fires, healthy text of the same languages
(technical pages with the most unknown words, LLM answers) does not; the word extraction is
incremental and ignores code, names and identifiers."""

from __future__ import annotations

import dataclasses
import json
import unicodedata
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from proxy.detect import SIGNALS, Detector, DetectorConfig
from proxy.detect.salad import (
    SALAD_LANGUAGES,
    ProseWords,
    WordSalad,
    lexicon,
    list_path,
    normalise,
    prose_words,
    sorted_ranges,
)
from tests.detect.conftest import only, stream
from tests.detect.texts import as_deltas

SAMPLES = Path(__file__).resolve().parent.parent / "data" / "salad" / "samples.jsonl"
ROWS: list[dict[str, Any]] = [
    json.loads(line) for line in SAMPLES.read_text(encoding="utf-8").splitlines()
]


def _ids(rows: list[dict[str, Any]]) -> list[str]:
    return [row["id"] for row in rows]


SALAD = [r for r in ROWS if r["expect"] == "salad"]
QUIET = [r for r in ROWS if r["expect"] == "none"]
ONLY_SALAD = only("salad", "end_judgement")


def test_samples_cover_every_language_and_name_their_source() -> None:
    assert all(row["source"] for row in ROWS)
    assert {row["lang"] for row in SALAD} == SALAD_LANGUAGES
    healthy = {row["lang"] for row in QUIET if row["label"] == "healthy"}
    assert healthy == SALAD_LANGUAGES
    assert "salad" in SIGNALS


@pytest.mark.parametrize("row", SALAD, ids=_ids(SALAD))
def test_real_salad_is_called_salad(row: dict[str, Any]) -> None:
    """An answer read as salad ends with a salad verdict whose onset is an invented word (or,
    where a run of words without syntax was seen first, the first word of that run)."""
    detector = Detector(expected_language=row["lang"])
    for delta in as_deltas(row["text"]):
        if detector.feed(delta) is not None:
            break
    verdict = detector.finish().verdict
    assert verdict is not None and verdict.signal == "salad"
    assert 0.25 <= verdict.score <= 1.0
    if "function_word_share" in detector.evidence:
        return  # the run shape (tests/detect/test_word_runs.py)
    first = row["text"][verdict.onset_char :].split()[0]
    words = lexicon(row["lang"])
    assert words is not None
    assert first.strip(".,;:!?\"'()«»") not in words


@pytest.mark.parametrize("row", QUIET, ids=_ids(QUIET))
def test_healthy_and_real_text_is_not_salad(row: dict[str, Any]) -> None:
    """Man pages and documentation full of option names, LLM answers, and clumsy but real
    sentences of a small model pass the salad signal (every other signal off)."""
    assert stream(row["text"], ONLY_SALAD, expected_language=row["lang"]).verdict is None


def test_long_salad_fires_while_streaming() -> None:
    """A salad longer than the window is cut while it streams, not only at the end."""
    (row,) = [r for r in ROWS if r["expect"] == "salad-streaming"]
    detector = Detector(ONLY_SALAD, expected_language=row["lang"])
    text = row["text"]
    verdicts = [detector.feed(text[i : i + 12]) for i in range(0, len(text), 12)]
    fired = [v for v in verdicts if v is not None]
    assert len(fired) == 1 and fired[0].signal == "salad"
    assert fired[0].fired_at_char < len(text) - 200
    assert fired[0].onset_char < fired[0].fired_at_char


def test_salad_needs_an_expected_language_with_a_large_list() -> None:
    """Without an expected language, or for one without a large word list (Turkish,
    Indonesian, Vietnamese), the signal stays off."""
    text = SALAD[0]["text"]
    assert stream(text, ONLY_SALAD).verdict is None
    for language in ("tr", "id", "vi"):
        assert not WordSalad(DetectorConfig(), language).active
        assert stream(text, ONLY_SALAD, expected_language=language).verdict is None
    off = dataclasses.replace(ONLY_SALAD, salad=False)
    assert stream(text, off, expected_language=SALAD[0]["lang"]).verdict is None


def test_english_is_judged_while_streaming_only() -> None:
    """English changelogs and copyright files reach the end-of-stream bar on package and
    maintainer names: English salad is called from a full streaming window only."""
    (row,) = [r for r in SALAD if r["lang"] == "en"]
    words = row["text"].split()
    short = " ".join(words[-30:])
    assert stream(short, ONLY_SALAD, expected_language="en").verdict is None
    assert stream(short, ONLY_SALAD, expected_language="de").verdict is not None


def test_a_list_of_names_is_not_prose() -> None:
    """Lower-case user ids spread through a list of names and addresses are not a window of
    prose, however many are unknown."""
    (row,) = [r for r in QUIET if r["lang"] == "en"]
    spread = dataclasses.replace(ONLY_SALAD, salad_max_chars_per_word=10_000)
    assert stream(row["text"], ONLY_SALAD, expected_language="en").verdict is None
    assert stream(row["text"], spread, expected_language="en").verdict is not None


def test_a_repeated_unknown_name_is_one_unknown_word() -> None:
    """Technical prose that keeps naming one package is not salad: the window needs several
    distinct unknown words."""
    sentence = (
        "die neue version von libfoobarz bringt viele kleine verbesserungen und behebt einen "
        "fehler, der bei libfoobarz unter bestimmten bedingungen auftrat; "
    )
    text = sentence * 12
    assert stream(text, ONLY_SALAD, expected_language="de").verdict is None
    invented = text.replace("verbesserungen", "verbasserlingen").replace("fehler", "fohlrer")
    invented = invented.replace("bedingungen", "bedangulen").replace("bringt", "brongelt")
    assert stream(invented, ONLY_SALAD, expected_language="de").verdict is not None


def test_json_output_is_not_judged() -> None:
    salad = SALAD[0]
    text = json.dumps({"answer": salad["text"]}, ensure_ascii=False)
    summary = stream(text, ONLY_SALAD, expected_language=salad["lang"], structured=True)
    assert summary.verdict is None


# -- word extraction ---------------------------------------------------------------------------


def test_prose_words_skip_names_code_urls_and_identifiers() -> None:
    text = (
        "Paris ist schön. Die ``` code_block irgendwas ``` draußen `inline sachen` bleiben "
        "https://beispiel.org/seite www.beispiel.org v2.0 foo_bar pre-release a/b 3dinge "
        "«wörter», (klammern) dell'amore l’uomo rock'n'roll IPHONE iPhone"
    )
    assert prose_words(text) == [
        "schön",
        "draußen",
        "bleiben",
        "wörter",
        "klammern",
        "dell",
        "amore",
        "uomo",
        "rock",
        "roll",
    ]


def test_unclosed_fence_hides_the_rest() -> None:
    assert prose_words("gute worte\n```python\nalles hier bleibt code\n") == ["gute", "worte"]


def test_offsets_point_at_the_words() -> None:
    text = "Er sagte: «vielleicht» und ging. `code hier` dann dell'amore weiter"
    found = ProseWords().feed(text, final=True)
    assert found
    for word, offset, _ in found:
        assert text[offset : offset + len(word)] == word


_PIECES = st.sampled_from(
    [
        "schön", "wörter", "straße", "ab", "Haus", "dell'amore", "l’uomo", "rock'n'roll",
        "fohlrer", "x_y", "v2.0", "pre-release", "https://a.b/c", "«", "»", ".", ",", "(",
        " ", " ", " ", "\n", "\n\n", "\t", "`", "```", "'",
    ]
)  # fmt: skip


@settings(max_examples=300, deadline=None)
@given(pieces=st.lists(_PIECES, max_size=80), cuts=st.lists(st.integers(0, 400), max_size=8))
def test_feeding_in_pieces_finds_what_the_whole_text_holds(
    pieces: list[str], cuts: list[int]
) -> None:
    """Any split of the stream into deltas gives the same words at the same offsets."""
    text = "".join(pieces)
    whole = ProseWords().feed(text, final=True)
    words = ProseWords()
    got: list[tuple[str, int, bool]] = []
    last = 0
    for cut in sorted(min(c, len(text)) for c in cuts):
        got += words.feed(text[last:cut])
        last = cut
    got += words.feed(text[last:], final=True)
    assert got == whole


@settings(max_examples=300, deadline=None)
@given(pieces=st.lists(_PIECES.filter(lambda p: "`" not in p), max_size=80))
def test_fast_path_agrees_with_the_token_walk(pieces: list[str]) -> None:
    """Text without backticks takes one regular expression; it must find exactly what the
    token-by-token walk (used around code) finds."""
    text = "".join(pieces)
    fast = ProseWords().feed(text, final=True)
    slow = ProseWords()._tokens(text, len(text), 0)
    assert fast == slow


# -- word lists ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("language", "known", "unknown"),
    [
        ("de", ["straße", "strasse", "verbesserungen", "schön"], ["frankresien", "zutächtige"]),
        ("es", ["calefacción", "también"], ["calefacía", "ejécladas"]),
        ("fr", ["développement", "lumière"], ["évéronment", "résuracnes"]),
        ("it", ["riscaldamento", "perché"], ["potraciamo", "sicuremangi"]),
        ("nl", ["verwarming", "gedicht"], ["uitgebrukke", "raadvoloper"]),
        ("pl", ["ogrzewania", "właściciela"], ["zapliakacja", "jestlijcego"]),
        ("pt", ["fotossíntese", "também"], ["fotossíndese", "essessemos"]),
        ("ru", ["фотосинтез", "ребёнку"], ["напремителё", "разныкеры"]),
    ],
)
def test_word_lists_know_real_words_and_not_invented_ones(
    language: str, known: list[str], unknown: list[str]
) -> None:
    words = lexicon(language)
    assert words is not None and len(words) > 200_000
    for word in known:
        assert word in words
        assert unicodedata.normalize("NFD", word) in words  # decomposed accents are the same word
    for word in unknown:
        assert word not in words


def test_normalisation_is_wordfreqs_own() -> None:
    """The lists hold wordfreq's normalised forms: ours must be the same for these languages."""
    from wordfreq.preprocess import preprocess_text

    samples = ["straße", "größe", "ÉTÉ", "cañón", "łódź", "ёлка", "groß", "Ĳssel", "e\u0301te"]
    for language in sorted(SALAD_LANGUAGES):
        for word in samples:
            assert normalise(word) == preprocess_text(word, language)


@pytest.mark.parametrize("language", ["nl", "pt"])
def test_streamed_reading_holds_every_word_of_wordfreqs_list(language: str) -> None:
    """The lists are read band by band from wordfreq's data file, not through wordfreq: the
    result must hold exactly the words wordfreq itself reads from that file."""
    import wordfreq

    words = lexicon(language)
    assert words is not None
    listed = {w for band in wordfreq.read_cBpack(str(list_path(language))) for w in band}
    assert {hash(w) for w in listed} == set(words.hashes)
    assert list(words.hashes) == sorted(words.hashes)
    assert lexicon("xx") is None and list_path("xx") is None


_INT64 = st.integers(min_value=-(1 << 63), max_value=(1 << 63) - 1)
_BOUNDS = [-(1 << 63) + (i << 60) for i in range(16)]
_EDGES = st.sampled_from([*_BOUNDS, (1 << 63) - 1])


@given(st.lists(st.lists(_INT64 | _EDGES | _EDGES.map(lambda b: b - 1))))
@settings(max_examples=300)
def test_range_by_range_sorting_is_one_sort(runs: list[list[int]]) -> None:
    """The ranges (sorted one by one, so that no sort of a whole list holds the interpreter's
    lock for long) concatenate to the one sort of every item, hashes at the bounds included."""
    expected = sorted(h for run in runs for h in run)
    ranges = sorted_ranges([list(run) for run in runs], key=int)
    assert len(ranges) == 16
    assert [h for part in ranges for h in part] == expected


def test_only_dictionary_words_are_remembered_between_streams() -> None:
    """Lookups of listed words are remembered (prose repeats them); a stream's unknown words,
    which may be its names and identifiers, are never kept."""
    words = lexicon("it")
    assert words is not None
    for _ in range(2):
        assert words.unknown("potraciamo") and not words.unknown("riscaldamento")
    assert "riscaldamento" in words._known
    assert "potraciamo" not in words._known
