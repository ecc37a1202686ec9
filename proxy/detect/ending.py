"""End-of-stream judgement: what the streaming thresholds cannot see in a short answer.

The streaming signals need their evidence to hold over a span (hysteresis), which is right while
text is still arriving — more may come that explains it — but leaves short answers unjudged: an
answer that restates the question in Italian for 120 characters, goes on in English for 250 and
ends never gives the drift signal enough identified text, and a flood in the last 80 characters
never reaches the span a streaming loop needs. When the stream ends, nothing more can come, so
the whole (bounded) text can be judged at once:

* **drift at the end**: the answer is cut into sentence-sized units, each identified on its
  own (a fixed-size segment straddling the switch is a mixture that identifies as nothing).
  With an expected language, drift is foreign text that *ends* the answer (the model never came
  back) and holds a third of the identified text, or foreign text that holds half of it. Without
  one, a document may switch language for good (a page translated in part, an English heading
  over a localised page), so only the shape of a drifted answer counts: a short opening (the
  prompt restated), then, to the end, a language models fall back to, holding most of the text.
  Quoted phrases are left out of a sentence's identification: they are mentioned, not written
  in ("In German, the phrase «…» translates to …" is English).
* **flood at the end**: a unit of a few characters repeated to the very end.
* **loop at the end**: an exact periodic tail with fewer copies than a streaming loop needs but
  enough to be no accident (three whole copies of a long unit that the answer ends in).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from proxy.detect.drift import OPENING_MAX, code_like, fallback_languages, same_language
from proxy.detect.repetition import PeriodicTail, periodic_tail
from proxy.detect.script import scripts_of_language

# Sentence-sized units: up to a sentence end (Latin and CJK punctuation) or a line break.
_UNIT = re.compile(r"[^\n.!?。！？]*(?:[.!?。！？]+[\"”»」']*|\n+|$)")
_QUOTED = re.compile(
    r'"[^"]{1,160}"|“[^”]{1,160}”|„[^“”]{1,160}[“”]|«[^»]{1,160}»|「[^」]{1,160}」'
)
# Letters of scripts written without spaces carry about a word each, not a letter's worth.
_WIDE = re.compile(r"[\u2e80-\u9fff\uac00-\ud7af\uf900-\ufaff]")

#: Identified weight (characters, wide ones x3) a unit needs before it is identified.
UNIT_MIN = 24
#: Confidence a unit needs to count as a language at all.
UNIT_CONFIDENCE = 0.7
#: Identified weight the foreign text must reach.
FOREIGN_MIN = 100
#: Consecutive foreign units, or the weight of one, that end an answer and make it drift
#: whatever their share of it.
TAIL_UNITS = 2
TAIL_WEIGHT = 150
#: Characters up to which an answer is short for that rule (eight streaming segments).
SHORT_ANSWER = 1024


@dataclass(frozen=True, slots=True)
class Unit:
    """One identified unit: where it starts in the judged text, its weight and language."""

    start: int
    weight: int
    code: str | None


def _weight(clean: str) -> int:
    return len(clean) + 2 * len(_WIDE.findall(clean))


def _code_unit(text: str, code_like: Callable[[str], bool]) -> bool:
    """Code, by the streaming signal's density rule, with at least three symbols (one bracket
    and a semicolon make a 35-character list item look like code: "1) a laptop;"), or a row of
    a table (two cells or more): names and numbers between bars are data, not sentences."""
    if text.count("|") >= 2 and text.strip().startswith("|"):
        return True
    return code_like(text) and sum(text.count(c) for c in "{}();=$<>[]") >= 3


#: Different words a unit of a spaced script needs to be prose: "Row 1: 1, 5, 8 … Column 1: …"
#: lines merged into one unit are labels and numbers, which identification reads as anything.
PROSE_WORDS = 4
_ALPHA_WORD = re.compile(r"[^\W\d_]{2,}")


def _prose_words(clean: str) -> bool:
    if _WIDE.search(clean):
        return True
    return len({w.lower() for w in _ALPHA_WORD.findall(clean)}) >= PROSE_WORDS


def words_in(unit: str) -> int:
    """Words of a unit: space-separated ones, and for scripts written without spaces one per
    two letters (a Chinese or Japanese word is one to three characters)."""
    return len(unit.split()) + len(_WIDE.findall(unit)) // 2


# A sentence of a script written without spaces that goes on in Latin-script words to its end:
# the point where it switches (a model that leaves Chinese or Japanese mid-sentence).
_TO_LATIN = re.compile(
    r"(?<=[\u3040-\u30ff\u3400-\u9fff\uac00-\ud7af])"
    r"(?=[ \t]*[A-Za-z][A-Za-z ,;:'’-]{39,}[.!?\"”]*\s*$)"
)


def _pieces(text: str) -> Iterator[tuple[int, str]]:
    """Sentence-sized pieces of ``text`` with their offsets; a CJK or Hangul sentence that
    switches to a run of Latin-script words to its end is two pieces (else the sentence is a
    mixture that identifies as neither language)."""
    for match in _UNIT.finditer(text):
        piece = match.group()
        if not piece:
            continue
        switch = _TO_LATIN.search(piece) if _WIDE.search(piece) else None
        if switch is None:
            yield match.start(), piece
        else:
            yield match.start(), piece[: switch.start()]
            yield match.start() + switch.start(), piece[switch.start() :]


def identified_units(text: str) -> list[Unit]:
    """Cut ``text`` into sentence-sized units (short ones merged forward) and identify each."""
    return list(_units(text))


def _units(text: str) -> Iterator[Unit]:
    """:func:`identified_units` one by one (a caller may stop after the first)."""
    from proxy.detect.language import classify, strip_noise

    start = 0
    pending = ""
    for piece_start, piece in _pieces(text):
        piece_end = piece_start + len(piece)
        if _code_unit(piece, code_like):
            # A line of code or a formula has no language, and it must not swallow the prose
            # around it (a run of formula lines would hold the sentences after it until it
            # grew too long and was dropped with them).
            continue
        if not pending:
            start = piece_start + len(piece) - len(piece.lstrip())
        pending += piece
        clean = "" if _code_unit(pending, code_like) else strip_noise(pending)
        weight = _weight(clean)
        if weight < UNIT_MIN and piece_end < len(text):
            if len(pending) > 600:
                pending = ""  # markup or code with no prose in it: skip it
            continue
        pending = ""
        if weight < UNIT_MIN // 2 or not _prose_words(clean):
            continue
        # A phrase in quotes is mentioned, not written in: "In German, the phrase «…»
        # translates to …" is an English sentence, whatever the quotation says.
        # Without the quotation too little may be left to be sure of: then the whole unit.
        found = None
        if _QUOTED.search(piece_text := text[start:piece_end]):
            unquoted = strip_noise(_QUOTED.sub(" ", piece_text))
            if _weight(unquoted) >= UNIT_MIN:
                found = classify(unquoted)
        if found is None or found[1] < UNIT_CONFIDENCE:
            found = classify(clean)
        code = found[0] if found and found[1] >= UNIT_CONFIDENCE else None
        yield Unit(start, weight, code)


def _native(reference: str, code: str, accepted: frozenset[str]) -> bool:
    return same_language(reference, code) or code in accepted


def final_drift(
    text: str, expected: str | None, *, offset: int = 0, accepted: frozenset[str] = frozenset()
) -> tuple[float, int] | None:
    """(foreign share, onset offset in ``text``) when the finished ``text`` has drifted;
    ``offset`` is how much of the stream came before ``text``; ``accepted``: other languages
    the answer may be in (:func:`~proxy.detect.drift.with_close_languages` of a weak
    expectation's)."""
    found = _units(text)
    units: list[Unit] = []
    if expected is None:
        # No request language: the opening is the best guess of what was asked. Only a
        # language with fallback languages can drift (not English): else the first unit
        # identified settles it, and the rest need not be.
        for unit in found:
            units.append(unit)
            if unit.code is not None:
                if not fallback_languages(unit.code):
                    return None
                break
    units.extend(found)
    known = [u for u in units if u.code is not None]
    if not known:
        return None
    reference = expected
    if reference is None:
        reference = known[0].code
    assert reference is not None
    total = sum(u.weight for u in units)
    foreign = [u for u in known if not _native(reference, u.code or "", accepted)]
    foreign_weight = sum(u.weight for u in foreign)
    if foreign_weight < FOREIGN_MIN or total == 0:
        return None
    share = foreign_weight / total
    # Runs of foreign units, separated by units in the reference language.
    runs: list[list[Unit]] = []
    previous_foreign = False
    for unit in known:
        is_foreign = not _native(reference, unit.code or "", accepted)
        if is_foreign and not previous_foreign:
            runs.append([])
        if is_foreign:
            runs[-1].append(unit)
        previous_foreign = is_foreign
    ends_foreign = previous_foreign
    if expected is None:
        # No request language: a document may switch language for good (a page translated in
        # part, an English heading over a localised page), so only the shape drift has counts:
        # a short opening (the prompt restated) and then, to the end, one of the languages
        # models fall back to, holding most of the text.
        if (
            len(runs) == 1
            and ends_foreign
            and offset + runs[0][0].start <= OPENING_MAX
            and all(u.code in fallback_languages(reference) for u in runs[0])
            and share >= 0.5
        ):
            return (share, runs[0][0].start)
        return None
    tail = runs[-1] if ends_foreign else []
    tail_weight = sum(u.weight for u in tail)
    # The answer ends in another language and never came back: drift when the foreign ending
    # is a third of the text. A short answer (a chat turn, a length-capped answer) that drifts
    # late has no room left to build that share, so there it is enough that the ending is more
    # than a quotation, a title or a closing phrase in another language (one short unit): two
    # units or more, or one long sentence — a model that went on in English writes on. A
    # longer text keeps the share rule (and the streaming judgement): a passage in another
    # language that ends it is as often a document's untranslated part.
    short = offset + len(text) <= SHORT_ANSWER
    # A tail in a script none of the accepted languages is written in (an English answer that
    # goes on in Chinese) is no untranslated part of a document, which is in English, in Latin
    # letters: the short answer's rule holds.
    script = tail and _other_script(tail, reference, accepted)
    if tail_weight >= FOREIGN_MIN and (
        tail_weight >= total / 3
        or ((short or script) and (len(tail) >= TAIL_UNITS or tail_weight >= TAIL_WEIGHT))
    ):
        return (share, tail[0].start)
    if share >= 0.5:
        return (share, runs[0][0].start)
    return None


def _other_script(tail: list[Unit], reference: str, accepted: frozenset[str]) -> bool:
    """Every unit of ``tail`` is in a language written in a script other than Latin that
    neither the reference language nor any accepted one is written in."""
    native = {"Latin"}.union(scripts_of_language(reference), *map(scripts_of_language, accepted))
    return all(not native & set(scripts_of_language(u.code)) for u in tail)


# Characters a table rule or a drawn line repeats: layout, not a flood.
_LAYOUT = frozenset(" \t\n-=_*#~|.:+")


def final_flood(text: str) -> PeriodicTail | None:
    """A short unit (up to 8 characters, not a layout rule) repeated at least 12 times over at
    least 40 characters at the very end."""
    tail = periodic_tail(text[-512:])
    if tail is None or tail.period > 8 or tail.repeats < 12 or tail.span < 40:
        return None
    unit = text[len(text) - tail.period :]
    # A rule of dashes or a run of blank lines is layout; line after line of nothing but
    # markup ("#", "---" a dozen times over) is not.
    if all(ch in _LAYOUT for ch in unit) and not ("\n" in unit and unit.strip()):
        return None
    return tail


def final_loop(text: str, min_span: int) -> PeriodicTail | None:
    """An exact periodic tail of at least three whole copies whose unit holds four words or
    more, covering ``min_span`` characters (wide ones x3): an answer that ends repeating
    itself."""
    tail = periodic_tail(text[-8192:])
    if tail is None or tail.repeats < 3:
        return None
    # Characters of scripts written without spaces weigh as in the drift units (x3).
    if _weight(text[len(text) - tail.span :]) < min_span:
        return None
    unit = text[len(text) - tail.period :]
    if words_in(unit) < 4:
        return None
    return tail
