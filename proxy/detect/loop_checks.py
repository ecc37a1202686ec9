"""The repetition family's checks of :class:`proxy.detect.Detector`: exact and counter loops,
near-identical lines, list cycles, repeated blocks, low diversity, repeated n-grams and
compression, while streaming and at the end of the answer.

A part of the detector of its own, so that the detector's module composes the signals and this
one holds the loop judgements, with what makes them relax inside code, tables and JSON (text
that keeps bringing new content is not a loop). The detector sets every attribute. Pure.
"""

from __future__ import annotations

import bisect
import re
from collections import deque
from typing import TYPE_CHECKING

from proxy.detect.blocks import BlockLoop, statement_lines
from proxy.detect.diversity import (
    compression_ratio,
    content_compression,
    distinct_line_share,
    distinct_ratio,
    tokens_of,
)
from proxy.detect.drift import code_like, source_like
from proxy.detect.ending import final_flood, final_loop
from proxy.detect.items import ListCycle
from proxy.detect.lines import LineLoop
from proxy.detect.repetition import (
    PeriodicTail,
    counts_down,
    counts_on,
    is_loop,
    loop_kind,
    periodic_tail,
    repeated_ngram_rate,
)
from proxy.detect.types import DetectorConfig, Verdict

_NUMBER = re.compile(r"\d+")


