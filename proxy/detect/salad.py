"""Word salad: prose whose words are not words of the expected language.

Small models write "Frankresien", "Königina", "potraciamo": invented words that mix fragments
of related languages, in sentences fastText still calls the expected language (its character
n-grams look right). What gives them away is the vocabulary: a reader of the language would not
find them in any dictionary. So the signal is the share of the words a prose reader would check
(lower-case, alphabetic, four letters or more, outside code and URLs; capitalised words are
names) that the language's word list does not hold at all.

The word lists are `wordfreq <https://pypi.org/project/wordfreq/>`_'s "large" lists (words down
to about one in 10⁸ of running text). Only languages that have one and that were measured
(``bench/measure/detector/measure_salad.py``, docs/detector.md, *Word salad*) are checked: the
"small" lists (Turkish, Indonesian, Vietnamese) miss ordinary inflected forms; English is judged
while streaming only, as its healthy changelogs and copyright files are full of package names.
A list is loaded once per process and
language, on first use, and kept as a sorted array of string hashes (5 MB instead of the 60 to
120 MB a set of the words takes).

Two thresholds, as for the other signals: while streaming, a full window of recent words must
hold the share and enough *distinct* unknown words (a package name repeated twenty times is one
unknown word, not twenty) over consecutive checks; when the stream ends, a short answer's words
are judged once with a lower bar (most salad answers are short).
"""

from __future__ import annotations

import functools
import gzip
import importlib.util
import re
import unicodedata
from array import array
from bisect import bisect_left
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import TypeVar

from proxy.detect.types import DetectorConfig

#: Languages with a large wordfreq list whose healthy text was measured against salad.
SALAD_LANGUAGES: frozenset[str] = frozenset({"de", "en", "es", "fr", "it", "nl", "pl", "pt", "ru"})
#: Languages judged at the end of a stream too. English is judged while streaming only: its
#: healthy changelogs and copyright files, full of package and maintainer names, pass the
#: streaming window (a full window, sustained) but reach the lower end-of-stream bar
#: (docs/detector.md, *Word salad*; three Debian files of the development corpus).
_END_LANGUAGES: frozenset[str] = SALAD_LANGUAGES - {"en"}

_TOKEN = re.compile(r"\n|[^\s]+")
_APOSTROPHE = re.compile(r"['’]")
# Punctuation and markup around a word ("(word),", "**word**", "«word»").
_EDGES = "\"'“”„«»‘’‚‹›()[]{}<>.,;:!?¿¡*_~…—–-/\\|#"
_MIN_LETTERS = 4
_LETTERS = r"[^\W\d_]+(?:['’][^\W\d_]+)*"
_EDGE_CLASS = "[" + re.escape(_EDGES) + "]*"
# A whole whitespace-separated token that is letters (and inner apostrophes) inside punctuation;
# never a hashtag or a handle ("#womeninscience", "@nasa"): names made of run-together words.
_WORD = re.compile(
    r"(?<!\S)(?![#@])" + _EDGE_CLASS + "(" + _LETTERS + ")" + _EDGE_CLASS + r"(?!\S)"
)
_WHOLE = re.compile(_LETTERS)
_MAX_TOKEN = 256
#: Languages that write compounds as one word, and the shortest part of one that is judged.
_COMPOUNDING = frozenset({"de", "nl"})
_MIN_PART = 4
_MIN_COMPOUND = 12
#: What separates the items of an enumeration.
_SEPARATORS = frozenset(",;")
#: Characters of whitespace that may stand between two items of an enumeration.
_GAP = 16
_SEEN_MAX = 50_000
#: The last frequency band of the words :meth:`Lexicon.is_common` holds: band ``i`` holds the
#: words of frequency 10^(-i/100), so band 600 is one in a million (Zipf 3).
COMMON_BAND = 600
#: How many of a language's most frequent words are its function words.
FUNCTION_WORDS = 100


