"""What one text of a request says about the answer's language (see
:mod:`proxy.core.requested_language` for how the texts of a request are weighed).

An instruction is one of a few unambiguous forms whose object is the answer ("answer / reply /
respond / write your answer in X", "in X, please" or "Language: X" as a clause of its own, and
the same few forms in the languages the detector judges best), not negated, not conditional,
not inside quotes or code. Everything else a text names is a mention, which only ever widens
what is accepted. Pure: regular expressions over lower-case clauses.
"""

from __future__ import annotations

import re
from typing import Literal, NamedTuple

from proxy.core.language_mentions import Name, find_names, widens
from proxy.core.language_names import UNJUDGED, resolve
from proxy.core.language_qualifiers import (
    ANY_LANGUAGE,
    CODE_ONLY,
    CONCESSION,
    CONDITION,
    CONTRAST,
    EXCEPT,
    FOLLOWS_USER,
    LOCALE,
    NEGATION,
    NEGATION_AFTER,
    PERSISTENT,
    RULED_OUT_AFTER,
    RULED_OUT_BEFORE,
    UNNAMED,
)
from proxy.core.prompt_language import prose

_SENTENCE = re.compile(r"[^.!?;\n。！？；]+[.!?;。！？；]*")
# A clause of its own inside a sentence: between commas, colons, brackets and dashes.
_PART = re.compile(r"[^,:()\[\]\u2014\u2013，：、（）]+")
# The question words that make a clause ask about replying rather than ask for a reply ("How do
# you reply in French to a compliment?").
_WH = re.compile(
    r"^\s*(?:how|what|why|when|where|which|who|whose|cómo|qué|por qué|comment|pourquoi|wie"
    r"|warum|was|come|perché|como|o que|porque|как|почему|что)\b"
)

