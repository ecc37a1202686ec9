"""Near-identical loops: units (lines and sentences) that repeat with small edits.

The exact periodic-tail check needs byte-identical copies. Real loops are often not: the first
copy of a two-speaker exchange differs by one word from the three that follow, a numbered list
repeats its item with only the number changing and a word swapped here and there. At the level
of *units* — lines, or sentences inside long lines — such a loop is still periodic, once two
units that share nearly all their words count as equal.

Each completed unit is reduced to the sequence of its words and numbers (case-folded; a number
is content: rows that differ in their figures are different rows, each a new one), and compared
with the units 1 to ``MAX_PERIOD`` places back; two units are the same when one word or number
at most was substituted, inserted or deleted. That is a loop's small edit, and it is not a
template: list items that share a frame ("how AI is changing the way film / music is
produced") differ in several words, and so do the verses of a cumulative song. ``run[p]``
counts how many consecutive units matched the unit ``p`` places before them; a run of ``r``
units at period ``p`` covers ``(r + p) / p`` copies of a ``p``-unit block. Most units differ in
length from every recent one by more than a word, which one comparison settles, so a unit
costs a few microseconds.
"""

from __future__ import annotations

import re
from collections import deque

from proxy.detect.diversity import tokens_of
from proxy.detect.ending import words_in

#: Longest block (units) looked for: a dialogue exchange or a stanza of a few lines.
MAX_PERIOD = 8
#: Edited (not identical) matches a running loop may hold: one edited unit is compared twice,
#: with the copy before and the copy after it. A counting song ("ten green bottles", "nine
#: green bottles") edits every copy; a loop repeats itself verbatim after a slip.
MAX_EDITED = 2
#: A unit longer than this (characters) is cut: memory stays bounded on text with no breaks.
MAX_UNIT_CHARS = 2048
#: Words of a unit that are compared (a long unit is told apart by its start and length).
MAX_UNIT_WORDS = 40

#: Words one copy of the repeated block must hold: a loop repeats prose; a block of labels,
#: numbers and grid lines (a Sudoku worked row by row, a file list) is layout.
MIN_BLOCK_WORDS = 12

# A unit ends at a line break, or after a sentence end followed by space.
_SPLIT = re.compile(r"\n|(?<=[.!?。！？])\s+")
# The ordinal that opens a list item.
_ORDINAL = re.compile(r"^[ \t]*\d{1,4}[.)](?=[ \t]|$)")


def similar(a: tuple[str, ...], b: tuple[str, ...]) -> bool:
    """Whether two units are equal but for one word substituted, inserted or deleted (units of
    under six words must be equal: one word in five is more than a small edit)."""
    if a == b:
        return True
    if min(len(a), len(b)) < 6 or not a[0] or not b[0]:
        return False
    if len(a) == len(b):
        return sum(x != y for x, y in zip(a, b, strict=True)) <= 1
    if abs(len(a) - len(b)) != 1:
        return False
    short, long = (a, b) if len(a) < len(b) else (b, a)
    i = 0
    while i < len(short) and short[i] == long[i]:
        i += 1
    return short[i:] == long[i + 1 :]


class LineLoop:
    """Near-identical unit loop state of one stream."""

    def __init__(self) -> None:
        self._partial = ""
        self._partial_start = 0
        # (words, start offset, characters, word count) of the recent non-blank units
        self._units: deque[tuple[tuple[str, ...], int, int, int]] = deque(maxlen=2 * MAX_PERIOD + 1)
        self._runs = [0] * (MAX_PERIOD + 1)
        self._edited = [0] * (MAX_PERIOD + 1)

    def update(
        self, new: str, *, end: int, final: bool = False
    ) -> tuple[int, int, int, int, int, int] | None:
        """Take the text of one check (``end``: stream length after it). Return (copies x 100,
        onset offset (the second copy's start), characters covered from the first copy on,
        period in units, edited matches, the first copy's start) of the unit loop the latest
        unit belongs to, or None."""
        if not self._partial:
            self._partial_start = end - len(new)
        text = self._partial + new
        base = self._partial_start
        latest: tuple[int, int, int, int, int, int] | None = None
        begin = 0
        for match in _SPLIT.finditer(text):
            latest = self._add(text[begin : match.start()], base + begin, latest)
            begin = match.end()
        if final or len(text) - begin > MAX_UNIT_CHARS:
            latest = self._add(text[begin:], base + begin, latest)
            begin = len(text)
        self._partial = text[begin:]
        self._partial_start = base + begin
        return latest

    def _add(
        self, piece: str, start: int, latest: tuple[int, int, int, int, int, int] | None
    ) -> tuple[int, int, int, int, int, int] | None:
        """Add one unit; return the loop it continues (``latest`` for a blank unit)."""
        if not piece.strip():
            return latest
        # A list item's ordinal says nothing; every other number is content.
        found = tokens_of(_ORDINAL.sub("", piece, count=1))
        words = tuple(found[:MAX_UNIT_WORDS]) + (
            (str(len(found)),) if len(found) > MAX_UNIT_WORDS else ()
        )
        # A small edit is only told from a different line in prose: six words separated by
        # spaces at least (a path or an identifier is one "word" to a reader, several here).
        spaced = len(piece.split())
        unit = words if spaced >= 6 else ("", *words)
        units = self._units
        runs, edited = self._runs, self._edited
        n = len(unit)
        fuzzy = spaced >= 6 and n >= 6  # only such units can match with an edit
        have = len(units)
        alive = False
        for p in range(1, MAX_PERIOD + 1):
            if p > have:
                runs[p] = edited[p] = 0
                continue
            other = units[-p][0]
            if other == unit:
                runs[p] += 1
                alive = True
            elif fuzzy and -1 <= len(other) - n <= 1 and similar(unit, other):
                runs[p] += 1
                edited[p] += 1
                alive = True
            else:
                runs[p] = edited[p] = 0
        count = spaced if piece.isascii() else words_in(piece)
        units.append((unit, start, len(piece), count))
        if not alive:
            return None
        best: tuple[int, int, int, int, int, int] | None = None
        for p in range(1, MAX_PERIOD + 1):
            run = runs[p]
            if run < p or self._edited[p] > MAX_EDITED:
                continue  # not two copies of the block yet, or a template edited every time
            covered = run + p
            if covered > len(units):
                covered = len(units)
            if sum(u[3] for u in list(units)[-p:]) < MIN_BLOCK_WORDS:
                continue
            first = units[-covered]
            span = start + len(piece) - first[1]
            copies = 100 * covered // p
            if best is None or copies > best[0]:
                # The repeating starts with the second copy: the first is content.
                second = units[-covered + p][1] if covered > p else first[1]
                best = (copies, second, span, p, self._edited[p], first[1])
        return best
