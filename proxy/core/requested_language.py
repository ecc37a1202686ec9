"""The language an answer must be in, derived from what the client asked, and how sure that is.

The expectation decides two things: which language ``GUARD_LANGUAGE=auto`` pins in the request,
and which languages the detector accepts in the answer. Getting it wrong is worse than having
none: an English instruction injected into "Reply in French. Explain …" makes the model answer
against the user's wish, and the detector then aborts the correct French answer; an English
answer to "Explain the difference between *por* and *para* in Spanish" is the right answer, not
drift. So an expectation has a **strength**:

* *strong* — the client's ``x-guard-language``, the operator's ``GUARD_LANGUAGE=<code>``, an
  instruction that binds the *answer* to a language ("Reply in French", "Please respond in
  Turkish: …", "Write a short email in Korean …", "translate … into Italian", "rispondi in
  inglese", "auf Englisch", "用英文回答", "日本語で答えて"), or a prompt written in a language other
  than English that names no other language. Only that language is accepted; ``auto`` injects it.
* *weak* — a language named as the prompt's *subject* ("Explain … in Spanish" about grammar or
  words, "In German, why does the verb move?", "What do English speakers get wrong in French?"),
  an English prompt with no instruction, or anything the derivation is unsure of. The prompt's
  language and every language the prompt names are accepted; ``auto`` injects nothing.

No expectation: two different requested languages, a translation with no target ("Translate
this:"), a requested language the detector cannot judge (Zulu, Hausa …: never the prompt's
language instead), or a prompt whose language cannot be told.

An instruction is a language named in a marked form (a preposition before the name, "in French",
"на русском", "用英文", or a case ending after it, "英語で", "영어로", "हिंदी में") in the same
clause as a directive verb (reply, write, use, translate …, in the same languages), where nothing
before the name in the clause makes the language the subject (words about words, grammar,
speakers, learning, "how do you say"). Names come from langcodes (:mod:`proxy.core.language_names`),
the phrase markers and verbs are written here. Pure and fast: a few dictionary look-ups per word.
"""

from __future__ import annotations

import contextlib
import hashlib
import re
from collections import OrderedDict
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Literal, NamedTuple

from proxy.core.language_names import UNJUDGED, names
from proxy.core.prompt_language import prompt_language

#: Where an expectation came from (a bounded metric label): the client's request (its header
#: or an instruction in it), the prompt's own language, the operator's configuration, or nowhere.
Source = Literal["request", "prompt", "config", "none"]
SOURCES: tuple[Source, ...] = ("request", "prompt", "config", "none")
#: How sure the expectation is (a bounded metric label; see the module docstring).
Strength = Literal["strong", "weak", "none"]
STRENGTHS: tuple[Strength, ...] = ("strong", "weak", "none")


@dataclass(frozen=True, slots=True)
class Expectation:
    """The expected answer language (ISO 639-1, or None), how sure, where it came from and why,
    and the languages an answer may be in (``code`` alone when strong)."""

    code: str | None
    source: Source
    #: A short fixed word saying why: header, instruction, prompt, subject, conflict,
    #: translation, unjudged, config, english, unknown, off.
    reason: str
    strength: Strength = "strong"
    accepted: frozenset[str] = frozenset()

    def __post_init__(self) -> None:
        if self.code is None:
            object.__setattr__(self, "strength", "none")
            object.__setattr__(self, "accepted", frozenset())
        elif not self.accepted:
            object.__setattr__(self, "accepted", frozenset({self.code}))

    def header(self) -> str:
        """The ``x-guard-language`` response header, e.g. ``fr; source=request; by=instruction;
        strength=strong`` or ``en; source=prompt; by=subject; strength=weak; accepts=en,es``."""
        out = f"{self.code or 'none'}; source={self.source}; by={self.reason}"
        out += f"; strength={self.strength}"
        if self.strength == "weak":
            out += "; accepts=" + ",".join(sorted(self.accepted))
        return out


