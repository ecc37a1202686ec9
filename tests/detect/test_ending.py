"""End-of-stream judgement: short answers that the streaming thresholds leave unjudged."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from proxy.core.rewrite import RewritePolicy, rewrite_request
from proxy.detect import Detector, DetectorConfig
from proxy.detect.ending import fallback_languages, final_drift, final_flood, identified_units
from tests.detect.conftest import stream
from tests.detect.texts import CHINESE, ENGLISH, ITALIAN, as_deltas

# A base model's answer: the Italian prompt restated, then English until the end.
RESTATED = "Scrivi un breve saggio sull'importanza del voto nelle democrazie moderne. "
SHORT_DRIFT = RESTATED + ENGLISH[:160]

NO_END = DetectorConfig(end_judgement=False)


def streamed_only(text: str, config: DetectorConfig, **kw: object) -> bool:
    """Whether any feed() returned a verdict (the streaming signals, before finish())."""
    detector = Detector(config, **kw)  # type: ignore[arg-type]
    return any(detector.feed(d) is not None for d in as_deltas(text))


def test_short_answer_that_ends_in_english_is_drift_at_the_end() -> None:
    """Restated prompt in Italian, then 160 characters of English, then the end: the streaming
    signal has too little text, the end-of-stream judgement has enough."""
    assert not streamed_only(SHORT_DRIFT, DetectorConfig(), expected_language="it")
    assert stream(SHORT_DRIFT, NO_END, expected_language="it").verdict is None
    verdict = stream(SHORT_DRIFT, expected_language="it").verdict
    assert verdict is not None and verdict.signal == "language-drift"
    assert len(RESTATED) - 5 <= verdict.onset_char <= len(RESTATED) + 5
    assert verdict.fired_at_char == len(SHORT_DRIFT)


def test_short_answer_in_the_expected_language_passes() -> None:
    assert stream(ITALIAN[:500], expected_language="it").verdict is None
    assert stream(ENGLISH[:500], expected_language="en").verdict is None


def test_a_short_english_aside_that_does_not_end_the_answer_passes() -> None:
    """Foreign text in the middle, under half of the answer, is a quotation, not drift."""
    text = ITALIAN[:400] + ENGLISH[:150] + ITALIAN[400:800]
    assert stream(text, expected_language="it").verdict is None


def test_without_a_request_language_the_opening_is_the_reference() -> None:
    verdict = stream(SHORT_DRIFT).verdict
    assert verdict is not None and verdict.signal == "language-drift"


def test_without_a_request_language_english_into_another_language_passes() -> None:
    """English turning into Italian is a localised page under an English heading."""
    assert stream(ENGLISH[:120] + ITALIAN[:600]).verdict is None
    assert fallback_languages("en") == frozenset()
    assert "en" in fallback_languages("it") and "zh" not in fallback_languages("ja")


def test_units_are_sentences_identified_one_by_one() -> None:
    units = identified_units(SHORT_DRIFT)
    assert units[0].code == "it" and units[0].start == 0
    assert {u.code for u in units[1:]} == {"en"}


def test_final_drift_reports_the_share_and_where_the_foreign_text_starts() -> None:
    found = final_drift(SHORT_DRIFT, "it")
    assert found is not None
    share, onset = found
    assert 0.6 < share <= 1.0 and onset == len(RESTATED)
    assert final_drift(SHORT_DRIFT, "en") is None or final_drift(SHORT_DRIFT, "en")[0] < 0.5  # type: ignore[index]


@pytest.mark.parametrize(
    "tail",
    ["ha" * 40, " no" * 27, "!!" * 30, "\U0001f600" * 45],
    ids=["syllable", "word", "exclamations", "emoji"],
)
def test_a_flood_in_the_last_80_characters_is_caught_at_the_end(tail: str) -> None:
    text = ENGLISH[:400] + tail
    assert not streamed_only(text, DetectorConfig())
    verdict = stream(text).verdict
    assert verdict is not None and verdict.signal == "token-flood"
    assert abs(verdict.onset_char - 400) <= 3


@pytest.mark.parametrize(
    ("unit", "copies", "signal"),
    [("的", 45, "token-flood"), ("谢谢", 25, "token-flood"), ("暴风雪礼赞", 13, "repetition")],
    ids=["char", "word", "phrase"],
)
def test_a_chinese_flood_at_the_end_is_named_by_its_words(
    unit: str, copies: int, signal: str
) -> None:
    """The end judgement names what it finds as the streaming one does: a phrase of five
    ideographs ("ode to the blizzard") repeated is a loop, a word repeated a flood. The
    repeating starts with the second copy (of the shortest unit: 谢谢 is 谢 twice)."""
    text = CHINESE + unit * copies
    assert not streamed_only(text, DetectorConfig())
    verdict = stream(text).verdict
    assert verdict is not None and verdict.signal == signal
    assert len(CHINESE) < verdict.onset_char <= len(CHINESE) + len(unit)


@pytest.mark.parametrize(
    "tail", ["-" * 80, "=" * 80, "\n" * 40, "| --- " * 12], ids=["rule", "double", "blank", "table"]
)
def test_layout_at_the_end_is_not_a_flood(tail: str) -> None:
    assert final_flood(ENGLISH[:400] + tail) is None
    assert stream(ENGLISH[:400] + tail).verdict is None


def test_a_short_answer_that_ends_in_three_copies_of_a_sentence_is_a_loop() -> None:
    sentence = "I am a professional writer offering a good amount of experience in editing. "
    text = ENGLISH[:200] + sentence * 3
    assert not streamed_only(text, DetectorConfig())
    verdict = stream(text).verdict
    assert verdict is not None and verdict.signal == "repetition"


def test_end_judgement_is_a_switch() -> None:
    assert stream(ENGLISH[:400] + "ha" * 40, NO_END).verdict is None


# -- the expected language from the prompt (proxy.core.rewrite) ---------------------------------


def chat(text: str) -> dict[str, object]:
    return {"model": "m", "messages": [{"role": "user", "content": text}], "stream": True}


def test_the_prompt_language_is_expected_without_injecting_anything() -> None:
    body = chat("Scrivi un breve saggio sull'importanza del voto nelle democrazie moderne.")
    rw = rewrite_request(body, "chat", RewritePolicy())
    assert (rw.expected_language, rw.injected_language) == ("it", None)
    assert rw.body["messages"] == body["messages"]


def test_expect_language_off_expects_nothing() -> None:
    body = chat("Scrivi un breve saggio sull'importanza del voto nelle democrazie moderne.")
    rw = rewrite_request(body, "chat", RewritePolicy(expect_language="off"))
    assert rw.expected_language is None


def test_the_setting_reaches_the_policy() -> None:
    from proxy.settings import Settings

    policy = RewritePolicy.from_settings(Settings(expect_language="off"))
    assert policy.expect_language == "off"
    assert RewritePolicy.from_settings(Settings()).expect_language == "prompt"


def test_a_quoted_phrase_does_not_make_an_english_sentence_german() -> None:
    """Small models answer a German prompt with English sentences about the prompt; the quoted
    German inside them is mentioned, not written in."""
    prompt = "Schreibe eine kurze Geschichte über eine Katze, die fliegen lernt."
    text = (
        f'{prompt}\n\nIn German, the phrase "{prompt[:-1]}" translates to a story about a cat'
        " that learns to fly, and it is a common way to start a children's book in English."
    )
    units = identified_units(text)
    assert [u.code for u in units] == ["de", "en"]
    verdict = stream(text, expected_language="de").verdict
    assert verdict is not None and verdict.signal == "language-drift"


def test_a_counter_loop_cut_short_by_the_token_limit_is_a_loop_at_the_end() -> None:
    """Five copies that differ only in a year: too few for the streaming counter check, enough
    when the answer ends in them; a countdown of the same length still passes."""
    loop = "".join(f"{y} was the year of the dragon, the year of fire. " for y in range(2019, 2024))
    assert not streamed_only(ENGLISH[:200] + loop, DetectorConfig())
    verdict = stream(ENGLISH[:200] + loop).verdict
    assert verdict is not None and verdict.signal == "repetition"
    # The repeating starts with the second copy (the first is content).
    assert abs(verdict.onset_char - (200 + len(loop) // 5)) <= 3
    countdown = "".join(
        f"{n} was the year of the dragon, the year of fire. " for n in range(9, 4, -1)
    )
    assert stream(ENGLISH[:200] + countdown).verdict is None


def test_a_quotation_that_ends_a_sentence_stays_in_its_unit() -> None:
    prompt = "Napisz opowiadanie z trzydziestu akapitów, numerując każdy akapit."
    text = f'{prompt}\n\nThis is a common Polish expression that translates to "{prompt}"'
    units = identified_units(text)
    assert [u.code for u in units] == ["pl", "en"]


def test_an_english_prompt_expects_what_it_asks_for_or_english() -> None:
    """ "Write a story in Italian" is an English prompt whose healthy answer is Italian: the
    request sets the expectation. Without one, the conversation's own language is expected, so
    an English question answered in Chinese is judged."""
    body = chat("Write a 75-paragraph story in Italian, numbering each paragraph")
    assert rewrite_request(body, "chat", RewritePolicy()).expectation.accepted == {"it"}
    body = chat("Write a 75-paragraph story about the sea, numbering each paragraph")
    found = rewrite_request(body, "chat", RewritePolicy()).expectation
    assert (found.code, found.accepted) == ("en", {"en"})


def test_a_chinese_answer_that_ends_in_four_copies_of_a_sentence_is_a_loop() -> None:
    """CJK characters weigh three (a word each, not a letter): four copies of a 30-character
    sentence cover enough text."""
    sentence = "你可以在这里提供更多的副歌，我可以在这里提供更多的副歌。\n\n"
    verdict = stream("没有。" + sentence * 4).verdict
    assert verdict is not None and verdict.signal == "repetition"


def test_lines_of_nothing_but_markup_at_the_end_are_a_flood() -> None:
    verdict = stream(ENGLISH[:300] + "#\n\n" * 20).verdict
    assert verdict is not None and verdict.signal == "token-flood"


def test_a_list_item_with_a_bracket_and_a_semicolon_is_prose() -> None:
    """ "1) A home office and a work laptop;" is a list item, not code: it is identified."""
    text = "Hoe kies je? You have a choice between two options of this kind:\n"
    text += "1) A home office and a work laptop;\n2) An old room with an antique desk in it.\n"
    assert {u.code for u in identified_units(text)} == {"en"}
    verdict = stream(text, expected_language="nl").verdict
    assert verdict is not None and verdict.signal == "language-drift"


def test_a_verdict_at_the_end_of_a_non_streamed_answer_ends_it_as_the_guard_does() -> None:
    """A non-streamed answer judged when its finish arrives gets the guard's ending (its
    verdict, the abort's finish reason) though the engine finished it: nothing was stopped."""
    from proxy.core.guard import StreamGuard
    from proxy.core.policy import GuardPolicy
    from tests.test_relay import stream as sse_stream

    whole = sse_stream([SHORT_DRIFT])
    guard = StreamGuard(
        GuardPolicy.create(mode="enforce", collect=True), lambda: Detector(expected_language="it")
    )
    guard.feed(whole)
    guard.eof()
    [record] = guard.records(None)
    assert record.detection_action == "aborted"
    assert record.summary is not None and record.summary.verdict is not None
    assert record.summary.verdict.signal == "language-drift"
    answer = guard.response(trim=False)
    assert answer["choices"][0]["finish_reason"] == "content_filter"
    assert answer["choices"][0]["guard"]["signal"] == "language-drift"
    assert guard.outcome() == "completed"


