"""An answer that writes the next turn of its own conversation.

A model whose chat template marks turns with plain text ("### Human:", "### Assistant:") or
whose end-of-turn token reaches the text as text does not stop where its answer ends: it
invents the user's next message and answers it, turn after turn, until the token limit. What
comes after the marker is not the answer, so the marker is the onset: a non-streamed answer
trimmed there is the answer the model gave, whole.

The rule: a turn marker of a chat template, at the start of a line or right after the end of a
sentence, outside fenced code. The
markers are the role labels of the plain-text templates (``### Human:``, ``# Assistant:``,
``### User:``, ``### Instruction:``) and the special tokens of the common templates written as
text (``<|im_start|>``, ``<|eot_id|>``, ``[INST]``, ``<start_of_turn>``…). A request that
itself holds a marker (a pasted transcript, a question about a template, a raw completion
prompt in a template's format) may be answered with one, so the guard does not judge turns
there (:func:`quotes_turns`): what the request shows widens what the answer may hold.

Left out on purpose: a bare ``Human:`` or ``User:`` (a dialogue the user asked for writes
them), headings such as ``### Response:`` or ``### Input:`` (an API's documentation writes
them) and ``</s>`` (HTML's strikethrough closes with it, and some models end every line of
a list with it). Pure: no I/O.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

_MARKER = re.compile(
    # at a line's start, or right where a sentence of the answer ended ("Good luck!### Human:")
    r"(?m)(?:^[ \t>]*|(?<=[.!?])[ \t]*)(?:#{1,4}[ \t]*(?:Human|Assistant|User|Instruction)[ \t]*:"
    r"|<\|(?:im_start|im_end|user|assistant|system|endoftext|eot_id|start_header_id"
    r"|end_header_id|end)\|>|\[/?INST\]|<(?:start|end)_of_turn>)"
)
#: More than the longest marker with what may stand before it: this much of the end of a
#: piece is searched again with the next, so that a marker split between two is found whole.
_CARRY = 40


def quotes_turns(texts: Iterable[str]) -> bool:
    """Whether a request's texts hold a turn marker anywhere (see the module docstring)."""
    return any(_MARKER.search(text) for text in texts if text)


class TurnLeak:
    """Finds the first turn marker of the text fed, outside fenced code.

    :meth:`feed` takes the text in order (any pieces) and returns the offset of the marker the
    first time one appears, else None. Each character is searched once, plus the last
    :data:`_CARRY` characters of a piece again with the next (a marker split between two
    pieces is found whole).
    """

    __slots__ = ("_carry", "_fenced", "_line_start")

    def __init__(self) -> None:
        #: The end of the text fed, searched again with the next piece; whether it starts
        #: inside a fence and at a line's start (the stream opens a line).
        self._carry = ""
        self._fenced = False
        self._line_start = True

    def feed(self, new: str, start: int) -> int | None:
        """``new`` is the text at offset ``start`` of the stream; returns the onset of a
        marker, or None."""
        if not new:
            return None
        text = self._carry + new
        base = start - len(self._carry)
        # Mid-line, a character that is no newline keeps "^" from matching at the start.
        lead = "" if self._line_start else "\x00"
        found = _search(lead + text, self._fenced)
        if found is not None:
            return base + found - len(lead)
        cut = max(0, len(text) - _CARRY)
        while cut > 0 and text[cut - 1] == "`":
            cut -= 1  # a fence split between pieces is carried whole
        if cut:
            self._fenced ^= text.count("```", 0, cut) % 2 == 1
            self._line_start = text[cut - 1] == "\n"
            self._carry = text[cut:]
        else:
            self._carry = text
        return None


def _search(text: str, fenced: bool) -> int | None:
    """The first marker outside fenced code in ``text``, which starts inside a fence when
    ``fenced``."""
    if "#" not in text and "<" not in text and "[" not in text:
        return None  # every marker holds one of these: most text is passed over in C
    pos = 0
    while True:
        fence = text.find("```", pos)
        end = len(text) if fence < 0 else fence
        if not fenced:
            match = _MARKER.search(text, pos, end)
            if match is not None:
                return match.start()
        if fence < 0:
            return None
        fenced = not fenced
        pos = fence + 3
