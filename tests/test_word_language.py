"""The language of short Latin-script prompts that fastText alone cannot place, from the
frequencies of their words: non-English questions get their language, English questions (also
those naming foreign things) never get another one."""

from __future__ import annotations

import pytest

from proxy.core.requested_language import derive, prompt_language
from proxy.detect.language import classify_top, strip_noise
from proxy.detect.salad import list_path, read_bands
from proxy.detect.word_language import Frequencies, frequencies, identify_by_words


@pytest.mark.parametrize(
    ("text", "code"),
    [
        ("Fotosentez nedir?", "tr"),
        ("Kuantum fiziği nedir?", "tr"),
        ("Wat is fotosynthese?", "nl"),
        ("Wie was Vincent van Gogh?", "nl"),
        ("Apa itu demokrasi?", "id"),
        ("Hvad er fotosyntese?", "da"),
        ("Vad är fotosyntes?", "sv"),
        ("Jak funguje fotosyntéza?", "cs"),
        ("Ce este fotosinteza?", "ro"),
        ("Mikä on fotosynteesi?", "fi"),
        ("Mi az a fotoszintézis?", "hu"),
        ("Wer war Bismarck?", "de"),
    ],
)
def test_short_questions_get_their_language(text: str, code: str) -> None:
    assert prompt_language(text) == code
    assert derive([("user", text)]).code == code


@pytest.mark.parametrize(
    "text",
    [
        "What is a Japanese tea ceremony?",
        "Who was Simon Bolivar?",
        "What is Dutch oven cooking?",
        "Who was Atatürk?",
        "What does hygge mean?",
        "Tell me about Borobudur.",
        "What is a Turkish bath?",
        "Is tofu healthy?",
        "Die Hard plot summary?",
        "Explain machine learning.",
        "Define entropy.",
        "nasi goreng recipe",
        "la vie en rose lyrics",
    ],
)
def test_english_questions_naming_foreign_things_stay_english(text: str) -> None:
    """The costly mistake: an English question given another language's expectation would
    have its correct English answer aborted."""
    assert prompt_language(text) in (None, "en")


def test_common_english_words_stay_english_whatever_fasttext_says() -> None:
    """Every word common in English: never another language, even when fastText's candidates
    put another language first (a made-up ranking here)."""
    assert identify_by_words("is it here", [("nl", 0.6), ("en", 0.3)]) is None


def test_names_and_titles_are_not_evidence() -> None:
    """Capitalised words after the first are what the prompt is about: "Sturm" and "Drang" are
    left out, and the one German word left ("und") cannot outvote "what is"."""
    clean = strip_noise("What is Sturm und Drang")
    candidates = [("en", 0.45), ("de", 0.4), ("nl", 0.05)]
    assert identify_by_words(clean, candidates) != "de"


def test_a_language_that_cannot_be_checked_blocks() -> None:
    """fastText prefers a language with no word list (Afrikaans): no guess."""
    assert identify_by_words("Wat is fotosintese", [("af", 0.5), ("nl", 0.3)]) is None


def test_both_signals_must_agree_on_the_shortlist() -> None:
    """The words alone say Turkish, but fastText does not list Turkish: no guess... unless the
    words single out one of fastText's candidates."""
    clean = strip_noise("Fotosentez nedir?")
    assert identify_by_words(clean, [("en", 0.5), ("de", 0.3)]) is None
    assert identify_by_words(clean, classify_top(clean, 5)) == "tr"


def test_frequency_lists_read_as_zipf() -> None:
    english = frequencies("en")
    assert isinstance(english, Frequencies)
    assert len(english) > 20_000
    assert 7.0 < english.zipf("the") < 8.5
    assert english.zipf("fotosynthese") == 2.0  # the floor


def test_english_words_in_the_prompt_block_another_language() -> None:
    """ "lyrics" is a common English word, ten times as frequent in English as in French: a
    prompt with it is not a French prompt, whatever the other words say."""
    clean = "la vie en rose lyrics"
    assert identify_by_words(clean, [("fr", 0.5), ("es", 0.2), ("en", 0.1)]) is None
    assert identify_by_words("la vie en rose", [("fr", 0.5), ("es", 0.2), ("en", 0.1)]) == "fr"


def test_fasttext_disfavouring_a_language_tenfold_blocks_it() -> None:
    """The words of "nasi goreng" are Indonesian, but fastText reads the prompt as English
    (0.51 against 0.035): neither signal overrules the other tenfold."""
    clean = "nasi goreng"
    assert identify_by_words(clean, [("en", 0.51), ("id", 0.035)]) is None
    assert identify_by_words(clean, [("en", 0.3), ("id", 0.2)]) == "id"


def test_other_scripts_are_left_to_their_letters() -> None:
    assert identify_by_words("was 量子 ist", [("de", 0.5), ("zh", 0.3)]) is None


def test_a_list_holds_each_words_hash_with_its_band_in_hash_order() -> None:
    """Built range by range (no sort of a whole list at once), a list is the words' (hash,
    band) pairs of wordfreq's file, sorted."""
    path = list_path("en", "small")
    assert path is not None
    pairs = sorted((hash(w), band) for band, words in read_bands(path) for w in words)
    english = frequencies("en")
    assert english is not None
    assert list(zip(english.hashes, english.bands, strict=True)) == pairs
