"""Expectation tiers on prompt *shapes* (templates x languages), not one phrasing.

Strong (narrows to one language): the client's header, the operator's code, an unambiguous
instruction about the answer (in English or the language's own phrasing). Weak (widens): the
conversation's own languages and every language a prompt names (a subject, a text to write, a
translation's target). None: a request for a language the detector cannot judge (never the
prompt's language instead).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest

from proxy.cli.score import split_deltas
from proxy.core.language_names import JUDGED, english_name, resolve
from proxy.core.language_rule import language_instruction
from proxy.core.requested_language import Expectation, derive
from proxy.core.rewrite import RewritePolicy, rewrite_request
from proxy.detect import Detector
from proxy.observability.metrics import Metrics
from proxy.settings import check_language
from tests.fakes.vllm import FakeVLLM, Script

# English names as people write them, and the code the detector answers with.
LANGUAGES = {
    "Spanish": "es", "French": "fr", "German": "de", "Japanese": "ja", "Korean": "ko",
    "Turkish": "tr", "Catalan": "ca", "Croatian": "hr", "Portuguese": "pt", "Chinese": "zh",
    "Arabic": "ar", "Tagalog": "tl", "Urdu": "ur", "Tamil": "ta", "Slovak": "sk",
}  # fmt: skip

SUBJECT_SHAPES = [
    "Explain the difference between por and para in {L}.",
    "Explain the difference between the two past tenses in {L}.",
    "In {L}, why does the verb move to the end of the sentence?",
    "What do English speakers get wrong in {L}?",
    "How do you say 'good night' in {L}?",
    "How do I translate 'good morning' into {L}?",
    "What is the best way to learn {L} as an adult?",
    "How do you pronounce the letter r in {L}?",
    "What are the most common greetings in {L}?",
    "Is {L} grammar hard for beginners?",
    "In {L}, how do you ask for directions politely?",
]
# Directives whose object is the answer: they narrow.
ENGLISH_REQUESTS = [
    "Please respond in {L}: what is the capital of Australia?",
    "I need the answer in {L}: how do vaccines work?",
    "Reply in {L}. Explain how a rainbow forms.",
    "Explain how a rainbow forms. Answer in {L}, please.",
    "Write your answer in {L}: why do leaves change colour?",
    "{L} only: how do vaccines work?",
    "Summarize this article in {L}.",
]
# Texts to write in a language where more may follow the name, and translations (whose answer
# may explain in the prompt's language): they widen, accepting English and the language.
ENGLISH_WIDENING = [
    "Write a short email in {L} to my landlord about a broken heater.",
    "Translate the following text into {L}: the weather is nice today.",
    "Write a 100-word poem in {L} including the words moon, river and bread.",
    "Create a dialogue in {L} between a shopkeeper and a customer.",
]
# Requests written in the requested language itself (the prompt is in that language too).
NATIVE_REQUESTS = {
    "es": "Responde en español, por favor: ¿cómo funcionan las vacunas?",
    "fr": "Réponds en français : comment fonctionnent les vaccins ?",
    "de": "Antworte bitte auf Deutsch: Wie funktionieren Impfstoffe?",
    "it": "Rispondi in italiano: come funzionano i vaccini?",
    "pt": "Responda em português: como funcionam as vacinas?",
    "ja": "日本語で答えてください：ワクチンはどのように働きますか？",
    "ko": "한국어로 답해 주세요: 백신은 어떻게 작동하나요?",
    "zh": "请用中文回答：疫苗是如何起作用的？",
    "ru": "Ответь на русском языке: как работают вакцины?",
    "ar": "أجب باللغة العربية: كيف تعمل اللقاحات؟",
    "hi": "कृपया हिंदी में उत्तर दें: टीके कैसे काम करते हैं?",
    "tr": "Lütfen Türkçe cevap ver: aşılar nasıl çalışır?",
    "pl": "Odpowiedz po polsku: jak działają szczepionki?",
    "cs": "Odpověz česky: jak fungují vakcíny?",
    "vi": "Trả lời bằng tiếng Việt: vắc-xin hoạt động như thế nào?",
}
# A request for a third language in another language's prompt.
CROSS_REQUESTS = {
    "ca": "Antworte bitte auf Katalanisch: Wie funktionieren Impfstoffe?",
    "cs": "Odpowiedz po czesku: Jak działają szczepionki?",
    "hr": "Réponds en croate : comment fonctionnent les vaccins ?",
    "sk": "Responde en eslovaco: ¿cómo funcionan las vacunas?",
    "tl": "Rispondi in tagalog: come funzionano i vaccini?",
    "ko": "Responda em coreano: como funcionam as vacinas?",
}
# Languages fastText lid.176 cannot identify, named in English and in other languages.
UNJUDGED_REQUESTS = [
    "Reply in Zulu: how do vaccines work?",
    "Please respond in Hausa.",
    "Write a short email in Maori to my landlord.",
    "Antworte bitte auf Zulu: Wie funktionieren Impfstoffe?",
    "Réponds en haoussa : comment fonctionnent les vaccins ?",
]
AUTO = RewritePolicy(language="auto")


def chat(text: str) -> dict[str, object]:
    return {"model": "m", "messages": [{"role": "user", "content": text}]}


def pairs(shapes: list[str], names: list[str], per_shape: int) -> list[tuple[str, str]]:
    """Each shape with ``per_shape`` languages, the languages taken in turn."""
    return [
        (shape, names[(i * per_shape + k) % len(names)])
        for i, shape in enumerate(shapes)
        for k in range(per_shape)
    ]


SUBJECT_NAMES = ["Spanish", "German", "Japanese", "Catalan", "Turkish", "Arabic", "Croatian"]
REQUEST_NAMES = ["Spanish", "Korean", "Turkish", "Catalan", "Croatian", "Urdu", "Tagalog"]


def derive_prompt(text: str) -> Expectation:
    return derive([("user", text)])


@pytest.mark.parametrize(("shape", "name"), pairs(SUBJECT_SHAPES, SUBJECT_NAMES, 3))
def test_a_language_as_the_subject_is_weak_and_accepts_english(shape: str, name: str) -> None:
    found = derive_prompt(shape.format(L=name))
    assert (found.code, found.strength) == ("en", "weak")
    assert {"en", LANGUAGES[name]} <= found.accepted
    rw = rewrite_request(chat(shape.format(L=name)), "chat", AUTO)
    assert rw.injected_language is None  # auto never injects for a weak expectation
    assert rw.body["messages"] == chat(shape.format(L=name))["messages"]


@pytest.mark.parametrize(("shape", "name"), pairs(ENGLISH_REQUESTS, REQUEST_NAMES, 3))
def test_an_english_request_for_the_answer_is_strong(shape: str, name: str) -> None:
    code = LANGUAGES[name]
    found = derive_prompt(shape.format(L=name))
    assert (found.code, found.strength, found.source) == (code, "strong", "request")
    assert found.accepted == {code}
    assert rewrite_request(chat(shape.format(L=name)), "chat", AUTO).injected_language == code


@pytest.mark.parametrize(("shape", "name"), pairs(ENGLISH_WIDENING, REQUEST_NAMES, 3))
def test_a_text_to_write_or_translate_in_a_language_widens(shape: str, name: str) -> None:
    code = LANGUAGES[name]
    found = derive_prompt(shape.format(L=name))
    assert found.strength == "weak"
    assert {"en", code} <= found.accepted
    assert rewrite_request(chat(shape.format(L=name)), "chat", AUTO).injected_language is None


@pytest.mark.parametrize(("code", "text"), sorted({**NATIVE_REQUESTS}.items()))
def test_a_native_request_is_strong(code: str, text: str) -> None:
    found = derive_prompt(text)
    assert (found.code, found.strength) == (code, "strong")


@pytest.mark.parametrize(("code", "text"), sorted(CROSS_REQUESTS.items()))
def test_a_request_for_a_third_language_never_expects_the_prompts(code: str, text: str) -> None:
    found = derive_prompt(text)
    assert (found.code, found.strength, found.reason) == (code, "strong", "instruction")
    assert rewrite_request(chat(text), "chat", AUTO).injected_language == code


@pytest.mark.parametrize("text", UNJUDGED_REQUESTS)
def test_a_language_the_detector_cannot_judge_gives_no_expectation(text: str) -> None:
    found = derive_prompt(text)
    assert (found.code, found.strength, found.reason) == (None, "none", "unjudged")
    rw = rewrite_request(chat(text), "chat", AUTO)
    assert (rw.expected_language, rw.injected_language) == (None, None)


def test_a_prompt_without_a_request_is_weak_and_gets_no_instruction() -> None:
    """The prompt's language is read, not asked for: it is accepted, and ``auto`` injects
    nothing (a guess is never told to the model)."""
    for text, code in (
        ("Write a long story about the sea and the mountains of Scotland, please.", "en"),
        ("Schreibe bitte eine lange Geschichte über das Meer und die Berge in Bayern.", "de"),
    ):
        found = derive_prompt(text)
        assert (found.code, found.strength, found.accepted) == (code, "weak", {code})
        assert rewrite_request(chat(text), "chat", AUTO).injected_language is None


def test_a_request_after_a_long_article_is_read() -> None:
    article = "The council met on Tuesday to discuss the new transport plan for the city. " * 80
    for tail, code in (("Summarize the article above in Arabic.", "ar"), ("Reply in Tamil.", "ta")):
        rw = rewrite_request(chat(f"{article}\n\n{tail}"), "chat", AUTO)
        assert (rw.expected_language, rw.injected_language) == (code, code)


@pytest.mark.parametrize(
    ("value", "code"),
    [
        ("fr", "fr"), ("pt-BR", "pt"), ("zh-CN", "zh"), ("zh_TW", "zh"), ("zh-Hans-CN", "zh"),
        ("en-US", "en"), ("french", "fr"), ("Français", "fr"), ("Deutsch", "de"),
        ("castellano", "es"), ("iw", "he"), ("fil", "tl"), ("Catalan", "ca"),
    ],
)  # fmt: skip
def test_header_values_reduce_to_the_detectors_code(value: str, code: str) -> None:
    assert check_language(value, names=True) == code
    assert resolve(value) == code


@pytest.mark.parametrize("value", ["klingon", "xx", "zulu", "tlh"])
def test_header_values_the_detector_cannot_judge_are_refused(value: str) -> None:
    with pytest.raises(ValueError, match="ISO 639-1"):
        check_language(value, names=True)


def test_every_judged_language_has_an_english_name_from_langcodes() -> None:
    """The fallback instruction names the language (no hand table of names)."""
    assert all(english_name(code) for code in JUDGED)
    assert language_instruction("ca") == "Respond only in Catalan. Do not use any other language."
    assert language_instruction("tl").startswith("Respond only in Filipino.")


def test_the_shipped_index_matches_langcodes() -> None:
    """``language_names.json`` is langcodes' data (scripts/build_language_names.py): a sample
    of names in several languages looks up to the same code in the library itself."""
    langcodes = pytest.importorskip("langcodes")
    pytest.importorskip("language_data")
    data = json.loads(
        (Path(__file__).parent.parent / "proxy/core/language_names.json").read_text("utf-8")
    )
    sample = {
        "en": "english", "de": "französisch", "es": "inglés", "ru": "английский", "zh": "英语",
        "ko": "영어", "fr": "catalan",
    }  # fmt: skip
    for phrase, name in sample.items():
        assert data["by_language"][phrase][name] == langcodes.find(name).language
    assert data["english"]["hr"] == langcodes.Language.get("hr").display_name("en")


# Real answers of Llama 3 in Spanish and Italian (tests/data/salad/README.md says where from).
SAMPLES = Path(__file__).parent / "data"


def _text(path: str, row_id: str) -> str:
    with (SAMPLES / path).open(encoding="utf-8") as fh:
        for line in fh:
            row = json.loads(line)
            if row["id"] == row_id:
                return str(row["text"])
    raise KeyError(row_id)


def _verdict(text: str, expected: str, accepted: frozenset[str]) -> str | None:
    detector = Detector(expected_language=expected, accepted_languages=accepted)
    for delta in split_deltas(text):  # token-sized, as vLLM streams
        if detector.feed(delta) is not None:
            break
    found = detector.finish().verdict
    return None if found is None else found.signal


def test_a_weak_expectation_accepts_the_languages_the_prompt_names() -> None:
    spanish = _text("salad/samples.jsonl", "lcb-llama-3-instruct-es-dolly_human_edited-90")
    italian = _text("salad/samples.jsonl", "lcb-llama-3-instruct-it-okapi-48")
    assert _verdict(spanish, "en", frozenset()) == "language-drift"
    assert _verdict(spanish, "en", frozenset({"en", "es"})) is None
    # only the named languages: an Italian answer to a prompt about German is still drift
    assert _verdict(italian, "en", frozenset({"en", "de"})) == "language-drift"


def test_the_header_and_the_metric_say_the_strength(
    fake_upstream: FakeVLLM, proxy_server: Callable[..., str]
) -> None:
    """Through a running proxy: a prompt about Spanish is weak (English and Spanish accepted,
    nothing injected under auto), a client's ``x-guard-language: pt-BR`` is strong Portuguese;
    ``x-guard-language`` and ``guard_language_expectation_total`` say so."""
    fake_upstream.script = Script(
        texts=[
            "Por means 'by' or 'through' and marks a cause or a route; para means 'for' and "
            "marks a purpose or a destination. So you travel por the park para school, and a "
            "gift is para your friend because of (por) her birthday."
        ]
    )
    metrics = Metrics()
    base = proxy_server(language="auto", allow_client_override=True, metrics=metrics)
    body = {"model": "m", "messages": chat(SUBJECT_SHAPES[0].format(L="Spanish"))["messages"]}
    r = httpx.post(base + "/v1/chat/completions", json=body)
    said = r.headers["x-guard-language"]
    assert said.startswith("en; source=prompt; by=conversation; strength=weak; accepts=")
    assert {"en", "es"} <= set(said.rsplit("=", 1)[1].split(","))
    assert r.json()["choices"][0]["finish_reason"] == "stop"
    assert fake_upstream.guarded_requests()[0].json["messages"] == body["messages"]
    r = httpx.post(base + "/v1/chat/completions", json=body, headers={"x-guard-language": "pt-BR"})
    assert r.headers["x-guard-language"] == "pt; source=request; by=header; strength=strong"
    text = metrics.render_quality()[0].decode()
    for source, strength in (("prompt", "weak"), ("request", "strong")):
        line = (
            f'guard_language_expectation_total{{model="m",source="{source}",strength="{strength}"}}'
        )
        assert f"{line} 1.0" in text


def test_a_weak_expectation_lets_an_answer_in_a_named_script_stand() -> None:
    """ "How do you say … in Japanese?" answered wholly in Japanese (a real GPT-4 answer of
    FastChat's data, tests/data/detect/README.md) is no script intrusion when Japanese is named."""
    japanese = _text("detect/sample.jsonl", "fc-ja-gpt-4-67-t0")
    assert _verdict(japanese, "en", frozenset()) in ("script-intrusion", "language-drift")
    assert _verdict(japanese, "en", frozenset({"en", "ja"})) is None
