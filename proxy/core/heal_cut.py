"""Where heal cuts an answer and what the kept part is: the word boundary near the detector's
onset, the text of the events that straddle the cut, and the kept answer's language.

Pure helpers of :class:`proxy.core.heal.HealGuard`, apart so the stage reads as a relay.
"""

from __future__ import annotations

from typing import Any

import orjson

from proxy.core.chunks import Piece
from proxy.core.records import Endpoint

#: Characters at the end of the kept answer its language is identified from, and the confidence
#: the identification needs (the prompt's language detection asks the same).
LANGUAGE_CHARS = 2048


_LANGUAGE_CONFIDENCE = 0.8


def answer_language(prefix: str) -> str | None:
    """The language the kept answer is written in, which a continuation must keep: the
    detector of a continuation expects it, so salad, gibberish and drift in the continuation
    are judged against the answer it continues (a request that names no language, and a
    prompt too short to identify, otherwise leave those signals without a language). Once per
    heal, on at most the last 2 KiB of the answer; ``None`` when unsure."""
    from proxy.detect.language import identify_language

    found = identify_language(prefix[-LANGUAGE_CHARS:])
    if found is None or found[1] < _LANGUAGE_CONFIDENCE:
        return None
    return found[0]


#: How far :func:`word_boundary` looks for the end of a word before it gives up (scripts without
#: spaces between words: the cut stays at the onset).
_WORD_REACH = 32


def word_boundary(text: str, cut: int, floor: int) -> int:
    """Where to cut ``text`` near the detector's onset ``cut`` (never below ``floor``, what the
    client already holds), so that a continuation starts a fresh token (``" The"``) rather than
    the rest of a split word or a word after a dangling space, which tokenise unlike anything
    the model was trained on.

    An onset inside a word is moved *forward* to the end of that word: a periodic loop's onset
    is where its period first matches, and that match often reaches a few characters back into
    the healthy word before the loop (``"river. "`` ends like ``"answer. "``). Whitespace before
    the cut is then dropped. Scripts without spaces keep the onset as it is.
    """
    i = cut
    if 0 < i < len(text) and text[i - 1].isalnum() and text[i].isalnum():
        j = i
        while j < len(text) and j - i < _WORD_REACH and not text[j].isspace():
            j += 1
        if j < len(text) and text[j].isspace():
            i = j
    while i > floor and text[i - 1].isspace():
        i -= 1
    return i


def event_json(out: bytes) -> dict[str, Any] | None:
    """The JSON object of one ``data: {...}\\n\\n`` event (as the relay writes and vLLM sends),
    or None for anything else."""
    if not (out.startswith(b"data: {") and out.endswith(b"\n\n")) or b"\n" in out[:-2]:
        return None
    try:
        value = orjson.loads(out[6:-2])
    except orjson.JSONDecodeError:
        return None
    return value if isinstance(value, dict) else None


def trim_choice(chunk: dict[str, Any], keep: int) -> None:
    """Cut the text of choice 0 of ``chunk`` to its first ``keep`` characters (the event that
    straddles the cut); it no longer ends the choice."""
    choice = chunk["choices"][0]
    delta = choice.get("delta")
    if isinstance(delta, dict):
        if isinstance(delta.get("content"), str):
            delta["content"] = delta["content"][:keep]
    elif isinstance(choice.get("text"), str):
        choice["text"] = choice["text"][:keep]
    choice["finish_reason"] = None
    if "stop_reason" in choice:
        choice["stop_reason"] = None


def cut_pieces(pieces: list[tuple[int, Piece]], cut: int) -> list[tuple[int, Piece]]:
    out = []
    for offset, piece in pieces:
        if offset >= cut:
            break
        if offset + len(piece.text) > cut:
            piece = Piece(piece.channel, piece.text[: cut - offset], piece.tool_index)
        out.append((offset, piece))
    return out


def chunk_object(endpoint: Endpoint) -> str:
    return "chat.completion.chunk" if endpoint == "chat" else "text_completion"


#: Prose words a continuation (and the kept answer) needs before its vocabulary is judged.
MIN_JUDGED_WORDS = 10


def worse_vocabulary(text: str, prefix: str, language: str | None, bar: float) -> float | None:
    """The share of a continuation's prose words missing from ``language``'s word list, when it
    is above ``bar`` (``heal.max_unknown_share``) and above what the kept answer ``prefix``
    itself had, else ``None``: a model's usual quality in a language is not the heal's doing;
    invented words the raised penalties brought are."""
    from proxy.detect.salad import SALAD_LANGUAGES, lexicon, prose_words

    if language not in SALAD_LANGUAGES or bar >= 1.0:
        return None
    words = prose_words(text)
    lex = lexicon(language)
    if lex is None or len(words) < MIN_JUDGED_WORDS:
        return None
    share = sum(map(lex.unknown, words)) / len(words)
    if share <= bar:
        return None
    before = prose_words(prefix[-LANGUAGE_CHARS:])
    if len(before) >= MIN_JUDGED_WORDS and share <= sum(map(lex.unknown, before)) / len(before):
        return None
    return share
