"""The requested language: explicit instructions in many languages and positions, the prompt's
own language for short prompts, and no expectation where the request is ambiguous."""

from __future__ import annotations

import pytest

from proxy.core.language_rule import LANGUAGE_INSTRUCTIONS
from proxy.core.requested_language import derive, explicit_requests, prompt_language


@pytest.mark.parametrize(
    ("text", "code"),
    [
        ("Reply in French. Explain how photosynthesis works.", "fr"),
        ("Explain how photosynthesis works. Reply in French.", "fr"),
        (
            "Explain how photosynthesis works, and please answer in German so my class can read it",
            "de",
        ),
        ("Write it in Japanese", "ja"),
        ("Use Spanish.", "es"),
        ("Translate the following text into Italian: the weather is nice today.", "it"),
        ("Translate from French to English: il fait beau.", "en"),
        ("rispondi in inglese", "en"),
        ("Antworte bitte auf Englisch.", "en"),
        ("Übersetze den Text ins Englische.", "en"),
        ("Responde en inglés, por favor.", "en"),
        ("Réponds en anglais.", "en"),
        ("Responda em inglês.", "en"),
        ("Ответь на английском языке.", "en"),
        ("Переведи на английский.", "en"),
        ("用英文回答这个问题", "en"),
        ("请翻译成法语。", "fr"),
        ("日本語で答えてください", "ja"),
        ("영어로 답해 주세요", "en"),
        ("अंग्रेज़ी में जवाब दें", "en"),
        ("أجب باللغة الإنجليزية", "en"),
        ("İngilizce cevap ver.", "en"),
        ("Jawab dalam bahasa Inggris.", "en"),
        ("Trả lời bằng tiếng Anh.", "en"),
        ("Odpowiedz po angielsku.", "en"),
        ("Antwoord in het Engels.", "en"),
        ("Svara på engelska.", "en"),
    ],
)
def test_explicit_instructions_in_many_languages(text: str, code: str | None) -> None:
    assert explicit_requests(text) == ({code} if code else set())


@pytest.mark.parametrize(
    "text",
    [
        "Write an essay on trends in Chinese manufacturing.",
        "How do you say hello in French?",
        "Explain the French revolution.",
        "Tell me about Spanish-speaking countries.",
        "Напиши о русском рынке.",
        "What is the capital of Japan?",
        "Give me 5 phrases in Japanese for travel.",
        "How do you reply in French to a compliment?",
    ],
)
def test_mentions_that_are_not_instructions(text: str) -> None:
    """A language named as a topic, an adjective or the subject of a question asks nothing."""
    assert explicit_requests(text) == set()


@pytest.mark.parametrize("code", sorted(LANGUAGE_INSTRUCTIONS))
def test_the_injected_instructions_read_back_as_their_language(code: str) -> None:
    """A request the proxy already constrained (a retry, a heal) derives the same language."""
    assert explicit_requests(LANGUAGE_INSTRUCTIONS[code]) == {code}


@pytest.mark.parametrize(
    ("text", "code"),
    [
        ("من هم الحوثيون؟", "ar"),
        ("什么是量子计算？", "zh"),
        ("こんにちは", "ja"),
        ("안녕하세요", "ko"),
        ("สวัสดีครับ", "th"),
        ("Τι κάνεις;", "el"),
        ("מה שלומך?", "he"),
        ("გამარჯობა", "ka"),
        ("Բարեւ", "hy"),
        ("Apa itu fotosintesis?", "id"),
        ("Quang hợp là gì?", "vi"),
        ("Почему небо голубое?", "ru"),
        ("Чи є в тебе час?", "uk"),
        ("Was ist das?", "de"),
        ("Ciao amico", "it"),  # ten letters: fastText unsure, but both words are Italian
        ("hi", None),
        ("```python\nprint(1)\n```", None),
    ],
)
def test_short_prompts(text: str, code: str | None) -> None:
    assert prompt_language(text) == code


def test_derive_order_and_ambiguity() -> None:
    question = "Spiega come funziona la fotosintesi nelle piante verdi, per favore."
    assert derive([], question).code == "it"
    assert derive([], question).source == "prompt"
    asked = derive(["You are a helpful assistant. Always answer in English."], question)
    assert (asked.code, asked.source, asked.reason) == ("en", "request", "instruction")
    both = derive(["Always answer in English."], question + " Rispondi in francese.")
    assert (both.code, both.source, both.reason) == (None, "none", "conflict")
    untargeted = derive([], "Translate this: il fait beau aujourd'hui et nous allons au parc.")
    assert (untargeted.code, untargeted.reason) == (None, "translation")
    assert derive([], "ok").code is None
    for program in (
        "Write a Python function that translates text into French.",
        "How would I translate my website into Spanish?",
    ):
        assert derive([], program).strength != "strong"  # the language is the program's
