"""Gibberish: text that is no longer words at all, in any language.

Two shapes of it, both seen when a small model's sampling is pushed far from its own choices
(heal's raised penalties on SmolLM2-135M; ``bench/data/gibberish.jsonl``):

* **Letter runs with no word boundary**: ``TheoLloydBhcatenadonathatwasonehundredyearsold``,
  ``KEDSCARMAXNASDFUCTIONALFIAAWHEREMPACK``. Every language written with spaces and letter case
  (Latin, Greek, Cyrillic, Armenian) keeps its words short: a stretch of twenty letters or more
  in one case is a compound or a technical term now and then, never most of a passage. Code
  identifiers are long too, but they change case at every word (``getElementById``) or carry
  digits, underscores or dots, which end a stretch; URLs, paths, hashes and base64 do the same.
  So the signal is the share of a window's visible characters that lie in such stretches.
  Scripts written without spaces (Chinese, Japanese, Thai, ...) have no case and are never
  counted.
* **Script soup**: Hebrew running into Arabic inside one word, Cyrillic into a Latin ligature,
  a technical symbol into a letterlike one, enclosed digits beside Greek. Real text changes
  script between words (a list of greetings in six alphabets), or inside a word only in a few
  known ways (Japanese and Korean mix Han, kana or Hangul with Latin; scientists write ``μm``
  and ``Δx``; mathematics puts Greek letters, operators, arrows, super- and subscripts against
  the letters of any script: ``对于任意ε>0``, ``CO₂的``, ``8πです``). Soup
  changes script *inside* words, between unrelated ones (Hebrew into Arabic, Cyrillic into a
  Latin ligature, a technical symbol into a letterlike one). The signal counts those changes,
  in the sense of Unicode's mixed-script detection (UTS #39), over a window.

A third shape is not language at all: **bytes that never became text**. A model that writes
byte tokens out of order (a broken emoji, half of a multi-byte character) leaves a sequence
that is not UTF-8, and the decoder (the engine's, or the proxy's) writes U+FFFD, the
replacement character, for it: ``🐈😻🐾🎁😊���ન️``. Engines hold back a character's first bytes
until it is whole, so a replacement character in an answer is a byte sequence that never
completed. Text means to write one rarely and alone (an answer about encodings); a few of them
are evidence at once, whatever the length of the text (fenced code is not counted).

Incremental and cheap: each check looks at its new text once, with C-implemented regular
expressions; an ASCII-only check (most English) costs one ``str.isascii`` for the soup and one
regular expression scan for the letter runs. A token split across checks is held back until
the whitespace after it arrives, so a run is measured whole.
"""

from __future__ import annotations

import re
from collections import deque

from proxy.detect.types import DetectorConfig

#: Judged text kept to place the onset (a few checks' worth).
_RECENT_CHARS = 1024
#: U+FFFD, what a decoder writes for bytes that are not UTF-8.
_REPLACEMENT = "\ufffd"

# ----------------------------------------------------------------------------- letter runs

# Letters of the cased alphabets (Latin with its extensions, Greek, Cyrillic, Armenian).
_CASED = "A-Za-z\u00c0-\u00d6\u00d8-\u00f6\u00f8-\u024f\u0370-\u03ff\u0400-\u052f\u0531-\u0587"
_CASED += "\u1e00-\u1eff\u1f00-\u1fff"
#: A whitespace-separated token (the unit a run is judged in).
_TOKEN = re.compile(r"\S+")
#: Tokens with these inside are not prose: URLs, paths, e-mail, identifiers, numbers, base64.
_NOT_PROSE = re.compile(r"[0-9_/\\@=+%&#<>{}\[\]|`$^~*]|://|\.\w")
#: Lower-case and upper-case letters of those alphabets (a stretch of one case).
_LOWER = "a-z\u00df-\u00f6\u00f8-\u00ff\u0101-\u017f\u03ac-\u03ce\u0430-\u045f"
#: A stretch of cased letters (the part of a mixed token that can be a run).
_CASED_RUN = re.compile("[" + _CASED + "]+")
_UPPER = "A-Z\u00c0-\u00d6\u00d8-\u00de\u0386-\u03ab\u0400-\u042f"

# ----------------------------------------------------------------------------- script soup

