"""The language of a short Latin-script prompt, from how often its words occur in each language.

fastText reads character n-grams. On a question of two to eight words ("Fotosentez nedir?",
"Wat is fotosynthese?") it has too few of them: it spreads its probability over related
languages and English, and the requested-language derivation rightly refuses to expect a
language it is unsure of, so a wholly English answer to such a question passes. A reader
decides those questions by their words: "nedir" is a Turkish word and no other language writes
it; "wat" is ten thousand times more frequent in Dutch than in English. This module makes that
second, independent judgement and combines it with fastText's own candidates.

The evidence is a unigram model per language: wordfreq's "small" lists (every word with a
frequency of at least one in a million in that language's web, subtitle and book text, with its
frequency in centibels). For each candidate language the prompt's words score their log10
frequency (a word the list does not hold scores a floor below the list's cut-off). Each word's
influence is bounded: it can cost a language at most ``CLIP`` (a factor of 100) against the
language that explains the word best, so one loanword cannot outvote the words around it; and
capitalised words after the first are left out, as names and titles ("Who was Simon Bolivar?",
"Tell me about Angkor Wat") say what a prompt is about, not which language it is in. The words
are judged against every listed language; their sums, plus fastText's log probability for each
(a floor for languages outside its shortlist), give a posterior. A language is taken only when

* it is among fastText's top candidates, with at least a tenth of the probability of its first
  (the two signals agree on the shortlist; neither overrules the other tenfold);
* the words alone favour it over every other listed language by a factor of ten;
* the combined posterior reaches ``POSTERIOR``;
* fastText does not prefer a language that has no word list and so cannot be checked;
* the prompt is not made wholly of common English words (every word at least one in 100,000
  English words): such a prompt stays English whatever its other readings;
* no word is a common English word that English uses ten times as often as the chosen
  language ("recipe" in "nasi goreng recipe", "lyrics" in "la vie en rose lyrics"): a prompt
  with English in it is an English prompt naming something foreign, or a mixed one, and an
  expectation of the other language would abort a correct English answer.

Only Latin-script languages with a wordfreq list take part; other scripts decide by their letters
before this runs (:mod:`proxy.core.requested_language`). The 26 lists are loaded once per
process, by the server beside serving as it starts (:func:`load_all`,
:mod:`proxy.server.preload`) or else on the first short prompt (about 1 s in all), as sorted
hashes with their frequency bands: about 10 MB for all of them, instead of the several MB per
language a dict of the words takes. Scoring a prompt then costs about
0.1 to 0.2 ms (``bench/measure/language/measure_short_prompts.py``). Pure otherwise: no I/O.
"""

from __future__ import annotations

import functools
import math
import re
from array import array
from bisect import bisect_left
from collections.abc import Sequence
from operator import itemgetter

from proxy.detect.salad import list_path, normalise, read_bands, sorted_ranges

#: Latin-script languages with a wordfreq "small" list, as fastText names them (Malay is read
#: with Indonesian, Norwegian as Bokmål, Serbian and Bosnian as Croatian: one list each).
LISTED: frozenset[str] = frozenset(
    ("ca", "cs", "da", "de", "en", "es", "fi", "fr", "hr", "hu", "id", "is", "it", "lt", "lv",
     "nb", "nl", "pl", "pt", "ro", "sk", "sl", "sv", "tl", "tr", "vi")
)  # fmt: skip
#: fastText code -> the language it is scored as.
_GROUP_OF = {"ms": "id", "no": "nb", "nn": "nb", "sr": "hr", "bs": "hr"}
#: The wordfreq lists of a language, where they differ from its code.
_LIST_NAMES: dict[str, tuple[str, ...]] = {"id": ("id", "ms"), "tl": ("fil",), "hr": ("sh",)}
#: Scored (their words are evidence against the others) but never the answer: identification
#: tells Croatian, Serbian and Bosnian apart by chance, and an expectation of one would judge
#: an answer identified as another as drift.
_NEVER_CHOSEN = frozenset({"hr"})

#: A word a list does not hold is rarer than one in a million; it scores a tenth of that.
FLOOR = 2.0
#: The most one word can cost a language against the language that explains it best (log10).
CLIP = 2.0
#: How much the words alone must favour the chosen language over the runner-up (log10).
MARGIN = 1.0
#: fastText must not favour another language over the chosen one by more than this factor.
FASTTEXT_RATIO = 10.0
#: The combined posterior the chosen language must reach.
POSTERIOR = 0.95
#: fastText probability given to a language that is not among its top candidates.
_ABSENT = 0.01
#: A common English word: at least one in 100,000 words of English (Zipf 4).
COMMON_ENGLISH = 4.0
#: Prompts longer than this are not "short": fastText's unsureness there means mixed text.
MAX_WORDS = 16

