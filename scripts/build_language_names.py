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
EXTRA = {
    "castellano": "es", "mandarin": "zh", "putonghua": "zh", "普通话": "zh", "普通話": "zh",
    "bahasa": "id",  # what English speakers call Indonesian ("Answer in Bahasa, please")
}  # fmt: skip
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
    if phrase == "fi" and " " not in name:
        # the translative, "into / in X" (ruotsiksi, englanniksi, suomeksi): a language's form
        # alone, where the name itself is also the country's (Ruotsi)
        stem = re.sub(r"nti$", "nni", re.sub(r"mi$", "me", name))
        out.add(stem + "ksi")
    if phrase == "et" and name.endswith(" keel"):
        out.update({name + "es", name + "de"})  # "soome keeles", "inglise keelde"
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


#: Regions that share a name with a language (CLDR lists countries, not these): a request about
#: Corsica, Sardinia or Java names a place, not a language.
REGIONS = frozenset((
    "corse", "corsica", "córcega", "corcega", "korsika", "córsega", "sardinia", "sardegna",
    "cerdeña", "sardaigne", "sardinien", "sardenha", "java", "jawa", "bretagne", "brittany",
    "bretaña", "galicia", "galice", "galizien", "catalonia", "catalunya", "cataluña",
    "catalogne", "katalonien", "wales", "scotland", "écosse", "schottland", "escocia",
    "friesland", "frisia", "bavaria", "bayern", "sicily", "sicilia", "sizilien", "provence",
    "occitania", "occitanie", "asturias", "euskadi", "tibet", "xizang", "kurdistan", "tatarstan",
    "bashkortostan", "chechnya", "ossetia", "yakutia", "sunda", "bali", "sindh", "punjab",
    "kashmir", "gujarat", "bengal", "assam", "odisha", "tamil nadu", "kerala", "karnataka",
    "andalucía", "andalusia", "valencia", "flanders", "flandre", "vlaanderen", "wallonie",
    "wallonia", "lombardia", "lombardy", "venezia", "veneto", "napoli", "naples",
))  # fmt: skip
#: How often a word may occur (wordfreq's Zipf scale: 3.5 is about three in a million words)
#: before it counts as a common word of that language rather than a name.
COMMON_ZIPF = 3.5
#: How much more common (Zipf) than its language's English name is in English a minor language's
#: name may be before another sense of the word is what makes it common.
OTHER_SENSE = 1.5
#: A name of a language the detector cannot judge only turns judging off, so only a word far
#: more common than such a name could be is left out ("akan", Indonesian for "will": 6.8;
#: "zulu" stays, 3.8 in Danish).
VERY_COMMON_ZIPF = 4.5


def _tries(kind: str) -> dict[str, marisa_trie.BytesTrie]:
    root = Path(data_filename("trie/en/name_to_language.marisa")).parent.parent
    out = {}
    for folder in sorted(root.iterdir()):
        path = folder / f"name_to_{kind}.marisa"
        if path.exists():
            trie = marisa_trie.BytesTrie()
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                trie.load(str(path))
            out[folder.name] = trie
    return out