class ProseWords:
    """Incremental extraction of the words a prose reader would check, with their offsets.

    Text arrives in arbitrary pieces; a token is only judged once the whitespace after it has
    arrived (or the stream ends), so a word split across deltas is seen whole. Fenced code and
    inline code are skipped, as are URLs, capitalised words (names, sentence starts), and tokens
    with digits, underscores, dashes or dots inside (identifiers, versions, file names).

    Each word comes with whether it stands *inside an enumeration*: its token ends in a comma
    (or semicolon) and so does the token before it (``…, emakhuwa, xichangana, cisena, …``). A
    run of single words between commas is a list of names or terms (the local languages of a
    country, written in lower case in Portuguese; chemical elements; package names), which no
    word list need hold; salad is invented words in running sentences.
    """

    def __init__(self) -> None:
        self._carry = ""
        self._carry_at = 0
        self._fenced = False
        self._ticked = False
        # Where the last token judged so far ended, and whether in a list separator.
        self._last_end = -_GAP - 1
        self._last_separator = False

    def feed(self, text: str, *, final: bool = False) -> list[tuple[str, int, bool]]:
        buf = self._carry + text
        base = self._carry_at
        if final or buf[-1:].isspace():
            cut = len(buf)
        else:
            # The last token may go on in the next delta: keep it back.
            cut = max(buf.rfind(" "), buf.rfind("\n"), buf.rfind("\t")) + 1
        self._carry = buf[cut:]
        self._carry_at = base + cut
        if len(self._carry) > _MAX_TOKEN:
            # No word is this long (base64, a minified line): drop it rather than keep growing.
            self._carry_at += len(self._carry)
            self._carry = ""
        if self._fenced or self._ticked or buf.find("`", 0, cut) != -1:
            return self._tokens(buf, cut, base)
        # Fast path (no code in sight): one regular expression finds the whole-token words.
        out: list[tuple[str, int, bool]] = []
        for match in _WORD.finditer(buf, 0, cut):
            word = match.group(1)
            if len(word) >= _MIN_LETTERS:
                sep = match.group()[-1] in _SEPARATORS
                listed = sep and self._separated(buf, match.start(), base)
                _keep(word, base + match.start(1), listed, out)
        self._note_last(buf, cut, base)
        return out

    def _separated(self, buf: str, start: int, base: int) -> bool:
        """Whether the token before the one at ``start`` ends in a list separator (and is at
        most a few spaces away)."""
        head = buf[max(0, start - _GAP) : start].rstrip()
        if head:
            return head[-1] in _SEPARATORS
        return self._last_separator and self._last_end > base + start - _GAP

    def _note_last(self, buf: str, cut: int, base: int) -> None:
        """Remember where the last complete token ended and whether in a separator (for the
        next feed, whose first token may follow it)."""
        head = buf[max(0, cut - _GAP) : cut].rstrip()
        if head:
            self._last_separator = head[-1] in _SEPARATORS
            self._last_end = base + max(0, cut - _GAP) + len(head)

    def _tokens(self, buf: str, cut: int, base: int) -> list[tuple[str, int, bool]]:
        """Token by token, following code fences and inline code."""
        out: list[tuple[str, int, bool]] = []
        for match in _TOKEN.finditer(buf, 0, cut):
            token = match.group()
            if token == "\n":
                self._ticked = False  # inline code does not run past a line
                continue
            if "```" in token:
                if token.count("```") % 2:
                    self._fenced = not self._fenced
                continue
            if self._fenced:
                continue
            ticks = token.count("`")
            if ticks or self._ticked:
                if ticks % 2:
                    self._ticked = not self._ticked
                continue
            word = token.strip(_EDGES)
            if len(word) >= _MIN_LETTERS and _WHOLE.fullmatch(word):
                listed = token[-1] in _SEPARATORS and self._separated(buf, match.start(), base)
                _keep(word, base + match.start() + token.find(word), listed, out)
        self._note_last(buf, cut, base)
        return out


def _keep(word: str, start: int, listed: bool, out: list[tuple[str, int, bool]]) -> None:
    """Append the lower-case parts of four letters or more of ``word`` (split at apostrophes:
    "dell'amore" is two words)."""
    if "'" not in word and "’" not in word:
        if word.islower() and word.isalpha():
            out.append((word, start, listed))
        return
    for part in _APOSTROPHE.split(word):
        if len(part) >= _MIN_LETTERS and part.islower() and part.isalpha():
            out.append((part, start + word.find(part), listed))


def prose_words(text: str) -> list[str]:
    """The words of a whole text that the signal looks at (for measurement and tests)."""
    return [word for word, _, _ in ProseWords().feed(text, final=True)]


def normalise(word: str) -> str:
    """wordfreq's own normalisation for these languages: NFC, then case folding (ß -> ss)."""
    return unicodedata.normalize("NFC", word).casefold()


