"""Language names and tags -> the ISO 639-1 code the detector answers with.

The names are langcodes' (``language_data``: CLDR and Wiktionary names of every language in many
languages), read by ``scripts/build_language_names.py`` into ``language_names.json``: reading the
library's name tries takes tens of seconds, so the index ships as data and loads once (a few
milliseconds, about 1 MB). Two sets:

* names of the languages fastText ``lid.176`` can identify (:data:`JUDGED`), in the
  :data:`PHRASE_LANGUAGES` and in each language's own tongue, with the forms the library does not
  list (no accents, Slavic stems, "bahasa X", 英文);
* names of other languages (Zulu, Hausa, Maori …): a request for one of those can be recognised
  as a request, but gives no expectation, since the detector cannot judge the answer.
"""

from __future__ import annotations

import json
import re
from functools import cache
from pathlib import Path
from typing import NamedTuple

#: The ISO 639-1 codes fastText ``lid.176`` can answer with; a language it cannot name can never
#: be "expected", so any other value would count every answer as drift
#: (``tests/test_settings.py`` checks this against the model file).
JUDGED = frozenset(
    (
        "af", "am", "an", "ar", "as", "av", "az", "ba", "be", "bg", "bh", "bn", "bo", "br",
        "bs", "ca", "ce", "co", "cs", "cv", "cy", "da", "de", "dv", "el", "en", "eo", "es",
        "et", "eu", "fa", "fi", "fr", "fy", "ga", "gd", "gl", "gn", "gu", "gv", "he", "hi",
        "hr", "ht", "hu", "hy", "ia", "id", "ie", "io", "is", "it", "ja", "jv", "ka", "kk",
        "km", "kn", "ko", "ku", "kv", "ky", "la", "lb", "li", "lo", "lt", "lv", "mg", "mk",
        "ml", "mn", "mr", "ms", "mt", "my", "ne", "nl", "nn", "no", "oc", "or", "os", "pa",
        "pl", "ps", "pt", "rm", "ro", "ru", "sa", "sc", "sd", "sh", "si", "sk", "sl", "so",
        "sq", "sr", "su", "sv", "sw", "ta", "te", "tg", "th", "tk", "tl", "tr", "tt", "ug",
        "uk", "ur", "uz", "vi", "wa", "yi", "yo", "zh", "kw", "qu", "vo",
    )
)  # fmt: skip

#: The languages whose names for other languages are indexed: the languages people most write
#: instructions in (the phrase rules of :mod:`proxy.core.requested_language` read these).
PHRASE_LANGUAGES = (
    "en", "zh", "es", "hi", "ar", "pt", "ru", "ja", "de", "fr", "ko", "it", "tr", "id", "vi",
    "nl", "pl", "uk", "sv", "cs", "th", "el", "he", "fa",
)  # fmt: skip

#: The code of a language the detector cannot judge (a name was found, but no expectation).
UNJUDGED = "?"

_DATA = Path(__file__).with_name("language_names.json")


class Names(NamedTuple):
    """The loaded index (see the module docstring).

    ``codes``: the names read in a text of any language -> code (:data:`UNJUDGED` for other
    languages), with no place and no common word of any language among them: a mention only
    ever widens what is accepted, or turns judging off. ``by_language``: the names of judged
    languages written in each phrase language, each checked against that language's places and
    common words ("italien" is French for Italian, and Italy in German), which the phrase rules
    of that language read. ``own``: each judged language's name in itself. ``every``: all of
    them, for a client's explicit ``x-guard-language``."""

    codes: dict[str, str]
    by_language: dict[str, dict[str, str]]
    own: dict[str, str]
    every: dict[str, str]
    english: dict[str, str]
    tags: dict[str, str]


@cache
def names() -> Names:
    """The index, loaded on first use (the server loads it beside serving as it starts)."""
    data = json.loads(_DATA.read_text(encoding="utf-8"))
    codes = dict.fromkeys(data["unjudged"], UNJUDGED)
    codes.update(data["anywhere"])
    every: dict[str, str] = {}
    for found in data["by_language"].values():
        every.update(found)
    every.update(data["own"])
    every.update(data["anywhere"])
    return Names(codes, data["by_language"], data["own"], every, data["english"], data["tags"])


_TAG = re.compile(r"^[a-z]{2,3}(?:[-_][a-z0-9]{1,8})*$")


def resolve(value: str) -> str | None:
    """The judged code ``value`` names, or None: a code (``fr``), a BCP-47 tag (``pt-BR``,
    ``zh-Hans-CN``, ``zh_TW``: the language subtag decides), an old or member tag (``iw``,
    ``fil``, ``cmn``), or a name in any indexed language (``french``, ``Français``,
    ``castellano``, ``Deutsch``)."""
    text = " ".join(value.strip().casefold().replace("i̇", "i").split())
    if not text:
        return None
    index = names()
    if _TAG.match(text):
        base = re.split(r"[-_]", text, maxsplit=1)[0]
        base = index.tags.get(base, base)
        if base in JUDGED:
            return base
    code = index.every.get(text)
    return code if code in JUDGED else None


def english_name(code: str) -> str | None:
    """The English name of a judged code ("ca" -> "Catalan")."""
    return names().english.get(code)
