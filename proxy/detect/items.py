"""List cycles: a list that repeats its own items.

A list names a different thing in every item; that is what a list is for. A model that has lost
its way goes round the items it already wrote — "21. Innovative, 22. Inventive, 23. Cutting-edge"
again after twenty, the same link four times, the antonyms of a word cycled three times — often
under new numbers, so that no two lines are the same and the periodic-tail check sees nothing.
A healthy answer restates items of *other* lists (a summary of the points above) or repeats an
answer option under every question ("a. Yes", "b. No"), but it does not list the same items
again, in the same order, inside one list.

So the items of each list (lines that open with a bullet or an ordinal, outside code fences) are
compared with the items before them in the same list, their marker left out: the item that is
the same as the one ``p`` places back continues a run at period ``p``; a run of
:data:`RUN_ITEMS` items is a cycle. A list ends where a line of prose at its indentation or less
comes, where an item of another kind comes at its indentation (the "Yes"/"No" bullets under each
numbered question are lists of their own), and where an ordinal starts again at 1 or ``a``.
Numbers inside the items are kept: "1/4 cup chopped fresh thyme" repeated is a repeated item,
"W 35th St", "W 38th St" are different streets.

Incremental: :meth:`ListCycle.update` takes the text of one check; a completed line costs one
regular expression and a dictionary lookup, and memory is bounded per list.
"""

from __future__ import annotations

import re
from collections import deque
from dataclasses import dataclass, field

#: Items of one list, each the same as the item one period back, that make a cycle: three
#: items listed again in the same order (or one item three times more) is no accident.
RUN_ITEMS = 3
#: Items of a list whose positions are remembered (a cycle longer than this is not seen).
HISTORY_ITEMS = 128
#: A line longer than this (characters) is cut: memory stays bounded on text with no breaks.
MAX_LINE_CHARS = 2048
#: Characters of an item (its first line and the deeper lines that continue it) compared.
MAX_ITEM_CHARS = 1024

# A list item: indentation, then a bullet, an ordinal ("12." "12)" "(12)") or a letter ("a."
# "b)"), then space and the item's text.
_ITEM = re.compile(
    r"([ \t]*)(?:([-*+•])|(\d{1,4})[.)]|([A-Za-z])[.)]|\((\d{1,4}|[A-Za-z])\))[ \t]+(?=\S)"
)
_FENCE = re.compile(r"[ \t]*(```|~~~)")
# The first two characters of a line that may be an item's.
_MAY_OPEN = re.compile(r"[-*+•(\d]|[A-Za-z][.)]")
_SPACE = re.compile(r"\s+")
_LETTER = re.compile(r"[^\W\d_]")
_NUMBER = re.compile(r"\d+")


@dataclass(slots=True)
class _List:
    """One open list: where each item's text (numbers masked) was last seen, the recent items'
    numbers, and the run the latest item is in."""

    seen: dict[str, int] = field(default_factory=dict)
    # the numbers of the recent items and the step each took from its source
    recent: deque[tuple[tuple[int, ...], tuple[int, ...] | None]] = field(
        default_factory=lambda: deque(maxlen=HISTORY_ITEMS)
    )
    items: int = 0
    run: int = 0
    period: int = 0
    run_start: int = 0


@dataclass(slots=True)
class _Item:
    """The item being read: where it starts and ends, its list, its text so far."""

    start: int
    end: int
    key: tuple[int, str]
    text: str


@dataclass(frozen=True, slots=True)
class Cycle:
    """A list going round its items: items in the run, its period, where it began (the first
    item that repeats an earlier one) and the characters from there to the latest item's end."""

    items: int
    period: int
    onset: int
    span: int