def _finish_of(out: bytes) -> dict[str, object]:
    chunks = [json.loads(line[6:]) for line in out.decode().split("\n") if line[6:7] == "{"]
    return next(
        c["choices"][0] for c in chunks if c.get("choices") and c["choices"][0].get("finish_reason")
    )


def test_a_streamed_answer_wholly_in_the_wrong_language_is_judged_at_its_finish() -> None:
    """A short answer too small for the streaming drift check reaches the client whole; its
    finish event still carries the verdict (finish reason, guard object), as
    ``coherence-guard score`` judges it, and the engine's own ending follows untouched."""
    from proxy.core.guard import GuardPolicy, StreamGuard
    from tests.test_relay import stream as sse_stream

    assert stream(SHORT_DRIFT, expected_language="it").verdict is not None  # judged at the end
    whole = sse_stream([SHORT_DRIFT])
    guard = StreamGuard(
        GuardPolicy.create(mode="enforce"), lambda: Detector(expected_language="it")
    )
    out = guard.feed(whole) + guard.eof()
    finish = _finish_of(out)
    assert finish["finish_reason"] == "content_filter"
    assert finish["guard"]["signal"] == "language-drift"  # type: ignore[index]
    assert out.endswith(b"data: [DONE]\n\n") and guard.saw_done
    [record] = guard.records(None)
    assert record.detection_action == "aborted"
    assert record.summary is not None and record.summary.chars == len(SHORT_DRIFT)