NONE = Expectation(None, "none", "unknown")
#: No expectation because none was looked for (the default of a rewrite).
UNSET = Expectation(None, "none", "off")


# --- finding language names ----------------------------------------------------------------------
# A word: letters with the combining marks Indic, Arabic and Hebrew write inside words.
_WORD = re.compile(
    r"(?:[^\W_]|[\u0300-\u036f\u0591-\u05c7\u064b-\u065f\u0670\u0900-\u0dff\u0e00-\u0e7f])+"
)
_UNSPACED = re.compile(r"[\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff\u0e00-\u0e7f]")
_LATIN_CYRILLIC = re.compile(r"^[a-zß-ɏḀ-ỿ\u0400-\u052f]+$")
# Case endings a Latin-script name may take ("ins Englische", "po angielsku", "v angličtině").
_LATIN_TAILS = frozenset((
    "e", "en", "er", "es", "em", "a", "as", "o", "os", "u", "ą", "ie", "im", "iego", "ej",
    "ou", "ě", "ině", "ého", "ým", "ii",
))  # fmt: skip
# Prefixes written onto the word (Arabic "بالإنجليزية", Hebrew "בעברית").
_PREFIXES = ("بال", "بـ", "ب", "لل", "ال", "ב", "ל")


class _Name(NamedTuple):
    start: int
    end: int
    code: str
    spaced: bool  # a Latin or Cyrillic name: what follows it decides (see _FOLLOW)


def _unspaced_pattern() -> re.Pattern[str]:
    words = sorted((n for n in names().codes if _UNSPACED.search(n)), key=len, reverse=True)
    return re.compile("|".join(map(re.escape, words)))


_UNSPACED_NAMES: list[re.Pattern[str]] = []


def find_names(clause: str) -> list[_Name]:
    """Every language name in ``clause`` (lower case, single spaces), left to right: whole words
    and runs of up to three words looked up in langcodes' index, a stem with a case ending
    ("английском"), a prefix written on ("بالإنجليزية"), and names inside unspaced scripts."""
    codes = names().codes
    found: list[_Name] = []
    words = list(_WORD.finditer(clause))
    skip_to = 0
    for i, word in enumerate(words):
        if word.start() < skip_to:
            continue
        hit = _lookup(clause, words, i, codes)
        if hit is not None:
            found.append(hit)
            skip_to = hit.end
    if _UNSPACED.search(clause):
        if not _UNSPACED_NAMES:
            _UNSPACED_NAMES.append(_unspaced_pattern())
        for match in _UNSPACED_NAMES[0].finditer(clause):
            found.append(_Name(match.start(), match.end(), codes[match[0]], False))
        found.sort()
    return found


def _lookup(clause: str, words: list[re.Match[str]], i: int, codes: dict[str, str]) -> _Name | None:
    first = words[i]
    for n in (3, 2):  # "bahasa inggris", "tiếng anh", "scottish gaelic"
        if i + n <= len(words):
            last = words[i + n - 1]
            key = clause[first.start() : last.end()]
            if key in codes:
                return _Name(first.start(), last.end(), codes[key], True)
    word = first[0]
    start, end = first.start(), first.end()
    code = codes.get(word)
    if code is not None:
        return _Name(start, end, code, _LATIN_CYRILLIC.match(word) is not None)
    head = word[0]
    if "\u0590" <= head <= "\u06ff":  # Hebrew and Arabic write prefixes onto the word
        for prefix in _PREFIXES:
            if word.startswith(prefix) and word[len(prefix) :] in codes:
                return _Name(start + len(prefix), end, codes[word[len(prefix) :]], False)
        return None
    hangul = "\uac00" <= head <= "\ud7af"
    if len(word) < (3 if hangul else 6) or _UNSPACED.search(head):
        return None
    cyrillic = "\u0400" <= head <= "\u052f"
    for cut in range(1, 5):
        stem, tail = word[:-cut], word[-cut:]
        if len(stem) < (2 if hangul else 5) or stem not in codes:
            continue
        if hangul:  # 영어로, 한국어로: the particle is the mark (see _AFTER)
            return _Name(start, start + len(stem), codes[stem], False)
        if cyrillic or tail in _LATIN_TAILS:
            return _Name(start, end, codes[stem], True)
    return None