#: Scripts and symbol blocks, as (name, character class). Characters outside every group (ASCII
#: digits and punctuation, General Punctuation, Latin-1 symbols, currency, combining marks,
#: emoji and dingbats, box drawing and shapes, which trees and tables put against words; CJK
#: punctuation and the fullwidth forms of ASCII punctuation, which Chinese and Japanese put
#: against everything) are neutral: they neither change nor join a script.
_GROUPS: tuple[tuple[str, str], ...] = (
    ("latin", "A-Za-z\u00c0-\u00d6\u00d8-\u00f6\u00f8-\u024f\u1e00-\u1eff"),
    ("ipa", "\u0250-\u02af\u1d00-\u1dbf"),
    ("greek", "\u0370-\u03ff\u1f00-\u1fff"),
    ("cyrillic", "\u0400-\u052f"),
    ("armenian", "\u0531-\u058f"),
    ("hebrew", "\u05d0-\u05ea\u05f0-\u05f4"),
    ("arabic", "\u0620-\u064a\u066e-\u06d3\u06fa-\u06ff\u0750-\u077f\ufb50-\ufdff\ufe70-\ufefc"),
    ("syriac-thaana", "\u0710-\u074f\u0780-\u07b1"),
    ("indic", "\u0900-\u0dff"),
    ("thai-lao", "\u0e01-\u0e3a\u0e40-\u0e4e\u0e81-\u0edf"),
    ("georgian", "\u10a0-\u10ff"),
    ("hangul", "\u1100-\u11ff\u3130-\u318f\uac00-\ud7af\uffa0-\uffdc"),
    ("ethiopic", "\u1200-\u137f"),
    (
        "cjk",
        "\u2e80-\u2fdf\u3005-\u3007\u3040-\u30ff\u3100-\u312f\u3400-\u4dbf\u4e00-\u9fff"
        "\uf900-\ufaff\uff66-\uff9f",
    ),
    ("super-sub", "\u2070-\u209f"),
    ("letterlike", "\u2100-\u214f"),
    ("number-forms", "\u2150-\u218f"),
    ("arrows", "\u2190-\u21ff\u27f0-\u27ff\u2900-\u297f"),
    # Operators, and the technical block's floor and ceiling brackets (``⌊x⌋``).
    ("math", "\u2200-\u22ff\u2308-\u230b\u27c0-\u27ef\u2980-\u2aff\U0001d400-\U0001d7ff"),
    ("technical", "\u2300-\u2307\u230c-\u23ff"),
    ("enclosed", "\u2460-\u24ff\u3200-\u32ff"),
    ("presentation", "\ufb00-\ufb4f"),
    # Fullwidth letters and digits (their punctuation is neutral, above).
    ("fullwidth", "\uff10-\uff19\uff21-\uff3a\uff41-\uff5a"),
)
#: Changes of script inside a word that real text makes (UTS #39's allowed mixes for Japanese,
#: Chinese and Korean; Thai and CJK text that runs into an English word without a space; CJK
#: lists numbered with circled digits).
_ALLOWED: dict[str, frozenset[str]] = {
    "latin": frozenset({"cjk", "hangul", "thai-lao", "fullwidth", "ipa"}),
    "cjk": frozenset({"latin", "hangul", "fullwidth", "enclosed"}),
    "hangul": frozenset({"latin", "cjk", "fullwidth", "enclosed"}),
    "fullwidth": frozenset({"latin", "cjk", "hangul"}),
    "thai-lao": frozenset({"latin"}),
    "ipa": frozenset({"latin"}),
}
#: Formula characters: what mathematics, physics and chemistry write inline in *any* language
#: (``对于任意ε>0``, ``∀x(能阅读(x)→有文化(x))``, ``CO₂的``, ``25℃で``, ``第Ⅱ卷``, ``x∈집합``).
#: A formula is a context, not a change of script: these go with every script's letters and with
#: each other. Greek is among them because inline Greek letters are mathematical symbols (ε, δ,
#: π, μ), next to letters of any script.
_FORMULA = frozenset({"greek", "super-sub", "letterlike", "number-forms", "arrows", "math"})
#: Symbol blocks that are not letters of a script (soup between these and formula characters,
#: or a letter, still counts: an APL symbol into a script capital, a circled digit into Greek).
_SYMBOLS = frozenset({"technical", "enclosed", "presentation"}) | _FORMULA


def _allowed(a: str, b: str) -> bool:
    if a == b or b in _ALLOWED.get(a, ()) or a in _ALLOWED.get(b, ()):
        return True
    if a in _FORMULA and b in _FORMULA:
        return True
    # A formula character beside a letter of any script (not beside another symbol block).
    return (a in _FORMULA and b not in _SYMBOLS) or (b in _FORMULA and a not in _SYMBOLS)


def _switch_pattern() -> re.Pattern[str]:
    """One regular expression that matches each character directly followed by a character of
    a group it does not mix with (a script change inside a word)."""
    parts = []
    for name, cls in _GROUPS:
        foreign = "".join(c for other, c in _GROUPS if not _allowed(name, other))
        if foreign:
            parts.append(f"[{cls}](?=[{foreign}])")
    return re.compile("|".join(parts))


_SWITCH = _switch_pattern()


def script_changes(text: str) -> int:
    """Changes of script inside words of ``text`` that real text does not make (what the soup
    shape counts; for measurement and tests)."""
    return 0 if text.isascii() else len(_SWITCH.findall(text))


def blank_fences(text: str, fenced: bool, fill: str) -> tuple[str, bool]:
    """``text`` with fenced code (and its fences) replaced by ``fill``, character for character,
    so offsets stay; ``fenced`` says whether the text starts inside a fence, and the second
    value whether it ends inside one."""
    parts = text.split("```")
    keep = []
    for i, part in enumerate(parts):
        if i:
            fenced = not fenced
        keep.append(fill * len(part) if fenced else part)
    return (fill * 3).join(keep), fenced


