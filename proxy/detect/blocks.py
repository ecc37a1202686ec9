"""Block loops: text that keeps coming back to what it already said, in other words.

The exact and near-identical loop signals need copies that are the same but for a number or a
word. Real loops often change more: templated code whose index and expression grow with every
block (``sum_B_2 = [0] * N`` … ``sum_B_3[i] = B * B * B``), comment lines that restate the same
doubt in new words, reasoning that restarts ("Wait, let me think again") and walks the same
steps, a paragraph repeated with edits. What such text has in common is that it stops bringing
*new content*: the pieces it is made of were all written a few lines ago.

So the text is cut into units (lines, and sentences inside long lines), each unit is reduced to
*masked* tokens — case folded, every digit run ``0`` (numbers and the numeric suffixes of
identifiers), a run of one operator with its operands (``B * B * B``) or of one token collapsed
to one step — and to the set of its token shingles (pairs of adjacent tokens). A unit's
*novelty* is the share of its shingles not seen in the last :data:`HISTORY_UNITS` units. A loop
is a *sustained* run of units with little novelty (at most a quarter of the run's shingles new,
no unit in it mostly new but a slip every few units) that has gone round its source at least
``min_copies`` times: each unit's *lag* is how many units back its shingles were last seen (one
period of the loop), and a run of ``r`` units at median lag ``p`` covers ``(r + p) / p`` copies.
A healthy answer that restates a block once (a corrected version of a function, a summary, a
re-check of a step) makes two copies, not three; tables, enum arms and test cases bring a new
name, string or word on every line, and lines without words (rows of numbers) never count.

Restart markers ("Wait,", "Let me re-examine", "this is getting confusing") are counted in the
run: a reasoning that restarts and walks the same steps again makes no progress, so a run
holding :data:`RESTART_MARKERS` of them needs one copy less. So does a run whose period is a
long block (:data:`LONG_BLOCK_WORDS`) that brings next to no new word: a paragraph restated
with edits a third time (the repeated summary of a runaway answer) is a loop, not a list.

Incremental: :meth:`BlockLoop.update` takes the text of one check; each completed unit costs a
regular expression and a few set and dict operations, and memory is bounded by the history.
"""

from __future__ import annotations

import re
from collections import deque
from dataclasses import dataclass

#: Units whose shingles make the history a new unit is compared with.
HISTORY_UNITS = 32
#: A unit longer than this (characters) is cut: memory stays bounded on text with no breaks.
MAX_UNIT_CHARS = 2048
#: Tokens of a unit that count (a long unit is told by its first ones).
MAX_TOKENS = 40
#: A unit whose share of new shingles exceeds this is a new unit (it breaks the run, unless it
#: is a slip: at most one unit in :data:`SLIP_EVERY` of the run).
UNIT_MAX_NOVELTY = 0.5
SLIP_EVERY = 4
#: Words (two letters or more) one period of the loop must hold: a loop repeats content; a
#: block of labels and numbers is layout.
MIN_BLOCK_WORDS = 8
#: New words (types never seen in the history) per word of the run a loop may bring: a
#: templated list names a new thing in every item, a loop recycles its vocabulary.
MAX_NEW_WORDS = 0.03
#: Latest units of a run whose median lag is its period.
RECENT_LAGS = 8
#: Restart markers in a run that lower the copies it needs by one.
RESTART_MARKERS = 2
#: Words a period must hold, and the share of new words the run may bring at most, for the run
#: to need one copy less: a block of 40 words that comes back a third time with next to no
#: new word is not a list (lists name a new thing in every item), and healthy text restates a
#: block once (two copies).
LONG_BLOCK_WORDS = 40
LONG_BLOCK_MAX_NEW_WORDS = 0.01

# A unit ends at a line break, or after a sentence end followed by space.
_SPLIT = re.compile(r"\n|(?<=[.!?。！？])\s+")
_DIGITS = re.compile(r"\d+")
_TOKEN = re.compile(r"\w+")
# One operator character twice in the unit: only then can it hold a run of one operator.
_OPERATOR_TWICE = re.compile(r"([-+*/%^&|]).*?\1", re.DOTALL)
# Two operands joined twice by the same operator (``a * b * c``), a condition every run of one
# operator meets: the collapsing pattern below tries every word of the unit, so it runs only on
# the few units that pass this (hyphens in prose pass the check above, not this one).
_OPERATOR_CHAIN = re.compile(r"\w\s*([-+*/%^&|]{1,2})\s*\w+\s*\1\s*\w")
# One operand and operator repeated (``b * b * b``): keep one step and the last operand.
_OPERATOR_RUN = re.compile(r"(\b(\w+)\s*([-+*/%^&|]{1,2})\s*)(?:\2\s*\3\s*)+(?=\2\b)")
_RESTART = re.compile(
    r"\b(?:wait\b|hmm+\b|let me (?:think (?:again|about this again)|re-?(?:check|examine|"
    r"evaluate|consider|calculate|compute|think|do|read|visit)|start (?:over|again)|try again|"
    r"go back)|let's (?:re-?(?:check|examine|think|consider)|start over|try again|go back)|"
    r"i (?:think i )?made a mistake|(?:this|that) is getting (?:confusing|complicated)|"
    r"on second thought|start over|going in circles)",
    re.IGNORECASE,
)


