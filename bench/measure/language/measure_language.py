"""Measure the requested-language derivation and the language checks against it.

    python bench/measure/language/measure_language.py           # all figures (a minute, 1 core)
    python bench/measure/language/measure_language.py --misses  # also what was missed / flagged
    # the same data through another version:
    MEASURE_PROXY_ROOT=/path/to/other/checkout python bench/measure/language/measure_language.py

What is measured (figures in docs/language.md):

* **auto**: explicit-request prompts generated here (the instruction in 15 phrase languages,
  placed at the start, in the middle or at the end of a two-sentence question), rewritten with
  ``GUARD_LANGUAGE=auto``: how often the injected language contradicts the request, and how
  often it is the requested one.
* **healthy flagged**: real healthy answers (``../shared/corpus/dev.jsonl`` when present,
  else ``tests/data/corpus.jsonl``; ``bench/data/realgen.jsonl.gz``) streamed through the
  detector with the expectation the default settings derive from a question: the corpus's own
  instruction where it has one, else a question of our own in the answer's language.
* **wholly wrong language**: a real healthy answer in one language given to a question written
  in another (the question ours, short ones included), and to an English question that asks
  for another language explicitly ("Reply in Hindi.", "… Write in German.", "Use Spanish.").
* **real wrong-language answers**: SmolLM2-135M (llama.cpp) answers to prompts in 13 languages
  that the realgen labels call language drift, with their real prompts.
* **drift after a correct start**: the start of a real answer in the requested language (cut
  at a line, a sentence or mid-sentence) continued by a real English or Chinese answer.
* **lead-in**: a short English lead-in ("Here is the answer in Korean:") before a real answer
  in the requested language, which must pass.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import random
import sys
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, os.environ.get("MEASURE_PROXY_ROOT", str(ROOT)))

from proxy.cli.score import split_deltas  # noqa: E402
from proxy.core.rewrite import RewritePolicy, rewrite_request  # noqa: E402
from proxy.detect import Detector  # noqa: E402
from proxy.detect.drift import source_like  # noqa: E402
from proxy.detect.language import strip_noise  # noqa: E402

# Questions of our own, two to three per language, short ones included.
QUESTIONS: dict[str, list[str]] = {
    "en": ["What causes the seasons on Earth?", "How do vaccines train the immune system?"],
    "zh": ["什么是量子计算？", "为什么天空是蓝色的？请详细解释。", "如何学习编程？"],
    "es": ["¿Qué es la fotosíntesis?", "¿Por qué se extinguieron los dinosaurios?"],
    "hi": ["प्रकाश संश्लेषण क्या है?", "भारत की राजधानी के बारे में बताइए।"],
    "ar": ["من هم الحوثيون؟", "ما هي فوائد القراءة اليومية؟"],
    "pt": ["O que é a fotossíntese?", "Como funciona a inflação na economia?"],
    "ru": ["Что такое фотосинтез?", "Почему небо голубое?"],
    "ja": ["量子コンピュータとは何ですか？", "日本の四季について教えて。"],
    "de": ["Was ist Photosynthese?", "Wie funktioniert ein Kühlschrank?"],
    "fr": ["Qu'est-ce que la photosynthèse ?", "Pourquoi le ciel est-il bleu ?"],
    "ko": ["광합성이란 무엇인가요?", "서울의 역사에 대해 알려줘."],
    "it": ["Che cos'è la fotosintesi?", "Come funziona un motore elettrico?"],
    "tr": ["Fotosentez nedir?", "Gökyüzü neden mavidir?"],
    "id": ["Apa itu fotosintesis?", "Siapa presiden pertama Indonesia?"],
    "vi": ["Quang hợp là gì?", "Tại sao bầu trời có màu xanh?"],
    "nl": ["Wat is fotosynthese?", "Hoe werkt een koelkast?"],
    "pl": ["Co to jest fotosynteza?", "Dlaczego niebo jest niebieskie?"],
    "uk": ["Що таке фотосинтез?", "Чому небо блакитне?"],
}

ENGLISH_NAMES = {
    "zh": "Chinese", "es": "Spanish", "hi": "Hindi", "ar": "Arabic", "pt": "Portuguese",
    "ru": "Russian", "ja": "Japanese", "de": "German", "fr": "French", "ko": "Korean",
    "it": "Italian", "tr": "Turkish", "id": "Indonesian", "vi": "Vietnamese", "nl": "Dutch",
    "pl": "Polish", "uk": "Ukrainian", "en": "English",
}  # fmt: skip
ENGLISH_ASKS = ["Reply in {}.", "Please answer in {}.", "Write in {}.", "Use {}.",
                "Respond in {} only.", "Write your answer in {}, please."]  # fmt: skip

# (phrase language) -> (template, {target: name in the phrase language}); targets: en + one.
NATIVE_ASKS: dict[str, tuple[list[str], dict[str, str]]] = {
    "zh": (["请用{}回答。", "用{}写。"], {"en": "英文", "fr": "法语"}),
    "es": (["Responde en {}.", "Escribe la respuesta en {}."], {"en": "inglés", "fr": "francés"}),
    "hi": (["{} में जवाब दें।", "कृपया {} में उत्तर लिखें।"], {"en": "अंग्रेज़ी", "fr": "फ्रेंच"}),
    "ar": (["أجب باللغة {}.", "اكتب الإجابة باللغة {}."], {"en": "الإنجليزية", "fr": "الفرنسية"}),
    "pt": (["Responda em {}.", "Escreva em {}, por favor."], {"en": "inglês", "fr": "francês"}),
    "ru": (["Ответь на {} языке.", "Напиши ответ на {}."],
           {"en": "английском", "fr": "французском"}),
    "ja": (["{}で答えてください。", "{}で書いて。"], {"en": "英語", "fr": "フランス語"}),
    "de": (["Antworte auf {}.", "Schreib die Antwort bitte auf {}."],
           {"en": "Englisch", "fr": "Französisch"}),
    "fr": (["Réponds en {}.", "Écris la réponse en {}, s'il te plaît."],
           {"en": "anglais", "de": "allemand"}),
    "ko": (["{}로 답해 주세요.", "{}로 작성해."], {"en": "영어", "fr": "프랑스어"}),
    "it": (["Rispondi in {}.", "Scrivi la risposta in {}."], {"en": "inglese", "fr": "francese"}),
    "tr": (["{} cevap ver.", "Lütfen {} yaz."], {"en": "İngilizce", "fr": "Fransızca"}),
    "id": (["Jawab dalam bahasa {}.", "Tulis jawabannya dalam bahasa {}."],
           {"en": "Inggris", "fr": "Prancis"}),
    "vi": (["Trả lời bằng tiếng {}.", "Hãy viết câu trả lời bằng tiếng {}."],
           {"en": "Anh", "fr": "Pháp"}),
}  # fmt: skip
# Two-sentence bodies per phrase language (the instruction goes before, between or after).
BODIES: dict[str, tuple[str, str]] = {
    "en": ("Explain how a rainbow forms.", "Keep it suitable for a curious teenager."),
    "zh": ("解释一下彩虹是怎么形成的。", "请让内容适合好奇的青少年。"),
    "es": ("Explica cómo se forma un arcoíris.", "Hazlo adecuado para un adolescente curioso."),
    "hi": ("समझाइए कि इंद्रधनुष कैसे बनता है।", "इसे एक जिज्ञासु किशोर के लिए उपयुक्त रखें।"),
    "ar": ("اشرح كيف يتكون قوس قزح.", "اجعل الشرح مناسبًا لمراهق فضولي."),
    "pt": ("Explique como se forma um arco-íris.", "Deixe adequado para um adolescente curioso."),
    "ru": ("Объясни, как образуется радуга.", "Сделай объяснение понятным для подростка."),
    "ja": ("虹がどのようにできるのか説明してください。",
           "好奇心旺盛な十代にわかるようにしてください。"),
    "de": ("Erkläre, wie ein Regenbogen entsteht.", "Halte es für neugierige Jugendliche passend."),
    "fr": ("Explique comment se forme un arc-en-ciel.", "Adapte-le à un adolescent curieux."),
    "ko": ("무지개가 어떻게 생기는지 설명해 주세요.", "호기심 많은 십대에게 맞게 해 주세요."),
    "it": ("Spiega come si forma un arcobaleno.", "Rendilo adatto a un adolescente curioso."),
    "tr": ("Gökkuşağının nasıl oluştuğunu açıkla.", "Meraklı bir genç için uygun olsun."),
    "id": ("Jelaskan bagaimana pelangi terbentuk.", "Buat agar cocok untuk remaja yang penasaran."),
    "vi": ("Giải thích cầu vồng hình thành như thế nào.", "Hãy làm cho phù hợp với thiếu niên."),
}  # fmt: skip
LEAD_INS = ["Here is the answer in {}:\n\n", "Sure! Here it is in {}.\n\n",
            "Of course. The explanation in {} follows:\n\n"]  # fmt: skip

DEFAULT = RewritePolicy()
AUTO = RewritePolicy(language="auto")


def chat(text: str, system: str | None = None) -> dict[str, Any]:
    messages = [{"role": "system", "content": system}] if system else []
    return {"model": "m", "messages": [*messages, {"role": "user", "content": text}]}


class Expected(str):
    """The expected code, carrying the languages a weak expectation also accepts (versions
    without expectation strength have none)."""

    accepted: frozenset[str] = frozenset()


def expectation(text: str, policy: RewritePolicy = DEFAULT) -> str | None:
    rw = rewrite_request(chat(text), "chat", policy)
    if rw.expected_language is None:
        return None
    out = Expected(rw.expected_language)
    out.accepted = getattr(rw.expectation, "accepted", frozenset())
    return out


def verdict(text: str, expected: str | None) -> str | None:
    accepted = getattr(expected, "accepted", frozenset())
    kwargs = {"accepted_languages": accepted} if accepted else {}
    detector = Detector(expected_language=expected, **kwargs)
    for delta in split_deltas(text):
        if detector.feed(delta) is not None:
            break
    found = detector.finish().verdict
    return None if found is None else found.signal


#: Model answers (not changelogs, lyrics or legal text) by language: what a wrong-language or
#: drifting answer is made of.
ANSWER_KINDS = frozenset({"llm-answer", "qa-answer"})
ANSWERS: dict[str, list[str]] = defaultdict(list)


def prose(text: str) -> bool:
    """Prose, not code or a data file: a wrong-language answer is written, not listed. (Code
    in any language is judged by other signals; it is not a language the answer drifts to.)"""
    return len(strip_noise(text)) >= 0.7 * len(text) and not source_like(text)


def load_texts() -> tuple[dict[str, list[str]], list[tuple[str, str]]]:
    """Healthy answers by language (>= 200 characters), and (instruction, answer) pairs."""
    by_lang: dict[str, list[str]] = defaultdict(list)
    pairs: list[tuple[str, str]] = []
    corpus = ROOT.parent / "shared" / "corpus" / "dev.jsonl"
    if not corpus.is_file():
        corpus = ROOT / "tests" / "data" / "corpus.jsonl"
    for line in corpus.open(encoding="utf-8"):
        row = json.loads(line)
        if row.get("label") != "healthy" or row.get("kind") == "code" or row["lang"] == "code":
            continue
        if row.get("instruction"):
            pairs.append((row["instruction"], row["text"]))
        elif len(row["text"]) >= 200 and row["lang"] != "mixed":
            by_lang[row["lang"]].append(row["text"])
            if row.get("kind") in ANSWER_KINDS:
                ANSWERS[row["lang"]].append(row["text"])
    with gzip.open(ROOT / "bench" / "data" / "realgen.jsonl.gz", "rt", encoding="utf-8") as fh:
        for line in fh:
            row = json.loads(line)
            if row["label"] == "healthy" and len(row["text"]) >= 200:
                by_lang[row["lang"]].append(row["text"])
                ANSWERS[row["lang"]].append(row["text"])
    return by_lang, pairs


def realgen_drift() -> list[tuple[str, str, str]]:
    """(prompt, answer, prompt language) of the real answers labelled language drift."""
    out = []
    with gzip.open(ROOT / "bench" / "data" / "realgen.jsonl.gz", "rt", encoding="utf-8") as fh:
        for line in fh:
            row = json.loads(line)
            if row.get("degen_type") == "language-drift":
                out.append((row["prompt"], row["text"], row["prompt_language"]))
    return out


def place(body: tuple[str, str], ask: str, where: str, space: str) -> str:
    a, b = body
    return space.join({"start": [ask, a, b], "middle": [a, ask, b], "end": [a, b, ask]}[where])


def measure_auto(show: bool) -> dict[str, Any]:
    prompts: list[tuple[str, str]] = []
    for where in ("start", "middle", "end"):
        for target, name in ENGLISH_NAMES.items():
            if target == "en":
                continue
            for ask in ENGLISH_ASKS:
                prompts.append((place(BODIES["en"], ask.format(name), where, " "), target))
        for phrase, (asks, names) in NATIVE_ASKS.items():
            space = "" if phrase in ("zh", "ja") else " "
            for target, name in names.items():
                for ask in asks:
                    prompts.append((place(BODIES[phrase], ask.format(name), where, space), target))
    contradictions = injected = 0
    for text, target in prompts:
        rw = rewrite_request(chat(text), "chat", AUTO)
        if rw.injected_language == target:
            injected += 1
        elif rw.injected_language is not None:
            contradictions += 1
            if show:
                print(f"  auto contradicts {target}: {rw.injected_language} <- {text!r}")
        elif show:
            print(f"  auto silent ({target}): {text!r}")
    return {"prompts": len(prompts), "contradictions": contradictions, "injected": injected}


def measure(show: bool) -> dict[str, Any]:
    rng = random.Random(7)
    by_lang, pairs = load_texts()
    out: dict[str, Any] = {"auto": measure_auto(show)}

    # Healthy answers with the expectation the default settings derive.
    flagged = total = 0
    per_lang: Counter[str] = Counter()
    for instruction, text in pairs:
        total += 1
        if verdict(text, expectation(instruction)) is not None:
            flagged += 1
            if show:
                print(f"  healthy flagged (instruction): {instruction[:80]!r}")
    for lang, texts in sorted(by_lang.items()):
        questions = QUESTIONS.get(lang)
        for i, text in enumerate(texts):
            total += 1
            expected = expectation(questions[i % len(questions)]) if questions else None
            if verdict(text, expected) is not None:
                flagged += 1
                per_lang[lang] += 1
                if show:
                    print(f"  healthy flagged ({lang}, expected {expected}): {text[:80]!r}")
    out["healthy"] = {"answers": total, "flagged": flagged, "by_language": dict(per_lang)}

    # Wholly in another language: English (or Chinese) answers to questions in language L.
    caught = n = 0
    missed: Counter[str] = Counter()
    english = [t for t in ANSWERS["en"] if prose(t)]
    chinese = [t for t in ANSWERS["zh"] if prose(t)]
    for lang, questions in QUESTIONS.items():
        if lang == "en":
            continue
        for question in questions:
            for k in range(6):
                pool = chinese if (k % 3 == 2 and lang not in ("zh", "ja")) else english
                answer = rng.choice(pool)
                n += 1
                if verdict(answer, expectation(question)) is not None:
                    caught += 1
                else:
                    missed[lang] += 1
                    if show:
                        print(f"  missed ({question!r}): {answer[:60]!r}")
    out["wrong_in_question_language"] = {"answers": n, "caught": caught, "missed": dict(missed)}

    # English question, explicit request for another language, English answer.
    caught = n = 0
    missed = Counter()
    for target, name in ENGLISH_NAMES.items():
        if target == "en":
            continue
        for ask in ENGLISH_ASKS:
            for where in ("start", "end"):
                question = rng.choice(QUESTIONS["en"])
                text = (
                    f"{ask.format(name)} {question}"
                    if where == "start"
                    else (f"{question} {ask.format(name)}")
                )
                n += 1
                answer = rng.choice(english)
                if verdict(answer, expectation(text)) is not None:
                    caught += 1
                else:
                    missed[target] += 1
                    if show:
                        print(f"  missed ({text!r}): {answer[:60]!r}")
    out["wrong_when_requested"] = {"answers": n, "caught": caught, "missed": dict(missed)}

    # Real engine: SmolLM2 answers labelled drift, judged with their real prompts.
    real = realgen_drift()
    caught = sum(1 for prompt, text, _ in real if verdict(text, expectation(prompt)) is not None)
    out["real_engine_drift"] = {"answers": len(real), "caught": caught}

    # Drift after a correct start; lead-in before a correct answer.
    caught = n = 0
    missed = Counter()
    lead_flagged = lead_n = 0
    for lang, texts in sorted(by_lang.items()):
        if lang == "en" or lang not in QUESTIONS:
            continue
        for text in texts:
            question = rng.choice(QUESTIONS[lang])
            expected = expectation(question)
            for cut_kind in ("line", "sentence", "mid"):
                start = _cut(text, cut_kind, rng)
                if start is None:
                    continue
                pool = chinese if (lang not in ("zh", "ja") and rng.random() < 0.25) else english
                tail = rng.choice(pool)
                n += 1
                if verdict(start + tail, expected) is not None:
                    caught += 1
                else:
                    missed[f"{lang}/{cut_kind}"] += 1
            if lang in ENGLISH_NAMES:
                lead = rng.choice(LEAD_INS).format(ENGLISH_NAMES[lang])
                lead_n += 1
                ask = f"Reply in {ENGLISH_NAMES[lang]}."
                asked = expectation(f"{rng.choice(QUESTIONS['en'])} {ask}")
                if verdict(lead + text, asked) is not None:
                    lead_flagged += 1
                    if show:
                        print(f"  lead-in flagged ({lang}): {text[:60]!r}")
    out["drift_after_start"] = {"answers": n, "caught": caught, "missed": dict(missed)}
    out["lead_in"] = {"answers": lead_n, "flagged": lead_flagged}
    return out


def _cut(text: str, kind: str, rng: random.Random) -> str | None:
    """The start of ``text`` (150 to 600 characters) cut at a line, a sentence or mid-word."""
    low, high = 150, min(600, len(text) - 20)
    if high <= low:
        return None
    if kind == "mid":
        return text[: rng.randint(low, high)]
    marks = "\n" if kind == "line" else ".。!?！？"
    cuts = [i + 1 for i, c in enumerate(text[:high]) if c in marks and i + 1 >= low]
    return text[: rng.choice(cuts)] if cuts else None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--misses", action="store_true", help="print misses and false flags")
    args = parser.parse_args()
    result = measure(args.misses)
    print(json.dumps(result, indent=1, ensure_ascii=False))


if __name__ == "__main__":
    main()