def test_a_streamed_answer_ending_in_a_short_loop_is_judged_at_its_finish() -> None:
    """A loop too short for the streaming thresholds is judged when the answer's finish
    arrives; in monitor mode it is recorded as observed and the bytes are untouched."""
    from proxy.core.guard import GuardPolicy, StreamGuard
    from tests.test_relay import stream as sse_stream

    loop = "".join(f"{y} was the year of the dragon, the year of fire. " for y in range(2019, 2024))
    text = ENGLISH[:200] + loop
    assert not streamed_only(text, DetectorConfig())  # nothing fires while streaming
    whole = sse_stream([text])
    guard = StreamGuard(GuardPolicy.create(mode="enforce"), lambda: Detector())
    assert _finish_of(guard.feed(whole) + guard.eof())["finish_reason"] == "content_filter"
    [record] = guard.records(None)
    assert record.summary is not None and record.summary.verdict is not None
    assert record.summary.verdict.signal == "repetition"
    watch = StreamGuard(GuardPolicy.create(mode="monitor"), lambda: Detector())
    assert watch.feed(whole) + watch.eof() == whole
    [record] = watch.records(None)
    assert record.detection_action == "observed"


@pytest.mark.parametrize(
    "tail",
    [
        "".join(f"{y} was the year of the dragon, the year of fire. " for y in range(2019, 2024)),
        "Then the model says the same long thing again and again and again. " * 3,
        "ha" * 30,
    ],
    ids=["counter", "exact", "flood"],
)
def test_the_end_checks_leave_repetition_in_code_alone(tail: str) -> None:
    """A loop, counter loop or flood the answer ends in is one at the end of prose, and
    nothing inside an open code fence (code repeats by design), whichever check finds it."""
    verdict = stream(ENGLISH[:200] + tail).verdict
    assert verdict is not None and verdict.fired_at_char == 200 + len(tail)  # at the end
    assert stream(ENGLISH[:200] + "\n```text\n" + tail).verdict is None


