"""Language names in a text: the curated index of :mod:`proxy.core.language_names` read in a
clause, whole words and runs of words, case endings ("английском"), prefixes written on
("بالإنجليزية") and names inside scripts written without spaces ("用英文").

Pure: dictionary look-ups per word, one compiled pattern for the unspaced scripts.
"""

from __future__ import annotations

import re
from typing import NamedTuple

from proxy.core.language_names import UNJUDGED, names

# A word: letters with the combining marks Indic, Arabic and Hebrew write inside words.
_WORD = re.compile(
    r"(?:[^\W_]|[\u0300-\u036f\u0591-\u05c7\u064b-\u065f\u0670\u0900-\u0dff\u0e00-\u0e7f])+"
)
_UNSPACED = re.compile(r"[\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff\u0e00-\u0e7f]")
_LATIN_CYRILLIC = re.compile(r"^[a-zß-ɏḀ-ỿ\u0400-\u052f]+$")
# Case endings a Latin-script name may take ("ins Englische", "po angielsku", "v angličtině").
LATIN_TAILS = frozenset((
    "e", "en", "er", "es", "em", "a", "as", "o", "os", "u", "ą", "ie", "im", "iego", "ej",
    "ou", "ě", "ině", "ého", "ým", "ii", "ul", "ül", "ra", "re",
))  # fmt: skip
# Prefixes written onto the word (Arabic "بالإنجليزية", Hebrew "בעברית").
_PREFIXES = ("بال", "بـ", "ب", "لل", "ال", "ב", "ל")


class Name(NamedTuple):
    start: int
    end: int
    code: str
    spaced: bool  # a Latin or Cyrillic name: what follows it decides (see _FOLLOW)
    key: str  # the form found in the index


def _index() -> dict[str, str]:
    """Every name the rules may read: the judged languages' names in the phrase languages and
    in themselves, and the other languages' names (:data:`UNJUDGED`)."""
    if not _INDEX:
        index = names()
        merged = {k: v for k, v in index.codes.items() if v == UNJUDGED}
        merged.update(index.every)
        _INDEX.append(merged)
    return _INDEX[0]


_INDEX: list[dict[str, str]] = []
_UNSPACED_NAMES: list[re.Pattern[str]] = []


def find_names(clause: str) -> list[Name]:
    """Every language name in ``clause`` (lower case, single spaces), left to right: whole words
    and runs of up to three words looked up in the index, a stem with a case ending
    ("английском"), a prefix written on ("بالإنجليزية"), and names inside unspaced scripts."""
    codes = _index()
    found: list[Name] = []
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
            ordered = sorted((n for n in codes if _UNSPACED.search(n)), key=len, reverse=True)
            _UNSPACED_NAMES.append(re.compile("|".join(map(re.escape, ordered))))
        for match in _UNSPACED_NAMES[0].finditer(clause):
            found.append(Name(match.start(), match.end(), codes[match[0]], False, match[0]))
        found.sort()
    return found


def _lookup(clause: str, words: list[re.Match[str]], i: int, codes: dict[str, str]) -> Name | None:
    first = words[i]
    for n in (3, 2):  # "bahasa inggris", "tiếng anh", "scottish gaelic"
        if i + n <= len(words):
            last = words[i + n - 1]
            key = clause[first.start() : last.end()]
            if key in codes:
                return Name(first.start(), last.end(), codes[key], True, key)
    word = first[0]
    start, end = first.start(), first.end()
    code = codes.get(word)
    if code is not None:
        return Name(start, end, code, _LATIN_CYRILLIC.match(word) is not None, word)
    head = word[0]
    if "\u0590" <= head <= "\u06ff":  # Hebrew and Arabic write prefixes onto the word
        for prefix in _PREFIXES:
            rest = word[len(prefix) :]
            if word.startswith(prefix) and rest in codes:
                return Name(start + len(prefix), end, codes[rest], False, rest)
        return None
    hangul = "\uac00" <= head <= "\ud7af"
    if len(word) < (3 if hangul else 6) or _UNSPACED.search(head):
        return None
    cyrillic = "\u0400" <= head <= "\u052f"
    # Bengali to Malayalam write case endings onto the word ("ইংরেজিতে", in English)
    indic = "\u0980" <= head <= "\u0dff"
    for cut in range(1, 5):
        stem, tail = word[:-cut], word[-cut:]
        if len(stem) < (2 if hangul else 5) or stem not in codes:
            continue
        if hangul:  # 영어로, 한국어로: the particle is the mark
            return Name(start, start + len(stem), codes[stem], False, stem)
        if cyrillic or indic or tail in LATIN_TAILS:
            return Name(start, end, codes[stem], True, stem)
    return None


def widens(name: Name, language: str | None) -> bool:
    """Whether a mention names a language in a text written in ``language``: a name read in
    any text, or a name of that language's own (French "italien" is Italian; German "Italien"
    is Italy, and read in German text it names nothing)."""
    index = names()
    if name.key in index.codes or name.key in index.own:
        return True
    return language is not None and name.key in index.by_language.get(language, {})