@dataclass(frozen=True, slots=True)
class BlockRun:
    """A run of units with little new content: copies of its source, share of new shingles,
    where the repeating begins (the second copy: the first is content), characters covered
    from the first copy on, restart markers in it."""

    copies: float
    novelty: float
    onset: int
    span: int
    restarts: int
    #: Share of the run's words never seen in the history before it.
    new_words: float
    #: Whether the copies are the same once masked (no new shingle, no new word): an exact
    #: loop, or a counter loop, which the repetition signal names.
    identical: bool
    #: Copies this run needed (one less than the setting for a long block or restarts) and its
    #: period in units: what ``coherence-guard explain`` shows beside the copies.
    needed: float = 0.0
    period: int = 0
    #: Where the first copy, the run's source, began.
    source: int = 0

    def evidence(self) -> dict[str, float]:
        """The run's measures by name, as ``coherence-guard explain`` reports them."""
        return {
            "copies": self.copies,
            "copies_needed": self.needed,
            "period_units": float(self.period),
            "new_shingle_share": self.novelty,
            "new_word_share": self.new_words,
            "restart_markers": float(self.restarts),
            "span_chars": float(self.span),
        }


def masked_tokens(unit: str) -> list[str]:
    """The unit's first tokens, case folded, digit runs masked, and a run of one operand and
    operator collapsed (``b * b * b * b`` -> ``b * b``): a growing expression is the same step
    written more times."""
    text = _DIGITS.sub("0", unit[: 4 * MAX_TOKENS].lower())
    if _OPERATOR_TWICE.search(text) and _OPERATOR_CHAIN.search(text):
        text = _OPERATOR_RUN.sub(r"\1", text)
    return _TOKEN.findall(text)[:MAX_TOKENS]


def shingles(tokens: list[str]) -> set[int]:
    """Hashes of the runs of three adjacent tokens, the unit's edges included."""
    padded = ["^", *tokens, "$"]
    return set(map(hash, zip(padded, padded[1:], padded[2:], strict=False)))


def statement_lines(region: str) -> bool:
    """Whether a third of the region's non-blank lines end as statements and declarations do
    (``;``, a brace, a bracket, a parenthesis or a comma): SQL, CSS and C declarations that
    hold few symbols inside their lines, where a template repeats by design."""
    lines = [ln.rstrip() for ln in region.split("\n") if ln.strip()]
    ends = sum(1 for ln in lines if ln[-1] in ";{}()[],")
    return len(lines) >= 4 and 3 * ends >= len(lines)


