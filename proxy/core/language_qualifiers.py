"""What qualifies a language rule in a text: negation ("do not answer in X", "英語ではなく"),
conditions and permissions ("if the user writes in X", "you may also answer in X"), concessions
("regardless of the user's language"), a rule that follows the user's language, one meant for
the rest of a conversation ("from now on"), and the requests that leave the language open ("in
any language", "in my native language", code alone). Read by :mod:`proxy.core.language_forms`.

Pure: compiled regular expressions over lower-case text.
"""

from __future__ import annotations

import re

# Negation before the directive: "do not answer in X", "never respond in X", "no me contestes
# en X", "ne réponds pas en X", "nicht auf X antworten", "别用X回答", "不要用X".
NEGATION = re.compile(
    r"(?<![\w'])(?:not|no|never|don'?t|doesn'?t|won'?t|shouldn'?t|mustn'?t|can'?t|cannot|avoid\w*"
    r"|without|stop|refrain\w*|nunca|jamás|jamas|ni|sin|não|nao|nem|sem|ne|n'|pas|jamais|sans"
    r"|nicht|nie|niemals|kein\w*|ohne|non|mai|senza|niet|nooit|geen|zonder|не|ни|никогда|без"
    r"|ні|ніколи|nie|nigdy|bez|jangan|tidak|bukan|tanpa|không|đừng|değil|asla|لا|لن|ليس|بدون"
    r"|मत|नहीं|όχι|μην|μη|except|besides|excepto|sauf|außer|ausser|tranne|кроме|крім|oprócz"
    r"|kecuali|trừ)(?![\w'])"
    r"|不要|不用|别|別|勿|不能|不得|避免|禁止|不可|千万别|千萬別"
)
# A language named to be ruled out, without a directive: "英語ではなく、日本語で",
# "영어 말고 한국어로", "not in English but in French", "geen Engels, gewoon in het Nederlands",
# "nicht auf Englisch, sondern …": the name is negated.
RULED_OUT_AFTER = re.compile(
    r"^\s*(?:ではなく|じゃなくて|じゃなく|でなく|말고|가 아니라|이 아니라|而不是)"
)
CONTRAST = re.compile(
    r"^\s*(?:[,;.—–-]|$|(?:but|sino|mais|sondern|ma|mas|gewoon|just|please|alsjeblieft|bitte"
    r"|por favor|s'il)(?![\w]))"
)
EXCEPT = re.compile(
    r"(?<![\w])(?:except|besides|other\s+than|apart\s+from|excepto|salvo|sauf|außer|ausser"
    r"|tranne|exceto|кроме|крім|oprócz|behalve)\s+(?:for\s+)?(?:in\s+)?$"
)
RULED_OUT_BEFORE = re.compile(
    r"(?<![\w])(?:not|no|geen|kein\w*|nicht|pas|non|não|nie|не|ні)\s+(?:(?:in|en|em|auf|in het|на"
    r"|po|w)\s+)?(?:the\s+)?$"
)
# Negation written after the name: Japanese, Korean, Turkish, Hindi.
NEGATION_AFTER = re.compile(
    r"^.{0,12}?(?:ない|なく|禁止|지\s?마|말고|않|금지|마세요|(?:verme|yazma|kullanma|konuşma)\b"
    r"|मत|नहीं)"
)
# Words that make a text's language rules conditional or permissive: the directive depends on
# something ("if the user writes in X", "otherwise", "the user's language", "for any other
# language") or allows rather than asks ("you may also answer in English", "gerne auch auf
# Englisch"). Concessive words are not conditions ("even if asked", "auch wenn", "même si").
CONDITION = re.compile(
    r"(?<![\w])(?<!even )(?<!auch )(?<!même )(?<!meme )(?<!anche )(?<!mesmo )(?<!incluso )"
    r"(?:if|unless|when|whenever|in case|otherwise|else|depending|whichever|either"
    r"|regardless(?= of whether)|any other|all other|same language|user'?s language"
    r"|for\s+(?:users|customers|clients|people|visitors|members|anyone|those)\s+(?:with|who|whose"
    r"|from|in|using|speaking|on)"
    r"|customer'?s language|language of the (?:user|customer|question|message|client)"
    r"|matching|match the|may|feel free|also fine|is fine|are fine|is ok|is okay|prefer"
    r"|si|sino|cuando|a menos que|salvo que|según|de lo contrario|mismo idioma|cualquier otr[oa]"
    r"|los demás|caso"
    r"|se|quando|a menos|senão|mesmo idioma|lorsque|quand|sinon|sauf si|à moins|selon"
    r"|même langue|toute autre|tous les autres|autres cas|volontiers|wenn|falls|sofern|sonst"
    r"|ansonsten|je nach|gleichen sprache|anderen fällen|jede andere|gerne|gern|altrimenti"
    r"|a meno che|stessa lingua|qualsiasi altra|als|indien|tenzij|anders|om|hvis|jos|ha|gärna"
    r"|если|иначе|когда|в зависимости|том же языке|любом другом|можно|якщо|інакше|коли|можна"
    r"|jeśli|jeżeli|gdy"
    r"|chyba że|eğer|yoksa|değilse|\w{3,}(?:ysa|yse)|\w+[ae]bilirsin|aksi|jika|kalau|bila"
    r"|kecuali|boleh|nếu|trừ khi|إذا|اذا|لو|وإلا|عندما"
    r"|अगर|यदि|वरना)(?![\w])"
    r"|如果|若是|假如|要是|否则|否則|除非|的话|的話|根据|根據|其他语言|其他語言|其他情况|其他情況|也可以"
    r"|もし|場合|なら|以外|만약|경우|아니면|도 돼|도 괜찮"
)
# Concessions are not conditions: "regardless of the user's language", "无论用户使用什么语言".
CONCESSION = re.compile(
    r"(?<![\w])(?:regardless of|no matter (?:what|which)|irrespective of|unabhängig von"
    r"|quel(?:le)?s? que soi(?:t|ent)|independientemente d|indipendentemente da|même si|auch wenn"
    r"|even if|even when|even though)[^.;\n]*|(?:无论|不管|不论|無論)[^。；;\n，,]*"
)
# A rule that follows the user's own language ("reply in the user's language", "matching the
# customer", "in the same language as the question").
FOLLOWS_USER = re.compile(
    r"(?<![\w])(?:same language|(?:user|customer|client|caller|visitor)'?s(?:'s)? (?:own )?language"
    r"|language of the (?:user|customer|question|message|client|request|input)|matching the"
    r"|mismo idioma|idioma del (?:usuario|cliente)|même langue"
    r"|langue (?:de l'utilisateur|du client)"
    r"|gleichen sprache|sprache des (?:nutzers|kunden|benutzers)|stessa lingua|lingua dell'utente"
    r"|mesmo idioma|idioma do (?:usuário|cliente)|том же языке|языке пользователя"
    r"|whichever|(?:the\s+)?(?:user|customer|client)\s+(?:used|uses|writes|wrote)"
    r"|other\s+languages?\s*[:,]"
    # an exception to a rule, in another sentence ("Exception: if the student writes HELP, …")
    r"|exceptions?|except (?:when|if|for)|excepto (?:si|cuando)|sauf (?:si|quand)|außer wenn"
    # a rule for teaching a language: corrections and explanations come in the learner's
    r"|tutor\w*|correct (?:my|me|the student)|my mistakes|language learners?)(?![\w])"
    r"|同じ言語|相同的语言|相同语言|用户的语言|用戶的語言|같은 언어"
)
# A language the request asks for without naming it: "reply in my native language", "in her
# mother tongue", "en mi idioma". Which one cannot be known: no expectation.
UNNAMED = re.compile(
    r"(?<![\w])(?:in|into|using)\s+(?:my|her|his|their|our)\s+(?:own\s+|native\s+|mother\s+"
    r"|first\s+|home\s+)?(?:language|tongue)|en\s+(?:mi|su)\s+(?:propio\s+|lengua\s+)?(?:idioma"
    r"|lengua)|dans\s+(?:ma|sa)\s+langue|in\s+(?:meiner|seiner|ihrer)\s+(?:mutter)?sprache"
    r"|nella\s+(?:mia|sua)\s+lingua|na\s+minha\s+l[íi]ngua|用我的母语|用我的语言"
)
# An instruction meant for the rest of a conversation, not for one answer: "from now on", "for
# this whole chat", "always" (an operator's instruction always is).
PERSISTENT = re.compile(
    r"(?<![\w])(?:from\s+now\s+on|from\s+here\s+on|going\s+forward|henceforth|for\s+the\s+rest"
    r"|for\s+(?:this|the)\s+(?:whole\s+|entire\s+)?(?:chat|conversation|session)|always|every\s+time"
    r"|all\s+your\s+(?:answers|replies|responses)|a\s+partir\s+de\s+ahora|de\s+ahora\s+en\s+adelante"
    r"|siempre|à\s+partir\s+de\s+maintenant|désormais|toujours|ab\s+jetzt|von\s+nun\s+an|immer"
    r"|d'ora\s+in\s+poi|sempre|a\s+partir\s+de\s+agora|daqui\s+em\s+diante|отныне|впредь"
    r"|с\s+этого\s+момента|всегда|fremover|från\s+och\s+med\s+nu|vanaf\s+nu|mulai\s+sekarang"
    r"|từ\s+giờ|bundan\s+sonra|artık|odtąd|od\s+teraz)(?![\w])"
    r"|以后|以後|从现在开始|從現在開始|今後|これから|以降|앞으로|지금부터"
)
# A request for code alone: its answer is code, in no language ("Só o código, sem explicação").
CODE_ONLY = re.compile(
    r"(?<![\w])(?:(?:only|just)\s+(?:the\s+)?code|code\s+only|só\s+o\s+código|solo\s+el\s+código"
    r"|sólo\s+el\s+código|nur\s+(?:den\s+)?code|seulement\s+le\s+code|uniquement\s+le\s+code"
    r"|solo\s+il\s+codice|только\s+код)(?![\w])|只要代码|只给代码|コードだけ|코드만"
)
# A locale in an operator's data ("locale": "ja-JP", lang=pt_BR): the language it names.
LOCALE = re.compile(
    r"(?<![\w])(?:locale|lang(?:uage)?(?:_code)?)[\"']?\s*[:=]\s*[\"']?([a-z]{2,3})(?:[-_][a-z0-9]{2,8})*"
    r"(?![\w])"
)
# "Any language", "whatever language you like", "будь-якою мовою": the answer may be in any.
ANY_LANGUAGE = re.compile(
    r"(?<![\w])in\s+(?:any|whatever|whichever)\s+language(?!\s+(?:other|but|except))"
    r"|en\s+cualquier\s+idioma|dans n'importe quelle langue|in qualsiasi lingua"
    r"|em qualquer (?:idioma|língua)|in jeder (?:beliebigen )?sprache|на любом языке|любым языком"
    r"|будь-якою мовою|w dowolnym języku|用任何语言|用任何語言|どの言語でも|어떤 언어로든"
)