class LoopChecks:
    """The repetition checks of :class:`proxy.detect.Detector` (which sets every attribute)."""

    config: DetectorConfig
    structured: bool
    _chars: int
    _keep: int
    _raw: str
    _raw_base: int
    _norm: str
    _norm_total: int
    _anchors: deque[tuple[int, int]]
    _ordinals: str
    _fences: int
    _json_like: bool | None
    _relax_value: float | None
    _countdown: bool
    _evidence: dict[str, float]
    _repetition_max: float | None
    _diversity_min: float | None
    _diversity_next: int
    _checks: int
    _ngram_streak: int
    _ngram_onset: int
    _words: deque[str]
    _items: ListCycle
    _lines: LineLoop
    _blocks: BlockLoop

    if TYPE_CHECKING:

        def _fire(self, signal: str, score: float, onset: int) -> Verdict: ...

    def _judge_end_repetition(self, text: str) -> None:
        """Floods and loops the answer ends in (see :mod:`proxy.detect.ending`), unless the
        text is code, a table or JSON."""
        min_span = self.config.repetition_min_span_chars
        flood = final_flood(text)
        if flood is not None:
            if self._relax() <= 1.0:
                self._fire(loop_kind(flood, text), flood.repeats, self._chars - flood.repeated)
            return
        loop = final_loop(text, min_span)
        if loop is not None:
            if self._relax() <= 1.0:
                self._fire("repetition", loop.repeats, self._chars - loop.repeated)
            return
        # The same with numbers normalised: a counter loop cut short by the token limit, one
        # copy more than an exact one (a copy under a new number is less sure a copy).
        norm = self._norm
        counter = final_loop(norm, min_span)
        if counter is not None and counter.repeats >= 4 and self._relax() <= 1.0:
            first = self._norm_to_raw(self._norm_total - counter.span)
            slots = norm[len(norm) - counter.period :].count("0")
            region = self._raw[max(0, first - self._raw_base) :]
            if not counts_down(region, slots) and counts_on(region, slots):
                onset = self._norm_to_raw(self._norm_total - counter.repeated)
                self._fire("repetition", counter.repeats, onset)

    def _norm_to_raw(self, norm_abs: int) -> int:
        keys = [a[0] for a in self._anchors]
        i = bisect.bisect_right(keys, norm_abs) - 1
        if i < 0:
            return self._raw_base
        norm_at, raw_at = self._anchors[i]
        return raw_at + (norm_abs - norm_at)

    def _structured_context(self) -> bool:
        """Inside fenced code, unfenced source code, a Markdown table or JSON output repetition
        is expected."""
        if self.structured or self._json_like or self._fences % 2 == 1:
            return True
        tail = self._raw[-300:]
        lines = [ln for ln in tail.split("\n")[-4:] if ln.strip()]
        if len(lines) >= 2 and all(ln.lstrip().startswith("|") for ln in lines[-2:]):
            return True
        return self._fences == 0 and source_like(self._raw[-1200:])

    def _relax(self) -> float:
        """``structured_relax`` inside code, tables and JSON, else 1; computed once per check and
        only when a threshold is crossed (it is never needed on ordinary text)."""
        if self._relax_value is None:
            structured = self._structured_context()
            self._relax_value = self.config.structured_relax if structured else 1.0
        return self._relax_value

    def _check_repetition(self) -> Verdict | None:
        cfg = self.config
        window = self._raw[-cfg.window_chars :]
        exact = self._loop_in(window, cfg.repetition_min_repeats, cfg.repetition_min_span_chars)
        if exact is not None:
            onset = self._chars - exact.repeated  # the first copy is content
            return self._fire(loop_kind(exact, window), exact.repeats, onset)
        norm = self._norm[-cfg.window_chars :]
        counter = self._loop_in(norm, cfg.counter_min_repeats, cfg.counter_min_span_chars)
        if counter is not None:
            first = self._norm_to_raw(self._norm_total - counter.span)
            slots = norm[len(norm) - counter.period :].count("0")
            region = self._raw[max(0, first - self._raw_base) :]
            self._countdown = counts_down(region, slots)
            if not self._countdown and counts_on(region, slots):
                onset = self._norm_to_raw(self._norm_total - counter.repeated)
                return self._fire(loop_kind(counter, norm), counter.repeats, onset)
            return None
        self._countdown = False
        return None

    def _loop_in(self, text: str, need: float, span: int) -> PeriodicTail | None:
        """The periodic tail of ``text`` where it is a loop (``need`` copies over ``span``
        characters, more inside code, tables and JSON); every tail is noted for the summary."""
        tail = periodic_tail(text)
        if tail is None:
            return None
        self._note_repetition(tail)
        if is_loop(tail, text, need, span) and is_loop(tail, text, need * self._relax(), span):
            return tail
        return None

    def _check_lines(self, new: str, final: bool) -> Verdict | None:
        cycle = self._items.update(new, end=self._chars, final=final)
        if cycle is not None and not (self.structured or self._json_like):
            # A list that goes round its own items (under new numbers, as often as not).
            self._evidence = {
                "items_repeated": float(cycle.items),
                "period_items": float(cycle.period),
                "span_chars": float(cycle.span),
            }
            return self._fire("repetition", cycle.items, cycle.onset)
        found = self._lines.update(new, end=self._chars, final=final)
        if found is None:
            return None
        cfg = self.config
        copies, onset, span = found[0] / 100, found[1], found[2]
        if copies < cfg.line_loop_min_repeats or span < cfg.line_loop_min_span_chars:
            return None
        region = self._raw[max(0, found[5] - self._raw_base) :]
        if self._relax() > 1.0 or code_like(region):
            return None  # code, tables and JSON repeat lines by design (exact loops still count)
        slots = round(len(_NUMBER.findall(region)) / copies)
        if counts_down(region, slots):
            return None  # a countdown ends by itself (99 Bottles)
        # Copies identical but for their numbers are a loop like any exact one.
        return self._fire("near-repetition" if found[4] else "repetition", copies, onset)

    def _check_blocks(self, new: str, final: bool) -> Verdict | None:
        cfg = self.config
        run = self._blocks.update(new, end=self._chars, final=final)
        if run is None or run.span < cfg.block_loop_min_span_chars:
            return None
        start = max(0, run.source - self._raw_base)
        region = self._raw[start : start + run.span]
        if (self._relax() > 1.0 or code_like(region) or statement_lines(region)) and (
            run.copies < cfg.counter_min_repeats * cfg.structured_relax
            or run.novelty > cfg.block_loop_code_max_novelty
            or run.new_words > 0
        ):
            return None  # code and tables repeat their templates: only a copy with nothing new
        if counts_down(region, round(len(_NUMBER.findall(region)) / run.copies)):
            return None  # a countdown ends by itself (99 Bottles)
        signal = "repetition" if run.identical else "block-loop"
        self._evidence = run.evidence()
        return self._fire(signal, run.copies, run.onset)

    def _note_repetition(self, tail: PeriodicTail) -> None:
        if tail.span >= 64:
            score = tail.repeats
            if self._repetition_max is None or score > self._repetition_max:
                self._repetition_max = score

    def _check_diversity(self, new: str, final: bool) -> Verdict | None:
        cfg = self.config
        # The new text, its list ordinals "0": a list's numbering says nothing.
        self._words.extend(tokens_of(self._ordinals[-self._keep :]))
        self._checks += 1
        if self._checks % 2 and not final:
            return None  # every other check is enough for signals that need a sustained span
        if cfg.compression and self._checks % 8 == 0:
            window = self._raw[-cfg.compression_window_chars :]
            ratio_c = content_compression(window)
            limit = cfg.compression_max_ratio
            # Lines that are mostly new are rows, each with its own cells or figures.
            share = distinct_line_share(window) if ratio_c >= limit else None
            if ratio_c >= limit and ratio_c >= limit * self._relax() and (share or 0) <= 0.5:
                onset = self._chars - cfg.compression_window_chars
                return self._fire("compression", ratio_c, onset)
        if self._checks < self._diversity_next and not final:
            return None
        words = list(self._words)
        ratio = distinct_ratio(words)
        if ratio is None or len(words) < min(cfg.diversity_min_words, self._words.maxlen or 0):
            return None
        if ratio > 0.75:
            # One check brings about 20 new words: a window this varied cannot fall under the
            # thresholds (ratio 0.5) within four checks, so the next evaluations can wait.
            self._diversity_next = self._checks + 4
        if self._diversity_min is None or ratio < self._diversity_min:
            self._diversity_min = ratio
        recent_chars = sum(map(len, words)) + len(words)
        floor = cfg.diversity_min_ratio
        if cfg.diversity and ratio < floor and ratio < floor / self._relax():
            return self._fire("low-diversity", 1.0 - ratio, self._chars - recent_chars)
        # The n-gram rate is only worth computing when the words are already repetitive.
        if cfg.ngram and ratio < 0.5:
            rate = repeated_ngram_rate(words)
            if rate >= cfg.ngram_max_repeat_rate:
                ratio_c = compression_ratio(" ".join(words))
                limit = cfg.ngram_min_compression
                if ratio_c >= limit and ratio_c >= limit * self._relax():
                    if self._ngram_streak == 0:
                        self._ngram_onset = self._chars - recent_chars
                    self._ngram_streak += 1
                    if self._ngram_streak >= cfg.ngram_sustain_checks:
                        self._evidence = {"repeated_4gram_share": rate, "zlib_ratio": ratio_c}
                        return self._fire("near-repetition", rate, self._ngram_onset)
                    return None
        self._ngram_streak = 0
        return None