class BlockLoop:
    """Block-loop state of one stream (see the module docstring).

    ``update`` reports the run the latest unit belongs to once it holds ``min_copies`` copies
    with at most ``max_novelty`` of its shingles new; the caller applies stricter limits where
    repetition is expected (code, tables, JSON)."""

    def __init__(self, min_copies: float = 4.0, max_novelty: float = 0.25) -> None:
        self.min_copies = min_copies
        self.max_novelty = max_novelty
        self._partial = ""
        self._partial_start = 0
        self._index = 0
        # shingle hash or word -> index of the last unit that held it, for the recent units
        # and the generation before them
        self._recent: dict[int | str, int] = {}
        self._older: dict[int | str, int] = {}
        # start offsets of the recent units
        self._starts: deque[int] = deque(maxlen=HISTORY_UNITS + 1)
        # the current run: its recent units' (lag, words), and totals over all of it
        self._run: deque[tuple[int, int]] = deque(maxlen=HISTORY_UNITS)
        self._run_units = self._run_new = self._run_total = self._slips = self._restarts = 0
        self._run_new_words = self._run_words = 0
        self._run_start = 0
        self._period = 1

    def update(self, new: str, *, end: int, final: bool = False) -> BlockRun | None:
        """Take the text of one check (``end``: stream length after it); return the loop the
        latest units make, if any."""
        if not self._partial:
            self._partial_start = end - len(new)
        text = self._partial + new
        base = self._partial_start
        found: BlockRun | None = None
        begin = 0
        # The carried partial unit holds no break: only the new text is searched (a space
        # that follows a sentence end still sees it).
        for match in _SPLIT.finditer(text, len(self._partial)):
            found = self._add(text[begin : match.start()], base + begin) or found
            begin = match.end()
        if final or len(text) - begin > MAX_UNIT_CHARS:
            found = self._add(text[begin:], base + begin) or found
            begin = len(text)
        self._partial = text[begin:]
        self._partial_start = base + begin
        return found

    def _add(self, piece: str, start: int) -> BlockRun | None:
        if len(piece) < 4:
            return None  # too short to hold content (a brace, a bullet, a list number)
        tokens = masked_tokens(piece)
        words = set(tokens)
        words.discard("0")  # numbers are masked to 0
        if not words:
            return None  # a row of numbers and signs: neither content nor a break
        grams = shingles(tokens)
        index = self._index
        self._index += 1
        # The history is two generations of HISTORY_UNITS / 2 units each: memory stays bounded
        # without evicting entries one by one. Set differences against the dictionaries run in
        # C; where each known shingle was last seen is only looked up for a unit that continues
        # a run (most units of healthy text are new and end here).
        recent, older = self._recent, self._older
        total = len(grams)
        fresh = len(grams.difference(recent).difference(older))
        continues = fresh <= UNIT_MAX_NOVELTY * total or (
            self._run_units > 0 and (self._slips + 1) * SLIP_EVERY <= self._run_units + 1
        )
        known: list[int] = []
        if continues and fresh < total:
            known = [i for i in map(recent.get, grams) if i is not None]
            known += [i for g in grams if g not in recent and (i := older.get(g)) is not None]
        # The vocabulary shares the dictionaries: words are strings, shingles integers.
        new_words = len(words.difference(recent).difference(older))
        recent.update(dict.fromkeys(grams, index))
        recent.update(dict.fromkeys(words, index))
        if index % (HISTORY_UNITS // 2) == 0:
            self._older, self._recent = recent, {}
        self._starts.append(start)
        if not continues:
            self._reset()
            return None
        if fresh > UNIT_MAX_NOVELTY * total:
            self._slips += 1  # one new unit in a few: an edit inside the loop
        lag = index - sorted(known)[len(known) // 2] if known else 0
        if (
            self._run_units >= 2
            and lag > 0
            and not (self._period <= 3 * lag and lag <= 3 * self._period)
        ):
            self._reset()  # it comes back from elsewhere: another repeat begins here
        if not self._run_units:
            self._run_start = start
            self._period = lag or 1
        self._run_units += 1
        self._run_new += fresh
        self._run_total += total
        self._run_new_words += new_words
        self._run_words += len(words)
        self._restarts += _RESTART.search(piece) is not None  # only units in a run get here
        self._run.append((lag, len(words)))
        return self._judge(start + len(piece))

    def _reset(self) -> None:
        self._run.clear()
        self._run_units = self._run_new = self._run_total = 0
        self._run_new_words = self._run_words = self._slips = self._restarts = 0

    def _judge(self, end: int) -> BlockRun | None:
        novelty = self._run_new / self._run_total
        if novelty > self.max_novelty or self._run_new_words > MAX_NEW_WORDS * self._run_words:
            return None
        # The period is that of the latest units: a run that goes from a short repeat into a
        # long one has not gone round the long one yet.
        lags = sorted(u[0] for u in list(self._run)[-RECENT_LAGS:] if u[0] > 0)
        if not lags:
            return None
        period = self._period = max(1, lags[len(lags) // 2])
        copies = (self._run_units + period) / period
        block_words = sum(u[1] for u in list(self._run)[-period:])
        fewer = self._restarts >= RESTART_MARKERS or (
            block_words >= LONG_BLOCK_WORDS
            and self._run_new_words <= LONG_BLOCK_MAX_NEW_WORDS * self._run_words
        )
        need = self.min_copies - (1.0 if fewer else 0.0)
        if copies < need or block_words < MIN_BLOCK_WORDS:
            return None
        # The repeating begins with the run; its source, the first copy, one period before.
        first = len(self._starts) - self._run_units - period
        source = self._starts[first] if first >= 0 else self._run_start
        identical = self._run_new == 0 and self._run_new_words == 0
        words = self._run_new_words / max(1, self._run_words)
        return BlockRun(
            copies,
            novelty,
            self._run_start,
            end - source,
            self._restarts,
            words,
            identical,
            need,
            period,
            source,
        )