_FILLER_EN = (
    r"(?:\s+(?:to\s+me|to\s+us|to\s+this|to\s+them|to\s+the\s+user|back|me|only|always|solely"
    r"|exclusively|strictly|entirely|fully|just|please|from\s+now\s+on|going\s+forward|here"
    r"|everything|all|all\s+questions|every\s+question|each\s+question|the\s+user|users"
    r"|customers|it|them|this|that|all\s+of\s+this))*"
)
_STYLE = (
    r"(?:(?:simple|plain|formal|informal|proper|correct|good|clear|standard|modern|polite"
    r"|casual|fluent|natural|native|everyday|basic|easy|academic|business|conversational"
    r"|british|american|european|brazilian|mexican|castilian|latin\s+american|canadian)\s+)*"
)
#: What may stand right before a name for the mention to bind the answer, per language. Each is
#: matched against the clause's text before the name (lower case, single spaces).
_BEFORE_CHECKED: tuple[re.Pattern[str], ...] = tuple(
    re.compile(p + r"$")
    for p in (
        # English verbs whose "in X" may be an adjective before a noun ("talk in French class",
        # "use Chinese characters"): what follows the name must say it is the language.
        r"(?<![\w])(?:write\s+back|talk|speak|communicate|converse|chat|write|type)(?:s|ed|ing)?"
        + _FILLER_EN
        + r"\s+(?:in|using|with)\s+(?:the\s+)?"
        + _STYLE,
        r"(?<![\w])(?:switch|change|go)\s+(?:back\s+)?(?:over\s+)?to\s+(?:the\s+)?",
        r"(?<![\w])(?:use|using)\s+(?:only\s+)?",
        # "in simple Hindi", "in formal Japanese": a style of language, so a language, whatever
        # the verb ("Explain photosynthesis in simple Hindi")
        r"(?<![\w])in\s+(?:simple|plain|easy|basic|everyday|formal|informal|polite|casual"
        r"|proper|correct|standard|fluent|natural|clear|very\s+simple)\s+",
        # "explain it in X", "tell me this in X": the object is what is said, not a subject
        r"(?<![\w])(?:explain|describe|summari[sz]e|say|tell|repeat|rephrase|put)\s+(?:it|this"
        r"|that|them|everything|all\s+of\s+(?:it|this))(?:\s+(?:again|to\s+me|to\s+us|for\s+me"
        r"|please|once\s+more))*\s+in\s+(?:the\s+)?" + _STYLE,
    )
)
#: A text to write, in X: "Write the whole welcome text in Brazilian Portuguese", "compose an
#: email in Korean." Only where the name closes the sentence or its part (or a request word
#: follows): "write a sentence in Spanish and explain it" also wants the explanation.
_WRITE_TEXT = re.compile(
    r"(?<![\w])(?:write|compose|draft|prepare|create|produce|redo|rewrite|summari[sz]e|give\s+me"
    r"|send\s+me)"
    r"\s+(?:(?:me|us|him|her|them)\s+)?(?:(?:a|an|the|this|that|my|our|your|his|her|their|whole"
    r"|entire|full|same|short|long|new|brief|formal|friendly|polite|simple)\s+)+(?:[\w'-]+\s+){1,5}"
    r"in\s+(?:the\s+)?" + _STYLE + r"$"
)
# A text to write that is code or data ("a python function that returns 'Hello' in French", "the
# UI strings in Spanish"): its language is the data's, the answer around it may be another.
_WRITE_DATA = re.compile(
    r"(?<![\w])(?:function|script|code|program|class|method|query|regex|json|yaml|csv|xml|file"
    r"|strings?|array|dictionary|dict|variables?|snippet|tests?|sql|html|api|returns?|prints?"
    r"|outputs?|keys|labels|locale|i18n|translations?)(?![\w])"
)
_WRITE_FOLLOW = re.compile(
    r"^(?:\s*$|\s*[.!?;:,)(\u2014\u2013]|\s+(?:please|pls|plz|only|too|as\s+well)(?![\w]))"
)
# The same in the Romance languages and German: "explícamelo en español", "explique-le en
# français", "erklär es mir auf Deutsch", "spiegamelo in italiano".
_EXPLAIN_IT = re.compile(
    r"(?<![\w])(?:expl[ií]ca(?:me|melo|mela|lo|la|nos|noslo)?|expli(?:que|quez)(?:-(?:le|la|moi|nous"
    r"|les))*|erklär(?:e|en)?\s+(?:es|das|mir)(?:\s+(?:mir|es|bitte|das))*|spiega(?:mi|melo|mela"
    r"|lo|la|celo)?|expli(?:ca|que)(?:-(?:me|o|a|lo|la))*)\s+(?:en|in|auf|em)\s+$"
)
_BEFORE: tuple[re.Pattern[str], ...] = tuple(
    re.compile(p + r"$")
    for p in (
        # English: "answer in X", "please respond only in X", "reply to me in X", "your answer
        # should be in X"
        r"(?<![\w])(?:answer|reply|respond)(?:s|ed|ing)?"
        + _FILLER_EN
        + r"\s+(?:in|using|with)\s+(?:the\s+)?"
        + _STYLE,
        r"(?<![\w])(?:your|the|all\s+(?:your\s+|the\s+)?|every|each|my)\s*(?:answer|reply|response"
        r"|output|text|responses|answers|replies|outputs)s?(?:\s+(?:should|must|has\s+to|have\s+to"
        r"|needs?\s+to|will|shall|is\s+to|are\s+to|can)(?:\s+only|\s+always)?\s+be)?(?:\s+(?:written"
        r"|given|provided|delivered|formatted))?(?:\s+(?:only|entirely|fully|exclusively|all"
        r"|always))?\s+(?:in|using)\s+(?:the\s+)?" + _STYLE,
        # Spanish, Portuguese, French, Italian, German, Dutch, Swedish
        r"(?<![\w])(?:respond\w*|contest\w*|escrib\w*|escrev\w*|habl\w*|fal[ae]\w*|r[ée]pond\w*"
        r"|[ée]cri[sv]\w*|parl\w*|rispond\w*|scriv\w*|explic\w*|expliqu\w*|spieg\w*)(?:-moi|-nous)?(?:\s+(?:me|mi|nos|moi"
        r"|siempre|sempre|toujours|solo|sólo|só|so|solamente|únicamente|unicamente|apenas"
        r"|somente|exclusivamente|esclusivamente|soltanto|uniquement|seulement|exclusivement"
        r"|por\s+favor|porfa|per\s+favore|stp|svp|s'il\s+te\s+pla[iî]t|s'il\s+vous\s+pla[iî]t"
        r"|todo|tudo|tout|tutto|pas|no|não|non|nunca|jamais|jamás|mai))*\s+(?:en|em|in|no|na)\s+(?:idioma\s+|língua\s+"
        r"|lingua\s+|langue\s+)?" + r"(?:el\s+|o\s+|l')?",
        r"(?<![\w])(?:antwort\w*|schreib\w*|sprich|sprecht|sprechen|antwoord\w*|schrijf\w*"
        r"|spreek\w*|svara|skriv)(?:\s+(?:sie|mir|uns|bitte|nur|immer|ausschließlich"
        r"|ausschliesslich|stets|nicht|ab\s+jetzt|von\s+nun\s+an|me|altijd|alleen|uitsluitend"
        r"|alsjeblieft|aub|graag|alltid|bara|endast|gärna|niemals|nie|keinesfalls|nooit|aldrig))*"
        r"\s+(?:auf|in|på)\s+(?:het\s+)?",
        # Russian, Ukrainian, Polish, Czech
        r"(?<![\w])(?:отвеча\w*|ответ\w*|пиш\w*|напиш\w*|говор\w*|відповіда\w*|відповід\w*"
        r"|odpowiad\w*|odpowiedz\w*|pisz|napisz\w*|odpovídej|odpověz\w*|piš|napiš\w*)"
        r"(?:\s+(?:мне|мені|пожалуйста|будь\s+ласка|только|тільки|лише|всегда|завжди"
        r"|исключительно|виключно|mi|proszę|tylko|zawsze|wyłącznie|prosím|jen|pouze|vždy"
        r"|výhradně))*\s+(?:на\s+|по-|po\s+|w\s+języku\s+|v\s+)?",
        # Indonesian/Malay, Vietnamese, Arabic, Hebrew, Greek
        r"(?<![\w])(?:jawab\w*|balas\w*|tulis\w*|gunakan|pakai|pake|bicara|menjawab|membalas)"
        r"(?:\s+(?:saja|selalu|hanya|ya|dengan|dalam|pakai|pake|menggunakan))*\s+",
        r"(?<![\w])(?:trả\s+lời|viết|nói|dùng|sử\s+dụng)(?:\s+(?:chỉ|luôn|bằng))*\s+",
        r"(?:أجب|اجب|أجيبي|اجيبي|رد|ردّ|ردي|اكتب|أكتب|تحدث|تكلم)(?:\s+(?:فقط|دائما|دائمًا|دائماً|من\s+فضلك"
        r"|رجاء|رجاءً))*\s+(?:باللغة\s+|بلغة\s+|بال|ب)?",
        # Swahili: "Jibu kwa Kiswahili", "niandikie kwa lugha ya Kiingereza"
        r"(?<![\w])(?:jibu|nijibu|tujibu|andika|niandikie|eleza|nieleze)(?:\s+(?:tu|daima"
        r"|tafadhali))*\s+kwa\s+(?:lugha\s+ya\s+)?",
        # A preference said as the request: "perdona, prefiero en español", "je préfère en
        # français", "prefiro em português"
        r"(?<![\w])(?:prefiero|prefiro|pr[ée]f[èe]re|preferisco|preferirei|preferiría)(?:\s+(?:que"
        r"|me|mi|si|la|le|respuesta|risposta|resposta|réponse|respondas|responda|contestes"
        r"|rispondi|rispondere|répondre|responder|contestar|escribas|écrire|que\s+tu))*\s+"
        r"(?:en|em|in)\s+",
        r"(?:ענה|עני|תענה|תעני|כתוב|כתבי)(?:\s+(?:רק|תמיד))*\s+(?:ב|ל)?",
        r"(?<![\w])(?:απάντ\w*|γράψ\w*|γράφ\w*)(?:\s+(?:μόνο|πάντα|μου))*\s+(?:στα|σε|στην)\s+",
        # Chinese, Thai
        r"(?:请|請)?(?:你)?(?:只|仅|僅|都|一律|全部|始终|始終|总是|總是)?(?:用|以|使用|改用|换成|換成"
        r"|改成)",
        r"(?:ตอบ|เขียน)(?:เป็น)?",
    )
)
#: What may follow a name for the mention to bind the answer, in the languages that put the
#: verb (or the particle) after it: Chinese, Japanese, Korean, Turkish, Hindi, Persian, German
#: and Dutch verb-final clauses.
_AFTER = re.compile(
    r"^(?:来|來)?(?:回答|回复|回覆|作答|答复|答覆|答|写|寫|说|說|交流|输出|輸出|表达|表達|解释|解釋|讲|講"
    r"|聊|对话|對話)"
    r"|^(?:のみ|だけ)?で(?:の)?(?:回答|答え|返信|返答|書い|書き|話し|説明|お願い|応答|記述|お答え)"
    r"|^(?:로만|으로만|로|으로)\s*(?:만\s*)?(?:답|대답|답변|응답|말|써|작성|설명|얘기|이야기|해)"
    r"|^(?:'?\w{0,4})?\s+(?:olarak\s+|dilinde\s+)?(?:cevap|yanıt|yanit|yaz|konuş|cevapla|yanıtla)"
    r"|^\s+में\s+(?:ही\s+)?(?:जवाब|उत्तर|लिख|बात|बोल|दें|दो|दीजिए|दीजिये)"
    r"|^\s+(?:me|mein|mai|main|mei|mey)\s+(?:hi\s+)?(?:samjha\w*|bata\w*|likh\w*|jawab|bol\w*"
    r"|baat|reply|answer|explain)(?![\w])"
    r"|^\s+(?:پاسخ|جواب|بنویس)"
    r"|^\s+(?:উত্তর|জবাব|লিখুন|লেখো|লিখে)"
    r"|^\s+(?:zu\s+)?(?:antworten|schreiben|sprechen|formulieren|antwoorden|schrijven)"
)
# Before a Persian name: "به زبان X پاسخ بده".
_BEFORE_FA = re.compile(r"(?:به\s+)?(?:زبان\s+)?$")
# What may follow a spaced name for the mention to bind the answer: the clause's end,
# punctuation, a request word ("please", "only", "from now on"), or a conjunction — never a
# noun ("trends in Chinese manufacturing", "a French teacher").
_FOLLOW = re.compile(
    r"^(?:$|[\s]*[,:;.!?)\"'»“”–—(]|\s+(?:please|pls|plz|only|language|and|or|then|so|from"
    r"|too|also|even|again|instead|as|not|no|rather|but|if|here|below|always|throughout"
    r"|for\s+(?:all|every|each|your|this|the\s+rest|the\s+whole)|in\s+(?:all|every|each|your)"
    r"|for\s+(?:the|your)\s+(?:explanation|answer|reply|response)"
    r"|at\s+all|with\s+(?:me|us)"
    r"|thanks|thank|going|por|favor|porfa|solo|solamente|s'il|stp|svp|seulement|bitte|nur"
    r"|und|per|soltanto|apenas|só|язык\w*|мовою|только|лише|тільки|пожалуйста|будь|proszę"
    r"|prosím|tack|lütfen|tolong|ya|saja|nhé|nha|ạ|và|y|e|et|o|ou|oder|of|или|або|lub|nebo"
    r"|veya|atau|hoặc|ภาษา)(?![\w]))"
)
# A clause of its own that asks for a language: "in X, please", "Spanish only", "only in X",
# "Not in English", "en español por favor", "auf Deutsch bitte".
_OWN_PREFIX = re.compile(
    r"^(?:(?:and|but|also|then|y|e|et|und|и|і|αλλά|ma|mais|aber|pero|mas|но|але|ale|maar|men)\s+)?"
    r"(?:(?:switch|go|come|let's\s+go)\s+)?(?:back\s+to\s+)?"
    r"(?:(?:just|simply|gewoon|einfach|simplement|просто|now|maintenant|ahora|agora|jetzt|adesso"
    r"|теперь|teraz|nu)\s+)?"
    r"(?:(?:please|pls|plz|kindly|only|just|all"
    r"|por\s+favor|s'il\s+te\s+pla[iî]t|bitte|per\s+favore|пожалуйста|not|no|non|nicht|pas"
    r"|όχι|не|nie|ne|não|nem)\s+)*"
    r"(?:(?:in|using|en|em|auf|in\s+het|на|по-|po|på|bằng|dalam|w\s+języku|στα)\s+(?:the\s+)?)?"
    + _STYLE
    + r"$"
)
_OWN_SUFFIX = re.compile(
    r"^(?:\s*,?\s*(?:please|pls|plz|only|language|language\s+only|thanks|thank\s+you|por\s+favor"
    r"|porfa|solamente|solo|s'il\s+te\s+pla[iî]t|s'il\s+vous\s+pla[iî]t|stp|svp|seulement|bitte"
    r"|nur|per\s+favore|soltanto|apenas|somente|пожалуйста|только|лише|будь\s+ласка|proszę"
    r"|tylko|prosím|tack|lütfen|tolong|ya|nhé|now|maintenant|ahora|agora|jetzt|adesso|теперь"
    r"|teraz|from\s+now\s+on|d[ée]sormais|a\s+partir\s+de\s+ahora|ab\s+jetzt))*\s*$"
)
# "in X please" closing a part whatever comes before it: "kurz und auf Deutsch bitte".
_PLEASE = re.compile(
    r"^\s*,?\s*(?:please|pls|plz|por\s+favor|porfa|s'il\s+te\s+pla[iî]t|s'il\s+vous\s+pla[iî]t"
    r"|stp|svp|bitte|per\s+favore|пожалуйста|будь\s+ласка|proszę|prosím|lütfen|tolong)\s*$"
)
_PREPOSITION = re.compile(r"(?<![\w])(?:in|en|em|auf|на|po|på|bằng|dalam)$")
# "Language: French", "Output language - German", "Idioma: español" as a line of its own.
_LANGUAGE_LINE = re.compile(
    r"(?:^|\n)[ \t*_#>-]*(?:(?:output|response|answer|reply|preferred)\s+)?(?:language|lang"
    r"|idioma|langue|sprache|lingua|язык|мова|语言|語言|言語|언어)[ \t*_]*[:=：-][ \t]*"
    r"([^\n]{2,40})"
)
# Words about a language's words, grammar, sounds, writing and learning: "In German, why does
# the verb move?" is about German, not a request for a German answer.
_ABOUT = re.compile(
    r"(?<![\w-])(?:say|said|mean\w*|word\s+for|called|pronounc\w*|spell\w*|phrases?|words?"
    r"|sentences?|expressions?|vocabulary|idioms?|greetings?|sayings?|grammar\w*|verbs?|nouns?"
    r"|adjectives?|adverbs?|pronouns?|tenses?|conjugat\w*|declension\w*|cases?|gender\w*|plurals?"
    r"|subjunctive|particles?|prepositions?|syntax|accents?|dialects?|alphabet|letters?"
    r"|characters?|kanji|hiragana|katakana|scripts?|spelling|punctuation|slang|honorifics?"
    r"|speakers?|learn\w*|stud(?:y|ying)|teach\w*|difference|between|mistakes?|translat\w*"
    r"|etymology|origins?|sound|tones?|rules?|usage|polite\w*|formal|informal|slang"
    r"|how\s+(?:do|does|would|can|could|should)\s+(?:you|i|we|one|people)\s+(?:say|ask|write"
    r"|greet|address|call|express|spell|pronounce))(?![\w])"
)
_TRANSLATE = re.compile(
    r"(?<![\w])(?:translat|tafsiri|trad[uú]c|tradui|übersetz|ubersetz|tradu[cz]|terjemah|dịch|çevir"
    r"|cevir|перевед|переве|перекла)|翻译|翻譯|翻訳|번역|अनुवाद|ترجم"
)
# A translation whose answer is nothing but the translation.
_ONLY_TRANSLATION = re.compile(
    r"(?<![\w])(?:(?:only|just)\s+(?:output\s+|return\s+|give\s+|reply\s+with\s+)?(?:the\s+)?"
    r"translat\w*|nothing\s+else|no\s+explanations?|without\s+(?:any\s+)?explanations?"
    r"|don'?t\s+explain|do\s+not\s+explain|translated\s+text\s+only"
    r"|(?:output|return|reply\s+with)\s+(?:only\s+)?the\s+translat\w*(?:\s+only)?)(?![\w])"
)
_TARGET = re.compile(r"(?<![\w])(?:into|to|in)\s+(?:the\s+)?" + _STYLE + r"$")
# A name that is itself an adverb of the language: Turkish "Türkçe", Czech "česky".
_SELF_MARKED = re.compile(r"(?:ca|ce|ça|çe|sky)$")
# A mention in a marked form ("in X", "into X", "auf X", "用X"): a language the detector
# cannot judge named so turns judging off (a Zulu answer must never be judged as English).
_MARKED = re.compile(
    r"(?<![\w])(?:in|into|en|em|auf|ins|на|по-|po|på|dalam|bằng|to)\s+(?:the\s+)?$|(?:用|成|为|為)$"
)

