"""The language a prompt is written in (the last rule of :mod:`proxy.core.requested_language`).

Short prompts: fastText (``proxy.detect.language``) misjudges a few words of Latin script, but most
scripts name their language outright (Hangul is Korean, kana Japanese, Thai, Greek, Hebrew,
Georgian, Armenian …), and a Chinese question of ten characters is a whole question. Languages
that identification splits (Indonesian and Malay) are scored as one group. Pure: no I/O besides
the language model that ``proxy.detect.language`` loads once.
"""

from __future__ import annotations

import re

# Scripts that name their language outright, and the letters a short text needs.
_SCRIPT_LANGUAGE: tuple[tuple[str, str], ...] = (
    ("\uac00-\ud7af\u1100-\u11ff\u3130-\u318f", "ko"),
    ("\u3040-\u30ff\u31f0-\u31ff", "ja"),
    ("\u0e00-\u0e7f", "th"),
    ("\u0370-\u03ff\u1f00-\u1fff", "el"),
    ("\u0590-\u05ff", "he"),
    ("\u10a0-\u10ff", "ka"),
    ("\u0530-\u058f", "hy"),
    ("\u0980-\u09ff", "bn"),
    ("\u0a00-\u0a7f", "pa"),
    ("\u0a80-\u0aff", "gu"),
    ("\u0b80-\u0bff", "ta"),
    ("\u0c00-\u0c7f", "te"),
    ("\u0c80-\u0cff", "kn"),
    ("\u0d00-\u0d7f", "ml"),
    ("\u0d80-\u0dff", "si"),
    ("\u1780-\u17ff", "km"),
    ("\u0e80-\u0eff", "lo"),
    ("\u1000-\u109f", "my"),
    ("\u1200-\u137f", "am"),
)
_SCRIPT_RES = tuple((re.compile(f"[{cls}]"), code) for cls, code in _SCRIPT_LANGUAGE)
_HAN = re.compile(r"[\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff]")
_ARABIC = re.compile(r"[\u0600-\u06ff\u0750-\u077f\ufb50-\ufdff\ufe70-\ufeff]")
_DEVANAGARI = re.compile(r"[\u0900-\u097f]")
_CYRILLIC = re.compile(r"[\u0400-\u052f]")
_LETTER = re.compile(r"[^\W\d_]")
_PERSIAN = re.compile(r"[پچژگ]")
_URDU = re.compile(r"[ٹڈڑںےھ]")
_UKRAINIAN = re.compile(r"[іїєґІЇЄҐ]")
_RUSSIAN = re.compile(r"[ыэъёЫЭЪЁ]")
# Letters of the other languages written in Cyrillic (neither Russian nor Ukrainian writes them).
_OTHER_CYRILLIC = re.compile(r"[әғқңөұүһђјљњћџѓќѕўӘҒҚҢӨҰҮҺЂЈЉЊЋЏЃЌЅЎ]")
# Short words only one of the two writes (question words, conjunctions, "this", "me").
_UKRAINIAN_WORDS = frozenset(
    ("що", "чому", "як", "це", "та", "або", "але", "який", "яка", "яке", "які", "де", "коли",
     "ти", "мені", "чи", "навіщо", "скільки", "хто")
)  # fmt: skip
_RUSSIAN_WORDS = frozenset(
    ("что", "почему", "как", "это", "или", "но", "какой", "какая", "какое", "какие", "где",
     "когда", "ты", "мне", "ли", "зачем", "сколько", "кто")
)  # fmt: skip
# Letters only Vietnamese uses among the languages people write to models in.
# (Not the dot below alone, which Yoruba writes too, nor ă and đ, which Romanian and Croatian
# write.)
_VIETNAMESE = re.compile(
    "[ơưƠƯấầẩẫậắằẳẵặếềểễệốồổỗộớờởỡợứừửữựảẻỉỏủỷẤẦẨẪẬẮẰẲẴẶẾỀỂỄỆỐỒỔỖỘỚỜỞỠỢỨỪỬỮỰẢẺỈỎỦỶ]"
)
#: Any letter of the scripts above: a prompt with none of them (most are Latin-script) skips
#: their counts, which could only come out zero.
_SCRIPTED = re.compile(
    "["
    + "".join(cls for cls, _ in _SCRIPT_LANGUAGE)
    + "".join(p.pattern[1:-1] for p in (_HAN, _ARABIC, _DEVANAGARI, _CYRILLIC))
    + "]"
)

