"""Unicode-script shares: foreign-script intrusion against the stream's established mix.

The mix is learnt from the stream itself (the first stretch of letters), so a Japanese answer
that mixes Han, Hiragana and Katakana is normal, and so are Latin terms inside CJK or Cyrillic
text. What fires is a script that was (almost) absent from the established mix taking a large
share of the recent window: Chinese characters inside an Italian answer, Hangul inside English.
"""

from __future__ import annotations

import functools
import re
from collections import Counter, deque

from proxy.detect.types import DetectorConfig

# Scripts that matter for LLM output, as regex classes. Han, Hiragana and Katakana are kept apart
# so the established mix can tell Japanese from Chinese.
_SCRIPTS: dict[str, str] = {
    "Latin": "A-Za-z\u00c0-\u024f\u0250-\u02af\u1e00-\u1eff",
    "Cyrillic": "\u0400-\u052f",
    "Greek": "\u0370-\u03ff",
    "Arabic": "\u0600-\u06ff\u0750-\u077f\ufb50-\ufdff\ufe70-\ufeff",
    "Hebrew": "\u0590-\u05ff",
    "Devanagari": "\u0900-\u097f",
    "Thai": "\u0e00-\u0e7f",
    "Hangul": "\u1100-\u11ff\u3130-\u318f\uac00-\ud7af",
    "Hiragana": "\u3040-\u309f",
    "Katakana": "\u30a0-\u30ff\u31f0-\u31ff",
    "Han": "\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff",
    "Other": (
        "\u0530-\u058f\u0980-\u0dff\u0f00-\u0fff\u1000-\u109f\u10a0-\u10ff\u1200-\u137f"
        "\u1780-\u17ff"
    ),
}
_RUN = re.compile("|".join(f"([{cls}]+)" for cls in _SCRIPTS.values()))
_NAMES = tuple(_SCRIPTS)
_NOT_ASCII_LETTER = re.compile(r"[^A-Za-z]+")


def script_counts(text: str) -> Counter[str]:
    """Letters per script in ``text`` (ASCII-only text takes a fast path)."""
    counts: Counter[str] = Counter()
    if text.isascii():
        latin = len(_NOT_ASCII_LETTER.sub("", text))
        if latin:
            counts["Latin"] = latin
        return counts
    for match in _RUN.finditer(text):
        index = match.lastindex
        if index is not None:
            counts[_NAMES[index - 1]] += match.end() - match.start()
    return counts


# Scripts that count as one writing system when judging intrusion: Japanese text mixes Han and
# kana, Korean text may carry Hanja.
_FAMILIES: dict[str, frozenset[str]] = {
    "Han": frozenset({"Han", "Hiragana", "Katakana", "Hangul"}),
    "Hiragana": frozenset({"Han", "Hiragana", "Katakana"}),
    "Katakana": frozenset({"Han", "Hiragana", "Katakana"}),
    "Hangul": frozenset({"Hangul", "Han"}),
}


@functools.cache
def foreign_pattern(native: frozenset[str]) -> re.Pattern[str]:
    """A pattern matching any letter of a script outside ``native`` (cached per mix), so a
    chunk with no foreign letter is recognised by one search instead of a count."""
    classes = "".join(cls for name, cls in _SCRIPTS.items() if name not in native)
    return re.compile(f"[{classes}]") if classes else re.compile(r"(?!x)x")


def native_scripts(established: Counter[str]) -> frozenset[str]:
    """Scripts that cannot intrude: Latin, and every script of a family that holds at least 2 %
    of the established letters."""
    total = sum(established.values())
    native = {"Latin"}
    for script, count in established.items():
        if count > 0.02 * total:
            native |= _FAMILIES.get(script, frozenset({script}))
    return frozenset(native)


def intruding_share(
    established: Counter[str], recent: Counter[str]
) -> tuple[str, float, int] | None:
    """Foreign letters in ``recent``: (the largest foreign script, the share of all foreign
    letters together, their number), or None when there are none.

    A script is foreign when it (with its family) held under 2 % of the established letters.
    Latin never counts as foreign: technical terms, names and code are written in Latin
    everywhere. Foreign scripts are summed, so gibberish that scatters a few letters of many
    scripts counts as much as one script taking over.
    """
    base_total = sum(established.values())
    recent_total = sum(recent.values())
    if base_total == 0 or recent_total == 0:
        return None
    native = native_scripts(established)
    foreign = {script: n for script, n in recent.items() if script not in native and n > 0}
    if not foreign:
        return None
    letters = sum(foreign.values())
    return (max(foreign, key=foreign.__getitem__), letters / recent_total, letters)


