"""Language drift: the stream's language moves away from the expected (or established) one.

Consecutive segments of the text are identified with fastText ``lid.176``
(``proxy.detect.language``) after code, URLs, numbers and markup are removed. Drift fires when a
segment is confidently in another language and foreign text, weighted by confidence, has grown to a
share of all the text identified so far; old text fades with a half-life, so a long healthy start
cannot hide a drift for ever, while a quoted English paragraph in a long page never reaches the
share.
"""

from __future__ import annotations

import re

from proxy.detect.script import scripts_of_language
from proxy.detect.types import DetectorConfig

# Languages close enough that fastText confuses them on short windows; a switch inside a group
# is not drift.
_CLOSE_LANGUAGES: tuple[frozenset[str], ...] = (
    frozenset({"es", "gl", "ca", "pt", "it", "an", "ast"}),
    frozenset({"no", "nb", "nn", "da", "sv"}),
    frozenset({"id", "ms", "jv", "su"}),
    frozenset({"hr", "sr", "bs", "sl", "sh"}),
    frozenset({"ru", "uk", "be", "bg", "mk"}),
    frozenset({"cs", "sk"}),
    frozenset({"zh", "wuu", "yue", "ja"}),
    frozenset({"hi", "mr", "ne", "sa"}),
    frozenset({"ar", "fa", "ur", "arz"}),
)
_GROUP = {code: group for group in _CLOSE_LANGUAGES for code in group}


_LATIN_LETTER = re.compile(r"[A-Za-z]")
_CODE_SYMBOLS = re.compile(r"[{}();=$<>\[\]]")


#: Without a request language: the longest opening (characters) that can still be a restated
#: prompt before the answer falls back to another language.
OPENING_MAX = 500
#: A stream of up to this many segments is short: the end judges it sentence by sentence where
#: the streaming identification left its ending open (:attr:`LanguageDrift.unseen`).
SHORT_SEGMENTS = 8


def fallback_languages(reference: str) -> frozenset[str]:
    """The languages a model drifts into from ``reference``: English, the language most of its
    training text is in, and Chinese for the models trained on much of it (the drift users
    report: Qwen #543, DeepSeek-V3 #1045). A text that moves *from* English into another
    language is a localised document, not drift, so nothing counts from English."""
    if reference == "en":
        return frozenset()
    return frozenset({"en"}) if reference in ("zh", "ja", "ko") else frozenset({"en", "zh"})


def code_like(text: str) -> bool:
    """Prose rarely has more than one brace, bracket, semicolon or sigil in 33 characters; a
    Markdown table (most of its lines rows of cells) is data too: team names and scores between
    bars identify as any language."""
    return len(_CODE_SYMBOLS.findall(text)) > 0.03 * len(text) or table_like(text)


def table_like(text: str) -> bool:
    """Most lines of ``text`` (two or more) are table rows: they start with a bar and hold
    another one."""
    if text.count("|") < 4:
        return False
    lines = [ln.strip() for ln in text.split("\n") if ln.strip()]
    rows = sum(1 for ln in lines if ln.startswith("|") and ln.count("|") >= 2)
    return rows >= 2 and 2 * rows >= len(lines)


# A line of source code, as opposed to a line of prose, verse, math or Markdown: a preprocessor
# directive, a comment opener, a decorator, a keyword that opens a statement or an assignment at
# its start; a brace, semicolon or backslash at its end, a ``)`` that opens a block or ends a
# statement or list item, or a number and a comma (a data row), before an optional comment; or an
# identifier_with_underscores or a hex literal anywhere. Verse ends its lines with commas after
# words, prose with ``(…)``, Markdown starts them with ``#`` and a space or ``*``: none is code.
_SOURCE_LINE = re.compile(
    r"^\s*(?:#[a-z]|//|/\*|@[A-Za-z]"
    r"|(?:def|class|return|import|from\s+\S+\s+import|public|private|static|const|let|var|func"
    r"|fn|struct|enum|typedef)\b"
    r"|[A-Za-z_][\w.]*(?:\[[^\]]*\])?\s*[-+*/|&]?=[^=])"
    r"|(?:[{};\\]|\)\s*[;:{,]|[\]}]\s*,|\d\s*,)\s*(?:(?://|#|/\*).*)?$"
    r"|\b[A-Za-z][A-Za-z0-9]*_[A-Za-z0-9_]*|\b0x[0-9A-Fa-f]+\b"
)


