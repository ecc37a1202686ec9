"""Word salad of real words: a long run of words with no syntax in it.

Models that dissolve do not always invent words. They chain real ones, thesaurus-like, with no
punctuation and no sentence structure: "… based on your imagination's keenened current upshot
done today beyond ever momentary end goal noticed prior updated before tomorrow posed
unnaturally remaining alongside lesser worldly reality built …" (SmolLM2-135M under raised
penalties, ``bench/data/gibberish.jsonl``). Every word is in the dictionary, so the word-list
share of :mod:`proxy.detect.salad` stays low; what is gone is the grammar.

Grammar shows on the surface in two ways a reader notices at once:

* **function words** — a language's hundred most frequent words ("the", "of", "and", "which",
  "because"; "die", "und"; "в", "и"; with a few common verbs and nouns among them) are what
  turn content words into sentences. They make 45 % of the words of running English (the
  median 40-word window of the healthy answers of the real-answer set's tuning half); a stretch
  of forty words with a third of that or less (15 %) is a heap of words, not a sentence. The
  fifty most frequent are too few: "which", "their", "because" and "who" are not among them,
  and run-on sentences of a small model that keep their syntax fell under the bar;
* **punctuation and line breaks** — sentences end, clauses are set off, list items are cut by
  commas or lines. Forty words in a row without any of them are more than two ordinary
  sentences.

So the shape is a *run*: words with nothing between them but spaces (any punctuation, digit,
symbol, code, line break or hashtag ends it), and the signal fires when the last
``salad_run_words`` counted words of one run hold at most ``salad_run_max_function_share`` of
function words. Counted are the lower-case words and the function words in any case;
capitalised words are names, titles and product names ("Journal Planner Pens Colored Pens
Fine Point Markers") and neither count nor end a run. Four more conditions keep what is not
salad out:

* most of the other words are words the language commonly uses (one in a million or more):
  a stop-word list of another language in a source file is a run of words without syntax too;
* the run is no list in alphabetical order (an index, a keyword list of a syntax file);
* its words vary (half of them distinct at least): a run of one repeated word is a loop, the
  business of the repetition signals;
* the answer started normally: before the run it wrote a sentence (a run of
  ``salad_run_min_sentence_words`` counted words or more, ended by punctuation or a line
  break, with more function words than the bar). Salad is what an answer dissolves into; text
  that is a list of words from its first word on (a word list, keywords asked for) has shown
  no grammar to lose.

Incremental: each check's new text is cut at its breaks with one C-level split, and only the
run still open at the end of the text is kept for the next check (at most a window's words of
it once judged): a word cut between two checks is whole again when the next check's first
piece is added to it, and the last word of an open run is judged only once it has ended.
Judging a run costs a set lookup and a binary search per word, and only runs of a window's
length or more are judged: prose breaks every twenty words or so.
"""

from __future__ import annotations

import re
from itertools import pairwise

from proxy.detect.gibberish import blank_fences
from proxy.detect.salad import SALAD_LANGUAGES, Lexicon, lexicon
from proxy.detect.types import DetectorConfig

#: Letters of the word-list languages (Latin with its accents and combining marks, Cyrillic).
_LETTERS = "a-zA-Z\u00c0-\u00d6\u00d8-\u00f6\u00f8-\u024f\u0300-\u036f\u0400-\u04ff"
#: What ends a run: anything but those letters, spaces, tabs, apostrophes and hyphens
#: (punctuation, digits, symbols, line breaks, markup). Between two of these lies a run of
#: words. One negated class: the split is the cost of every check.
_BREAK = re.compile(f"[^{_LETTERS} \t'’-]")
_TOKEN = re.compile(r"\S+")
_FENCE = "```"


