"""Public surface of the detector.

This module fixes the contract between the detector and the proxy. The implementation behind
:class:`Detector` may change freely; these names, fields and signatures may not without updating
the relay (``proxy/core/guard.py``), the metrics layer and the score CLI.

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

    # How often (characters) the window is evaluated; signals never run per token.
    check_every_chars: int = 128
    # Rolling window (characters) for periodic loops; memory per stream is about twice this.
    window_chars: int = 8192

    # Repetition signal on/off: exact periodic tail of any period (raw and digit-normalised).
    repetition: bool = True
    # Copies of the unit an exact loop needs.
    repetition_min_repeats: float = 4.0
    # Characters an exact loop must cover (half of it at least; span x copies >= 4x this).
    repetition_min_span_chars: int = 180
    # Copies a counter loop (periodic once digit runs are normalised) needs.
    counter_min_repeats: float = 6.0
    # Characters a counter loop must cover (same rule as repetition_min_span_chars).
    counter_min_span_chars: int = 400
    # Inside code fences, Markdown tables and JSON: copies and compression limits times this.
    structured_relax: float = 2.0

    # Near-identical loop signal on/off (with repetition): lines or sentences that repeat with
    # small edits (proxy/detect/lines.py).
    line_loop: bool = True
    # Copies of a block of near-identical units (lines, sentences) a loop needs.
    line_loop_min_repeats: float = 4.0
    # Characters such a loop must cover.
    line_loop_min_span_chars: int = 240

    # Block-loop signal on/off (with repetition): units (lines, sentences) that keep recycling
    # what the last few dozen units said, in other words or with growing numbers and
    # expressions: templated code, circular commentary, restarted reasoning
    # (proxy/detect/blocks.py). Off by default: on real answers and real files it still cuts
    # finite lists whose items share a frame (docs/detector.md, "The block-loop signal").
    block_loop: bool = False
    # Copies of its source a run of units with little new content must make (one less when
    # the run holds restart markers such as "Wait, let me think again").
    block_loop_min_copies: float = 4.0
    # Share of the run's masked token pairs that may be new to the recent units.
    block_loop_max_novelty: float = 0.25
    # Characters the run and its source must cover.
    block_loop_min_span_chars: int = 300
    # Inside code, tables and JSON (which repeat their templates by design): the share of new
    # token shingles allowed (and no new word); the copies needed are a counter loop's there
    # (counter_min_repeats x structured_relax).
    block_loop_code_max_novelty: float = 0.05

    # Near-repetition signal on/off: repeated word-4-gram rate plus compression.
    ngram: bool = True
    # Recent words the n-gram and diversity signals look at.
    ngram_window_words: int = 240
    # Share of the window's 4-grams seen before in it at which near-repetition holds.
    ngram_max_repeat_rate: float = 0.7
    # zlib ratio of those words that must hold at the same time.
    ngram_min_compression: float = 3.5
    # Consecutive evaluations (every 2 checks) near-repetition must hold before firing.
    ngram_sustain_checks: int = 3

    # Low-diversity signal on/off: distinct-word ratio of the recent words (floods, babble).
    diversity: bool = True
    # Distinct words / words below which the window is a flood.
    diversity_min_ratio: float = 0.04
    # Words needed before diversity is judged.
    diversity_min_words: int = 120

    # Script-intrusion signal on/off: scripts foreign to the stream's established mix.
    script: bool = True
    # Letters that establish the stream's script mix (unless the expected language does).
    script_establish_letters: int = 200
    # Recent characters in which foreign letters are counted.
    script_window_chars: int = 512
    # Share of the window's letters foreign scripts must hold.
    script_max_share: float = 0.35
    # Foreign letters needed in the window.
    script_min_letters: int = 60
    # Consecutive checks the intrusion must hold before firing.
    script_sustain_checks: int = 2

    # Turn-leak signal on/off: the answer writes a turn marker of a chat template ("### Human:",
    # "<|im_start|>") at a line's start outside code, inventing the conversation's next turn
    # (proxy/detect/turns.py). Not judged where the request itself holds a marker.
    turn_leak: bool = True

    # Language-drift signal on/off (fastText lid.176 on cleaned segments of the text).
    language_drift: bool = True
    # Characters per identified segment.
    language_segment_chars: int = 128
    # Cleaned characters a segment needs to be identified (half at the end of a stream).
    language_min_chars: int = 50
    # Confidence a segment in another language needs to count as drift.
    language_min_confidence: float = 0.9
    # Share of all identified text the off-language text must reach to fire.
    language_min_share: float = 0.5
    # Consecutive off-language segments needed to fire.
    language_sustain_segments: int = 1
    # Cleaned characters identified in all before drift can fire (one segment is too little).
    language_min_identified_chars: int = 200
    # Half-life (identified characters) with which the share forgets old text.
    language_half_life_chars: int = 2048
    # Characters at the start of a stream in which every segment is identified.
    language_dense_chars: int = 512
    # After that, only every n-th segment is identified (fastText is the costliest step).
    language_sample_every: int = 2

    # End-of-stream judgement on/off: drift, floods and loops in answers too short for the
    # streaming thresholds, judged once when the stream ends (proxy/detect/ending.py); the
    # drift part on non-streamed answers only (a streamed one has reached the client whole).
    end_judgement: bool = True
    # Characters at the end of the answer the end-of-stream drift judgement reads.
    end_drift_chars: int = 2048

    # Word-salad signal on/off: share of prose words missing from the expected language's
    # wordfreq list, and runs of real words without syntax (de, en, es, fr, it, nl, pl, pt, ru;
    # only when the expected language is known).
    salad: bool = True
    # Recent prose words (lower-case, 4+ letters, outside code) the salad share is taken over.
    salad_window_words: int = 60
    # Prose words the window needs before salad is judged while streaming.
    salad_min_words: int = 40
    # Share of the window's words unknown to the word list at which salad holds.
    salad_min_unknown_share: float = 0.3
    # Distinct unknown words the window needs (a repeated name is one unknown word).
    salad_min_distinct_unknown: int = 5
    # Characters per prose word above which a window is not prose (a list of names and user
    # ids): prose, salad or not, has one prose word every 8 to 15 characters.
    salad_max_chars_per_word: int = 30
    # Consecutive checks salad must hold before firing.
    salad_sustain_checks: int = 2
    # Prose words an answer needs for the end-of-stream salad judgement.
    salad_end_min_words: int = 10
    # Unknown share at which the end-of-stream judgement calls the last window salad.
    salad_end_min_unknown_share: float = 0.25
    # Distinct unknown words the end-of-stream judgement needs.
    salad_end_min_distinct_unknown: int = 3
    # Salad of real words (proxy/detect/word_runs.py): counted words (lower-case words and
    # function words) of one run without punctuation or line break that are judged together.
    salad_run_words: int = 40
    # Share of the language's 100 most frequent words in such a window at or below which it is
    # a heap of words, not sentences (running English holds 45 %).
    salad_run_max_function_share: float = 0.15
    # Counted words of the sentence the answer must have written before such a run (a normal
    # start: a run ended by punctuation with more function words than the bar).
    salad_run_min_sentence_words: int = 8

    # Gibberish signal on/off (proxy/detect/gibberish.py): long single-case letter runs with no
    # word boundary, and script changes inside words between unrelated scripts (script soup).
    gibberish: bool = True
    # Letters in one case without a break from which a stretch counts as a run with no word
    # boundary (languages written with spaces keep words shorter).
    gibberish_run_letters: int = 20
    # Recent checks (of check_every_chars each) the gibberish counts are taken over.
    gibberish_window_checks: int = 4
    # Visible (non-space) characters that window needs before it is judged.
    gibberish_min_chars: int = 200
    # Share of the window's visible characters in run tokens at which gibberish holds.
    gibberish_run_share: float = 0.5
    # Script changes inside words, between scripts that do not mix, at which soup holds.
    gibberish_min_switches: int = 6
    # Consecutive checks gibberish must hold before firing.
    gibberish_sustain_checks: int = 2
    # Replacement characters (U+FFFD: bytes that are not UTF-8) in that window, outside fenced
    # code, at which gibberish holds at once, however short the text.
    gibberish_min_replacements: int = 3

    # Entropy-collapse signal on/off (needs top_logprobs from the upstream).
    entropy: bool = True
    # Tokens over which the mean entropy is taken.
    entropy_window_tokens: int = 256
    # Mean entropy (nats) at or below which the model counts as collapsed.
    entropy_max_nats: float = 0.05
    # zlib ratio of the recent text needed at the same time (low entropy alone is normal).
    entropy_min_compression: float = 3.0

    # Compression signal on/off: zlib ratio of the recent text as a stand-alone cross-check.
    compression: bool = True
    # Recent characters compressed (every 8 checks).
    compression_window_chars: int = 1536
    # zlib ratio at or above which the window fires.
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
    "salad",
    "gibberish",
    "block-loop",
    "turn-leak",
)


@dataclass(frozen=True, slots=True)
class Verdict:
    """Why and where a stream was judged degenerate.

    ``onset_char`` is the best estimate of where degeneration began (offset into the text fed so
    far), used to trim the tail of a non-streaming answer; ``fired_at_char`` is how much text had
    been fed when the verdict fired. ``channel`` is the text it fired on (``content``: the
    answer; ``reasoning``: the thinking; ``tool``: tool-call arguments; see
    :mod:`proxy.core.channels`); a detector's own verdicts are ``content`` until the relay places
    them.
    """

    signal: str
    score: float
    fired_at_char: int
    fired_at_token: int
    onset_char: int
    channel: str = "content"
    #: For a language-drift verdict: the language the answer was judged against and where
    #: that expectation came from (``request``, ``prompt``, ``config`` or ``none``).
    expected_language: str | None = None
    language_source: str | None = None


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