#: How much of a long text is searched for instructions: its start and its end.
_SCAN_CHARS = 3000


class Reading(NamedTuple):
    """What one text says about the answer's language.

    ``asked``: the languages its unambiguous instructions bind the answer to (``?`` for one the
    detector cannot judge), empty when it has none or makes them conditional; ``negated``: the
    languages it asks the answer not to be in; ``named``: every language it mentions (only ever
    added to what is accepted; ``?`` when a language the detector cannot judge is named in a
    marked form); ``untargeted``: it asks for a translation and names no language, or lets the
    answer be in any language; ``rules``: it says anything about the answer's language at all
    (names one, or follows the user's); ``persistent``: its instruction is meant for the rest of
    the conversation ("from now on"), not for one answer.
    """

    asked: frozenset[str]
    negated: frozenset[str]
    named: frozenset[str]
    untargeted: bool
    any_language: bool = False
    rules: bool = False
    persistent: bool = False


def read(text: str, language: str | None = None) -> Reading:
    """What ``text`` (written in ``language``, when known) says about the answer's language."""
    if len(text) > 2 * _SCAN_CHARS:
        text = text[:_SCAN_CHARS] + "\n" + text[-_SCAN_CHARS:]
    low = text.replace("İ", "i").lower()
    named: set[str] = set()
    for sentence in _SENTENCE.finditer(low):
        clause = " ".join(sentence[0].split())
        for name in find_names(clause):
            if name.code == UNJUDGED:
                if _MARKED.search(clause[: name.start]):
                    named.add(UNJUDGED)
            elif widens(name, language):
                named.add(name.code)
    asked: set[str] = set()
    negated: set[str] = set()
    prose_text = prose(low)
    # A rule that follows the user's own language makes every language rule of the text
    # conditional; what a concession says ("regardless of the user's language") does not.
    conditional = FOLLOWS_USER.search(CONCESSION.sub(" ", prose_text)) is not None
    for line in _LANGUAGE_LINE.finditer(prose_text):
        value = " ".join(line[1].strip(" .*_").split())
        found = find_names(value)
        if len(found) == 1 and found[0].start == 0 and _OWN_SUFFIX.match(value[found[0].end :]):
            asked.add(found[0].code)
    for sentence in _SENTENCE.finditer(prose_text):
        clause = " ".join(sentence[0].split())
        found = find_names(clause)
        if not found or _WH.match(clause):
            continue
        here: dict[str, set[str]] = {"asked": set(), "negated": set()}
        # A name inside a concession ("even if the customer writes in English") asks nothing.
        conceded = [m.span() for m in CONCESSION.finditer(clause)]
        for name in found:
            if any(a <= name.start < b for a, b in conceded):
                continue
            # A rule made conditional where it stands only names its language; a condition in
            # the question after a colon ("Answer in Spanish: what if …?") is the question's.
            ruled = _ruled_out(clause, name)
            if ruled == "only":  # "never use any language other than English": English alone
                here["asked"].add(name.code)
                continue
            if ruled:
                here["negated"].add(name.code)  # whatever the rest says ("… is fine")
                continue
            colon = clause.find(":", name.end)
            rule = clause[: colon if colon >= 0 else len(clause)]
            if CONDITION.search(CONCESSION.sub(" ", rule)):
                continue
            bound = _binds(clause, name)
            if bound is not None:
                here[bound].add(name.code)
        negated |= here["negated"]
        # A sentence that also asks for another language, in a marked form it does not rule out,
        # asks for both ("write a story in Spanish, then explain it in English"): it narrows
        # nothing. A name that is only a subject ("my English is not so good") asks nothing.
        others = {
            n.code
            for n in found
            if _MARKED.search(clause[: n.start]) and not any(a <= n.start < b for a, b in conceded)
        }
        if not others - here["asked"] - here["negated"]:
            asked |= here["asked"]
    if conditional:
        asked.clear()
        negated.clear()
    if not asked and _ONLY_TRANSLATION.search(prose_text):
        asked |= _translation_targets(prose_text)
    any_language = bool(
        ANY_LANGUAGE.search(prose_text)
        or UNNAMED.search(prose_text)
        or CODE_ONLY.search(prose_text)
    )
    for tag in LOCALE.finditer(low):
        code = resolve(tag[1])
        if code is not None:
            named.add(code)
    untargeted = any_language or (not named and _TRANSLATE.search(low) is not None)
    rules = bool(named or asked or negated or conditional or any_language)
    persistent = bool(asked) and PERSISTENT.search(prose_text) is not None
    return Reading(
        frozenset(asked),
        frozenset(negated),
        frozenset(named),
        untargeted,
        any_language,
        rules,
        persistent,
    )