class WordRuns:
    """Runs of words without syntax in one stream (inactive unless the language has a word
    list: see :data:`proxy.detect.salad.SALAD_LANGUAGES`)."""

    def __init__(self, config: DetectorConfig, language: str | None) -> None:
        self.config = config
        self.active = config.salad and language in SALAD_LANGUAGES
        self._language = language or ""
        self._lexicon: Lexicon | None = None
        self._fenced = False
        # Characters taken so far, and whether the last text was the stream's end.
        self._fed = 0
        self._final = False
        # The run still open at the end of the judged text: its text and where it starts.
        self._open = ""
        self._open_at = 0
        # Whether the answer has written a sentence before the open run (a normal start).
        self._started = False
        # The fewest characters a window's words take (a letter and a space each).
        self._min_chars = 2 * config.salad_run_words - 1

    def update(self, new: str, *, final: bool) -> tuple[float, int] | None:
        """Take the text of one check; return (function-word share, onset) once a run of words
        without syntax holds."""
        if not self.active:
            return None
        if self._lexicon is None:
            self._lexicon = lexicon(self._language)
            if self._lexicon is None:  # pragma: no cover - wordfreq missing
                self.active = False
                return None
        base = self._fed
        self._fed += len(new)
        self._final = final
        text = new
        if self._fenced or _FENCE in text:
            # Fenced code is no prose: blanked with line breaks, which end every run.
            text, self._fenced = blank_fences(text, self._fenced, "\n")
        return self._runs(text, base)

    def _runs(self, text: str, base: int) -> tuple[float, int] | None:
        """Cut ``text`` at its breaks (one C-level split) and judge only the pieces that can
        hold a window: the first goes on from the open run, the last stays open. Prose breaks
        every twenty words or so, so most checks judge nothing."""
        pieces = _BREAK.split(text)
        if not self._open:
            self._open_at = base
        self._open += pieces[0]  # the open run goes on to the first break
        found = self._judge() if self._long() else None
        if len(pieces) == 1:
            return found
        self._close()
        middle = pieces[1:-1]
        started = self._started
        if middle and (not started or max(map(len, middle)) >= self._min_chars):
            at = base + len(pieces[0]) + 1
            for piece in middle:
                if found is None and len(piece) >= self._min_chars:
                    self._open, self._open_at = piece, at
                    found = self._judge() if self._long() else None
                elif not self._started:
                    self._open = piece
                self._close()
                at += len(piece) + 1
        self._open = pieces[-1]
        self._open_at = base + len(text) - len(self._open)
        if found is None and self._long():
            found = self._judge()
        return found

    def _long(self) -> bool:
        """Whether the open run holds enough words to hold a window."""
        run = self._open
        return run.count(" ") + run.count("\t") >= self.config.salad_run_words - 1

    def _close(self) -> None:
        """The open run ended. Until the answer has written a sentence, see whether this run
        was one: ``salad_run_min_sentence_words`` counted words or more, ended by punctuation
        or a line break, with more function words than the bar (syntax)."""
        if self._open and not self._started:
            assert self._lexicon is not None
            function = self._lexicon.function_words
            cfg = self.config
            counted = inside = 0
            for word in self._open.split():
                if word.casefold() in function:
                    inside += 1
                    counted += 1
                elif word.islower():
                    counted += 1
            self._started = (
                counted >= cfg.salad_run_min_sentence_words
                and inside > cfg.salad_run_max_function_share * counted
            )
        self._open = ""

    def _judge(self) -> tuple[float, int] | None:
        """The earliest window of ``salad_run_words`` counted words of the open run that is a
        heap of words, as (function-word share, onset)."""
        cfg = self.config
        lex = self._lexicon
        assert lex is not None
        function = lex.function_words
        size = cfg.salad_run_words
        # Counted words: (offset, is a function word, content word in lower case or "").
        counted: list[tuple[int, bool, str]] = []
        tokens = list(_TOKEN.finditer(self._open))
        if tokens and not self._final and not self._open[-1:].isspace():
            tokens.pop()  # the last word may go on in the next text: judged once it ends
        for token in tokens:
            word = token.group()
            folded = word.casefold()
            if folded in function:
                counted.append((token.start(), True, ""))
            elif word.islower() and "-" not in word:
                counted.append((token.start(), False, folded.replace("’", "'")))
        if len(counted) < size:
            return None
        if not self._started:
            self._trim(counted, size)  # no sentence yet: a list of words from the start
            return None
        most = int(cfg.salad_run_max_function_share * size)
        flags = [f for _, f, _ in counted]
        inside = sum(flags[:size])
        for start in range(len(counted) - size + 1):
            if start:
                inside += flags[start + size - 1] - flags[start - 1]
            if inside > most:
                continue
            content = [w for _, f, w in counted[start : start + size] if not f]
            if _heap(content, lex):
                return inside / size, self._open_at + counted[start][0]
        self._trim(counted, size)
        return None

    def _trim(self, counted: list[tuple[int, bool, str]], size: int) -> None:
        """Drop the words of the open run whose windows were all judged: the next window ends
        in a word still to come, so only the last ``size - 1`` counted words can be part of
        it."""
        drop = len(counted) - (size - 1)
        if drop <= 0:
            return
        at = counted[drop][0]
        self._open = self._open[at:]
        self._open_at += at


def _heap(content: list[str], lex: Lexicon) -> bool:
    """Whether a window's content words are a heap of the language's words: mostly common
    words, varied, and not a list in alphabetical order."""
    if not content:
        return False
    if 2 * len(set(content)) < len(content):
        return False  # one word over and over: a loop, not salad
    common = sum(1 for w in content if lex.is_common(w) or lex.is_common(w.split("'")[0]))
    if 2 * common <= len(content):
        return False  # not this language's words (a foreign stop-word list)
    ordered = sum(1 for a, b in pairwise(content) if a <= b)
    return 4 * ordered < 3 * (len(content) - 1)  # sorted: an index or a word list