class ListCycle:
    """List-cycle state of one stream (see the module docstring)."""

    def __init__(self) -> None:
        self._partial = ""
        self._partial_start = 0
        self._fenced = False
        # open lists by (indentation, marker kind)
        self._lists: dict[tuple[int, str], _List] = {}
        # the item being read (its lines until the next item or a line no deeper than it)
        self._pending: _Item | None = None

    def update(self, new: str, *, end: int, final: bool = False) -> Cycle | None:
        """Take the text of one check (``end``: stream length after it); return the cycle the
        latest item belongs to, if it has gone round :data:`RUN_ITEMS` items."""
        if not self._partial:
            self._partial_start = end - len(new)
        text = self._partial + new
        base = self._partial_start
        found: Cycle | None = None
        begin = 0
        newline = text.find("\n", len(self._partial))
        while newline >= 0:
            found = self._line(text[begin:newline], base + begin) or found
            begin = newline + 1
            newline = text.find("\n", begin)
        if final or len(text) - begin > MAX_LINE_CHARS:
            found = self._line(text[begin:], base + begin) or found
            begin = len(text)
        if final:
            found = self._close() or found
        self._partial = text[begin:]
        self._partial_start = base + begin
        return found

    def _line(self, line: str, start: int) -> Cycle | None:
        head = line.lstrip(" \t")[:2]
        if head[:1] in ("`", "~") and _FENCE.match(line):
            found = self._close()
            self._fenced = not self._fenced
            self._lists.clear()
            return found
        if self._fenced or not head:
            return None  # code repeats its lines by design; a blank line ends no list
        if not self._lists and self._pending is None and not _MAY_OPEN.match(head):
            return None  # prose, and no list open: the common line costs only this
        match = _ITEM.match(line)
        if match is None:
            indent = len(line) - len(line.lstrip(" \t"))
            pending = self._pending
            if pending is not None and indent > pending.key[0]:
                # A deeper line continues the item: a record of a YAML list, a wrapped line
                # of a reStructuredText bullet; the item is all of it.
                if len(pending.text) < MAX_ITEM_CHARS:
                    pending.text += " " + line.strip()
                pending.end = start + len(line)
                return None
            found = self._close()
            # Prose at a list's indentation or less ends it.
            for key in [k for k in self._lists if k[0] >= indent]:
                del self._lists[key]
            return found
        found = self._close()
        bullet, number, letter, enclosed = match.group(2, 3, 4, 5)
        ordinal = number or letter or enclosed
        kind = bullet or ("1" if (number or (enclosed or "").isdigit()) else "a")
        key = (len(match.group(1).expandtabs(4)), kind)
        lists = self._lists
        # Deeper lists end where a shallower item comes, and so does a list of another kind at
        # this indentation; an ordinal that starts again opens a new list.
        for other in [k for k in lists if k[0] > key[0] or (k[0] == key[0] and k != key)]:
            del lists[other]
        if key not in lists or (ordinal is not None and ordinal.lower() in ("1", "a")):
            lists[key] = _List()
        self._pending = _Item(start, start + len(line), key, line[match.end() :].strip())
        return found

    def _close(self) -> Cycle | None:
        """The pending item is complete: compare it with its list's earlier items."""
        pending, self._pending = self._pending, None
        if pending is None:
            return None
        state = self._lists.get(pending.key)
        item = _SPACE.sub(" ", pending.text.lower()).rstrip(" .,;:")
        if state is None or len(_LETTER.findall(item, 0, 64)) < 2:
            return None  # a choice's letter, a row of numbers or signs: no named thing
        index = state.items
        state.items += 1
        numbers = tuple(int(n[-9:]) for n in _NUMBER.findall(item))
        masked = _NUMBER.sub("0", item)
        last = state.seen.get(masked)
        period = index - last if last is not None else 0
        step: tuple[int, ...] | None = None
        if period and period <= len(state.recent):
            theirs, their_step = state.recent[-period]
            if numbers != theirs:
                # Numbers are content, unless they only count on, inside a cycle of several
                # items, by the step their source took ("At instruction 30 …", six items later
                # "At instruction 36 …", then 42): the item itself is the same again.
                if len(numbers) == len(theirs):
                    step = tuple(a - b for a, b in zip(numbers, theirs, strict=True))
                if period < 2 or step is None or step != their_step:
                    period = 0
        if period and period == state.period and state.run:
            state.run += 1
        elif period:
            state.run, state.period, state.run_start = 1, period, pending.start
        else:
            state.run = state.period = 0
        state.seen[masked] = index
        state.recent.append((numbers, step))
        if len(state.seen) > 2 * HISTORY_ITEMS:
            state.seen = {k: i for k, i in state.seen.items() if i > index - HISTORY_ITEMS}
        if state.run < RUN_ITEMS:
            return None
        return Cycle(state.run, state.period, state.run_start, pending.end - state.run_start)
