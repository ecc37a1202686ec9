"""The languages an answer may be in, read from the request: evidence in tiers.

A wrong reading must never cut a correct answer. So each kind of evidence may do only what its
certainty allows (the table is in ``docs/language.md``):

* **Declared** — the client's ``x-guard-language``, the operator's ``GUARD_LANGUAGE=<code>``
  (:func:`proxy.core.rewrite.expect_language`): the answer must be in that language.
* **Instructed** — an unambiguous directive whose object is the answer: "answer / reply /
  respond / write your answer in X", "in X, please" or "Language: X" as a clause of its own, and
  the same few forms in the languages the detector judges best ("responde en X", "antworte auf
  X", "用X回答", "Xで答えて", "X로 답해" …). Not negated, not conditional, not inside quotes or
  code; from any system/developer text or user turn, the latest winning. It narrows what is
  accepted to X, and only it tells ``auto`` what to inject.
* **The conversation's own languages** — what every user turn is written in (English
  included), with the languages identification finds nearly as likely for a short turn, the
  languages of text a turn quotes or pastes, and the language of the model's own earlier
  answers. Accepted.
* **Read from the text** — every language named anywhere in the request (a subject, an
  adjective, a condition, a translation's target). Only ever *added* to what is accepted.
* **Negation** ("do not answer in X", "no me contestes en X") removes X and narrows nothing else.
  A **condition** ("if the user writes in X, answer in X"; "otherwise, reply in Y") narrows
  nothing: a text that makes its language rules conditional only names languages.

No expectation: a request for (or in a marked form, a mention of) a language the detector cannot
judge; a translation with no target; nothing identifiable; everything removed by negation.

Names are the curated index of :mod:`proxy.core.language_names` (no places, no common words).
Pure: rules, a name index and the language model that :mod:`proxy.detect.language` loads once.
"""

from __future__ import annotations

import contextlib
import hashlib
from collections import OrderedDict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Literal

from proxy.core.language_forms import Reading, explicit_requests, read
from proxy.core.language_names import UNJUDGED
from proxy.core.prompt_language import prompt_language, turn_languages

__all__ = [
    "MEMO", "NONE", "SOURCES", "STRENGTHS", "UNSET", "Expectation", "Reading", "Role",
    "Source", "Strength", "TextMemo", "derive", "explicit_requests", "prompt_language", "read",
]  # fmt: skip

#: Where an expectation came from (a bounded metric label): the client's request (its header
#: or an instruction in it), the conversation's own languages, the operator's configuration,
#: or nowhere.
Source = Literal["request", "prompt", "config", "none"]
SOURCES: tuple[Source, ...] = ("request", "prompt", "config", "none")
#: How sure the expectation is (a bounded metric label): strong narrows to one language
#: (declared or instructed), weak accepts every language the request gives a reason for.
Strength = Literal["strong", "weak", "none"]
STRENGTHS: tuple[Strength, ...] = ("strong", "weak", "none")
#: Who wrote a text of the request: the operator (system, developer, Responses instructions,
#: Messages system), the user, or the model (earlier answers, read for their language only).
Role = Literal["system", "user", "assistant"]


@dataclass(frozen=True, slots=True)
class Expectation:
    """The expected answer language (ISO 639-1, or None), how sure, where it came from and why,
    and the languages an answer may be in (``code`` alone when strong)."""

    code: str | None
    source: Source
    #: A short fixed word saying why: header, config, instruction, conversation, translation,
    #: any, unjudged, negated, unknown, off.
    reason: str
    strength: Strength = "strong"
    accepted: frozenset[str] = frozenset()

    def __post_init__(self) -> None:
        if self.code is None:
            object.__setattr__(self, "strength", "none")
            object.__setattr__(self, "accepted", frozenset())
        elif not self.accepted:
            object.__setattr__(self, "accepted", frozenset({self.code}))

    def header(self) -> str:
        """The ``x-guard-language`` response header, e.g. ``fr; source=request; by=instruction;
        strength=strong`` or
        ``en; source=prompt; by=conversation; strength=weak; accepts=en,es``."""
        out = f"{self.code or 'none'}; source={self.source}; by={self.reason}"
        out += f"; strength={self.strength}"
        if self.strength == "weak":
            out += "; accepts=" + ",".join(sorted(self.accepted))
        return out


NONE = Expectation(None, "none", "unknown")
#: No expectation because none was looked for (the default of a rewrite).
UNSET = Expectation(None, "none", "off")


class _Seen:
    """One text's entry in :class:`TextMemo`: its language once asked, its reading, and the
    languages it is written in (its own and those of text it quotes) once asked."""

    __slots__ = ("identified", "language", "languages", "reading")

    def __init__(self) -> None:
        self.identified = False
        self.language: str | None = None
        self.reading: Reading | None = None
        self.languages: tuple[str | None, frozenset[str]] | None = None


