"""Public surface of the detector.

This module fixes the contract between the detector and the proxy. The implementation behind
:class:`Detector` may change freely; these names, fields and signatures may not without updating
the relay (``proxy/relay.py``), the metrics layer and the score CLI.

NOTE: the body of ``Detector`` below is a trivial stand-in (a run of identical words) until the
real signals land; its signature is the contract.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, slots=True)
class DetectorConfig:
    """Thresholds and switches. Every field is settable as ``GUARD_<FIELD_NAME_UPPER>``.

    The proxy builds this from the environment generically (``proxy/settings.py``), so adding a
    field here is all it takes to expose a new knob.
    """

    flood_run: int = 40


@dataclass(frozen=True, slots=True)
class Verdict:
    """Why and where a stream was judged degenerate.

    ``onset_char`` is the best estimate of where degeneration began (offset into the text fed so
    far), used to trim the tail of a non-streaming answer; ``fired_at_char`` is how much text had
    been fed when the verdict fired.
    """

    signal: str
    score: float
    fired_at_char: int
    fired_at_token: int
    onset_char: int


@dataclass(frozen=True, slots=True)
class Summary:
    """Per-choice worst-window values, recorded once when the choice ends.

    ``None`` means the signal had too little text (or no logprobs) to say anything.
    """

    chars: int
    tokens: int
    repetition_score: float | None
    lexical_diversity: float | None
    token_entropy: float | None
    verdict: Verdict | None


class Detector:
    """Incremental detector for one choice.

    ``feed`` returns a Verdict the first time the stream is judged degenerate and ``None``
    otherwise (also on every call after a verdict). ``tokens`` is the number of tokens the delta
    holds when the caller knows it (else 1 per call); ``logprobs`` is the OpenAI
    ``logprobs.content`` list of the delta when the upstream returned logprobs.
    ``expected_language`` is an ISO 639-1 code when the request carried a language constraint;
    ``structured`` marks JSON output (``response_format``), where repetition is expected.
    """

    def __init__(
        self,
        config: DetectorConfig | None = None,
        *,
        expected_language: str | None = None,
        structured: bool = False,
    ) -> None:
        self.config = config or DetectorConfig()
        self.expected_language = expected_language
        self.structured = structured
        self._chars = 0
        self._tokens = 0
        self._last_word: str | None = None
        self._run = 0
        self._run_start = 0
        self._verdict: Verdict | None = None

    @property
    def verdict(self) -> Verdict | None:
        return self._verdict

    def feed(
        self, delta: str, *, tokens: int | None = None, logprobs: list[Any] | None = None
    ) -> Verdict | None:
        start = self._chars
        self._chars += len(delta)
        self._tokens += 1 if tokens is None else tokens
        if self._verdict is not None:
            return None
        word = delta.strip()
        if word and word == self._last_word:
            self._run += 1
        else:
            self._last_word = word or self._last_word
            self._run = 1
            self._run_start = start
        if self._run >= self.config.flood_run:
            self._verdict = Verdict("token-flood", 1.0, self._chars, self._tokens, self._run_start)
            return self._verdict
        return None

    def finish(self) -> Summary:
        return Summary(self._chars, self._tokens, None, None, None, self._verdict)