def build() -> dict[str, object]:
    """The index: names of judged languages per phrase language, their own names, the names
    of other languages, with places and common words left out (see the module docstring)."""
    from wordfreq import available_languages

    language_tries = _tries("language")
    places: dict[str, set[str]] = {
        lang: set(trie.keys()) for lang, trie in _tries("territory").items()
    }
    all_places = set().union(*places.values()) | REGIONS
    by_language: dict[str, dict[str, str]] = {p: {} for p in PHRASE_LANGUAGES}
    own: dict[str, str] = {}
    other: dict[str, tuple[str, str]] = {}  # name -> (code, the language it is written in)
    # Every judged language's names in every other judged language ("angol" is English in
    # Hungarian, "ruotsi" Swedish in Finnish): read in any text, only ever to widen what is
    # accepted.
    major: dict[str, tuple[str, str]] = {}
    for phrase in (*PHRASE_LANGUAGES, *sorted(JUDGED)):
        trie = language_tries.get(phrase)
        if trie is None:
            continue
        for key, value in trie.items():
            code = _code(value.decode("utf-8"))
            if any(ch.isdigit() for ch in key) or (key.isascii() and len(key) < 3):
                continue
            if code == phrase and code in JUDGED:
                for form in variants(key, phrase):
                    own.setdefault(form, code)
            if phrase not in PHRASE_LANGUAGES:
                if code in JUDGED:
                    for form in variants(key, phrase):
                        major.setdefault(form, (code, phrase))
                continue
            if code in JUDGED:
                for form in variants(key, phrase):
                    by_language[phrase].setdefault(form, code)
            elif len(code) == 2:
                for form in variants(key, phrase):
                    other.setdefault(form, (code, phrase))
    for name, code in EXTRA.items():
        home = "es" if name == "castellano" else "en" if name.isascii() else "zh"
        by_language[home][name] = code
    by_language["cs"].update(ADVERBS)
    english = {code: langcodes.Language.get(code).display_name("en") for code in sorted(JUDGED)}
    wordlists = sorted(available_languages(wordlist="best"))

    def zipf(name: str, lang: str) -> float:
        """Zipf frequency of a one-word name; 0 for a phrase, and in Chinese, Japanese, Korean
        and Thai, whose words wordfreq cuts with tokenizers this script does not need."""
        if lang not in wordlists or lang in ("zh", "ja", "ko") or " " in name:
            return 0.0
        if re.search(r"[\u0e00-\u0e7f\u3040-\u9fff\uac00-\ud7af]", name):
            return 0.0
        return float(zipf_frequency(name, lang))

    # What each word-listed language calls each language: where a word is one of those, its
    # frequency there comes (at least in part) from that sense ("norsk" in Danish).
    names_in: dict[str, dict[str, str]] = {}
    for w in wordlists:
        trie = language_tries.get(w)
        if trie is not None:
            found = names_in[w] = {}
            for key, value in trie.items():
                for form in variants(key, w):
                    found.setdefault(form, _code(value.decode("utf-8")))

    def common_elsewhere(name: str, code: str, home: str | None) -> bool:
        """A common word of a language other than ``home`` where it does not name the same
        language ("fins" in Portuguese, "jawa" in Malay)."""
        return any(
            zipf(name, w) >= COMMON_ZIPF
            for w in wordlists
            if w != home and names_in.get(w, {}).get(name) != code
        )

    def minor_common(name: str, code: str, home: str) -> bool:
        """A minor language's name that is a common word where it is written, far more common
        than that language is ever named (its English name in English: :data:`OTHER_SENSE`
        apart), so another sense dominates: "corso", Corsican in Italian but above all "course";
        "akan", Indonesian for "will". "finska" (Swedish for Finnish) and "catalán" stay."""
        if code in PHRASE_LANGUAGES:
            return False
        common = zipf(name, home)
        named = float(zipf_frequency(english[code].lower(), "en")) if code in english else 0.0
        return common >= COMMON_ZIPF and common - named > OTHER_SENSE

    # Each language's own name ("suomi", "eesti": common at home because they are its name),
    # unless it is a region, or a minor language's name that is a common word of another.
    own = {
        n: c
        for n, c in own.items()
        if n not in REGIONS and (c in PHRASE_LANGUAGES or not common_elsewhere(n, c, c))
    }
    canonical = {name.casefold() for name in english.values()} | set(own)

    def keep(name: str, code: str, home: str) -> bool:
        """A name read in a text written in ``home``: never a place there ("Italien" is Italy
        in German, "Estonia" Estonia in Indonesian), never a minor language's name that is
        above all a common word there."""
        if name in canonical:
            return name not in REGIONS
        if name in REGIONS or name in places.get(home, ()):
            return False
        return not minor_common(name, code, home)

    by_language = {
        phrase: dict(sorted((n, c) for n, c in found.items() if keep(n, c, phrase)))
        for phrase, found in by_language.items()
    }
    # Names read in a text of any language (only ever to widen what is accepted): no place
    # anywhere, no common word of any language but the one the name belongs to.
    anywhere: dict[str, str] = dict(own)
    for phrase, found in by_language.items():
        for name, code in found.items():
            if name in canonical or (
                name not in all_places
                and not common_elsewhere(name, code, phrase)
                and not any(minor_common(name, code, w) for w in wordlists)
            ):
                anywhere.setdefault(name, code)
    for name, (code, _home) in major.items():
        if (
            name not in anywhere
            and name not in all_places
            and name not in REGIONS
            and not any(minor_common(name, code, w) for w in wordlists)
        ):
            anywhere[name] = code
    unjudged = sorted(
        n
        for n, (c, home) in other.items()
        if n not in anywhere
        and n not in all_places
        and not any(zipf(n, w) >= VERY_COMMON_ZIPF for w in wordlists)
    )
    # A minor language's name that the name finder would read as the stem of a place's name with
    # a case ending ("sardini" + "a"): left out, as the place is. (A major language's keeps its
    # name: "frans" is French in Dutch, though "Fransa" is France in Turkish.)
    from proxy.core.language_mentions import LATIN_TAILS

    stems = {
        place[: -len(tail)]
        for place in all_places
        for tail in LATIN_TAILS
        if place.endswith(tail) and len(place) > len(tail) + 4
    }

    def stemmed_place(name: str, code: str) -> bool:
        return name in stems and name not in canonical and code not in PHRASE_LANGUAGES

    anywhere = {n: c for n, c in anywhere.items() if not stemmed_place(n, c)}
    by_language = {
        phrase: {n: c for n, c in found.items() if not stemmed_place(n, c)}
        for phrase, found in by_language.items()
    }
    tags = {alias: code for alias, code in MEMBERS.items()}
    tags.update({"iw": "he", "in": "id", "ji": "yi", "jw": "jv", "mo": "ro"})
    return {
        "source": f"language_data {version('language-data')}, langcodes {version('langcodes')}, "
        f"wordfreq {version('wordfreq')}",
        "anywhere": dict(sorted(anywhere.items())),
        "by_language": by_language,
        "own": dict(sorted(own.items())),
        "english": english,
        "unjudged": unjudged,
        "tags": dict(sorted(tags.items())),
    }


if __name__ == "__main__":
    data = build()
    OUT.write_text(json.dumps(data, ensure_ascii=False, indent=0, sort_keys=False) + "\n")
    print(
        f"{OUT}: {len(data['anywhere'])} names read anywhere, "  # type: ignore[arg-type]
        f"{sum(map(len, data['by_language'].values()))} per phrase language, "  # type: ignore[union-attr]
        f"{len(data['unjudged'])} names of other languages"  # type: ignore[arg-type]
    )