# Markers that make a mention an instruction about the answer's language: a preposition or
# particle before the name ("in", "auf", "на", "用", "باللغة"; "to" only in a translation), a
# case ending or postposition after it ("で", "로", "में"), or the name standing as an adverb
# (Turkish "İngilizce", Czech "česky", Indonesian "bahasa X", Vietnamese "tiếng X").
_BEFORE = re.compile(
    r"(?:(?<![\w])(?:in|into|en|al|ao|auf|ins|em|para|dalam|ke|sang|bằng|на|по|po|på"
    r"|use|usa|usar|utilise|utilisez|utiliza|utilizza|verwende|nutze|gunakan|pakai|kullan"
    r"|dùng|sử dụng|используй\w*)"
    r" (?:the |la |il |o |het |lingua |língua |idioma |langue |sprache )?"
    r"|по-|用|以|使用|成|为|為|改用|改成|باللغة |بلغة |بال|ب|إلى |الى |اللغة |زبان |เป็น"
    r"|στα |σε |ב)$"
)
_BEFORE_TO = re.compile(r"(?<![\w])to (?:the )?$")
_AFTER = re.compile(
    r"^(?: ?(?:のみで|だけで|で|に|로|으로|में|回答|回复|作答|答|写|寫|说|說)"
    r"| (?:olarak|dilinde|language|only|please|язык\w*|мовою|ภาษา)(?![\w]))"
)
_SELF_MARKED = re.compile(r"(?:ca|ce|ça|çe)$|^bahasa |^tiếng |^česky$")
# What may follow a name written with spaces for the mention to be about the answer: the end
# of the clause, punctuation, or a small word ("in French please", "auf Deutsch und kurz"), not
# a noun ("trends in Chinese manufacturing", "на русском рынке").
_FOLLOW = re.compile(
    r"^(?:$|[,:;.!?)\"'»“”–—(]| (?:please|only|language|and|or|then|so|from|with"
    r"|without|using|for|to|about|instead|as|not|no|rather|but|how|what|why|when|where|who"
    r"|which|that|this|these|the|a|an|even|too|also|if|here|below|always|throughout|text"
    r"|por|favor|solo|solamente|sobre|de|del|y|e|et|s'il|seulement|sur|bitte|nur|und|über"
    r"|per|su|di|soltanto|somente|apenas|язык\w*|только|и|о|об|про|пожалуйста"
    r"|saja|dan|tentang|tolong|và|về|chỉ|ve|sadece|hakkında|lütfen|мовою"
    # what a text to write goes on with: "an email in Korean asking for …"
    r"|asking|explaining|describing|telling|including|containing|covering|saying|thanking"
    r"|inviting|requesting|introducing|summari[sz]ing|comparing|listing|giving|addressed"
    r"|of|on|in|at|by|like|every|each|whose|while|after|before|because|between)(?![\w]))"
)