_WORD = re.compile(r"[^\W\d_]+(?:['’][^\W\d_]+)*")
_LATIN = re.compile(r"[a-zß-ɏḀ-ỿ'’]+$")
_LATIN_RUN = re.compile(r"[A-Za-zß-ɏḀ-ỿ]+(?:['’][A-Za-zß-ɏḀ-ỿ]+)*")


class Frequencies:
    """One language's word list: sorted word hashes and, in step, their frequency bands."""

    def __init__(self, hashes: array[int], bands: array[int]) -> None:
        self.hashes = hashes
        self.bands = bands

    def zipf(self, word: str) -> float:
        """log10 of the word's frequency per 10⁹ words (wordfreq's Zipf scale), or the floor."""
        return self.zipf_of(hash(word))

    def zipf_of(self, h: int) -> float:
        """:meth:`zipf` of the word whose hash is ``h``."""
        i = bisect_left(self.hashes, h)
        if i == len(self.hashes) or self.hashes[i] != h:
            return FLOOR
        return 9.0 - self.bands[i] / 100.0

    def __len__(self) -> int:
        return len(self.hashes)


@functools.cache
def frequencies(name: str) -> Frequencies | None:
    """wordfreq's small list ``name`` (a wordfreq list name), loaded on first use, else None."""
    path = list_path(name, "small")
    if path is None:
        return None
    hashes, bands = array("q"), array("H")
    runs = ([(hash(word), band) for word in words] for band, words in read_bands(path))
    for part in sorted_ranges(runs, key=itemgetter(0)):
        hashes.extend(h for h, _ in part)
        bands.extend(b for _, b in part)
    return Frequencies(hashes, bands)


def load_all() -> None:
    """Load every list now (the server does it beside serving as it starts), not inside the
    first request that needs one."""
    for code in sorted(LISTED):
        _lists(code)


def _lists(code: str) -> list[Frequencies]:
    found = [frequencies(name) for name in _LIST_NAMES.get(code, (code,))]
    return [f for f in found if f is not None]


@functools.cache
def _listed() -> dict[str, list[Frequencies]]:
    """Every listed language that has a list, in code order, with its lists."""
    return {code: lists for code in sorted(LISTED) if (lists := _lists(code))}


@functools.lru_cache(maxsize=4096)
def _word_scores(h: int) -> tuple[float, ...]:
    """The Zipf value of the word whose hash is ``h`` in each language of :func:`_listed` (its
    best list), in that order. Why cached: each value is a binary search in each of 27 lists,
    most of a short prompt's judgement (0.2 to 0.5 ms), and prompts are made of the same common
    words again and again. Keyed by the word's hash, as the lists themselves are; at most 4,096
    words (250 to 900 bytes each: at most about 3.5 MB)."""
    return tuple(max(f.zipf_of(h) for f in lists) for lists in _listed().values())


def prompt_words(clean: str) -> list[str]:
    """The words of a cleaned prompt that say which language it is written in, normalised as
    wordfreq stores them. Capitalised words after the first are names and titles ("Simon
    Bolivar", "Sturm und Drang"): they say what the prompt is about, not its language."""
    words = _WORD.findall(clean)
    return [normalise(w) for i, w in enumerate(words) if i == 0 or not w[0].isupper()]


def _english_word(word: str, lists: list[Frequencies]) -> bool:
    """A common English word that English uses ten times as often as the other language: it
    speaks for English ("recipe", "lyrics", "machine"), where "is" or "was" do not."""
    english = frequencies("en")
    if english is None:  # pragma: no cover - wordfreq missing
        return False
    zipf = english.zipf(word)
    return zipf >= COMMON_ENGLISH and zipf - max(f.zipf(word) for f in lists) >= MARGIN


#: An English word mixed into another language's turn: at least three in a million English words,
#: and three times as frequent as in the turn's own language (which borrows English words:
#: Filipino writes "apply" a third as often as English does).
MIXED_ENGLISH = 3.5
MIXED_MARGIN = 0.5


