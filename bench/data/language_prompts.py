"""The prompt sets of ``bench/measure/language/measure_language_strength.py`` (language strength).

* ``about_prompts()``: English prompts *about* a language (grammar, words, sounds, learning,
  culture, "In X, how do you …", translation questions) — the answer is English with words of
  the language in it, and cutting it is harm done by the guard.
* ``explicit_prompts()``: prompts that bind the answer to a language, phrased in English (15
  shapes) and in the target language itself (one or two native phrasings per language).
* ``crosslingual_prompts()``: the shapes ``auto`` used to contradict: a request inside a creative
  task ("Write a 100-word poem in Arabic including the words …") and a request after a long
  article.

Written for this project; no public benchmark prompts. Each prompt says its template, so
figures can be broken down by shape.
"""

from __future__ import annotations

import random

#: English name -> code, for the languages the prompts are about or ask for.
LANGUAGES: dict[str, str] = {
    "Spanish": "es", "French": "fr", "German": "de", "Italian": "it", "Portuguese": "pt",
    "Japanese": "ja", "Korean": "ko", "Chinese": "zh", "Russian": "ru", "Arabic": "ar",
    "Hindi": "hi", "Turkish": "tr", "Dutch": "nl", "Polish": "pl", "Swedish": "sv",
    "Greek": "el", "Hebrew": "he", "Vietnamese": "vi", "Indonesian": "id", "Thai": "th",
    "Catalan": "ca", "Croatian": "hr", "Czech": "cs", "Finnish": "fi", "Hungarian": "hu",
    "Ukrainian": "uk", "Persian": "fa", "Tagalog": "tl", "Swahili": "sw", "Latin": "la",
}  # fmt: skip

ABOUT_TEMPLATES: dict[str, str] = {
    "difference": "Explain the difference between the two past tenses in {L}.",
    "in-x-why": "In {L}, why does the verb go where it goes in a sentence?",
    "in-x-how": "In {L}, how do you form the plural of nouns?",
    "speakers-wrong": "What do English speakers get wrong in {L}?",
    "how-say": "How do you say 'thank you very much' in {L}?",
    "learn": "What is the best way to learn {L} as an adult?",
    "pronounce": "How do you pronounce the letter r in {L}?",
    "greetings": "What are the most common greetings in {L}?",
    "grammar-hard": "Is {L} grammar difficult for beginners? Why?",
    "mistakes": "What are some common mistakes learners make in {L}?",
    "cases": "How many grammatical cases does {L} have?",
    "translate-q": "How would you translate 'I miss you' into {L}, and what does each word mean?",
    "word-culture": "What does the word for 'home' in {L} tell us about the culture?",
    "formal": "Explain how formal and informal speech work in {L}.",
    "spelling": "Why is {L} spelling hard for learners?",
    "listening": "Give me tips for improving my {L} listening skills.",
    "origin": "What is the origin of the {L} language?",
    "conjugation": "Explain how verbs are conjugated in {L}.",
    "dialects": "Which countries speak {L}, and how do the dialects differ?",
    "count": "How do you count from one to five in {L}?",
    "directions": "In {L}, how do you ask for directions politely?",
    "false-friends": "What are false friends between English and {L}?",
    "word-order": "How is word order in {L} different from English?",
    "writing": "Describe the writing system used for {L}.",
    "word-for": "What is the {L} word for 'butterfly' and where does it come from?",
    "translate-how": "How do I translate 'good morning' into {L}?",
    "idiom": "Explain a common idiom in {L} and what it means.",
    "culture": "What should I know about politeness when speaking {L} with older people?",
}

EXPLICIT_TEMPLATES: dict[str, str] = {
    "please-respond": "Please respond in {L}: what is the capital of Australia?",
    "need-answer": "I need the answer in {L}: how do vaccines work?",
    "short-email": "Write a short email in {L} to my landlord about a broken heater.",
    "reply-first": "Reply in {L}. Explain how a rainbow forms.",
    "answer-last": "Explain how a rainbow forms. Answer in {L}, please.",
    "write-answer": "Write your answer in {L}: why do leaves change colour in autumn?",
    "respond-only": "Respond only in {L}. What are the benefits of regular exercise?",
    "translate": "Translate the following text into {L}: The weather is nice today, so we "
    "are going to the park.",
    "explain-topic": "Explain photosynthesis in {L}.",
    "story": "Write a short story in {L} about a lost dog finding its way home.",
    "use": "Describe the water cycle. Use {L}.",
    "can-you": "Can you answer in {L}? What causes earthquakes?",
    "summary": "Summarize the plot of Romeo and Juliet in {L}.",
    "poem-words": "Write a 100-word poem in {L} including the words moon, river and bread.",
    "tell-me": "Tell me about the history of the bicycle in {L}.",
}