# Directive verbs: the clause asks for an answer, a text or a translation (stems, 15+ languages).
_VERBS_SPACED = (
    "repl|respon|answer|writ|explain|use|using|speak|talk|translat|output|give|tell|describ"
    "|summar|continu|provid|generat|compos|draft|rewrit|put|keep|conduct|creat|mak|prepar"
    "|contest|escrib|explic|utiliz|habl|traduc|resum|redact|dime|dame"
    "|répond|repond|écri|ecri|expliqu|utilis|parl|tradui|résum|rédig|donne"
    "|antwort|schreib|erklär|erklar|verwend|nutz|sprich|sprech|übersetz|ubersetz|fass"
    "|formulier|gib|rispond|scriv|spieg|usa|utilizz|tradu|riassum|dimmi|fornisc"
    "|escrev|expliq|fal[ae]|diga|jawab|balas|tulis|jelaskan|gunakan|pakai|bicara|terjemah"
    "|beri|buat|trả\\s+lời|viết|giải\\s+thích|dùng|sử\\s+dụng|nói|dịch|tóm\\s+tắt"
    "|cevap|yanıt|yanit|yaz|açıkla|acikla|kullan|konuş|çevir|cevir|anlat|özetle"
    "|ответ|отвеча|напиш|пиш|объясн|использ|говор|перевед|переве|расскаж|опиш|сформулир"
    "|odpowi|napisz|pisz|wyjaśnij|użyj|przetłumacz|antwoord|schrijf|gebruik|vertaal|svara"
    "|skriv|förklara|använd|översätt|odpovíd|odpověz|napiš|vysvětli|použij|přelož"
    "|відповід|напиш|поясн|використ|переклад|απάντ|γράψ|γράφ|εξήγ|χρησιμοπ|μετάφρ"
)
_VERBS_WIDE = (
    "回答|回复|回覆|作答|答|写|寫|解释|解釋|用|使用|说|說|翻译|翻譯|讲|講|输出|介绍|告诉"
    "|答え|答えて|回答|書い|書き|説明|使っ|話し|翻訳|返信|返答|教え|記述"
    "|답|대답|써|쓰|작성|설명|사용|말해|번역|알려"
    "|जवाब|उत्तर|लिख|समझा|उपयोग|इस्तेमाल|बोल|अनुवाद|बता|दें|दो"
    "|أجب|اجب|أجيبي|رد|ردّ|اكتب|أكتب|اشرح|استخدم|تحدث|ترجم|أعط|قدم"
    "|پاسخ|بنویس|توضیح|استفاده|ترجمه|ตอบ|เขียน|อธิบาย|ใช้|แปล|ענה|עני|כתוב|הסבר|השתמש|תרגם"
)
_VERB = re.compile(rf"(?<![\w])(?:{_VERBS_SPACED})|{_VERBS_WIDE}")
_TRANSLATE = re.compile(
    r"(?<![\w])(?:translat|traduc|tradui|übersetz|ubersetz|tradu[cz]|terjemah|dịch|çevir"
    r"|cevir|перевед|переве)|翻译|翻譯|翻訳|번역|अनुवाद|ترجم"
)

