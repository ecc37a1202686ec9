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

Text that keeps bringing new content is not a loop, however alike its units: a list whose items
share a sentence frame names a new herb, module or product in each ("Cut the fresh *thyme*
stems", "… the fresh *oregano* stems"), a table of deductions brings new cells and digits. So
the latest copy of a run (:data:`STALE_COPIES`, at least :data:`STALE_UNITS` units) must bring
nothing new: no word the run and its source have not held — new to the recent history, or
filling a slot of a frame the recent units share (a new combination of words seen before, the
"Lzma" of a note written for "Bzip2" before) — and no figure the run has not held, unless it
only counts on by the step its source took (an index, a growing expression: ``sum_B_3`` after
``sum_B_2``). A loop's copies recycle their words; a restart marker is no content, in whatever
words it restarts. The verdict's onset is where the repeating begins, the run's first unit: the
first copy, its source, is content.

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
#: Copies at the end of a run that must bring nothing new (no word, no number that does more
#: than count on) for the run to be a loop: a list that names a new thing in every item, or a
#: table of new figures in a shared sentence frame, moves on however alike its items are.
STALE_COPIES = 1
#: Units at least that must bring nothing new (one unit is too little to tell).
STALE_UNITS = 2
#: Words kept per run to tell what its copies bring (a loop's vocabulary saturates; a run that
#: goes on naming new things past this is no loop).
MAX_RUN_WORDS = 4096

# A unit ends at a line break, or after a sentence end followed by space.
_SPLIT = re.compile(r"\n|(?<=[.!?。！？])\s+")
_DIGITS = re.compile(r"\d+")
_TOKEN = re.compile(r"\w+")
_NUMBERS_MAX = 8
_FIGURE = re.compile(r"\d+(?:[.,]\d+)*")
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


class _Unit:
    """A recent unit: its masked tokens and words, the start of its text (where its numbers are
    read), and, worked out only for the units a run compares, its frame, its numbers and the
    step they took from its source's."""

    __slots__ = ("_frame", "_numbers", "head", "step", "tokens", "words")

    def __init__(self, tokens: list[str], words: set[str], head: str) -> None:
        self.tokens = tokens
        self.words = words
        self.head = head
        self.step: tuple[int, ...] | None = None
        self._frame: tuple[str, ...] | None = None
        self._numbers: tuple[int, ...] | None = None

    @property
    def frame(self) -> tuple[str, ...]:
        if self._frame is None:
            self._frame = _frame(self.tokens)
        return self._frame

    @property
    def numbers(self) -> tuple[int, ...]:
        if self._numbers is None:
            self._numbers = _numbers(self.head)
        return self._numbers


def _numbers(unit: str) -> tuple[int, ...]:
    """The unit's first numbers (as :func:`masked_tokens` reads it), each to nine digits; a
    figure written in parts ("1.5", "1,000") is one number."""
    found = _FIGURE.findall(unit, 0, 4 * MAX_TOKENS)[:_NUMBERS_MAX]
    return tuple(int(n.replace(".", "").replace(",", "")[-9:]) for n in found)


def _frame(tokens: list[str]) -> tuple[str, ...]:
    """The unit's frame: its masked tokens, a figure written in parts ("1.5", "1,000") one."""
    return tuple(t for i, t in enumerate(tokens) if t != "0" or i == 0 or tokens[i - 1] != "0")


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
        # the recent units' masked words, numbers and the step their numbers took from their
        # source (what a unit of a run brings is judged against them); the words the current
        # run and its source hold; whether each recent unit of the run brought something new
        self._units: deque[_Unit] = deque(maxlen=HISTORY_UNITS + 1)
        self._run_vocabulary: set[str] = set()
        self._run_keys: set[tuple[str, ...]] = set()
        self._run_fresh: deque[bool] = deque(maxlen=HISTORY_UNITS)

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
        novel = words.difference(recent).difference(older)
        new_words = len(novel)
        recent.update(dict.fromkeys(grams, index))
        recent.update(dict.fromkeys(words, index))
        if index % (HISTORY_UNITS // 2) == 0:
            self._older, self._recent = recent, {}
        self._starts.append(start)
        unit = _Unit(tokens, words, piece[: 4 * MAX_TOKENS])
        units = self._units
        if not continues:
            units.append(unit)
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
        vocabulary = self._run_vocabulary
        if not self._run_units:
            self._run_start = start
            self._period = lag or 1
            # The run's source: the units one period back, whose words the copies recycle.
            for i in range(max(0, len(units) - self._period), len(units)):
                vocabulary.update(units[i].words)
                vocabulary.update(map(str, units[i].numbers))
        source = units[-lag] if 0 < lag <= len(units) else None
        numbers = unit.numbers
        theirs_n = () if source is None else source.numbers
        if len(numbers) == len(theirs_n) and numbers != theirs_n:
            unit.step = tuple(a - b for a, b in zip(numbers, theirs_n, strict=True))
        units.append(unit)
        key = unit.frame
        figures = set(map(str, numbers))
        # New content: a word the run and its source have not held, that is new to the
        # history too or fills the slot of its source's frame (the herb of "Cut the fresh
        # thyme stems", a module named in the introduction); a figure the run has not held,
        # unless it counts on by the step its source took (a counter, an index, a growing
        # expression). A restart marker is no content, in whatever words it restarts.
        restart = _RESTART.search(piece) is not None  # only units in a run get here
        unseen = words - vocabulary
        if not unseen & novel:
            # A word seen before, or a new combination of words seen before, is content only
            # in the slots of a frame the recent units share (the same words around them): a
            # new item of a template, not a loop's copy in other words.
            unseen = set()
            if key not in self._run_keys:
                half = len(key) // 2
                for i in range(max(0, len(units) - 1 - 2 * self._period), len(units) - 1):
                    theirs = units[i].frame
                    if (
                        len(theirs) == len(key)
                        and theirs != key
                        and (sum(a == b for a, b in zip(key, theirs, strict=True)) > half)
                    ):
                        unseen = words
                        break
        step = unit.step
        brings = bool(unseen) or (
            not figures <= vocabulary and (step is None or source is None or step != source.step)
        )
        if len(self._run_keys) < MAX_RUN_WORDS:
            self._run_keys.add(key)
        self._run_fresh.append(brings and not restart)
        if len(vocabulary) < MAX_RUN_WORDS:
            vocabulary.update(words)
            vocabulary.update(figures)
        self._run_units += 1
        self._run_new += fresh
        self._run_total += total
        self._run_new_words += new_words
        self._run_words += len(words)
        self._restarts += restart
        self._run.append((lag, len(words)))
        return self._judge(start + len(piece))

    def _reset(self) -> None:
        if not self._run_units and not self._run_vocabulary:
            return  # no run: nothing to clear (most units of healthy text)
        self._run.clear()
        self._run_fresh.clear()
        self._run_vocabulary = set()
        self._run_keys = set()
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
        # The latest copies must bring nothing new: a template list names a new thing in
        # every item, however few new words that makes of the run.
        fresh = self._run_fresh
        stale = max(STALE_COPIES * period, STALE_UNITS)
        if any(fresh[i] for i in range(max(0, len(fresh) - stale), len(fresh))):
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
