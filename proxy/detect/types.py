"""Public surface of the detector.

This module fixes the contract between the detector and the proxy. The implementation behind
:class:`Detector` may change freely; these names, fields and signatures may not without updating
the relay (``proxy/relay.py``), the metrics layer and the score CLI.

``Detector`` itself lives in :mod:`proxy.detect.detector` (its signature is the contract).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class DetectorConfig:
    """Thresholds and switches. Every field is settable as ``GUARD_<FIELD_NAME_UPPER>``.

    The proxy builds this from the environment generically (``proxy/settings.py``), so adding a
    field here is all it takes to expose a new knob. Lengths are in characters: tokenisers
    differ between models, characters do not.
    """

    # How often the window is evaluated; signals never run per token.
    check_every_chars: int = 128
    # Rolling window for periodicity (bounds memory per stream; a unit must fit 3 times).
    window_chars: int = 8192

    # 1. repetition: exact periodic tail of any period
    repetition: bool = True
    repetition_min_repeats: float = 4.0
    repetition_min_span_chars: int = 240
    # ... and the same after digit runs are normalised (counter loops): stronger evidence needed
    counter_min_repeats: float = 6.0
    counter_min_span_chars: int = 400
    # inside fenced code, Markdown tables and JSON output the two above are multiplied by this
    structured_relax: float = 2.0

    # 2. near-duplicate loops: repeated word-4-gram rate and compression of the recent words
    ngram: bool = True
    ngram_window_words: int = 240
    ngram_max_repeat_rate: float = 0.7
    ngram_min_compression: float = 3.5
    ngram_sustain_checks: int = 3

    # 3. lexical diversity (floods and babble): distinct-word ratio of the recent words
    diversity: bool = True
    diversity_min_ratio: float = 0.04
    diversity_min_words: int = 120

    # 4. script intrusion against the stream's established script mix
    script: bool = True
    script_establish_letters: int = 200
    script_window_chars: int = 512
    script_max_share: float = 0.35
    script_min_letters: int = 60
    script_sustain_checks: int = 2

    # 5. language drift (fastText lid.176 on cleaned, consecutive segments of the text): fires
    # when a segment is confidently in another language and such segments have become at least
    # language_min_share of all identified text (a quoted passage in a long page has not)
    language_drift: bool = True
    language_segment_chars: int = 128
    language_min_chars: int = 50
    language_min_confidence: float = 0.9
    language_min_share: float = 0.4
    language_sustain_segments: int = 1
    # the share forgets old text with this half-life (identified characters), so drift after a
    # long stretch in the right language is still caught within a couple of thousand characters
    language_half_life_chars: int = 2048
    # identification costs ~0.6 µs per character: past the first language_dense_chars of a
    # stream, only every language_sample_every-th segment is identified
    language_dense_chars: int = 512
    language_sample_every: int = 2

    # 6. entropy collapse (needs top_logprobs from the upstream)
    entropy: bool = True
    entropy_window_tokens: int = 256
    entropy_max_nats: float = 0.05
    entropy_min_compression: float = 3.0

    # 7. zlib compression ratio of the window as a stand-alone cross-check
    compression: bool = True
    compression_window_chars: int = 1536
    compression_max_ratio: float = 8.0


#: Every value :attr:`Verdict.signal` can take (a small fixed set, fit for a metric label).
SIGNALS: tuple[str, ...] = (
    "repetition",
    "token-flood",
    "near-repetition",
    "low-diversity",
    "compression",
    "script-intrusion",
    "language-drift",
    "entropy-collapse",
)


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


def __getattr__(name: str) -> object:
    """``Detector`` lives in :mod:`proxy.detect.detector`; re-exported here for the contract."""
    if name == "Detector":
        from proxy.detect.detector import Detector

        return Detector
    raise AttributeError(name)