class Lexicon:
    """Membership in one language's word list: a sorted array of the words' hashes.

    ``hash`` of a string is salted per process, which is fine: the array is built and queried in
    the same process. A collision between an invented word and one of ~700,000 listed words has
    a chance of about 10⁻¹³ per lookup.

    Two smaller views of the same list serve :mod:`proxy.detect.word_runs`: ``common``, the
    sorted hashes of the words of at least one in a million (wordfreq's Zipf 3, the floor of its
    "small" lists: 30,000 to 60,000 words), and ``function_words``, the language's
    :data:`FUNCTION_WORDS` most frequent words ("the", "of", "and"; "die", "und"; "в", "и"),
    the words that make a sentence out of a string of content words.
    """

    def __init__(
        self,
        hashes: array[int],
        common: array[int] | None = None,
        function_words: frozenset[str] = frozenset(),
    ) -> None:
        self.hashes = hashes
        self.common = common if common is not None else array("q")
        self.function_words = function_words
        # Listed words already looked up: a binary search in the array costs ~20 boxed
        # comparisons, a set hit one, and prose repeats its common words. Only dictionary words
        # are kept (never a stream's unknown words: names, identifiers), and at most _SEEN_MAX.
        self._known: set[str] = set()

    def unknown(self, word: str) -> bool:
        """Whether ``word`` (lower-case) is missing from the list."""
        if word in self._known:
            return False
        h = hash(word if word.isascii() else normalise(word))
        hashes = self.hashes
        i = bisect_left(hashes, h)
        if i == len(hashes) or hashes[i] != h:
            return True
        if len(self._known) < _SEEN_MAX:
            self._known.add(word)
        return False

    def compound(self, word: str) -> bool:
        """Whether ``word`` is a closed compound of two listed words: twelve letters or more,
        split into two listed parts of four letters or more (``krankheits|relevanten``,
        ``transkriptom|ischen``). German and Dutch write new compounds freely, and technical
        prose is full of ones no list holds. The invented words of a small model's salad are
        shorter (``koppligern``, ``neuenzeigen``: ten or eleven letters), and below twelve
        letters a string splits too easily into two of the list's many short entries."""
        if len(word) < _MIN_COMPOUND:
            return False
        unknown = self.unknown
        for i in range(_MIN_PART, len(word) - _MIN_PART + 1):
            if not unknown(word[:i]) and not unknown(word[i:]):
                return True
        return False

    def is_common(self, word: str) -> bool:
        """Whether ``word`` (lower-case) is among the list's words of at least one in a million."""
        h = hash(word if word.isascii() else normalise(word))
        common = self.common
        i = bisect_left(common, h)
        return i < len(common) and common[i] == h

    def __len__(self) -> int:
        return len(self.hashes)

    def __contains__(self, word: object) -> bool:
        return isinstance(word, str) and not self.unknown(word)


def list_path(language: str, size: str = "large") -> Path | None:
    """wordfreq's list file of ``language`` (``size`` "large" or "small"), found without
    importing wordfreq (whose import pulls in ftfy, regex and langcodes, none of which the
    signal needs)."""
    spec = importlib.util.find_spec("wordfreq")
    if spec is None or not spec.submodule_search_locations:  # pragma: no cover - a dependency
        return None
    path = Path(next(iter(spec.submodule_search_locations))) / "data"
    path /= f"{size}_{language}.msgpack.gz"
    return path if path.is_file() else None


def read_bands(path: Path) -> Iterator[tuple[int, list[str]]]:
    """The frequency bands of a wordfreq "cBpack" file (a gzipped msgpack list: a header, then
    one list of words per band; band ``i`` holds the words of frequency 10^(-i/100)), one band
    at a time: the words of a whole list as Python strings would take 60 to 120 MB at once."""
    import msgpack

    with gzip.open(path, "rb") as fh:
        unpacker = msgpack.Unpacker(fh, raw=False)
        bands = unpacker.read_array_header()
        header = unpacker.unpack()
        if not isinstance(header, dict) or header.get("format") != "cB":
            raise ValueError(f"{path}: not a wordfreq cBpack file")
        for band in range(bands - 1):
            yield band, unpacker.unpack()


#: The hash space is cut into this many ranges, each sorted on its own (:func:`sorted_ranges`).
_RANGES = 16
_RANGE_BOUNDS = [(-1 << 63) + (i << 60) for i in range(1, _RANGES)]
_T = TypeVar("_T")


def sorted_ranges(runs: Iterable[list[_T]], key: Callable[[_T], int]) -> list[list[_T]]:
    """Every item of ``runs`` (word hashes, or tuples that start with one; ``key`` reads it),
    sorted, in sixteen lists by range of the hash: concatenated, they are ``sorted(all items)``.

    Why not one sort: a sort is one call that holds the interpreter's lock throughout, and one
    sort of a whole list (0.2 to 0.6 s for a large one) is that long without an answer from a
    server that loads the lists beside serving (:mod:`proxy.server.preload`). Each run (one
    frequency band) is sorted and split at the ranges' bounds; each range then gathers a few
    hundred sorted runs, which its own sort merges: the same result, in about the same time,
    with no call holding the lock for more than a sixteenth of it."""
    ranges: list[list[_T]] = [[] for _ in range(_RANGES)]
    for run in runs:
        run.sort()
        lo = 0
        for part, bound in zip(ranges, _RANGE_BOUNDS, strict=False):
            hi = bisect_left(run, bound, lo, key=key)
            part += run[lo:hi]
            lo = hi
        ranges[-1] += run[lo:]
    for part in ranges:
        part.sort()
    return ranges