#: Languages identification splits; scored as one, named by the first (the one far more
#: people write to a model in).
_MERGED = {"ms": "id"}
#: Identification on ``n`` cleaned characters must reach this confidence (by length).
_MIN_CHARS = 12
_LONG_CHARS = 20
_SHORT_CONFIDENCE = 0.90
_CONFIDENCE = 0.75
#: fastText candidates handed to the word-frequency judgement of a short prompt.
_CANDIDATES = 5


def prompt_language(text: str) -> str | None:
    """The language ``text`` is written in, or None when unsure.

    Scripts that belong to one language decide at once (two or three letters are enough); a
    text in Han without kana is Chinese from four characters on; Latin, Cyrillic and Arabic
    script need fastText, with the Indonesian/Malay split summed."""
    from proxy.detect.language import strip_noise

    clean = strip_noise(text)
    letters = _LETTER.findall(clean)
    if not letters:
        return None
    if _SCRIPTED.search(clean) is not None:
        code = _scripted(clean, len(letters))
        if code is not _LATIN:
            return code
    if len(_VIETNAMESE.findall(clean)) >= 2:
        return "vi"
    return _identified(clean, None, words=True)


#: :func:`_scripted`'s answer when no script decided: go on as for Latin script.
_LATIN = "latin"


def _scripted(clean: str, total: int) -> str | None:
    """The language of a text with letters of a script that names it (or needs its own
    identification), :data:`_LATIN` when none of them holds enough of the text."""
    for pattern, code in _SCRIPT_RES:
        count = len(pattern.findall(clean))
        if count >= 2 and 2 * count >= total * (0.3 if code == "ja" else 1.0):
            return code
    han = len(_HAN.findall(clean))
    if han >= 4 and 2 * han >= total:
        return "zh"
    arabic = len(_ARABIC.findall(clean))
    if arabic >= 4 and 2 * arabic >= total:
        fallback = "fa" if _PERSIAN.search(clean) else "ur" if _URDU.search(clean) else "ar"
        return _identified(clean, {"ar", "fa", "ur", "ps", "ckb"}) or fallback
    if len(_DEVANAGARI.findall(clean)) >= 4 and 2 * len(_DEVANAGARI.findall(clean)) >= total:
        return _identified(clean, {"hi", "mr", "ne"}) or "hi"
    cyrillic = len(_CYRILLIC.findall(clean))
    if cyrillic >= 4 and 2 * cyrillic >= total:
        # Russian and Ukrainian share most words; a wrong guess between them would judge one
        # language's words against the other's word list, so letters and the few short words
        # only one of them writes decide, and identification only where they say nothing.
        if _OTHER_CYRILLIC.search(clean):
            return _identified(clean, None)  # Kazakh, Mongolian, Serbian … (ы is not Russian's)
        words = set(re.findall(r"\w+", clean.lower()))
        ukrainian = bool(_UKRAINIAN.search(clean) or words & _UKRAINIAN_WORDS)
        russian = bool(_RUSSIAN.search(clean) or words & _RUSSIAN_WORDS)
        if ukrainian != russian:
            return "uk" if ukrainian else "ru"
        return _identified(clean, None)
    return _LATIN


def _identified(clean: str, within: set[str] | None, *, words: bool = False) -> str | None:
    """fastText's answer when confident enough for the length (merged pairs summed). When it
    is not and ``words`` (Latin script), a short prompt's words may still tell: see
    :mod:`proxy.detect.word_language`."""
    from proxy.detect.language import classify_top

    if not words and len(clean) < _MIN_CHARS:
        return None  # too short for fastText's answer, and no words to judge instead
    top = classify_top(clean, _CANDIDATES)
    scores: dict[str, float] = {}
    for code, prob in top[:3]:
        code = _MERGED.get(code, code)
        scores[code] = scores.get(code, 0.0) + prob
    if scores and len(clean) >= _MIN_CHARS:
        best = max(scores, key=scores.__getitem__)
        need = _CONFIDENCE if len(clean) >= _LONG_CHARS else _SHORT_CONFIDENCE
        if scores[best] >= need:
            return best if within is None or best in within else None
    if not words:
        return None
    from proxy.detect.word_language import identify_by_words

    return identify_by_words(clean, top)


