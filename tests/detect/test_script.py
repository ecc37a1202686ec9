"""Script intrusion: a script foreign to the stream's established mix takes over the window."""

from __future__ import annotations

from collections import Counter

from proxy.detect import DetectorConfig
from proxy.detect.script import intruding_share, script_counts, scripts_of_language
from tests.detect.conftest import stream
from tests.detect.texts import CHINESE, ENGLISH, ITALIAN, JAPANESE

# Only the script signal, so the tests show what it alone decides.
SCRIPT_ONLY = DetectorConfig(
    repetition=False,
    ngram=False,
    diversity=False,
    language_drift=False,
    entropy=False,
    compression=False,
)


def test_script_counts_letters_per_script() -> None:
    counts = script_counts("Ciao 世界 мир ひらがな カタカナ")
    assert counts == Counter({"Latin": 4, "Han": 2, "Cyrillic": 3, "Hiragana": 4, "Katakana": 4})
    assert script_counts("plain ascii, 123!") == Counter({"Latin": 10})


def test_latin_is_never_foreign() -> None:
    """Technical terms in Latin letters inside CJK text are normal."""
    assert intruding_share(Counter({"Han": 500}), Counter({"Latin": 300, "Han": 10})) is None


def test_japanese_mix_is_one_family() -> None:
    base = Counter({"Han": 200, "Hiragana": 300, "Katakana": 50})
    assert intruding_share(base, Counter({"Katakana": 400, "Han": 100})) is None


def test_scripts_of_language() -> None:
    assert scripts_of_language("ja") == ("Han", "Hiragana", "Katakana")
    assert scripts_of_language("it") == ("Latin",)
    assert scripts_of_language(None) == ()


def test_chinese_inside_italian_fires() -> None:
    text = ITALIAN + "".join(f"Allora {CHINESE} " for _ in range(6))
    summary = stream(text, SCRIPT_ONLY)
    assert summary.verdict is not None
    assert summary.verdict.signal == "script-intrusion"
    assert summary.verdict.score >= 0.35
    assert len(ITALIAN) - 600 <= summary.verdict.onset_char <= len(ITALIAN) + 300


def test_a_few_chinese_words_in_italian_pass() -> None:
    """A quoted term (one short Han run) is not an intrusion."""
    text = ITALIAN + "La parola cinese 问题 significa problema. " + ITALIAN
    assert stream(text, SCRIPT_ONLY).verdict is None


def test_japanese_text_with_english_terms_passes() -> None:
    text = (JAPANESE + " The detector uses fastText and zlib. ") * 4
    assert stream(text, SCRIPT_ONLY).verdict is None
    assert stream(text, SCRIPT_ONLY, expected_language="ja").verdict is None


def test_expected_language_seeds_the_mix() -> None:
    """A Japanese page that opens with English options is not taken over by its Japanese."""
    text = ENGLISH[:300] + JAPANESE * 3
    assert stream(text, SCRIPT_ONLY, expected_language="ja").verdict is None


def test_gibberish_scattering_many_scripts_fires() -> None:
    """No single script takes over, but together the foreign letters do."""
    gibberish = "mesh ต่ำ 빈иё engan جاري伝 mixed नमस Heył 想着 ril التش ศาล คร 件 вза ここ 刊 પુસ્ત "
    summary = stream(ITALIAN + gibberish * 8, SCRIPT_ONLY)
    assert summary.verdict is not None
    assert summary.verdict.signal == "script-intrusion"


def test_a_list_of_greetings_in_many_languages_passes() -> None:
    """An English answer quoting a word in several scripts is not gibberish."""
    text = (
        ENGLISH
        + (
            "Here is hello in a few languages: Japanese こんにちは (konnichiwa), Chinese 你好 "
            "(ni hao), Korean 안녕하세요 (annyeonghaseyo), Russian Привет (privet), Arabic مرحبا "
            "(marhaba) and Hindi नमस्ते (namaste). Each greeting is used in everyday speech, and "
            "the romanised forms in brackets show how they sound to an English speaker. "
        )
        + ENGLISH
    )
    assert stream(text, SCRIPT_ONLY).verdict is None
