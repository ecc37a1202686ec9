"""Lexical diversity and compressibility of the rolling window.

Floods and babble loops use few distinct words and compress far better than ordinary text. Both
measures are computed with C-implemented primitives (``set``, ``zlib``) over a bounded window,
so a check costs microseconds.
"""

from __future__ import annotations

import re
import zlib

# Words that carry a letter: numbers and punctuation say nothing about lexical diversity (a CSV
# of scores is not a flood), and floods of punctuation are the periodic-tail check's job.
_WORD = re.compile(r"[^\W\d_]\w*")


def words_of(text: str) -> list[str]:
    """Case-folded words that contain a letter."""
    return _WORD.findall(text.lower())


# Words as above, and numbers: a row that repeats the last one's words with new figures says
# something new, which the repeated n-gram rate must see.
_TOKEN = re.compile(
    r"[^\W\d_]\w*|\d+(?:\.\d+)*|(?<![-<>=!~^@?&|+*/%])[-<>=!~^@?&|+*/%]{1,3}(?![-<>=!~^@?&|+*/%])"
)


def tokens_of(text: str) -> list[str]:
    """Case-folded words (as :func:`words_of` finds them) and numbers ("3.4" one), in order."""
    return _TOKEN.findall(text.lower())


def distinct_ratio(words: list[str]) -> float | None:
    """Type-token ratio of ``words`` (distinct-1); ``None`` for fewer than 20 words."""
    if len(words) < 20:
        return None
    return len(set(words)) / len(words)


def mattr(words: list[str], span: int = 50) -> float | None:
    """Moving-average type-token ratio over non-overlapping blocks of ``span`` words.

    Averaging blocks makes the value independent of window length (a plain TTR falls as text
    grows); non-overlapping blocks keep it cheap.
    """
    blocks = [words[i : i + span] for i in range(0, len(words) - span + 1, span)]
    if not blocks:
        return None
    return sum(len(set(b)) for b in blocks) / (span * len(blocks))


def compression_ratio(text: str) -> float:
    """Raw size over zlib-compressed size of the UTF-8 text (Whisper's gzip check, cheaper).

    Whitespace runs are collapsed first: column alignment in tables and code is layout, not
    repetition of content.
    """
    data = " ".join(text.split()).encode("utf-8")
    if not data:
        return 1.0
    return len(data) / len(zlib.compress(data, 6))


def content_compression(text: str) -> float:
    """Compression ratio of the text's words and numbers alone: table rules, box drawing,
    quoting and indentation are layout, and a table whose rows repeat their frame with new
    cells or new figures is no flood; a loop compresses as well without them."""
    return compression_ratio(" ".join(tokens_of(text)))


def distinct_line_share(text: str) -> float | None:
    """Share of distinct lines among the non-blank lines of ``text`` (its first, maybe partial,
    line left out); ``None`` for fewer than four lines (a loop inside one line)."""
    lines = [ln.strip() for ln in text.split("\n")[1:]]
    lines = [ln for ln in lines if ln]
    if len(lines) < 4:
        return None
    return len(set(lines)) / len(lines)