class Gibberish:
    """Gibberish state of one stream: the last ``gibberish_window_checks`` checks' counts."""

    def __init__(self, config: DetectorConfig) -> None:
        self.config = config
        self.active = config.gibberish
        least = f"]{{{max(2, config.gibberish_run_letters)},}}"
        #: Candidate tokens: a stretch of cased letters at least this long somewhere in them.
        self._run_re = re.compile("[" + _CASED + least)
        self._lower = re.compile("[" + _LOWER + least)
        self._upper = re.compile("[" + _UPPER + least)
        self._carry = ""
        self._carry_at = 0
        self._fenced = False
        # per check: (visible characters, characters in run tokens, script switches, onset,
        # replacement characters)
        self._checks: deque[tuple[int, int, int, int, int]] = deque(
            maxlen=max(1, config.gibberish_window_checks)
        )
        self._streak = 0
        # The last judged text (for the onset: where the last sentence before it ended).
        self._recent = ""
        self._recent_end = 0

    def update(self, new: str, *, end: int, final: bool) -> tuple[str, float, int] | None:
        """Take the text of one check (``end``: characters fed so far); return (kind, score,
        onset) once gibberish holds."""
        buf = self._carry + new
        base = self._carry_at
        if final or buf[-1:].isspace():
            cut = len(buf)
        else:
            cut = max(buf.rfind(" "), buf.rfind("\n"), buf.rfind("\t")) + 1
            if cut == 0 and len(buf) > 4 * self.config.check_every_chars:
                cut = len(buf)  # no whitespace at all for a long while: judge it as it is
        text = buf[:cut]
        self._carry = buf[cut:]
        self._carry_at = base + cut
        if "```" in text or self._fenced:
            text = self._prose(text)
        visible = len(text) - text.count(" ") - text.count("\n") - text.count("\t")
        in_runs, first = self._runs(text, base)
        switches = replaced = 0
        if not text.isascii():
            found = _SWITCH.search(text)
            if found is not None:
                switches = len(_SWITCH.findall(text))
                first = min(first, base + found.start()) if first >= 0 else base + found.start()
            replaced = text.count(_REPLACEMENT)
            if replaced:
                at = base + text.find(_REPLACEMENT)
                first = min(first, at) if first >= 0 else at
        self._checks.append((visible, in_runs, switches, first, replaced))
        self._recent = (self._recent + buf[:cut])[-_RECENT_CHARS:]
        self._recent_end = base + cut
        return self._judge(end)

    def _prose(self, text: str) -> str:
        """``text`` without fenced code (following fences across checks)."""
        text, self._fenced = blank_fences(text, self._fenced, " ")
        return text

    def _runs(self, text: str, base: int) -> tuple[int, int]:
        """Characters of ``text`` in long single-case letter stretches of prose tokens, and
        where the first such token starts (-1: none)."""
        total = 0
        first = -1
        run_re = self._run_re
        if run_re.search(text) is None:
            return 0, -1
        for match in _TOKEN.finditer(text):
            token = match.group()
            if run_re.search(token) is None or _NOT_PROSE.search(token):
                continue
            longest = sum(len(m) for m in self._lower.findall(token))
            longest += sum(len(m) for m in self._upper.findall(token))
            if longest:
                # A token of a script written without spaces is a whole clause: only its
                # cased letters count (``使用internationalization的方法`` is one long word).
                total += len(token) if token.isascii() else sum(map(len, _CASED_RUN.findall(token)))
                if first < 0:
                    first = base + match.start()
        return total, first

    def _judge(self, end: int) -> tuple[str, float, int] | None:
        cfg = self.config
        checks = self._checks
        replaced = sum(c[4] for c in checks)
        if replaced >= cfg.gibberish_min_replacements:
            # Bytes that never became text: evidence at once, in a text of any length.
            onsets = [c[3] for c in checks if c[4]]
            return "bytes", float(replaced), self._sentence_start(onsets[0])
        visible = sum(c[0] for c in checks)
        if visible < cfg.gibberish_min_chars:
            self._streak = 0
            return None
        runs = sum(c[1] for c in checks)
        switches = sum(c[2] for c in checks)
        kind = ""
        score = 0.0
        if runs / visible >= cfg.gibberish_run_share:
            kind, score = "runs", runs / visible
        elif switches >= cfg.gibberish_min_switches:
            kind, score = "soup", float(switches)
        if not kind:
            self._streak = 0
            return None
        self._streak += 1
        if self._streak < cfg.gibberish_sustain_checks:
            return None
        onsets = [c[3] for c in checks if c[3] >= 0]
        return kind, score, self._sentence_start(min(onsets) if onsets else end)

    def _sentence_start(self, at: int) -> int:
        """Where the gibberish that shows at ``at`` began: after the last sentence that ended
        before it (the first long run or script change is rarely its first word)."""
        start = self._recent_end - len(self._recent)
        i = at - start
        if i <= 0:
            return at
        head = self._recent[:i]
        j = max(head.rfind(". "), head.rfind("! "), head.rfind("? "), head.rfind("\n"))
        return start + j + 1 if j >= 0 else at