def source_like(text: str) -> bool:
    """Unfenced source code (a code completion, a header, a data table): among the distinct
    lines of the last (up to) 12 non-empty ones, at least 4, two thirds look like code. Such text
    repeats its structure by design (declarations, enumerations, tables) and is judged like
    fenced code. Distinct lines, because a loop of one line that happens to look like code (an
    equation, a row of ASCII art) is still a loop: repeated, it is one line."""
    lines = {ln.strip() for ln in [ln for ln in text.split("\n")[-13:] if ln.strip()][-12:]}
    if len(lines) < 4:
        return False
    code = sum(1 for ln in lines if _SOURCE_LINE.search(ln))
    return 3 * code >= 2 * len(lines)


_HAN = re.compile(r"[\u3400-\u4dbf\u4e00-\u9fff]")
_HANGUL = re.compile(r"[\uac00-\ud7af]")
#: Languages written in Han characters: Chinese in them is their own script.
_HAN_WRITTEN = frozenset({"zh", "ja", "wuu", "yue"})


def native_segment(segment: str, reference: str) -> bool:
    """Whether a segment of a stream in a non-Latin script cannot have drifted: it holds no
    Latin letter (English) and no Chinese. Korean writes an occasional Hanja word among its
    Hangul, so for Korean Chinese counts only where it outnumbers the Hangul (an answer gone on
    in Chinese), not as a word here and there."""
    if _LATIN_LETTER.search(segment):
        return False
    if reference in _HAN_WRITTEN or not _HAN.search(segment):
        return True
    return reference == "ko" and 2 * len(_HAN.findall(segment)) < len(_HANGUL.findall(segment))


def same_language(a: str, b: str) -> bool:
    return a == b or b in _GROUP.get(a, ())


def with_close_languages(codes: frozenset[str]) -> frozenset[str]:
    """``codes`` and the languages identification confuses them with (one set, built once per
    stream, so each segment costs one membership test)."""
    return frozenset(codes).union(*(_GROUP.get(code, ()) for code in codes))