class TextMemo:
    """What :func:`read` and :func:`prompt_language` said of texts seen a moment ago.

    Why: both run on every guarded request (tens of µs for a short prompt, hundreds for a long
    system prompt: most of a request's own set-up), and the same texts come back again and
    again — a deployment's system prompt with every request, an agent's earlier turns with
    every step of its tool loop. Both are pure (fixed rules, a fixed language model), so a text
    read before is answered from here exactly as reading it again would answer.

    Keyed by a 16-byte digest of the text, never the text (as :mod:`proxy.core.retries` keeps
    no prompt); at most ``size`` texts, the least recently used forgotten first. One per
    process, used from the event loop's thread (another thread at worst reads a text again).
    """

    __slots__ = ("_entries", "size")

    def __init__(self, size: int = 1024) -> None:
        self.size = size
        self._entries: OrderedDict[bytes, _Seen] = OrderedDict()

    def __len__(self) -> int:
        return len(self._entries)

    def clear(self) -> None:
        self._entries.clear()

    def digests(self) -> list[bytes]:
        return list(self._entries)

    def _entry(self, text: str) -> _Seen:
        key = hashlib.blake2b(text.encode("utf-8", "surrogatepass"), digest_size=16).digest()
        entries = self._entries
        found = entries.get(key)
        if found is not None:
            with contextlib.suppress(KeyError):  # another thread forgot it meanwhile
                entries.move_to_end(key)
            return found
        found = entries[key] = _Seen()
        if len(entries) > self.size:
            with contextlib.suppress(KeyError):
                entries.popitem(last=False)
        return found

    def language(self, text: str) -> str | None:
        """:func:`prompt_language` of ``text``."""
        found = self._entry(text)
        if not found.identified:
            found.language = prompt_language(text)
            found.identified = True
        return found.language

    def reading(self, text: str) -> Reading:
        """:func:`read` of ``text``, in the language it is written in."""
        found = self._entry(text)
        if found.reading is None:
            found.reading = read(text, self.language(text))
        return found.reading

    def languages(self, text: str) -> tuple[str | None, frozenset[str]]:
        """:func:`proxy.core.prompt_language.turn_languages` of a user turn."""
        found = self._entry(text)
        if found.languages is None:
            found.languages = turn_languages(text)
        return found.languages


#: The process's memo of request texts (see :class:`TextMemo`).
MEMO = TextMemo()


def derive(turns: Sequence[tuple[Role, str]], *, use_prompt: bool = True) -> Expectation:
    """The expectation from a request's texts in order (see the module docstring). The
    conversation's languages count only when ``use_prompt``. Texts read a moment ago are
    answered from :data:`MEMO`.

    The latest instruction wins. A user's instruction holds for the turn it is in, and for the
    turns after it only where it says so ("from now on"): "Answer in German: …" followed by an
    English question asks nothing of the new answer, and a later turn that names another
    language ("actually English is fine now") adds it. An operator's instruction (system,
    developer) holds throughout, and where a user overrides it with another language both are
    accepted: models differ in which of the two they follow, and an answer that follows either
    is correct."""
    memo = MEMO
    instructed: frozenset[str] = frozenset()
    operator: frozenset[str] = frozenset()
    negated: set[str] = set()
    named: set[str] = set()
    #: The languages the operator's own texts are written in, where they say nothing of the
    #: answer's language: an answer in them follows the deployment ("Eres el asistente de una
    #: tienda…" with an English question). One that makes a rule ("Reply in the user's
    #: language.") is read for its rule alone.
    written: set[str] = set()
    #: The languages the model's own earlier answers in this conversation are in: going on in
    #: one of them is no drift ("Hallo!" answered in German, then an English question).
    answered: set[str] = set()
    any_language = translation = False
    last_user = next((t for r, t in reversed(turns) if r == "user" and t), None)
    #: Whether the instruction holds for the last answer, and the languages named after it.
    holds = True
    named_after: set[str] = set()
    for role, text in turns:
        if not text:
            continue
        if role == "assistant":
            if use_prompt and (code := memo.language(text)) is not None:
                answered.add(code)
            continue
        reading = memo.reading(text)
        named |= reading.named
        # A translation without a target is this turn's task; "in any language" holds anywhere.
        any_language = any_language or reading.any_language
        translation = translation or (reading.untargeted and text is last_user)
        if role == "system" and not reading.rules and (code := memo.language(text)) is not None:
            written.add(code)
        if reading.negated:
            negated |= reading.negated
            instructed = instructed - reading.negated
            operator = operator - reading.negated
        if reading.asked:
            instructed = reading.asked  # the latest instruction wins
            negated -= reading.asked
            holds = role == "system" or reading.persistent or text is last_user
            named_after = set()
            if role == "system":
                operator = reading.asked
        elif role == "user":
            named_after |= reading.named
    if instructed and (not holds or named_after - instructed):
        # For one earlier answer only, or loosened by a later turn: it names, it narrows no more.
        named |= instructed | named_after
        instructed = operator
    if UNJUDGED in instructed or UNJUDGED in named:
        return Expectation(None, "none", "unjudged")
    if (any_language or translation) and not instructed:
        return Expectation(None, "none", "any" if any_language else "translation")
    if len(instructed) == 1 and operator <= instructed:
        (code,) = instructed
        return Expectation(code, "request", "instruction")
    if not use_prompt:
        return Expectation(None, "none", "off")
    users = [text for role, text in turns if role == "user" and text]
    conversation: set[str] = set()
    primary: str | None = None
    for text in users:
        main, languages = memo.languages(text)
        conversation |= languages
        primary = main or primary
    if not conversation:
        # No user turn's language is known: what the request names alone says too little of
        # what the answer may be in ("Tafsiri kwa Kiingereza …", Swahili, names only English).
        return NONE
    accepted = (conversation | named | instructed | operator | written | answered) - negated
    if not accepted:
        return Expectation(None, "none", "negated" if negated else "unknown")
    if primary not in accepted:
        primary = next((c for c in _latest(users, memo) if c in accepted), min(accepted))
    return Expectation(primary, "prompt", "conversation", "weak", frozenset(accepted))


def _latest(users: list[str], memo: TextMemo) -> Iterable[str]:
    """The conversation's languages, the latest user turn's first."""
    for text in reversed(users):
        yield from sorted(memo.languages(text)[1])
