"""The language an answer must be in, derived from what the client asked.

The expectation decides two things: which language ``GUARD_LANGUAGE=auto`` pins in the request,
and which language the detector judges the answer against. Getting it wrong is worse than having
none: an English instruction injected into "Reply in French. Explain …" makes the model answer
against the user's wish, and the detector then aborts the correct French answer. So the
derivation follows what a reader of the request would conclude, in this order:

1. the client's explicit setting (``x-guard-language``, where the operator allows it);
2. an explicit instruction in the conversation — system or developer messages, Responses
   ``instructions``, Messages ``system`` and the last user turn, in any position: "Reply in
   French", "Write it in Japanese", "Use Spanish", "translate … into Italian", "rispondi in
   inglese", "auf Englisch", "用英文回答", "日本語で答えて" (the phrase in 15+ languages);
3. the language the last user turn is written in.

Two different requested languages, or a translation with no target ("Translate this:"), give no
expectation: the guard cannot know which language is right, and saying nothing is safe.

An instruction is a language *mention* in a marked form (a preposition before the name, "in
French", "на русском", "用英文", or a case ending after it, "英語で", "영어로", "हिंदी में") in
the same clause as a directive verb (reply, write, use, translate …, in the same languages).
The verb keeps "the French revolution" and "How do you say hello in French?" from counting.

Short prompts: fastText (``proxy.detect.language``) misjudges a few words of Latin script, but most
scripts name their language outright (Hangul is Korean, kana Japanese, Thai, Greek, Hebrew,
Georgian, Armenian …), and a Chinese question of ten characters is a whole question. Languages
that identification splits (Indonesian and Malay) are scored as one group.

Pure: no I/O besides the language model that ``proxy.detect.language`` loads once.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Literal

#: Where an expectation came from (a bounded metric label): the client's request (its header
#: or an instruction in it), the prompt's own language, the operator's configuration, or nowhere.
Source = Literal["request", "prompt", "config", "none"]
SOURCES: tuple[Source, ...] = ("request", "prompt", "config", "none")


@dataclass(frozen=True, slots=True)
class Expectation:
    """The expected answer language (ISO 639-1, or None), where it came from and why."""

    code: str | None
    source: Source
    #: A short fixed word saying why: header, instruction, prompt, conflict, translation, config,
    #: unknown, off.
    reason: str

    def header(self) -> str:
        """The ``x-guard-language`` response header: ``fr; source=request; by=instruction``."""
        return f"{self.code or 'none'}; source={self.source}; by={self.reason}"


NONE = Expectation(None, "none", "unknown")
#: No expectation because none was looked for (the default of a rewrite).
UNSET = Expectation(None, "none", "off")

# --- language names, in the languages people write the phrase in ---------------------------------
# Lower-case regex fragments per language. Names of Latin and Cyrillic script are stems that a
# few letters of inflection may follow ("Englische", "английском"); the others are written out.
_NAMES: dict[str, tuple[str, ...]] = {
    "en": (
        "angielsk", "engels", "engelska",
        "english", "inglés", "ingles", "inglesa", "anglais", "englisch", "inglese", "inglês",
        "англий", "英文", "英语", "英語", "영어", "अंग्रेज़ी", "अंग्रेजी", "इंग्लिश",
        "الإنجليزية", "الانجليزية", "الإنكليزية", "الانكليزية", "ingilizce", "bahasa inggris",
        "inggris", "tiếng anh",
    ),
    "zh": (
        "chińsk", "chinees", "kinesiska",
        "chinese", "mandarin", "chino", "chinois", "chinesisch", "cinese", "chinês", "chines",
        "китай", "中文", "汉语", "漢語", "普通话", "普通話", "华语", "華語", "中国語", "중국어",
        "चीनी", "الصينية", "çince", "bahasa mandarin", "bahasa tionghoa", "bahasa cina",
        "tiếng trung", "tiếng hoa",
    ),
    "es": (
        "hiszpańsk", "spaans", "spanska",
        "spanish", "español", "espanol", "castellano", "espagnol", "spanisch", "spagnolo",
        "espanhol", "испан", "西班牙语", "西班牙文", "西班牙語", "スペイン語", "스페인어",
        "स्पेनिश", "स्पैनिश", "الإسبانية", "الاسبانية", "ispanyolca", "bahasa spanyol",
        "tiếng tây ban nha",
    ),
    "hi": (
        "hindi", "hindí", "хинди", "印地语", "印地語", "ヒンディー語", "힌디어", "हिंदी",
        "हिन्दी", "الهندية", "hintçe", "bahasa hindi", "tiếng hindi",
    ),
    "ar": (
        "arabic", "árabe", "arabe", "arabisch", "arabo", "араб", "阿拉伯语", "阿拉伯文",
        "阿拉伯語", "アラビア語", "아랍어", "अरबी", "العربية", "arapça", "bahasa arab",
        "tiếng ả rập", "tiếng a rập",
    ),
    "pt": (
        "portugalsk", "portugees", "portugisiska",
        "portuguese", "portugués", "portugais", "portugiesisch", "portoghese", "português",
        "portugues", "португал", "葡萄牙语", "葡萄牙文", "葡萄牙語", "ポルトガル語", "포르투갈어",
        "पुर्तगाली", "البرتغالية", "portekizce", "bahasa portugis", "tiếng bồ đào nha",
    ),
    "ru": (
        "rosyjsk", "russisch", "ryska",
        "russian", "ruso", "russe", "russisch", "russo", "русск", "俄语", "俄文", "俄語",
        "ロシア語", "러시아어", "रूसी", "الروسية", "rusça", "bahasa rusia", "tiếng nga",
    ),
    "ja": (
        "japońsk", "japans", "japanska",
        "japanese", "japonés", "japones", "japonais", "japanisch", "giapponese", "japonês",
        "япон", "日语", "日文", "日語", "日本語", "일본어", "जापानी", "اليابانية", "japonca",
        "bahasa jepang", "tiếng nhật",
    ),
    "de": (
        "niemieck", "duits", "tyska",
        "german", "alemán", "aleman", "allemand", "deutsch", "tedesco", "alemão", "alemao",
        "немец", "德语", "德文", "德語", "ドイツ語", "독일어", "जर्मन", "الألمانية",
        "الالمانية", "almanca", "bahasa jerman", "tiếng đức",
    ),
    "fr": (
        "francusk", "frans", "franska",
        "french", "francés", "frances", "français", "francais", "französisch", "franzosisch",
        "francese", "francês", "француз", "法语", "法文", "法語", "フランス語", "프랑스어",
        "फ़्रेंच", "फ्रेंच", "फ्रांसीसी", "الفرنسية", "fransızca", "bahasa prancis",
        "bahasa perancis", "tiếng pháp",
    ),
    "ko": (
        "korean", "coreano", "coréen", "coreen", "koreanisch", "корей", "韩语", "韩文", "韓語",
        "韓文", "朝鲜语", "韓国語", "한국어", "한글", "कोरियाई", "الكورية", "korece",
        "bahasa korea", "tiếng hàn",
    ),
    "it": (
        "włosk", "italiaans", "italienska",
        "italian", "italiano", "italien", "italienisch", "итальян", "意大利语", "意大利文",
        "義大利語", "意大利語", "イタリア語", "이탈리아어", "इतालवी", "الإيطالية", "الايطالية",
        "italyanca", "bahasa italia", "tiếng ý",
    ),
    "tr": (
        "turkish", "turco", "turc", "türkisch", "turkisch", "турец", "土耳其语", "土耳其語",
        "トルコ語", "터키어", "튀르키예어", "तुर्की", "التركية", "türkçe", "turkce",
        "bahasa turki", "tiếng thổ nhĩ kỳ",
    ),
    "id": (
        "indonesian", "indonesio", "indonésien", "indonesien", "indonesisch", "indonesiano",
        "indonésio", "индонез", "印尼语", "印度尼西亚语", "印尼語", "インドネシア語",
        "인도네시아어", "इंडोनेशियाई", "الإندونيسية", "endonezce", "bahasa indonesia",
        "tiếng indonesia", "tiếng in-đô-nê-xi-a",
    ),
    "vi": (
        "vietnamese", "vietnamita", "vietnamien", "vietnamesisch", "вьетнам", "越南语",
        "越南語", "越南文", "ベトナム語", "베트남어", "वियतनामी", "الفيتنامية", "vietnamca",
        "bahasa vietnam", "tiếng việt",
    ),
    "nl": ("dutch", "holandés", "néerlandais", "niederländisch", "olandese", "holandês",
           "nederlands", "голланд", "нидерланд", "荷兰语", "オランダ語", "네덜란드어"),
    "pl": ("polish", "polaco", "polonais", "polnisch", "polacco", "polonês", "polski", "polsku",
           "польск", "波兰语", "ポーランド語", "폴란드어"),
    "uk": ("ukrainian", "ucraniano", "ukrainien", "ukrainisch", "ucraino", "украин",
           "україн", "乌克兰语", "ウクライナ語", "우크라이나어"),
    "sv": ("swedish", "sueco", "suédois", "schwedisch", "svedese", "svenska", "швед",
           "瑞典语", "スウェーデン語", "스웨덴어"),
    "el": ("greek", "griego", "grec", "griechisch", "greco", "grego", "греческ",
           "ελληνικά", "希腊语", "ギリシャ語", "그리스어"),
    "he": ("hebrew", "hebreo", "hébreu", "hebräisch", "ebraico", "hebraico", "иврит",
           "עברית", "希伯来语", "ヘブライ語", "히브리어", "العبرية"),
    "th": ("thai", "tailandés", "thaï", "thailändisch", "tailandese", "tailandês", "тайск",
           "ภาษาไทย", "泰语", "タイ語", "태국어", "tiếng thái", "bahasa thailand"),
    "fa": ("persian", "farsi", "persa", "persan", "persisch", "персидск", "فارسی",
           "波斯语", "ペルシア語", "페르시아어", "الفارسية"),
    "cs": ("czech", "checo", "tchèque", "tschechisch", "ceco", "tcheco", "češtin", "česky",
           "чешск"),
    "ro": ("romanian", "rumano", "roumain", "rumänisch", "rumeno", "romeno", "română",
           "румын"),
    "hu": ("hungarian", "húngaro", "hongrois", "ungarisch", "ungherese", "magyar", "венгер"),
    "bn": ("bengali", "bangla", "bengalí", "বাংলা", "бенгаль", "孟加拉语"),
    "ms": ("malay", "malayo", "malais", "malaiisch", "malese", "bahasa melayu", "bahasa malaysia"),
    "sw": ("swahili", "suajili", "kiswahili", "суахили"),
    "fi": ("finnish", "finlandés", "finnois", "finnisch", "finlandese", "suomi", "финск"),
    "da": ("danish", "danés", "danois", "dänisch", "danese", "dansk", "датск"),
    "no": ("norwegian", "noruego", "norvégien", "norwegisch", "norvegese", "norsk", "норвеж"),
}  # fmt: skip

# Names written with spaces between words are stems that a few letters of inflection may follow.
_SPACED = re.compile(r"^[a-zà-ɏḀ-ỿ\u0400-\u052f ]+$")
_INFLECTION = re.compile(r"\w{0,6}")
_CODE_OF = {name: code for code, names in _NAMES.items() for name in names}


def _trie_pattern(words: list[str]) -> str:
    """One regex for many literal words, factored by common prefixes: Python's ``re`` tries the
    alternatives of a flat list one by one at each position; a trie tries one letter."""
    trie: dict[str, dict] = {}  # type: ignore[type-arg]
    for word in words:
        node = trie
        for char in word:
            node = node.setdefault(char, {})
        node[""] = {}

    def emit(node: dict) -> str:  # type: ignore[type-arg]
        ends = "" in node
        branches = [re.escape(c) + emit(child) for c, child in sorted(node.items()) if c]
        if not branches:
            return ""
        body = branches[0] if len(branches) == 1 else "(?:" + "|".join(branches) + ")"
        if ends:
            return "(?:" + body + ")?"
        return body

    return emit(trie)


_NAME = re.compile(_trie_pattern(list(_CODE_OF)))

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
    r"|saja|dan|tentang|tolong|và|về|chỉ|ve|sadece|hakkında|lütfen|мовою)(?![\w]))"
)


def _mentions(clause: str, translation: bool) -> set[str]:
    """Languages named in ``clause`` (lower case, single spaces) in a marked form."""
    found: set[str] = set()
    for match in _NAME.finditer(clause):
        name = match[0]
        code = _CODE_OF.get(name)
        if code is None:
            continue
        start, end = match.span()
        spaced = _SPACED.match(name) is not None
        if spaced:
            if start and (clause[start - 1].isalnum() or clause[start - 1] == "_"):
                continue
            end = _INFLECTION.match(clause, end).end()  # type: ignore[union-attr]
            if end < len(clause) and (clause[end].isalnum() or clause[end] == "_"):
                continue
        before = clause[max(0, start - 24) : start]
        after = clause[end : end + 24]
        if _SELF_MARKED.search(name):
            found.add(code)
            continue
        if spaced and not _FOLLOW.match(after) and not _AFTER.match(after):
            continue
        if (
            _BEFORE.search(before)
            or _AFTER.match(after)
            or (translation and _BEFORE_TO.search(before))
        ):
            found.add(code)
    return found


# Directive verbs: the clause asks for an answer, a text or a translation (stems, 15+ languages).
_VERBS_SPACED = (
    "repl|respon|answer|writ|explain|use|using|speak|talk|translat|output|give|tell|describ"
    "|summar|continu|provid|generat|compos|draft|rewrit|put|keep|conduct"
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
# Clauses that name a language without asking for the answer to be in it: questions about the
# language ("How do you say …", "How would I translate my site into …"), snippets in it whose
# explanation is in the prompt's language ("5 phrases in Japanese"), and programs that
# translate ("a Python function that translates text into French").
_ABOUT = re.compile(
    r"(?<![\w])(?:say|mean\w*|word\s+for|called|pronounc\w*|spell\w*"
    r"|how\s+(?:do|would|can|could|should|to)(?:\s+(?:i|we))?"
    r"|phrases?|words?|sentences?|expressions?|vocabulary|idioms?|greetings?|sayings?|examples?"
    r"|python|javascript|typescript|java|function|program|script|code|api|regex|sql|translates)"
    r"(?![\w])"
)
_CLAUSE = re.compile(r"[^.!?;\n。！？；]+")

#: How much of a long message is searched for an instruction: its start and its end.
_SCAN_CHARS = 2000


def explicit_requests(text: str) -> set[str]:
    """The languages ``text`` explicitly asks the answer to be in (empty when none).

    A translation request without a target yields ``{"*"}``: no language can be expected."""
    if len(text) > 2 * _SCAN_CHARS:
        text = text[:_SCAN_CHARS] + "\n" + text[-_SCAN_CHARS:]
    low = text.replace("İ", "i").lower()
    found: set[str] = set()
    for clause in _CLAUSE.finditer(low):
        part = clause[0]
        hits = _mentions(" ".join(part.split()), _TRANSLATE.search(part) is not None)
        if hits and _VERB.search(part) and not _ABOUT.search(part):
            found |= hits
    if not found and _TRANSLATE.search(low):
        return {"*"}
    return found


# --- the prompt's own language -------------------------------------------------------------------
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
_VIETNAMESE = re.compile(r"[\u1ea0-\u1ef9ơưƠƯ]")
_ACCENTED = re.compile(r"[^\W\da-zA-Z_]")

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
    total = len(letters)
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
        words = set(re.findall(r"\w+", clean.lower()))
        ukrainian = bool(_UKRAINIAN.search(clean) or words & _UKRAINIAN_WORDS)
        russian = bool(_RUSSIAN.search(clean) or words & _RUSSIAN_WORDS)
        if ukrainian != russian:
            return "uk" if ukrainian else "ru"
        return _identified(clean, None)
    if _VIETNAMESE.search(clean) and len(_ACCENTED.findall(clean)) >= 2:
        return "vi"
    return _identified(clean, None, words=True)


def _identified(clean: str, within: set[str] | None, *, words: bool = False) -> str | None:
    """fastText's answer when confident enough for the length (merged pairs summed). When it
    is not and ``words`` (Latin script), a short prompt's words may still tell: see
    :mod:`proxy.detect.word_language`."""
    from proxy.detect.language import classify_top

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


def derive(instructions: Iterable[str], last_user: str, *, use_prompt: bool = True) -> Expectation:
    """The expectation from a request's texts: ``instructions`` (system/developer text) and the
    ``last_user`` turn; the prompt's language only when ``use_prompt``."""
    asked: set[str] = set()
    for text in [*instructions, last_user]:
        if text:
            asked |= explicit_requests(text)
    if "*" in asked:
        asked.discard("*")
        if not asked:
            return Expectation(None, "none", "translation")
    if len(asked) > 1:
        return Expectation(None, "none", "conflict")
    if asked:
        return Expectation(asked.pop(), "request", "instruction")
    if not use_prompt:
        return Expectation(None, "none", "off")
    code = prompt_language(last_user)
    if code is None:
        return NONE
    return Expectation(code, "prompt", "prompt")