def _ruled_out(clause: str, name: Name) -> bool | Literal["only"]:
    """A language named only to be ruled out: "not in English, but …", "英語ではなく", "any
    language except English"; ``"only"`` where the exception is to a negation ("never use any
    language other than English"), which leaves that language alone."""
    if RULED_OUT_AFTER.match(clause[name.end : name.end + 8]):
        return True
    found = EXCEPT.search(clause[max(0, name.start - 16) : name.start])
    if found is not None:
        before = clause[: max(0, name.start - 16) + found.start()]
        return "only" if NEGATION.search(before) else True
    if not RULED_OUT_BEFORE.search(clause[max(0, name.start - 20) : name.start]):
        return False
    return CONTRAST.match(clause[name.end : name.end + 30]) is not None


def _translation_targets(text: str) -> set[str]:
    """The target of a translation whose answer is the translation alone ("Translate the user's
    text into French. Output only the translation."): the languages named right after "into",
    "to" or "in" in a sentence that asks for a translation."""
    out: set[str] = set()
    for sentence in _SENTENCE.finditer(text):
        clause = " ".join(sentence[0].split())
        if not _TRANSLATE.search(clause) or CONDITION.search(clause):
            continue
        for name in find_names(clause):
            if name.code != UNJUDGED and _TARGET.search(clause[: name.start]):
                out.add(name.code)
    return out if len(out) == 1 else set()


