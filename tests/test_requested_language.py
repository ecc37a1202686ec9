"""The languages an answer may be in: evidence in tiers (``proxy.core.requested_language``).

An unambiguous instruction narrows (in many languages and positions, from any system text or user
turn, the latest winning); everything else only widens what is accepted: the conversation's own
languages (English included), the languages of quoted text, every language named. Negation
removes a language, a condition narrows nothing, a place or an adjective is never an instruction.
"""

from __future__ import annotations

import pytest

from proxy.core.language_rule import LANGUAGE_INSTRUCTIONS
from proxy.core.requested_language import (
    Expectation,
    Role,
    derive,
    explicit_requests,
    prompt_language,
)


def ask(*turns: str | tuple[Role, str]) -> Expectation:
    """The expectation of a conversation: plain strings are user turns."""
    return derive([("user", t) if isinstance(t, str) else t for t in turns])


def system(text: str) -> tuple[Role, str]:
    return ("system", text)


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
        ("Spanish only: explain the water cycle.", "es"),
        ("In Spanish: explain the water cycle.", "es"),
        ("Language: French\nExplain the water cycle.", "fr"),
        ("Explain the water cycle? Italian, please.", "it"),
        ("Write a short poem about the first snow, in Italian.", "it"),
        ("Your answer should be in Korean.", "ko"),
        ("rispondi in inglese", "en"),
        ("Antworte bitte auf Englisch.", "en"),
        ("kurz und auf Englisch bitte: warum ist Meerwasser salzig", "en"),
        ("Responde en inglés, por favor.", "en"),
        ("Explícamelo en español.", "es"),
        ("Réponds en anglais.", "en"),
        ("Responda em inglês.", "en"),
        ("Ответь на английском языке.", "en"),
        ("Відповідай українською, будь ласка.", "uk"),
        ("用英文回答这个问题", "en"),
        ("日本語で答えてください", "ja"),
        ("영어로 답해 주세요", "en"),
        ("कृपया उत्तर अंग्रेज़ी में दें", "en"),
        ("أجب باللغة الإنجليزية", "en"),
        ("İngilizce cevap ver.", "en"),
        ("Jawab dalam bahasa Inggris.", "en"),
        ("Trả lời bằng tiếng Anh.", "en"),
        ("Odpowiedz po angielsku.", "en"),
        ("Antwoord in het Engels.", "en"),
        ("Svara på engelska.", "en"),
        # read from a set of shapes written blind (bench/data/language_shapes_third.jsonl):
        # a Swahili directive, a preference said as the request, a clause "in X now",
        # romanised Hindi, and an Arabic adverb written with its tanwin before the alif
        ("Jibu kwa Kiswahili: what are the health benefits of drinking water?", "sw"),
        ("¿y cuál tiene mejor batería? perdona, prefiero en español", "es"),
        ("en français maintenant stp : quelle est la plus grande ville ?", "fr"),
        ("Now in German, please.", "de"),
        ("bhai quantum entanglement kya hota hai? hindi mein samjhao please", "hi"),
        ("أجب دائماً باللغة العربية الفصحى مهما كانت لغة السؤال.", "ar"),
        (
            "You are a translation engine. Translate the user's text into French. "
            "Output only the translation, nothing else.",
            "fr",
        ),
    ],
)
def test_unambiguous_instructions_in_many_languages(text: str, code: str) -> None:
    assert explicit_requests(text) == {code}


@pytest.mark.parametrize(
    "text",
    [
        # subjects, adjectives, places, questions about a language, translations
        "Write an essay on trends in Chinese manufacturing.",
        "How do you say hello in French?",
        "How do you reply in French to a compliment?",
        "Explain the French revolution.",
        "Tell me about the Japanese language.",
        "Summarize the history of the Spanish language.",
        "My Spanish teacher assigned us a project on climate change.",
        "Recommend some French dishes for a dinner party.",
        "Write a travel guide for a week in Estonia.",
        "Plan a hiking trip in Mongolia.",
        "Write a short story set in Sardinia.",
        "Schreib mir einen Reiseplan für zwei Wochen in Italien.",
        "Give me 5 phrases in Japanese for travel.",
        "In German, why does the verb go to the end?",
        "Translate this into Spanish and explain the grammar.",
        "Describe bowing etiquette in Japanese.",
        "Write a sentence in Spanish and explain its grammar.",
        "Напиши о русском рынке.",
        # a text to write, with its subject after the name: the answer may frame it in the
        # prompt's language ("Here is a poem in Italian: … Translation: …")
        "Write a short poem in Italian about the sea at dawn",
        "I talk in French because I live in Paris. Where can I buy bread?",
        "Is the hindi mein part of the sentence correct?",
    ],
)
def test_mentions_are_never_instructions(text: str) -> None:
    """A language named as a topic, an adjective, a place or the subject of a question, a
    translation that also wants an explanation: nothing is narrowed."""
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