# Clauses that name a language without asking for the answer to be in it: the words before the
# name make the language the subject — questions about the language ("How do you say …", "How
# would I translate my site into …", "What do English speakers get wrong in French?"), its
# grammar, words, sounds and writing ("the difference between por and para in Spanish"),
# learning it, snippets in it whose explanation is in the prompt's language ("5 phrases in
# Japanese") and programs that translate ("a Python function that translates text into French").
_ABOUT = re.compile(
    r"(?<![\w-])(?:say|said|mean\w*|word\s+for|called|pronounc\w*|spell\w*|written|write\s+(?:the|my)\s+name"
    r"|how\s+(?:do|does|would|can|could|should|to|is|are|did)(?:\s+(?:i|we|you))?"
    r"|phrases?|words?|sentences?|expressions?|vocabulary|idioms?|greetings?|sayings?|examples?"
    r"|grammar\w*|verbs?|nouns?|adjectives?|adverbs?|pronouns?|tenses?|conjugat\w*"
    r"|declension\w*|cases?|gender\w*|plurals?|subjunctive|particles?|prepositions?|syntax"
    r"|accents?|dialects?|alphabet|letters?|characters?|kanji|hiragana|katakana|scripts?|spelling"
    r"|punctuation|slang|formal|informal|polite\w*|honorifics?|speakers?|learn\w*|stud(?:y|ying)"
    r"|teach\w*|native|fluent\w*|difference|differences|between|mistakes?|wrong|errors?|literal\w*"
    r"|untranslatable|loanwords?|etymology|origins?|sound|tones?|numbers?|count(?:ing)?|days?"
    r"|months?|names?|nicknames?|swear\w*|curse\w*|lyrics|proverbs?|rules?|usage|used|difficult"
    r"|hard|easy|easier|harder|common|mean|meaning|definition|opposite|synonyms?|rhym\w*"
    r"|python|javascript|typescript|java|function|program|script|code|api|regex|sql|translates)"
    r"(?![\w])"
)
# A name bound to the answer itself outright, whatever else the clause says: "Answer in Spanish:
# what is a verb?", "Write your reply in German", "respond only in French".
_BOUND = re.compile(
    r"(?<![\w])(?:respond\w*|repl(?:y|ies|ying)|answer(?:s|ing)?|your\s+(?:answer|response|reply|output)"
    r"|the\s+(?:answer|response|reply|output)|write\s+back)"
    r"(?:\s+(?:me|only|please|back|to\s+me|to\s+this|this|it|all|everything|entirely|fully|just"
    r"|is|be|should|must|will|has|to|from\s+now\s+on))*\s+(?:in|into|using|en|em|auf|in\s+het)\s+(?:the\s+)?$"
)
# "How do you reply in French to …": a question about replying asks for nothing.
_WH = re.compile(r"^\s*(?:how|what|why|when|where|which|who)\b")
# "In German, why …": a name that opens a question is its topic.
_OPENS_QUESTION = re.compile(
    r"^\s*,\s*(?:why|how|what|which|when|where|who|is|are|do|does|can|could|should|would|will)\b"
)
_CLAUSE = re.compile(r"[^.!?;:\n。！？；：]+")

#: How much of a long message is searched for an instruction: its start and its end.
_SCAN_CHARS = 2000


class Reading(NamedTuple):
    """What one text says about the answer's language: the languages it binds the answer to
    (``?`` for one the detector cannot judge), every language it names, and whether it asks
    for a translation without a target."""

    asked: frozenset[str]
    named: frozenset[str]
    untargeted: bool


def read(text: str) -> Reading:
    """What ``text`` says about the answer's language (see :class:`Reading`)."""
    if len(text) > 2 * _SCAN_CHARS:
        text = text[:_SCAN_CHARS] + "\n" + text[-_SCAN_CHARS:]
    low = text.replace("İ", "i").lower()
    asked: set[str] = set()
    named: set[str] = set()
    for match in _CLAUSE.finditer(low):
        clause = " ".join(match[0].split())
        found = find_names(clause)
        if not found:
            continue
        named.update(name.code for name in found)
        if _VERB.search(clause):
            asked |= _bound(clause, found, _TRANSLATE.search(clause) is not None)
    # "Translate this: …" names no target; "How do I translate 'good morning' into Korean?"
    # names one, as its subject.
    untargeted = not asked and not named and _TRANSLATE.search(low) is not None
    return Reading(frozenset(asked), frozenset(named), untargeted)


def _bound(clause: str, found: list[_Name], translation: bool) -> set[str]:
    """The languages of ``found`` that ``clause`` binds the answer to."""
    out: set[str] = set()
    for name in found:
        before = clause[max(0, name.start - 24) : name.start]
        after = clause[name.end : name.end + 24]
        lead = clause[: name.start]
        if _BOUND.search(lead[-60:]) and not _WH.match(lead):
            out.add(name.code)
            continue
        if _ABOUT.search(lead) or (len(lead) <= 4 and _OPENS_QUESTION.match(after)):
            continue  # the language is what the clause is about
        word = clause[name.start : name.end]
        if _SELF_MARKED.search(word):
            out.add(name.code)
            continue
        if name.spaced and not _FOLLOW.match(after) and not _AFTER.match(after):
            continue
        if (
            _BEFORE.search(before)
            or _AFTER.match(after)
            or (translation and _BEFORE_TO.search(before))
        ):
            out.add(name.code)
    return out