def english_words(clean: str, language: str | None) -> int:
    """How many different lower-case words of ``clean`` are English words that ``language``
    (the turn's own, where it has a list) does not write as often: the English of a
    code-switched turn ("das Meeting für next week zu schedulen", "这个 deadline 太 tight 了",
    "necesito un outfit para un job interview"). Capitalised words after the first are names."""
    english = frequencies("en")
    if english is None:  # pragma: no cover - wordfreq missing
        return 0
    own = _lists(_GROUP_OF.get(language, language)) if language in LISTED else []
    found: set[str] = set()
    # Latin letters only: in "帮我写个email给client" the words touch the Han characters.
    for i, word in enumerate(_LATIN_RUN.findall(clean)):
        if i == 0:
            word = word.lower()
        if len(word) < 3 or not word.islower() or not _LATIN.match(word):
            continue
        zipf = english.zipf(word)
        if zipf >= MIXED_ENGLISH and (
            not own or zipf - max(f.zipf(word) for f in own) >= MIXED_MARGIN
        ):
            found.add(word)
    return len(found)


#: A word of another language mixed into a turn: at least one in 100,000 of that language.
MIXED_FOREIGN = 4.0


def mixed_languages(clean: str, language: str) -> set[str]:
    """The other listed languages two or more different lower-case words of ``clean`` belong
    to: common there (:data:`MIXED_FOREIGN`) and ten times rarer in ``language``, the turn's
    own (Taglish "pwede mo ba akong tulungan … kasi may family emergency", Spanglish)."""
    listed = _listed()
    own_index = list(listed).index(language) if language in listed else None
    hits: dict[str, set[str]] = {}
    for word in set(_WORD.findall(clean)):
        if len(word) < 2 or not word.islower() or not _LATIN.match(word):
            continue
        scores = _word_scores(hash(word))
        own = scores[own_index] if own_index is not None else FLOOR
        for code, score in zip(listed, scores, strict=True):
            if code != language and score >= MIXED_FOREIGN and score - own >= MARGIN:
                hits.setdefault(code, set()).add(word)
    return {code for code, words in hits.items() if len(words) >= 2}


def identify_by_words(clean: str, candidates: Sequence[tuple[str, float]]) -> str | None:
    """The language of the short Latin-script text ``clean`` given fastText's top
    ``candidates`` (code, probability), or None when the two signals do not agree firmly."""
    words = prompt_words(clean)
    if not 2 <= len(words) <= MAX_WORDS or not all(_LATIN.match(w) for w in words):
        return None  # too few words, too many, or not (only) Latin script
    english = _lists("en")
    if english and all(english[0].zipf(w) >= COMMON_ENGLISH for w in words):
        return None  # an English prompt, however fastText reads it
    shortlist: dict[str, float] = {}
    for code, prob in candidates:
        code = _GROUP_OF.get(code, code)
        shortlist[code] = shortlist.get(code, 0.0) + prob
    # The words are judged against every listed language, not only fastText's shortlist: on a
    # few words its shortlist can miss the language altogether ("Vem var …?" is Swedish;
    # fastText offered Malay, Serbian, Norwegian, Albanian).
    listed = _listed()
    lexical = dict.fromkeys(listed, 0.0)
    for word in words:
        scores = _word_scores(hash(word))
        best = max(scores)
        for code, score in zip(listed, scores, strict=True):
            lexical[code] += max(score - best, -CLIP)
    ranked = sorted(lexical, key=lexical.__getitem__, reverse=True)
    choice, runner_up = ranked[0], ranked[1]
    if choice in _NEVER_CHOSEN or choice not in shortlist:
        return None
    if shortlist[choice] * FASTTEXT_RATIO < max(shortlist.values()):
        return None  # fastText disfavours it tenfold ("nasi goreng recipe": English 0.51)
    if lexical[choice] - lexical[runner_up] < MARGIN:
        return None
    if choice != "en" and any(_english_word(w, listed[choice]) for w in words):
        return None  # English in the prompt ("nasi goreng recipe"): its language is not one
    if any(p > shortlist[choice] for code, p in shortlist.items() if code not in listed):
        return None  # fastText prefers a language whose words cannot be checked
    combined = {
        code: math.log10(max(shortlist.get(code, 0.0), _ABSENT)) + lexical[code] for code in listed
    }
    top = max(combined.values())
    total = sum(10 ** (score - top) for score in combined.values())
    if 10 ** (combined[choice] - top) / total < POSTERIOR:
        return None
    return choice