def _binds(clause: str, name: Name) -> Literal["asked", "negated"] | None:
    """Whether ``clause`` binds the answer to the language ``name`` names: an instruction
    (``asked``), the same instruction negated (``negated``), or neither."""
    before = clause[max(0, name.start - 120) : name.start]
    after = clause[name.end : name.end + 40]
    if not _is_form(clause, name, before, after):
        return None
    start = _clause_start(clause, name.start)
    if NEGATION.search(clause[start : name.start]) or NEGATION_AFTER.match(after):
        return "negated"
    return "asked"


def _is_form(clause: str, name: Name, before: str, after: str) -> bool:
    """Whether the words around the name are one of the forms of an instruction."""
    if any(p.search(before) for p in _BEFORE):
        return True
    follows = not name.spaced or _FOLLOW.match(after) is not None
    if follows and any(p.search(before) for p in _BEFORE_CHECKED):
        return True
    if _AFTER.match(after):
        return True
    if after.lstrip().startswith(("پاسخ", "جواب")) and _BEFORE_FA.search(before):
        return True
    if _own_clause(clause, name):
        return True
    if _WRITE_FOLLOW.match(after) is None:
        return False
    written = _WRITE_TEXT.search(before)
    if written is not None:
        return _WRITE_DATA.search(written[0]) is None
    return _EXPLAIN_IT.search(before) is not None