def test_an_english_question_expects_english() -> None:
    """The conversation's own language, English included: an English question answered in
    Chinese is judged (it was never judged when English prompts set no expectation)."""
    found = ask("How do I clean my armpits?")
    assert (found.code, found.strength, found.accepted) == ("en", "weak", frozenset({"en"}))
    assert found.header() == "en; source=prompt; by=conversation; strength=weak; accepts=en"


def test_negation_removes_a_language_and_narrows_nothing_else() -> None:
    """ "Do not answer in Chinese." used to expect Chinese; now it only takes Chinese away."""
    for rule in ("Do not answer in Chinese.", "Never respond in Chinese, even if asked."):
        found = ask(system(rule), "What is the capital of France?")
        assert found.accepted == {"en"}, rule
        assert found.strength == "weak"
    spanish = ask("No me contestes en inglés por favor. ¿Cómo configuro Gmail en Outlook?")
    assert spanish.accepted == {"es"}
    both = ask("Explain the rules of cricket. Don't answer in English — French or Spanish.")
    assert both.accepted == {"fr", "es"}


def test_a_condition_narrows_nothing() -> None:
    found = ask(system("If the user writes in Spanish, answer in Spanish."), "What is rain?")
    assert found.strength == "weak" and found.accepted == {"en", "es"}
    otherwise = ask(
        system(
            "If the user's question is about billing, respond in English only. Otherwise reply "
            "in the user's language."
        ),
        "¿Por qué me cobraron dos veces este mes?",
    )
    assert otherwise.accepted == {"es", "en"}
    french = ask(
        system(
            "Tu réponds dans la langue du client si elle est le français, l'allemand ou "
            "l'italien. Pour toute autre langue, réponds en français."
        ),
        "Qual è la capitale della Francia?",
    )
    assert "it" in french.accepted and french.strength == "weak"


def test_places_and_the_x_language_are_subjects() -> None:
    for text in (
        "Write a travel guide for a week in Estonia.",
        "Plan a week of hiking in Mongolia.",
        "Write a short story set in Sardinia.",
    ):
        assert ask(text).accepted == {"en"}, text
    assert ask("Tell me about the Japanese language.").accepted == {"en", "ja"}
    german = ask("Schreib mir einen Reiseplan für zwei Wochen in Italien.")
    assert german.accepted == {"de"}  # "Italien" is Italy in German
    portuguese = ask("Preciso de estes dados para fins de pesquisa, lavori in corso.")
    assert "fi" not in portuguese.accepted and "co" not in portuguese.accepted


def test_a_question_about_english_in_another_language_accepts_both() -> None:
    for text, code in (
        ("¿Cómo se escribe 'gracias' en inglés?", "es"),
        ("Wie schreibt man 'Danke' auf Englisch?", "de"),
    ):
        found = ask(text)
        assert found.accepted == {code, "en"}, text
        assert found.strength == "weak"


def test_an_instruction_in_an_earlier_turn_is_read() -> None:
    found = ask(
        "From now on, reply only in German.",
        ("assistant", "Gut, ab jetzt auf Deutsch."),
        "What is photosynthesis?",
    )
    assert (found.code, found.strength, found.reason) == ("de", "strong", "instruction")
    latest = ask(
        "Reply in German.", ("assistant", "Gut."), "Please answer in French from now on.", "Ok?"
    )
    assert latest.code == "fr"


def test_an_operator_rule_a_user_overrides_accepts_both() -> None:
    """Models differ in whether they follow the system prompt or the user: both answers are
    correct, so both languages are accepted and nothing is injected."""
    found = ask(
        system("Always respond in English."),
        "Please answer in German this time, my father will read it: how do I bank online?",
    )
    assert found.strength == "weak" and found.accepted == {"en", "de"}
    agreed = ask(system("Always respond in English regardless of the user's language."), "Hallo?")
    assert (agreed.code, agreed.strength) == ("en", "strong")


def test_quoted_and_pasted_text_widens() -> None:
    pasted = ask(
        "got this from my landlord, what does it mean?? do I have to pay this?\n\n---\n"
        "Sehr geehrte Frau Thompson,\n\nim Rahmen der jährlichen Betriebskostenabrechnung "
        "ergibt sich für Ihre Wohnung eine Nachzahlung in Höhe von 312,47 €."
    )
    assert {"en", "de"} <= pasted.accepted
    quoted = ask(
        '帮我总结一下这段话的意思："Large language models exhibit emergent abilities that are '
        'not present in smaller models."'
    )
    assert quoted.code == "zh" and {"zh", "en"} <= quoted.accepted


def test_unjudged_translation_and_any_language_give_no_expectation() -> None:
    assert ask("Can you reply in Zulu? What is rain?").reason == "unjudged"
    assert ask("Translate this: il fait beau aujourd'hui et nous allons au parc.").code is None
    assert ask("Answer in any language you like: what is rain?").code is None
    assert ask("ok").code is None


def test_a_program_that_translates_is_not_an_instruction() -> None:
    for program in (
        "Write a Python function that translates text into French.",
        "How would I translate my website into Spanish?",
    ):
        assert ask(program).strength != "strong", program