# Real texts that end in another language (tests/data/detect/endings.jsonl says where from): a
# Qwen1.5-110B answer, English for 2,003 characters, then point 8 and its conclusion in Chinese;
# a Russian manual page whose last section is untranslated English.
DATA = Path(__file__).parent.parent / "data" / "detect"
ENDINGS = {
    row["id"]: row["text"]
    for row in map(json.loads, (DATA / "endings.jsonl").read_text("utf-8").splitlines())
}


def test_an_english_answer_that_ends_in_chinese_is_drift() -> None:
    """An answer that leaves English for a script no accepted language is written in, and never
    comes back, drifted: it is no untranslated part of a document (those are in English)."""
    verdict = stream(ENDINGS["ae-Qwen1.5-110B-Chat-62"], expected_language="en").verdict
    assert verdict is not None and verdict.signal in ("language-drift", "script-intrusion")
    assert verdict.onset_char > ENDINGS["ae-Qwen1.5-110B-Chat-62"].index("7. Media")
    both = Detector(expected_language="en", accepted_languages=frozenset({"en", "zh"}))
    for piece in ENDINGS["ae-Qwen1.5-110B-Chat-62"].split(" "):
        both.feed(piece + " ")
    assert both.finish().verdict is None  # Chinese asked for (named): no drift


def test_a_localised_page_that_ends_in_english_is_not_drift() -> None:
    """English at the end of a Russian page is its untranslated part, not drift."""
    assert stream(ENDINGS["man-ru-persistent-keyring.7"], expected_language="ru").verdict is None