_CYRILLIC = (
    "ru", "uk", "be", "bg", "sr", "mk", "kk", "ky", "mn", "tg", "tt", "ba", "cv", "ce", "os",
    "av", "kv",
)  # fmt: skip
_OTHER = (
    "hy", "bn", "as", "pa", "gu", "or", "ta", "te", "kn", "ml", "si", "bo", "my", "ka", "am",
    "km",
)  # fmt: skip
_LANGUAGE_SCRIPTS: dict[str, tuple[str, ...]] = {
    "ja": ("Han", "Hiragana", "Katakana"),
    "zh": ("Han",),
    "ko": ("Hangul", "Han"),
    "el": ("Greek",),
    "th": ("Thai",),
    **dict.fromkeys(("ar", "fa", "ur", "ps", "sd", "ug", "ckb"), ("Arabic",)),
    **dict.fromkeys(("he", "yi"), ("Hebrew",)),
    **dict.fromkeys(("hi", "mr", "ne", "sa", "bh"), ("Devanagari",)),
    **dict.fromkeys(_CYRILLIC, ("Cyrillic",)),
    # The scripts of the "Other" class: Armenian, the Brahmic scripts of South and South-East
    # Asia, Tibetan, Georgian, Ethiopic.
    **dict.fromkeys(_OTHER, ("Other",)),
    # Written in more than one script (Latin is always native).
    "az": ("Latin", "Cyrillic", "Arabic"),
    "uz": ("Latin", "Cyrillic"),
    "ku": ("Latin", "Arabic"),
    "pa": ("Other", "Arabic"),
}


def scripts_of_language(code: str | None) -> tuple[str, ...]:
    """The scripts a language is written in (Latin for the many not listed); () for None.

    Lets the established mix start from the requested language, so a Japanese page whose first
    lines are English option names does not make its Japanese look like an intrusion.
    """
    if not code:
        return ()
    return _LANGUAGE_SCRIPTS.get(code, ("Latin",))


class ScriptIntrusion:
    """Script-intrusion state of one stream: the established mix and the recent window."""

    def __init__(self, config: DetectorConfig, expected_language: str | None) -> None:
        self.config = config
        self._base: Counter[str] = Counter(
            dict.fromkeys(scripts_of_language(expected_language), config.script_establish_letters)
        )
        self._base_total = sum(self._base.values())
        self._native = native_scripts(self._base)
        self._recent: deque[tuple[int, Counter[str]]] = deque()
        self._sum: Counter[str] = Counter()
        self._span = 0
        self._foreign = 0
        self._streak = 0
        self._onset = 0

    def update(self, new: str, *, end: int) -> tuple[float, int] | None:
        """Take the text of one check (``end``: stream length after it). Return (share,
        onset) when foreign scripts have held the window long enough."""
        cfg = self.config
        established = self._base_total >= cfg.script_establish_letters
        if (
            established
            and not self._foreign
            and (new.isascii() or not foreign_pattern(self._native).search(new))
        ):
            return None  # only native letters (Latin is always native): the common case
        counts = script_counts(new)
        if self._base_total < cfg.script_establish_letters:
            self._extend_base(counts)
            return None
        foreign_letters = self._foreign_letters(counts)
        if not foreign_letters and not self._foreign:
            # Latin is never foreign, so an all-Latin window cannot intrude (the common case):
            # skip the bookkeeping and let the letters extend the established mix.
            self._extend_base(counts)
            return None
        recent = self._sum
        self._recent.append((len(new), counts))
        self._foreign += foreign_letters
        recent.update(counts)
        span = self._span + len(new)
        while span - self._recent[0][0] >= cfg.script_window_chars:
            n, old = self._recent.popleft()
            span -= n
            recent.subtract(old)
            self._foreign -= self._foreign_letters(old)
        self._span = span
        if not self._foreign:
            self._recent.clear()
            self._sum = Counter()
            self._span = 0
            self._streak = 0
            return None
        intrusion = intruding_share(self._base, +recent)
        if (
            intrusion is not None
            and intrusion[1] >= cfg.script_max_share
            and intrusion[2] >= cfg.script_min_letters
        ):
            if self._streak == 0:
                self._onset = end - span
            self._streak += 1
            if self._streak >= cfg.script_sustain_checks:
                return (intrusion[1], self._onset)
            return None
        self._streak = 0
        # Letters that did not intrude extend the established mix (it follows the stream slowly).
        if intrusion is None or intrusion[1] < 0.05:
            self._extend_base(counts)
        return None

    def _extend_base(self, counts: Counter[str]) -> None:
        self._base.update(counts)
        self._base_total += sum(counts.values())
        self._native = native_scripts(self._base)

    def _foreign_letters(self, counts: Counter[str]) -> int:
        """Letters of scripts outside the established mix (the only ones that can intrude)."""
        native = self._native
        return sum(n for script, n in counts.items() if script not in native)
