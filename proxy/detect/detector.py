"""The detector: composes the signals over a rolling window of one choice's text.

Deltas are only appended on the per-token path (amortised O(1)); every ``check_every_chars``
characters the window is evaluated once. Each evaluation is O(window) in C-implemented
primitives (``str.rfind``, slicing, ``set``, ``zlib``, fastText), so the per-character cost stays
well under a microsecond and memory per stream is bounded by the window, however long the
generation runs.

Every signal needs its evidence to hold over a span before it fires (hysteresis): a periodic tail
must repeat several times *and* cover a minimum number of characters, the n-gram, script and
language signals must hold over consecutive checks. Inside fenced code, Markdown tables and JSON
output repetition is expected, so the repetition thresholds are multiplied by
``structured_relax`` there.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Mapping
from typing import Any

from proxy.detect.blocks import BlockLoop
from proxy.detect.diversity import compression_ratio
from proxy.detect.drift import SHORT_SEGMENTS, LanguageDrift, with_close_languages
from proxy.detect.ending import FOREIGN_MIN, final_drift
from proxy.detect.entropy import EntropyWindow, token_entropy
from proxy.detect.gibberish import Gibberish
from proxy.detect.items import ListCycle
from proxy.detect.lines import LineLoop
from proxy.detect.loop_checks import LoopChecks
from proxy.detect.repetition import normalise_numbers, normalise_ordinals, open_line
from proxy.detect.salad import WordSalad
from proxy.detect.script import ScriptIntrusion, scripts_of_language
from proxy.detect.turns import TurnLeak
from proxy.detect.types import DetectorConfig, Summary, Verdict
from proxy.detect.word_runs import WordRuns

#: What each shape of gibberish counts (the evidence `coherence-guard explain` shows).
_GIBBERISH_EVIDENCE = {
    "runs": "unreadable_run_share",
    "soup": "switches",
    "bytes": "replacement_characters",
}


class Detector(LoopChecks):
    """Incremental detector for one choice.

    ``feed`` returns a Verdict the first time the stream is judged degenerate and ``None``
    otherwise (also on every call after a verdict). ``tokens`` is the number of tokens the delta
    holds when the caller knows it (else 1 per call); ``logprobs`` is the OpenAI
    ``logprobs.content`` list of the delta when the upstream returned logprobs.
    ``expected_language`` is an ISO 639-1 code when the request carried a language constraint;
    ``structured`` marks JSON output (``response_format``), where repetition is expected;
    ``language_source`` says where the expected language came from (reported with a
    language-drift verdict); ``accepted_languages`` are other languages a weak expectation
    accepts; ``quoted_turns`` says the request itself holds a chat template's turn marker
    (:func:`proxy.detect.turns.quotes_turns`), so an answer may write one too.
    """

    def __init__(
        self,
        config: DetectorConfig | None = None,
        *,
        expected_language: str | None = None,
        structured: bool = False,
        language_source: str | None = None,
        accepted_languages: frozenset[str] = frozenset(),
        quoted_turns: bool = False,
    ) -> None:
        self.config = config or DetectorConfig()
        # "pt-BR", "zh_Hans" -> "pt", "zh": fastText answers with the bare ISO 639-1 code.
        code = (expected_language or "").replace("_", "-").split("-")[0].strip().lower()
        self.expected_language = code or None
        #: Where the expectation came from, reported with a language-drift verdict.
        self.language_source = language_source
        #: Other languages the answer may be in: a weak expectation accepts the languages the
        #: prompt names ("Explain por and para in Spanish": English and Spanish).
        self.accepted_languages = with_close_languages(accepted_languages - {code})
        self.structured = structured
        cfg = self.config
        self._step = max(16, cfg.check_every_chars)
        self._keep = max(cfg.window_chars, cfg.compression_window_chars)
        self._chars = 0
        self._tokens = 0
        self._verdict: Verdict | None = None
        self._evidence: dict[str, float] = {}
        self._pending: list[str] = []
        self._pending_chars = 0
        # raw window: _raw holds text[_raw_base:_chars - _pending_chars]
        self._raw = ""
        self._raw_base = 0
        # digit-normalised window with anchors mapping normalised offsets back to raw ones
        self._norm = ""
        self._norm_base = 0
        self._norm_total = 0
        self._carry = ""
        self._line_start = True
        # the text of the latest check with its list ordinals "0" (a list's numbering says
        # nothing; every other number is content)
        self._ordinals = ""
        self._anchors: deque[tuple[int, int]] = deque()
        self._fences = 0
        self._ngram_streak = 0
        self._ngram_onset = 0
        self._json_like: bool | None = None
        self._relax_value: float | None = None
        self._countdown = False
        self._lines = LineLoop()
        self._items = ListCycle()
        self._blocks = BlockLoop(cfg.block_loop_min_copies, cfg.block_loop_max_novelty)
        # A weak expectation that accepts a language of another script ("How do you say thank
        # you in Hebrew?") lets the answer establish its own script, as with no expectation.
        own = set(scripts_of_language(self.expected_language))
        other = any(not own >= set(scripts_of_language(c)) for c in self.accepted_languages)
        self._script = ScriptIntrusion(cfg, None if other else self.expected_language)
        # the recent words and numbers (a row with new figures is no flood)
        self._words: deque[str] = deque(maxlen=max(20, cfg.ngram_window_words))
        self._checks = 0
        self._diversity_next = 0
        self._drift = LanguageDrift(cfg, self.expected_language, self.accepted_languages)
        self._end_drift = True
        # Words are checked against one language's list: only when no other is accepted.
        judged = None if accepted_languages - {code} else code or None
        self._salad = WordSalad(cfg, judged)
        self._runs = WordRuns(cfg, judged)
        self._gibberish = Gibberish(cfg)
        self._turns = TurnLeak() if cfg.turn_leak and not quoted_turns else None
        self._entropy = EntropyWindow(cfg.entropy_window_tokens)
        self._entropy_min: float | None = None
        self._repetition_max: float | None = None
        self._diversity_min: float | None = None

    @property
    def verdict(self) -> Verdict | None:
        return self._verdict

    @property
    def evidence(self) -> Mapping[str, float]:
        """Measures behind the verdict, for ``coherence-guard explain`` (set as it fires)."""
        return self._evidence

    @property
    def end_drift(self) -> bool:
        """Whether :meth:`finish` judges drift sentence by sentence at the end (the default).

        Set it to ``False`` before feeding when the text is delivered as it streams and no
        verdict at the finish is wanted: :meth:`finish` then leaves that judgement out.
        """
        return self._end_drift

    @end_drift.setter
    def end_drift(self, value: bool) -> None:
        self._end_drift = value

    def feed(
        self, delta: str, *, tokens: int | None = None, logprobs: list[Any] | None = None
    ) -> Verdict | None:
        self._chars += len(delta)
        self._tokens += 1 if tokens is None else tokens
        if self._verdict is not None:
            return None
        if logprobs and self.config.entropy:
            for entry in logprobs:
                value = token_entropy(entry)
                if value is not None:
                    self._entropy.add(value[0])
        if delta:
            self._pending.append(delta)
            self._pending_chars += len(delta)
            if self._pending_chars >= self._step:
                return self._check(final=False)
        return None

    def finish(self, *, end_drift: bool | None = None) -> Summary:
        """Evaluate what is left and return the per-choice summary.

        ``end_drift`` defaults to :attr:`end_drift`; ``False`` leaves out the
        sentence-by-sentence language judgement at the end
        (:func:`proxy.detect.ending.final_drift`), the costliest evaluation of a short stream
        (fastText on each sentence, more than all its streaming checks together): a caller
        whose text has already been delivered whole (a streamed answer) cannot act on its
        verdict. The other end-of-stream checks (the last window, floods, loops, salad) cost
        about one streaming check and still run, so their verdicts still reach the metrics.
        """
        if self._verdict is None and self._pending_chars:
            self._check(final=True)
        if self._verdict is None and self._chars and self.config.end_judgement:
            self._judge_end(self.end_drift if end_drift is None else end_drift)
        return Summary(
            self._chars,
            self._tokens,
            self._repetition_max,
            self._diversity_min,
            self._entropy_min,
            self._verdict,
        )

    def _judge_end(self, drift: bool) -> None:
        """The stream has ended: judge what the streaming thresholds left open (see
        :mod:`proxy.detect.ending`). Runs once per stream, on the kept window only."""
        cfg = self.config
        text = self._raw
        base = self._raw_base
        # Inside code, tables and JSON none of the repetition checks below counts. Whether the
        # text is such is asked only once one of them finds something (it costs more than all
        # three on ordinary text).
        if cfg.repetition:
            self._judge_end_repetition(text)
        if self._verdict is not None:
            return
        # The sentence-level pass looks for foreign text (FOREIGN_MIN at least) that ends the
        # answer. Where the streaming identification found a foreign segment it may be there;
        # where it found none, only in a short answer's ending that no segment identified.
        # Without an expected language, once the text is English only a short answer's
        # opening sentence can say otherwise (a restated prompt: final_drift's reference).
        short = self._chars <= SHORT_SEGMENTS * cfg.language_segment_chars
        if self._drift.settled:
            unsure = short
        else:
            unsure = self._drift.doubt or (short and self._drift.unseen >= FOREIGN_MIN)
        if drift and cfg.language_drift and not self._json_like and unsure:
            judged = base + max(0, len(text) - cfg.end_drift_chars)
            found = final_drift(
                text[-cfg.end_drift_chars :],
                self.expected_language,
                offset=judged,
                accepted=self.accepted_languages,
            )
            if found is not None:
                self._fire("language-drift", found[0], judged + found[1])
                return
        if self._salad.active and not self._json_like:
            salad = self._salad.judge_end()
            if salad is not None:
                self._fire("salad", *salad)

    # -- evaluation ------------------------------------------------------------------------

    def _fire(self, signal: str, score: float, onset: int) -> Verdict:
        onset = max(0, min(onset, self._chars))
        if signal == "language-drift":
            self._verdict = Verdict(
                signal, float(score), self._chars, self._tokens, onset,
                expected_language=self.expected_language, language_source=self.language_source,
            )  # fmt: skip
        else:
            self._verdict = Verdict(signal, float(score), self._chars, self._tokens, onset)
        return self._verdict

    def _append(self, final: bool) -> str:
        new = "".join(self._pending)
        self._pending.clear()
        self._pending_chars = 0
        self._fences += (self._raw[-2:] + new).count("```")
        if self._json_like is None:
            head = (self._raw + new).lstrip()[:1]
            if head:
                # Output that opens with a bracket is JSON even when the request did not say so.
                self._json_like = head in ("{", "[")
        self._raw += new
        if len(self._raw) > 2 * self._keep:
            cut = len(self._raw) - self._keep
            self._raw = self._raw[cut:]
            self._raw_base += cut
        # Normalise up to where a number or an ordinal may be split across checks ("\n1" now,
        # "2. " next).
        text = self._carry + new
        raw_start = self._chars - len(text)
        cut_at = len(text)
        if not final:
            cut_at = min(
                open_line(text, line_start=self._line_start), len(text.rstrip("0123456789"))
            )
        self._carry = text[cut_at:]
        self._ordinals = normalise_ordinals(text[:cut_at], line_start=self._line_start)
        piece = normalise_numbers(text[:cut_at])
        if piece:
            self._line_start = piece[-1] == "\n"
            self._anchors.append((self._norm_total, raw_start))
            self._norm += piece
            self._norm_total += len(piece)
            if len(self._norm) > 2 * self.config.window_chars:
                cut = len(self._norm) - self.config.window_chars
                self._norm = self._norm[cut:]
                self._norm_base += cut
                while len(self._anchors) > 1 and self._anchors[1][0] <= self._norm_base:
                    self._anchors.popleft()
        return new

    def _check(self, *, final: bool) -> Verdict | None:
        new = self._append(final)
        cfg = self.config
        if self._turns is not None:
            # Before any other signal: what follows a turn marker is not the answer, whatever
            # else it does (it often repeats the answer, or loops).
            onset = self._turns.feed(new, self._chars - len(new))
            if onset is not None:
                self._evidence = {"turn_marker_at": float(onset)}
                return self._fire("turn-leak", 1.0, onset)
        if len(new) > self._keep:
            # One giant delta (a whole answer at once): the signals only ever look at a window,
            # so the rest of it would cost time without changing a decision.
            new = new[-self._keep :]
        self._relax_value = None
        verdict = None
        if cfg.repetition:
            verdict = self._check_repetition()
        if verdict is None and cfg.repetition and cfg.line_loop:
            verdict = self._check_lines(new, final)
        if verdict is None and cfg.repetition and cfg.block_loop:
            verdict = self._check_blocks(new, final)
        # A countdown explains its own repetition (and ends by itself): the softer repetition
        # signals stay quiet while one is running.
        if (
            verdict is None
            and not self._countdown
            and (cfg.ngram or cfg.diversity or cfg.compression)
        ):
            verdict = self._check_diversity(new, final)
        if verdict is None and cfg.script:
            verdict = self._check_script(new)
        if verdict is None and cfg.language_drift:
            verdict = self._check_language(new, final)
        if verdict is None and self._salad.active and not (self.structured or self._json_like):
            verdict = self._check_salad(new, final)
        if verdict is None and cfg.gibberish and not (self.structured or self._json_like):
            verdict = self._check_gibberish(new, final)
        if verdict is None and cfg.entropy:
            verdict = self._check_entropy()
        return verdict

    def _check_script(self, new: str) -> Verdict | None:
        # Inside code, a table or JSON another script is data (a locale file's strings, a
        # transliteration table), not the answer's language: fenced code is not counted at
        # all, and other code and tables are asked about only once a verdict would fire.
        fences = new.count("```")
        if fences or self._fences % 2:
            inside = (self._fences - fences) % 2 == 1
            new = "".join(new.split("```")[1 if inside else 0 :: 2])
        found = self._script.update(new, end=self._chars)
        if found is None or self._structured_context():
            return None
        return self._fire("script-intrusion", *found)

    def _check_language(self, new: str, final: bool) -> Verdict | None:
        found = self._drift.update(new, end=self._chars, fences=self._fences, final=final)
        return None if found is None else self._fire("language-drift", *found)

    def _check_salad(self, new: str, final: bool) -> Verdict | None:
        found = self._salad.update(new, final=final)
        if found is None:
            # Salad of real words: a run without syntax, unless it is code or a table.
            run = self._runs.update(new, final=final)
            if run is None or self._relax() > 1.0:
                return None
            self._evidence = {"function_word_share": run[0]}
            return self._fire("salad", 1.0 - run[0], run[1])
        return self._fire("salad", *found)

    def _check_gibberish(self, new: str, final: bool) -> Verdict | None:
        found = self._gibberish.update(new, end=self._chars, final=final)
        if found is None:
            return None
        self._evidence = {_GIBBERISH_EVIDENCE[found[0]]: found[1]}
        return self._fire("gibberish", found[1], found[2])

    def _check_entropy(self) -> Verdict | None:
        cfg = self.config
        mean = self._entropy.mean
        if mean is None:
            return None
        if self._entropy.full and (self._entropy_min is None or mean < self._entropy_min):
            self._entropy_min = mean
        if self._entropy.full and mean <= cfg.entropy_max_nats:
            ratio = compression_ratio(self._raw[-cfg.compression_window_chars :])
            if ratio >= cfg.entropy_min_compression:
                onset = self._chars - cfg.compression_window_chars
                return self._fire("entropy-collapse", -math.log(max(mean, 1e-6)), onset)
        return None