def explicit_requests(text: str) -> set[str]:
    """The languages ``text`` explicitly asks the answer to be in (empty when none; ``?`` for a
    language the detector cannot judge). A translation request without a target yields
    ``{"*"}``: no language can be expected."""
    reading = read(text)
    return {"*"} if reading.untargeted else set(reading.asked)


class _Seen:
    """One text's entry in :class:`TextMemo`: its reading, and its language once asked."""

    __slots__ = ("identified", "language", "reading")

    def __init__(self, reading: Reading) -> None:
        self.reading = reading
        self.identified = False
        self.language: str | None = None


class TextMemo:
    """What :func:`read` and :func:`prompt_language` said of texts seen a moment ago.

    Why: both run on every guarded request (tens of µs for a short prompt, hundreds for a long
    system prompt: most of a request's own set-up), and the same texts come back again and
    again — a deployment's system prompt with every request, an agent's last user turn with
    every step of its tool loop. Both are pure (fixed rules, a fixed language model), so a text
    read before is answered from here exactly as reading it again would answer.

    Keyed by a 16-byte digest of the text, never the text (as :mod:`proxy.core.retries` keeps
    no prompt); at most ``size`` texts, the least recently used forgotten first. One per
    process, used from the event loop's thread (another thread at worst reads a text again).
    """

    __slots__ = ("_entries", "size")

    def __init__(self, size: int = 1024) -> None:
        self.size = size
        self._entries: OrderedDict[bytes, _Seen] = OrderedDict()

    def __len__(self) -> int:
        return len(self._entries)

    def clear(self) -> None:
        self._entries.clear()

    def digests(self) -> list[bytes]:
        return list(self._entries)

    def seen(self, text: str) -> _Seen:
        """The entry of ``text``, read now when it is new."""
        key = hashlib.blake2b(text.encode("utf-8", "surrogatepass"), digest_size=16).digest()
        entries = self._entries
        found = entries.get(key)
        if found is not None:
            with contextlib.suppress(KeyError):  # another thread forgot it meanwhile
                entries.move_to_end(key)
            return found
        found = entries[key] = _Seen(read(text))
        if len(entries) > self.size:
            with contextlib.suppress(KeyError):
                entries.popitem(last=False)
        return found

    def language(self, text: str) -> str | None:
        """:func:`prompt_language` of ``text``."""
        found = self.seen(text)
        if not found.identified:
            found.language = prompt_language(text)
            found.identified = True
        return found.language


#: The process's memo of request texts (see :class:`TextMemo`).
MEMO = TextMemo()


def derive(instructions: Iterable[str], last_user: str, *, use_prompt: bool = True) -> Expectation:
    """The expectation from a request's texts: ``instructions`` (system/developer text) and the
    ``last_user`` turn; the prompt's language only when ``use_prompt``. Texts read a moment ago
    are answered from :data:`MEMO`."""
    asked: set[str] = set()
    named: set[str] = set()
    untargeted = False
    for text in [*instructions, last_user]:
        if text:
            reading = MEMO.seen(text).reading
            asked |= reading.asked
            named |= reading.named
            untargeted = untargeted or reading.untargeted
    if UNJUDGED in asked:
        return Expectation(None, "none", "unjudged")
    if len(asked) > 1:
        return Expectation(None, "none", "conflict")
    if asked:
        return Expectation(asked.pop(), "request", "instruction")
    if untargeted:
        return Expectation(None, "none", "translation")
    if not use_prompt:
        return Expectation(None, "none", "off")
    code = MEMO.language(last_user) if last_user else prompt_language(last_user)
    if code is None:
        return NONE
    others = named - {code}
    if UNJUDGED in others:
        return Expectation(None, "none", "unjudged")
    if others:
        return Expectation(code, "prompt", "subject", "weak", frozenset({code, *others}))
    if code == "en":
        return Expectation(code, "prompt", "prompt", "weak")
    return Expectation(code, "prompt", "prompt")