def _clause_start(clause: str, at: int) -> int:
    """Where the part of ``clause`` that holds position ``at`` begins (after the last comma,
    dash or bracket before it): "answer in English, not in Chinese" negates Chinese only."""
    cut = max(clause.rfind(mark, 0, at) for mark in (",", "(", "—", "–", "，", ";"))
    return cut + 1 if cut >= 0 else 0


def _own_clause(clause: str, name: Name) -> bool:
    """ "In Spanish: …", "Spanish only", "…? Italian, please.", "kurz und auf Deutsch bitte",
    ", in Italian.": the name with at most a preposition and request words, as a part of its own
    (between commas, colons, brackets or dashes), or a preposition and the name with a request
    word closing the part. Not a question about the language ("In German, why does the verb
    move?")."""
    for part in _PART.finditer(clause):
        if part.start() <= name.start and name.end <= part.end():
            if clause[part.start() - 1 : part.start()] in (")", "]", "）"):
                # "keep the terms (over, wicket, LBW) in English": after a bracket the part
                # goes on with the words before it, it is no clause of its own
                return False
            lead = clause[part.start() : name.start].strip()
            ends = (clause[name.end : part.end()], clause[name.end :])
            tails = [t.rstrip(" .!?;。！？") for t in ends]
            if _OWN_PREFIX.match(lead + " " if lead else ""):
                if not lead and not (
                    (tails[0].strip() and _OWN_SUFFIX.match(tails[0])) or _PLEASE.match(tails[1])
                ):
                    return False  # a bare name ("Spanish?", "French, German, or Italian")
                if not any(_OWN_SUFFIX.match(t) for t in tails):
                    return False
            elif not (_PLEASE.match(tails[0]) and _PREPOSITION.search(lead)):
                return False
            return not _ABOUT.search(clause[part.end() :])
    return False


def explicit_requests(text: str) -> set[str]:
    """The languages ``text`` unambiguously asks the answer to be in (empty when none; ``?``
    for a language the detector cannot judge). A translation request without a target yields
    ``{"*"}``: no language can be expected."""
    reading = read(text)
    return {"*"} if reading.untargeted else set(reading.asked)