#: A language identification finds at least this likely for a turn is accepted beside the
#: likeliest: a short turn is often read as a close or neighbouring language ("Kuidas ma saan
#: …", Estonian, reads as Finnish 0.48, Estonian 0.16), and a guess may only widen.
_ALTERNATIVE = 0.10
#: A paragraph, quoted span or stretch of one script this confidently in a language adds it (a
#: pasted email, an error message, a song line the user asks about).
_SEGMENT_CONFIDENCE = 0.5
_SEGMENT_LETTERS = 20
_MAX_SEGMENTS = 40
_LINES = re.compile(r"[^\n]+")
_QUOTE_SPANS = re.compile(r"\"[^\"\n]{8,}\"|“[^”\n]{8,}”|«[^»\n]{8,}»|「[^」\n]{4,}」|'[^'\n]{8,}'")
# The sentences of a turn that writes more than one (a Portuguese sentence, then an English
# question): each is a segment of its own.
_SENTENCES = re.compile(r"[^.!?。！？\n]+[.!?。！？]*")
# Code, and text in quotes, is what the user shows rather than what they write: the turn's own
# language is read without it (a Chinese request to summarise a quoted English paragraph is
# Chinese), and its language is added apart.
_CODE = re.compile(r"```.*?(?:```|$)|`[^`\n]*`", re.S)
_QUOTED = re.compile(
    r"\"[^\"\n]{3,}?\"|“[^”\n]{3,}?”|„[^“”\n]{3,}?[“”]|«[^»\n]{3,}?»|「[^」\n]*」|『[^』\n]*』"
    r"|(?<![\w])'[^'\n]{3,}?'(?![\w])"
)
# Words only English writes among the languages people mix with it: two of them in a turn make
# English one of its languages (code-switched Hinglish, Taglish, Spanglish).
_ENGLISH_WORDS = frozenset((
    "the", "what", "how", "why", "which", "does", "you", "your", "with", "this", "that",
    "from", "have", "please", "should", "would", "could", "about", "there", "they", "want",
    "need", "thanks", "thank", "just", "know", "because", "really", "something", "anyone",
    "and", "like", "but", "i'm", "it's", "don't", "can't", "doesn't", "isn't", "what's",
    "let's", "you're", "that's", "easy", "help",
))  # fmt: skip
_LATIN_WORD = re.compile(r"[a-z']+")
_WIDE = re.compile(r"[\u3040-\u30ff\u3400-\u9fff\uac00-\ud7af\uf900-\ufaff]")
_LATIN_RUN = re.compile(r"[A-Za-z\u00c0-\u024f'’]+(?:[\s,.;:!?-]+[A-Za-z\u00c0-\u024f'’]+)*")
# Hindustani written in Latin letters (Hinglish, Roman Urdu): words no other language writes as
# often. Two of them make Hindi, Urdu and English languages of the turn.
_ROMAN_HINDUSTANI = frozenset((
    "hai", "hain", "nahi", "nahin", "kya", "kyu", "kyun", "mera", "meri", "mere", "mujhe",
    "tum", "aap", "hum", "kaise", "kaisa", "karu", "karo", "karna", "kar", "raha", "rahi",
    "rahe", "tha", "thi", "bhai", "yaar", "acha", "achha", "accha", "kitna", "kitne", "batao",
    "bata", "sakte", "sakta", "chahiye", "matlab", "lekin", "aur", "bhi", "abhi", "kuch",
    "kab", "kahan", "wala", "wali", "hoga", "hogi", "agar", "toh", "woh", "yeh",
))  # fmt: skip
# Swahili (and Sheng, mixed with English): words no other language writes as often.
_SWAHILI = frozenset((
    "nataka", "kujua", "hapa", "bila", "kubwa", "niaje", "sana", "kwa", "gani", "habari",
    "tafadhali", "asante", "naomba", "jinsi", "kama", "lakini", "sasa", "hii", "hiyo", "yangu",
    "wangu", "nini", "wapi", "lini", "ndiyo", "hapana", "nina", "sina", "kuna", "tu", "pia",
))  # fmt: skip
# Tagalog mixed with English (Taglish): words no other language writes as often.
_TAGALOG = frozenset((
    "ang", "ng", "mga", "yung", "yun", "kasi", "parang", "lang", "naman", "po", "ako", "ko",
    "mo", "siya", "natin", "namin", "hindi", "wala", "ano", "paano", "bakit", "ito", "talaga",
    "pero", "kung", "din", "rin", "ba", "laging", "kulang", "sana", "nga", "pala", "diba",
))  # fmt: skip
# Arabic written in Latin letters and digits ("3afak", "n9der", "7abibi"): Arabic too (one such
# word is enough to widen; "b2b" in an English turn only adds a language).
_ARABIZI = re.compile(r"\b[a-z]*[a-z][235679][a-z]+\b|\b[235679][a-z]{2,}\b")


def _mixed_foreign(clean: str, main: str) -> set[str]:
    """Other languages' words mixed into a Latin-script turn (see
    :func:`proxy.detect.word_language.mixed_languages`)."""
    from proxy.detect.word_language import mixed_languages

    return {_MERGED.get(c, c) for c in mixed_languages(clean, main)}