class LanguageDrift:
    """Language-drift state of one stream."""

    def __init__(
        self,
        config: DetectorConfig,
        expected_language: str | None,
        accepted: frozenset[str] = frozenset(),
    ) -> None:
        self.config = config
        self.expected = expected_language
        #: Other languages an answer may be in (a weak expectation: the languages the prompt
        #: names), with their close languages (:func:`with_close_languages`).
        self.accepted = accepted
        self._buf: list[str] = []
        self._buf_chars = 0
        self._segments = 0
        self._non_latin = scripts_of_language(expected_language) not in ((), ("Latin",))
        self._seg_start = 0
        self._seg_fenced = False
        self._established: str | None = None
        self._total = 0.0
        self._seen = 0
        self._off = 0.0
        self._streak = 0
        self._onset = 0
        # Without an expected language: separate runs of foreign segments, and where the
        # first began (a document that switches once and stays is translated, not drifting).
        self._runs = 0
        self._in_foreign = False
        self._first_onset = 0
        # Whether any identified segment was in another language than the reference: without
        # that, the end-of-stream judgement has nothing to find and is skipped.
        self.doubt = False
        # Characters since the last segment identified in the reference language or an
        # accepted one (see :attr:`unseen`).
        self._unseen = 0
        # No expected language and the text established as English: no drift can fire any more
        # (nothing counts as drift *from* English, see ``fallback_languages``).
        self._settled = False

    @property
    def unseen(self) -> int:
        """Characters at the end of the text not identified as the reference language or an
        accepted one: what was sampled out, too short to identify, or not yet judged since the
        last segment identified so. Where no segment was foreign (:attr:`doubt`), only this
        part of a short answer can hold the foreign ending the sentence-by-sentence judgement
        at the end looks for (``Detector._judge_end``)."""
        return self._unseen + self._buf_chars

    @property
    def settled(self) -> bool:
        """No expected language and the text established as a language nothing drifts from:
        neither the streaming identification nor the end judgement has anything to find."""
        return self._settled

    def update(self, new: str, *, end: int, fences: int, final: bool) -> tuple[float, int] | None:
        """Take the text of one check (``end``: stream length after it; ``fences``: code fences
        seen so far). Return (confidence, onset) when drift is established."""
        from proxy.detect.language import classify, strip_noise

        if self._settled:
            # Nothing identification could find would be used: skip it (fastText is the
            # costliest step of a check).
            return None
        cfg = self.config
        if not self._buf:
            self._seg_start = end - len(new)
            self._seg_fenced = (fences - new.count("```")) % 2 == 1
        self._buf.append(new)
        self._buf_chars += len(new)
        if self._buf_chars < cfg.language_segment_chars and not final:
            return None
        segment = "".join(self._buf)[-4 * cfg.language_segment_chars :]
        self._segments += 1
        if (
            not final
            and end > cfg.language_dense_chars
            and self._segments % max(1, cfg.language_sample_every)
        ):
            self._unseen += self._buf_chars
            self._buf.clear()
            self._buf_chars = 0
            return None
        reference = self.expected or self._established
        if self._non_latin and reference and native_segment(segment, reference):
            # A stream in a non-Latin script drifts into Latin-script languages (English above
            # all) or into Chinese; drift between languages of one non-Latin script stays
            # within the close groups above. So a segment with neither is native: no need to
            # ask.
            self._unseen = 0
            self._buf.clear()
            self._buf_chars = 0
            fade = 0.5 ** (len(segment) / max(1, cfg.language_half_life_chars))
            self._total = self._total * fade + len(segment)
            self._off *= fade
            self._streak = 0
            return None
        clean = (
            ""  # source code: identifiers and keywords are not a language the answer drifts to
            if code_like(segment)
            else strip_noise("```" + segment if self._seg_fenced else segment)
        )
        short = len(clean) < cfg.language_min_chars
        if short and not final and self._buf_chars < 4 * cfg.language_segment_chars:
            return None  # mostly code or markup so far: keep collecting
        judged = self._buf_chars
        self._buf.clear()
        self._buf_chars = 0
        self._unseen += judged
        # The last words of a stream are all there will be: half the usual length must do.
        if len(clean) < (cfg.language_min_chars // 2 if final else cfg.language_min_chars):
            return None
        found = classify(clean)
        if found is None:
            return None
        code, confidence = found
        native = same_language(reference, code) if reference else False
        if native or code in self.accepted:
            self._unseen = 0
        elif reference is not None:
            self.doubt = True
        if reference is None:
            if confidence >= cfg.language_min_confidence:
                self._established = code
                self._settled = not fallback_languages(code)
                self._non_latin = scripts_of_language(code) != ("Latin",)
                self._total += len(clean)
                self._seen += len(clean)
            return None
        # Every identified segment counts towards the total; only confident foreign ones count
        # as drift, so unsure segments weigh on the side of the expected language. Old text
        # fades (half-life), so a long healthy start cannot hide a drift for ever.
        self._seen += len(clean)
        fade = 0.5 ** (len(clean) / max(1, cfg.language_half_life_chars))
        self._total = self._total * fade + len(clean)
        self._off *= fade
        if native or code in self.accepted:
            self._streak = 0
            if confidence >= cfg.language_min_confidence:
                self._in_foreign = False
            return None
        # Foreign text counts in proportion to the confidence (a mixed segment at a switch
        # point counts in part), but only a confident segment can fire.
        self._off += len(clean) * confidence
        if confidence < cfg.language_min_confidence:
            self._streak = 0
            return None
        if self._streak == 0:
            self._onset = self._seg_start
        if not self._in_foreign:
            self._in_foreign = True
            self._runs += 1
            if self._runs == 1:
                self._first_onset = self._seg_start
        self._streak += 1
        if self.expected is None:
            # No request language: the opening language is a guess and documents switch
            # language legitimately, so only the shape drift has counts (see
            # ``ending.final_drift``): a short opening, then one fallback language that never
            # gives way and holds two thirds of the text.
            if (
                self._runs == 1
                and self._first_onset <= OPENING_MAX
                and code in fallback_languages(reference)
                and self._off >= 2 * self._total / 3
                and self._seen >= 2 * cfg.language_min_identified_chars
            ):
                return (confidence, self._first_onset)
            return None
        if (
            self._streak >= cfg.language_sustain_segments
            and self._off >= cfg.language_min_share * self._total
            and self._seen >= cfg.language_min_identified_chars
        ):
            return (confidence, self._onset)
        return None
