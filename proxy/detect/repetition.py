"""Repetition signals: exact periodic tails and the repeated n-gram rate.

A looping model emits the same unit again and again *at the end* of what it has written so far,
so the periodic-tail check only ever looks at the tail: it takes the last few characters, finds
their previous occurrences with ``str.rfind`` (C speed), and for each candidate period counts how
many whole copies of the last unit precede it. That finds any period from one character up to
the window size in O(window) time with no per-character Python loop, which is what keeps the
detector above a million characters per second.

Lists that cycle their items under new numbers (``21. Harvested``, ``22. Harvesting``, …, the
text of earlier items) are periodic only once the numbering is normalised, so the same check
also runs on text whose list ordinals are replaced by a single ``0`` (see
:func:`normalise_ordinals`). Other numbers stay: a row that differs from the last one only in
its numbers brings new figures (a table, a test vector, an enum, a count from 1 to 100).
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass

_DIGITS = re.compile(r"\d+")


def normalise_numbers(text: str) -> str:
    """Replace every run of digits by ``0`` so incrementing counters compare equal."""
    return _DIGITS.sub("0", text)


# A list item's ordinal: a number that opens a line (after its indentation), followed by "."
# or ")" and a space (or the end of what has arrived).
_ORDINAL = re.compile(r"(?<=\n)([ \t]*)\d{1,4}(?=[.)](?:[ \t]|\Z))")
# The end of the text that may still become an ordinal when more comes.
_OPEN_LINE = re.compile(r"(?:\A|\n)[ \t]*\d{0,4}[.)]?\Z")


def normalise_ordinals(text: str, *, line_start: bool) -> str:
    """Replace the ordinals of list items by ``0`` (``21. Hara`` and ``22. Hara`` compare
    equal); ``line_start``: whether ``text`` begins a line.

    A list's numbering says nothing: a list that repeats its own items under new numbers is
    going round. Every other number is content — a row of a table, a test vector, a port, a
    count from 1 to 100 brings its new figures — so it is kept."""
    return _ORDINAL.sub(r"\g<1>0", ("\n" if line_start else " ") + text)[1:]


def open_line(text: str, *, line_start: bool) -> int:
    """Where the end of ``text`` that may still become an ordinal begins (``len(text)`` when
    none may): the caller keeps it back until more text has come."""
    found = _OPEN_LINE.search(text)
    if found is None or (found.start() == 0 and not line_start and not text.startswith("\n")):
        return len(text)
    return found.start() + (text[found.start()] == "\n")


@dataclass(frozen=True, slots=True)
class PeriodicTail:
    """The periodic region that ends the text: unit length, covered length, repetitions."""

    period: int
    span: int

    @property
    def repeats(self) -> float:
        return self.span / self.period if self.period else 0.0

    @property
    def repeated(self) -> int:
        """Characters after the first copy: the repeating starts with the second (the first
        copy is content, and a trimmed answer keeps it)."""
        return max(0, self.span - self.period)

    @property
    def mass(self) -> float:
        """Span times repeats: how much text the loop covers, weighted by how often it recurs
        (a long unit seen once is not a loop; a short unit seen many times over a few
        characters is a stutter)."""
        return self.span * self.repeats


def _common_suffix(a: str, b: str) -> int:
    """Length of the longest common suffix of ``a`` and ``b`` (binary search on slices)."""
    lo, hi = 0, min(len(a), len(b))
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if a[len(a) - mid :] == b[len(b) - mid :]:
            lo = mid
        else:
            hi = mid - 1
    return lo


def periodic_span(text: str, period: int) -> int:
    """How many characters at the end of ``text`` are periodic with ``period``."""
    n = len(text)
    if period <= 0 or period > n:
        return 0
    unit = text[n - period :]
    end = n - period
    while end >= period and text[end - period : end] == unit:
        end -= period
    return (n - end) + _common_suffix(text[:end], unit)


def periodic_tail(text: str, *, probe: int = 24, candidates: int = 6) -> PeriodicTail | None:
    """The periodic tail of ``text`` with the largest mass among a few candidate periods.

    Candidates are the distances back to the previous occurrences of the last ``probe``
    characters, nearest first; the nearest is the smallest period, later ones catch long units
    that contain an internal repeat.
    """
    n = len(text)
    m = min(probe, n // 2)
    if m < 1:
        return None
    tail = text[n - m :]
    best: PeriodicTail | None = None
    end = n - 1
    for _ in range(candidates):
        pos = text.rfind(tail, 0, end)
        if pos < 0:
            break
        period = n - m - pos
        found = PeriodicTail(period, periodic_span(text, period))
        if best is None or found.mass > best.mass:
            best = found
        end = pos + m - 1
    return best


def repeated_ngram_rate(words: list[str], n: int = 4) -> float:
    """Share of the window's word n-grams that already occurred earlier in the window.

    Near-duplicate loops (a list whose items differ by one word) are not exactly periodic but
    reuse most of their n-grams; ordinary prose reuses few 4-grams.
    """
    total = len(words) - n + 1
    if total <= 0:
        return 0.0
    grams = Counter(zip(*(words[i:] for i in range(n)), strict=False))
    return (total - len(grams)) / total


_NUMBER = re.compile(r"\d+")


def counts_down(region: str, slots: int) -> bool:
    """Whether the numbers of a counter loop only ever decrease from one copy to the next.

    A countdown (99 Bottles, Ten Green Bottles with digits, a timer) ends by construction when
    it reaches zero; a runaway generation enumerates forward (Paragraph 17, 18, 19 …) with no
    end in sight. ``slots`` is how many numbers one copy of the unit holds, so the number ``i``
    and the number ``i + slots`` fill the same place in consecutive copies.
    """
    if slots <= 0:
        return False
    numbers = [int(n[-9:]) for n in _NUMBER.findall(region)]
    steps = [b - a for a, b in zip(numbers, numbers[slots:], strict=False)]
    return bool(steps) and all(d <= 0 for d in steps) and any(d < 0 for d in steps)


_WORD = re.compile(r"[^\W\d_]+")
_SENTENCE_END = re.compile(r"[^\W\d_][.!?][\"')\]]*\s")


def counts_on(region: str, slots: int) -> bool:
    """Whether the numbers of a counter loop's copies say nothing new: they are list ordinals
    (``21. Harvested``, ``22. Harvesting``: a list's numbering), or counters inside copies of
    prose (``2019 was the year of the dragon …``, ``2020 was …``: the copies are sentences of
    words, and each number steps on by the same amount from copy to copy). Other numbers are
    content: a row that repeats the last one's frame with new figures, an enum, a version list,
    a count from 1 to 100 each brings something new. ``slots``: numbers per copy, ordinals
    included."""
    figures = [int(m.group()[-9:]) for m in _DIGITS.finditer(region) if not _is_ordinal(region, m)]
    if not figures:
        return True
    # Prose: sentences, four words or more for every number in them (a row of a table or a
    # file's records ends in no sentence: its key and figures are what it says).
    numbers = len(_DIGITS.findall(region))
    copies = numbers / max(1, slots)
    if (
        4 * len(figures) > len(_WORD.findall(region))
        or len(_SENTENCE_END.findall(region)) < copies - 1
    ):
        return False
    per_copy = max(1, round(slots * len(figures) / max(1, numbers)))
    steps = [b - a for a, b in zip(figures, figures[per_copy:], strict=False)]
    return all(d == e for d, e in zip(steps, steps[per_copy:], strict=False))


def _is_ordinal(text: str, number: re.Match[str]) -> bool:
    start, end = number.span()
    line = text.rfind("\n", 0, start) + 1
    return (
        not text[line:start].strip(" \t")
        and text[end : end + 1] in (".", ")")
        and text[end + 1 : end + 2] in (" ", "\t", "")
    )


def is_loop(tail: PeriodicTail, text: str, min_repeats: float, min_span: int) -> bool:
    """Enough copies covering enough text: ``repeats >= min_repeats`` and a loop "mass"
    (span x repeats) of at least ``min_span x 4``, so a short tail needs many copies and a
    long unit needs few; never under half of ``min_span``. A unit with no letter or digit
    (rules of dashes, runs of blank lines) must cover twice ``min_span``, as Markdown and
    plain-text layout legitimately draw lines of one character, unless it is several
    characters long and recurs four times as often as a loop must."""
    if tail.repeats < min_repeats:
        return False
    unit = text[len(text) - tail.period :]
    if not any(ch.isalnum() for ch in unit):
        if tail.period >= 3 and tail.repeats >= 4 * min_repeats:
            return tail.span >= min_span  # a multi-character unit, not a drawn line
        return tail.span >= 2 * min_span
    return tail.span >= min_span / 2 and tail.mass >= 4 * min_span


# Chinese and Japanese, written without spaces: a word there is one to three characters.
_UNSPACED = re.compile(r"[\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff]")


def loop_kind(tail: PeriodicTail, text: str) -> str:
    """A one-word unit is a flood (``the the the``, ``的的的``), a longer one a repeated passage.
    Without spaces to count words by, more than three ideographs or kana are more than a word:
    ``我是一个用户`` ("I am a user") repeated is a loop of a sentence, as an English one is."""
    unit = text[len(text) - tail.period :]
    one_word = len(unit.split()) <= 1 and len(_UNSPACED.findall(unit)) <= 3
    return "token-flood" if one_word else "repetition"