def _mixed_english(clean: str, main: str | None) -> bool:
    """English words mixed into a turn in another language (code-switching): two or more."""
    from proxy.detect.word_language import english_words

    return english_words(clean, main) >= 2


def prose(text: str) -> str:
    """``text`` without code and quoted spans: the words the writer wrote themselves."""
    if "`" in text:
        text = _CODE.sub(" ", text)
    return _QUOTED.sub(" ", text)


def turn_languages(text: str) -> tuple[str | None, frozenset[str]]:
    """The language a user turn is written in, and every language it may be in.

    The first is :func:`prompt_language` of the turn's own words (without code and quotes), else
    of the whole turn. The set adds the languages identification finds nearly as likely,
    English where English words are mixed in, Arabic where Arabic is written in Latin letters
    and digits, and the languages of its paragraphs, quoted spans and runs of one script. Only
    ever used to widen what an answer may be in, so every plausible reading counts."""
    from proxy.detect.language import classify, classify_top, strip_noise

    own = prose(text)
    main = prompt_language(own) if own.strip() != text.strip() else None
    main = main or prompt_language(text)
    out: set[str] = {main} if main else set()
    clean = strip_noise(text)
    if not _LETTER.search(clean):
        return main, frozenset(out)
    if main is not None:  # around an identified language; an unsure one gives no guess
        top = classify_top(strip_noise(own)[:4000] or clean[:4000], 3)
        # Only where identification itself chose the language: where a short prompt's words
        # overruled it ("Wat is fotosynthese?": English 0.46 by its letters, Dutch by its
        # words), its other guesses are what the words ruled out.
        if top and _MERGED.get(top[0][0], top[0][0]) == main:
            for code, prob in top:
                if prob >= _ALTERNATIVE and len(code) == 2:
                    out.add(_MERGED.get(code, code))
    low = clean.lower()
    if "en" not in out and (
        len(_ENGLISH_WORDS.intersection(_LATIN_WORD.findall(low))) >= 2
        # English words mixed into a turn whose own language is known, or beside a script
        # without spaces ("帮我写个email给client"); with no language known they would make
        # English the only one accepted ("un script PowerShell … la date")
        or (
            (main is not None or _WIDE.search(clean) is not None)
            and _mixed_english(strip_noise(own) or clean, main)
        )
    ):
        out.add("en")
    words = set(_LATIN_WORD.findall(low))
    if len(_ROMAN_HINDUSTANI & words) >= 2:
        out |= {"hi", "ur", "en"}  # Hinglish and Roman Urdu mix in English as a rule
    if len(_SWAHILI & words) >= 2:
        out |= {"sw", "en"}  # and so does Sheng
    if len(_TAGALOG & words) >= 3:
        out |= {"tl", "en"}  # and Taglish
    if _ARABIZI.search(text.lower()):
        out.add("ar")  # Arabizi, which mixes in English words as Hinglish does
        if _mixed_english(strip_noise(own) or clean, None):
            out.add("en")
    if main is not None and len(words) >= 4:
        out |= _mixed_foreign(strip_noise(own) or clean, main)
    pieces = [m[0] for m in _LINES.finditer(text)]
    pieces += [m[0] for m in _QUOTE_SPANS.finditer(text)]
    sentences = [m[0] for m in _SENTENCES.finditer(text)]
    if len(sentences) > 1:
        pieces += sentences
    if _SCRIPTED.search(clean) and _LATIN_WORD.search(low):
        pieces += [m[0] for m in _LATIN_RUN.finditer(clean)]  # the Latin stretches of a mix
        pieces.append(_LATIN_RUN.sub(" ", clean))  # and the rest
    # A line that is one sentence, or one quoted span, is identified once.
    for piece in list(dict.fromkeys(pieces))[:_MAX_SEGMENTS]:
        piece = strip_noise(piece)
        # Letters of scripts written without spaces weigh a word each (three letters' worth).
        weight = len(_LETTER.findall(piece)) + 2 * len(_WIDE.findall(piece))
        if weight < _SEGMENT_LETTERS or len(piece) >= len(clean):
            continue
        found = classify(piece)
        if found is not None and found[1] >= _SEGMENT_CONFIDENCE and len(found[0]) == 2:
            out.add(_MERGED.get(found[0], found[0]))
    if main is None and out:
        # A turn of no sure language (code-switched: "oye so my jefe wants me to hacer un
        # reporte…") that still made a set (its English words, a segment) would narrow to
        # that set: what identification finds likely for the whole turn widens it again.
        for code, prob in classify_top(strip_noise(own)[:4000] or clean[:4000], 3):
            if prob >= _ALTERNATIVE and len(code) == 2:
                out.add(_MERGED.get(code, code))
    return main, frozenset(out)