def read_hashes(path: Path) -> array[int]:
    """The sorted hashes of every word of a wordfreq list file (:func:`read_bands`)."""
    return read_lexicon(path).hashes


def read_lexicon(path: Path) -> Lexicon:
    """A :class:`Lexicon` of a wordfreq list file, read in one pass over its bands."""
    common: list[int] = []
    top: list[str] = []

    def runs() -> Iterator[list[int]]:
        for band, words in read_bands(path):
            found = list(map(hash, words))
            if band <= COMMON_BAND:
                common.extend(found)
            if len(top) < FUNCTION_WORDS:
                # The most frequent *words*: the lists also hold digit tokens ("00", "0000").
                top.extend(w for w in words if w.isalpha())
            yield found

    hashes = array("q")
    for part in sorted_ranges(runs(), key=int):  # int: the hash itself
        hashes.extend(part)
    common.sort()  # 30,000 to 60,000 hashes: a few milliseconds
    return Lexicon(hashes, array("q", common), frozenset(top[:FUNCTION_WORDS]))


@functools.cache
def lexicon(language: str) -> Lexicon | None:
    """wordfreq's large list of ``language``, loaded on first use (0.1 to 0.3 s), else None.

    Any language with a large list loads (the measuring script compares English too); the
    signal itself only asks for :data:`SALAD_LANGUAGES`.
    """
    path = list_path(language)
    return None if path is None else read_lexicon(path)


class WordSalad:
    """Word-salad state of one stream (inactive unless the expected language is supported)."""

    def __init__(self, config: DetectorConfig, expected_language: str | None) -> None:
        self.config = config
        self.active = config.salad and expected_language in SALAD_LANGUAGES
        self._language = expected_language or ""
        self._lexicon: Lexicon | None = None
        self._words = ProseWords()
        # (word, unknown, offset) of the most recent prose words
        self._window: deque[tuple[str, bool, int]] = deque()
        self._unknown = 0
        self._streak = 0

    def update(self, new: str, *, final: bool) -> tuple[float, int] | None:
        """Take the text of one check; return (unknown share, onset) once salad holds."""
        if not self.active:
            return None
        found = self._words.feed(new, final=final)
        if not found:
            return None
        if not self._add(found):
            return None
        cfg = self.config
        if len(self._window) < cfg.salad_min_words:
            return None
        judged = self._judge(cfg.salad_min_unknown_share, cfg.salad_min_distinct_unknown)
        if judged is None:
            self._streak = 0
            return None
        self._streak += 1
        return judged if self._streak >= cfg.salad_sustain_checks else None

    def judge_end(self) -> tuple[float, int] | None:
        """At the end of the stream: the last window of words, with the end-of-stream bar."""
        cfg = self.config
        if not self.active or len(self._window) < cfg.salad_end_min_words:
            return None
        if self._language not in _END_LANGUAGES:
            return None
        return self._judge(cfg.salad_end_min_unknown_share, cfg.salad_end_min_distinct_unknown)

    def _add(self, found: list[tuple[str, int, bool]]) -> bool:
        if self._lexicon is None:
            self._lexicon = lexicon(self._language)
            if self._lexicon is None:  # pragma: no cover - wordfreq missing
                self.active = False
                return False
        words = self._lexicon
        lookup = words.unknown
        compounds = self._language in _COMPOUNDING
        window = self._window
        size = max(1, self.config.salad_window_words)
        for word, offset, listed in found:
            # An item of an enumeration is a name or a term (see ProseWords); a closed compound
            # of two listed words is a word of a compounding language.
            unknown = not listed and lookup(word) and not (compounds and words.compound(word))
            if len(window) == size:
                self._unknown -= window.popleft()[1]
            window.append((word, unknown, offset))
            self._unknown += unknown
        return True

    def _judge(self, min_share: float, min_distinct: int) -> tuple[float, int] | None:
        window = self._window
        share = self._unknown / len(window)
        if share < min_share:
            return None
        # Prose is made of the words a reader checks: about one every 8 to 15 characters, salad
        # or not. Spread thinner, the window's words are the lower-case leftovers of something
        # else (user ids in a list of names and e-mail addresses), not prose.
        span = window[-1][2] + len(window[-1][0]) - window[0][2]
        if span > self.config.salad_max_chars_per_word * len(window):
            return None
        unknown = [(word, offset) for word, flag, offset in window if flag]
        if len({word for word, _ in unknown}) < min_distinct:
            return None
        return (share, unknown[0][1])
