"""Build ``proxy/core/language_names.json``: language names -> ISO 639-1 codes, from langcodes.

The names come from ``language_data`` (the data package of ``langcodes``: CLDR and Wiktionary
names), read from its per-language name tries for the languages people write instructions in
(``PHRASE_LANGUAGES``) and for each judged language's own name. Reading the tries takes tens of
seconds, far too long for a proxy's start, so the index is built here once and shipped as data;
``tests/test_language_names.py`` checks it against the library.

Only the forms the library cannot give are derived by rule: the same name without accents, the
stems that inflected names share (Slavic case endings: "на английском", "po angielsku"), "bahasa X"
and "tiếng X", the 文 form of a Chinese name (英语 -> 英文), Arabic names without the article
and without hamza, Devanagari without nukta.

    pip install 'language-data>=1.2' && python scripts/build_language_names.py
"""

from __future__ import annotations

import json
import re
import unicodedata
import warnings
from importlib.metadata import version
from pathlib import Path

import langcodes
import marisa_trie
from language_data.util import data_filename
from wordfreq import zipf_frequency

from proxy.core.language_names import JUDGED, PHRASE_LANGUAGES

OUT = Path(__file__).resolve().parent.parent / "proxy" / "core" / "language_names.json"
#: Member languages named apart from the macrolanguage the detector answers with.
MEMBERS = {"fil": "tl", "cmn": "zh", "nb": "no", "zsm": "ms", "arb": "ar", "pes": "fa"}
#: Names no data set lists, each checked against a dictionary (Spanish "castellano" is Spanish).
EXTRA = {"castellano": "es", "mandarin": "zh", "putonghua": "zh", "普通话": "zh", "普通話": "zh"}
#: Czech and Slovak write the language as an adverb ("odpověz česky"): forms no data set lists.
ADVERBS = {
    "česky": "cs", "anglicky": "en", "německy": "de", "francouzsky": "fr", "španělsky": "es",
    "italsky": "it", "rusky": "ru", "polsky": "pl", "slovensky": "sk", "čínsky": "zh",
    "japonsky": "ja", "nemecky": "de", "po slovensky": "sk", "po česky": "cs",
}  # fmt: skip
_SLAVIC = re.compile(r"^[a-ząćęłńóśźżčďěňřšťůýа-яёіїєґ ]+$")


def _trie(language: str) -> marisa_trie.BytesTrie | None:
    path = Path(data_filename(f"trie/{language}/name_to_language.marisa"))
    if not path.exists():
        return None
    trie = marisa_trie.BytesTrie()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trie.load(str(path))
    return trie


def _code(tag: str) -> str:
    base = tag.split("-")[0]
    base = MEMBERS.get(base, base)
    try:
        macro = langcodes.standardize_tag(base, macro=True).split("-")[0]
    except langcodes.tag_parser.LanguageTagError:
        return ""
    return MEMBERS.get(macro, macro)


def _plain(name: str) -> str:
    return "".join(c for c in unicodedata.normalize("NFD", name) if not unicodedata.combining(c))


def variants(name: str, phrase: str) -> set[str]:
    """The written forms of ``name`` (a casefolded name in language ``phrase``) to match."""
    name = name.replace("i̇", "i").strip()
    out = {name}
    if phrase == "el" and name.endswith("σ"):
        out.add(name[:-1] + "ς")
    if phrase not in ("vi", "el", "hi", "ar", "fa", "he", "th", "zh", "ja", "ko"):
        out.add(_plain(name))
    if phrase == "id":
        out.add("bahasa " + name)
    if phrase == "zh" and name.endswith("语") and len(name) >= 3:
        out.add(name[:-1] + "文")
    if phrase == "hi":
        for form in (name, name.replace("\u093c", "")):
            out.add(form)
            out.add(form.replace("\u0928\u094d", "\u0902"))  # हिन्दी -> हिंदी
    if phrase == "th" and not name.startswith("ภาษา"):
        out.add("ภาษา" + name)
    if phrase == "ar":
        for form in list(out):
            out.add(re.sub("[إأآ]", "ا", form))
            if form.startswith("ال") and len(form) >= 6:
                out.add(form[2:])
    if phrase in ("ru", "uk", "pl", "cs") and len(name) >= 6 and _SLAVIC.match(name):
        # the stem the case forms share: английский -> английск(ом), angielski -> angielsk(u)
        stem = re.sub(r"(?:ий|ый|ой|ая|а|и|ы|y|i|ý)$", "", name)
        if len(stem) >= 5:
            out.add(stem)
    return {v for v in out if len(v) >= 2}


def build() -> dict[str, object]:
    judged: dict[str, str] = {}
    other: dict[str, str] = {}
    for phrase in (*PHRASE_LANGUAGES, *sorted(JUDGED)):
        trie = _trie(phrase)
        if trie is None:
            continue
        own = phrase not in PHRASE_LANGUAGES
        for key, value in trie.items():
            code = _code(value.decode("utf-8"))
            if own and code != phrase:
                continue  # in a judged language's own trie, only its own name
            if any(ch.isdigit() for ch in key) or (key.isascii() and len(key) < 3):
                continue
            target = judged if code in JUDGED else other if len(code) == 2 else None
            if target is None:
                continue
            for form in variants(key, phrase):
                target.setdefault(form, code)
    for name, code in {**EXTRA, **ADVERBS}.items():
        judged[name] = code
    english = {code: langcodes.Language.get(code).display_name("en") for code in sorted(JUDGED)}
    # A one-word name that is a common English word but not a language's English name ("iron"
    # is Ossetian, "korea" Indonesian for Korean, "lets" Dutch for Latvian) names a thing.
    own = {name.casefold() for name in english.values()}
    common = {
        n for n in (*judged, *other)
        if n.isascii() and " " not in n and n not in own and zipf_frequency(n, "en") >= 3.5
    }  # fmt: skip
    clash = common | {n for n, c in judged.items() if other.get(n, c) != c}
    tags = {alias: code for alias, code in MEMBERS.items()}
    tags.update({"iw": "he", "in": "id", "ji": "yi", "jw": "jv", "mo": "ro"})
    return {
        "source": f"language_data {version('language-data')}, langcodes {version('langcodes')}",
        "judged": dict(sorted((n, c) for n, c in judged.items() if n not in clash)),
        "english": english,
        "unjudged": sorted(n for n in other if n not in judged and n not in common),
        "tags": dict(sorted(tags.items())),
    }


if __name__ == "__main__":
    data = build()
    OUT.write_text(json.dumps(data, ensure_ascii=False, indent=0, sort_keys=False) + "\n")
    print(f"{OUT}: {len(data['judged'])} names of judged languages, {len(data['unjudged'])} others")