#: A native request per language: (template in the language, code). "{body}" is a question in
#: that language, so the whole prompt is written in the requested language.
NATIVE: list[tuple[str, str]] = [
    ("Responde en español, por favor: {body}", "es"),
    ("Réponds en français : {body}", "fr"),
    ("Antworte bitte auf Deutsch: {body}", "de"),
    ("Rispondi in italiano: {body}", "it"),
    ("Responda em português: {body}", "pt"),
    ("日本語で答えてください：{body}", "ja"),
    ("한국어로 답해 주세요: {body}", "ko"),
    ("请用中文回答：{body}", "zh"),
    ("Ответь на русском языке: {body}", "ru"),
    ("أجب باللغة العربية: {body}", "ar"),
    ("कृपया हिंदी में उत्तर दें: {body}", "hi"),
    ("Lütfen Türkçe cevap ver: {body}", "tr"),
    ("Antwoord in het Nederlands: {body}", "nl"),
    ("Odpowiedz po polsku: {body}", "pl"),
    ("Svara på svenska: {body}", "sv"),
    ("Trả lời bằng tiếng Việt: {body}", "vi"),
    ("Jawab dalam bahasa Indonesia: {body}", "id"),
    ("Відповідай українською мовою: {body}", "uk"),
    ("Respon en català: {body}", "ca"),
    ("Odpověz česky: {body}", "cs"),
]
#: One question in each native language (the body of its native request).
NATIVE_BODIES: dict[str, str] = {
    "es": "¿Cómo funcionan las vacunas?", "fr": "Comment fonctionnent les vaccins ?",
    "de": "Wie funktionieren Impfstoffe?", "it": "Come funzionano i vaccini?",
    "pt": "Como funcionam as vacinas?", "ja": "ワクチンはどのように働きますか？",
    "ko": "백신은 어떻게 작동하나요?", "zh": "疫苗是如何起作用的？",
    "ru": "Как работают вакцины?", "ar": "كيف تعمل اللقاحات؟",
    "hi": "टीके कैसे काम करते हैं?", "tr": "Aşılar nasıl çalışır?",
    "nl": "Hoe werken vaccins?", "pl": "Jak działają szczepionki?",
    "sv": "Hur fungerar vacciner?", "vi": "Vắc-xin hoạt động như thế nào?",
    "id": "Bagaimana cara kerja vaksin?", "uk": "Як працюють вакцини?",
    "ca": "Com funcionen les vacunes?", "cs": "Jak fungují vakcíny?",
}  # fmt: skip
#: Requests for another language written in a third language (the prompt's language must not
#: be expected instead): German asking for Catalan, Polish asking for Czech, and so on.
CROSS_NATIVE: list[tuple[str, str]] = [
    ("Antworte bitte auf Katalanisch: Wie funktionieren Impfstoffe?", "ca"),
    ("Odpowiedz po czesku: Jak działają szczepionki?", "cs"),
    ("Réponds en croate : comment fonctionnent les vaccins ?", "hr"),
    ("Responde en eslovaco: ¿cómo funcionan las vacunas?", "sk"),
    ("Rispondi in tagalog: come funzionano i vaccini?", "tl"),
    ("Ответь на урду: как работают вакцины?", "ur"),
    ("Antworte auf Tamil: Wie funktionieren Impfstoffe?", "ta"),
    ("Responda em turco: como funcionam as vacinas?", "tr"),
    ("Réponds en coréen : comment fonctionnent les vaccins ?", "ko"),
]

ARTICLE = (
    "The city council met on Tuesday evening to discuss the new public transport plan. "
    "Residents raised concerns about the cost of the project, the length of construction and "
    "the effect on small businesses along the main road. The mayor said the plan would cut "
    "travel times by a third and reduce traffic in the centre. Several speakers asked for more "
    "bicycle lanes and better lighting at bus stops. A final vote is expected next month, "
    "after a second round of public consultation. "
) * 6
CROSSLINGUAL: dict[str, str] = {
    "poem-words": "Write a 100-word poem in {L} including the words moon, river and bread.",
    "after-article": ARTICLE + "\n\nSummarize the article above in {L}.",
    "after-article-2": ARTICLE + "\n\nNow write three questions about this article in {L}.",
    "dialogue": "Create a dialogue in {L} between a shopkeeper and a customer buying apples.",
    "slogan": "Write an advertising slogan in {L} for a new brand of orange juice.",
}


def about_prompts() -> list[dict[str, str]]:
    """Every (template, language) pair, shuffled once: 28 templates x 30 languages, of which
    the first 180 are used."""
    pairs = [(t, name) for t in ABOUT_TEMPLATES for name in LANGUAGES]
    random.Random(27).shuffle(pairs)
    return [
        {
            "template": t,
            "language": LANGUAGES[name],
            "prompt": ABOUT_TEMPLATES[t].format(L=name),
        }
        for t, name in pairs[:180]
    ]


EXPLICIT_TARGETS = (
    "Spanish", "French", "German", "Italian", "Portuguese", "Japanese", "Korean", "Chinese",
    "Russian", "Arabic", "Hindi", "Turkish", "Dutch", "Polish", "Vietnamese", "Catalan",
    "Croatian", "Tagalog",
)  # fmt: skip


def explicit_prompts() -> list[dict[str, str]]:
    """English-phrased requests (15 shapes x 18 target languages, 150 of them) and the native
    ones (20 languages, plus 9 asking for a third language)."""
    pairs = [(t, name) for t in EXPLICIT_TEMPLATES for name in EXPLICIT_TARGETS]
    random.Random(28).shuffle(pairs)
    out = [
        {
            "template": t,
            "phrasing": "english",
            "language": LANGUAGES[name],
            "prompt": EXPLICIT_TEMPLATES[t].format(L=name),
        }
        for t, name in pairs[:150]
    ]
    for template, code in NATIVE:
        prompt = template.format(body=NATIVE_BODIES[code])
        out.append({"template": "native", "phrasing": "native", "language": code, "prompt": prompt})
    for prompt, code in CROSS_NATIVE:
        out.append({"template": "cross", "phrasing": "native", "language": code, "prompt": prompt})
    return out


def crosslingual_prompts() -> list[dict[str, str]]:
    return [
        {"template": t, "language": LANGUAGES[name], "prompt": text.format(L=name)}
        for t, text in CROSSLINGUAL.items()
        for name in EXPLICIT_TARGETS
    ]
