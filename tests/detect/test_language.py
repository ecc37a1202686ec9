"""Language identification and the language-drift signal."""

from __future__ import annotations

from proxy.detect import Detector, DetectorConfig
from proxy.detect.language import identify_language, model_path, strip_noise
from tests.detect.conftest import stream
from tests.detect.texts import CHINESE, ENGLISH, ITALIAN, PYTHON_CODE, as_deltas

LANGUAGE_ONLY = DetectorConfig(
    repetition=False,
    ngram=False,
    diversity=False,
    script=False,
    entropy=False,
    compression=False,
)


def test_the_model_ships_in_the_wheel() -> None:
    """lid.176.ftz comes with the installed package: nothing is downloaded at run time."""
    path = model_path()
    assert path.is_file()
    assert path.stat().st_size > 500_000


def test_identify_language() -> None:
    assert identify_language(ITALIAN)[0] == "it"  # type: ignore[index]
    assert identify_language(ENGLISH)[0] == "en"  # type: ignore[index]
    found = identify_language("这个问题的答案非常复杂，我们需要从多个角度进行分析。")
    code, confidence = found or ("", 0.0)
    assert code == "zh" and 0.5 < confidence <= 1.0
    assert identify_language("ok") is None


def test_strip_noise_removes_code_urls_numbers_and_markup() -> None:
    text = "Vedi https://example.com/a?b=1 e `x = 1`.\n```python\nprint('hi')\n```\n**Nota** 42"
    clean = strip_noise(text)
    assert "example" not in clean and "print" not in clean and "42" not in clean
    assert "Vedi" in clean and "Nota" in clean and "\n" not in clean


def test_italian_drifting_into_english_fires() -> None:
    text = ITALIAN + ENGLISH * 2
    summary = stream(text, LANGUAGE_ONLY, expected_language="it")
    assert summary.verdict is not None
    assert summary.verdict.signal == "language-drift"
    assert len(ITALIAN) - 200 <= summary.verdict.onset_char <= len(ITALIAN) + 200
    assert summary.verdict.fired_at_char <= len(ITALIAN) + 1300


def test_drift_is_found_without_an_expected_language() -> None:
    """With no request language, a short opening (the prompt restated) followed by English to
    the end is the shape of drift: the opening language is the reference."""
    opening = ITALIAN[: ITALIAN.index(". ") + 2]
    summary = stream(opening + ENGLISH * 2, LANGUAGE_ONLY)
    assert summary.verdict is not None and summary.verdict.signal == "language-drift"
    assert len(opening) - 60 <= summary.verdict.onset_char <= len(opening) + 130


def test_a_document_that_switches_language_for_good_passes_without_a_request_language() -> None:
    """A long Italian page that goes on in English (a page translated in part) is not a model
    asked for Italian answering in English: without a request language it passes, and so does
    English turning into another language (an English heading over a localised page)."""
    assert stream(ITALIAN + ENGLISH * 2, LANGUAGE_ONLY).verdict is None
    assert stream(ENGLISH[:200] + ITALIAN * 2, LANGUAGE_ONLY).verdict is None
    assert stream(ITALIAN + ENGLISH * 2, LANGUAGE_ONLY, expected_language="it").verdict


def test_a_short_english_quote_in_a_long_italian_text_passes() -> None:
    text = ITALIAN * 2 + ENGLISH[:250] + ITALIAN * 2
    assert stream(text, LANGUAGE_ONLY, expected_language="it").verdict is None


def test_code_blocks_do_not_count_as_english() -> None:
    text = ITALIAN + "```python\n" + PYTHON_CODE * 2 + "```\n" + ITALIAN
    assert stream(text, LANGUAGE_ONLY, expected_language="it").verdict is None


def test_answer_in_the_expected_language_passes() -> None:
    assert stream(ITALIAN * 3, LANGUAGE_ONLY, expected_language="it").verdict is None
    assert stream(ENGLISH * 3, LANGUAGE_ONLY, expected_language="en").verdict is None


def test_answer_in_the_wrong_language_from_the_start_fires() -> None:
    """A request constrained to Italian answered in English is drift from the first segment."""
    summary = stream(ENGLISH * 2, LANGUAGE_ONLY, expected_language="it")
    assert summary.verdict is not None and summary.verdict.onset_char == 0


def test_drift_after_a_long_healthy_stretch_fires() -> None:
    """Italian sliding into English after thousands of characters is still caught: old text
    fades from the share, so the English needed to fire stays bounded."""
    italian = ITALIAN * 10
    summary = stream(italian + ENGLISH * 8, LANGUAGE_ONLY, expected_language="it")
    assert summary.verdict is not None and summary.verdict.signal == "language-drift"
    assert summary.verdict.fired_at_char - len(italian) <= 4000
    assert summary.verdict.onset_char >= len(italian) - 200


def test_chinese_drifting_into_english_fires() -> None:
    """Segments without a Latin letter are taken as native in a Chinese stream; the English
    that follows is still identified and caught."""
    chinese = CHINESE * 8
    summary = stream(chinese + ENGLISH * 2, LANGUAGE_ONLY, expected_language="zh")
    assert summary.verdict is not None and summary.verdict.signal == "language-drift"
    assert summary.verdict.onset_char >= len(chinese) - 200
    assert stream(chinese * 2, LANGUAGE_ONLY, expected_language="zh").verdict is None


def test_expected_language_with_a_region_is_reduced_to_its_code() -> None:
    assert Detector(expected_language="pt-BR").expected_language == "pt"
    assert Detector(expected_language="zh_Hans").expected_language == "zh"
    assert Detector(expected_language="").expected_language is None
    assert stream(ITALIAN * 3, LANGUAGE_ONLY, expected_language="IT").verdict is None


def test_one_short_foreign_segment_is_not_enough() -> None:
    """Under 100 identified foreign characters there is too little text to call drift, even at
    the end of the stream; while streaming, 200 identified characters are needed."""
    assert stream(ENGLISH[:90], LANGUAGE_ONLY, expected_language="it").verdict is None
    assert stream(ENGLISH[:400], LANGUAGE_ONLY, expected_language="it").verdict is not None
    detector = Detector(LANGUAGE_ONLY, expected_language="it")
    assert all(detector.feed(d) is None for d in as_deltas(ENGLISH[:160]))
