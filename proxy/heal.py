"""``GUARD_MODE=heal``: cut a degenerate choice back to where the loop began and let the engine
finish the answer from there, as the same choice of the same response.

Pure (no sockets, no asyncio), like :mod:`proxy.relay`; :mod:`proxy.guarded` does the I/O:

* :class:`HealPolicy` — the GUARD_HEAL_* settings, resolved once.
* :func:`unhealable` — why a request cannot be healed (then it is relayed as ``enforce``).
* :func:`continuation_request` — the body that asks the engine to go on from the trimmed text:
  chat appends it as a final assistant message with vLLM's ``continue_final_message``;
  completions appends it to the prompt. Each attempt turns the anti-repetition up one step.
* :class:`HealGuard` — a :class:`proxy.relay.StreamGuard` for one *stage* (the first request or
  one continuation). It relays through the ordinary chat/completions event handler (so the
  ``enforce``/``monitor``/``off`` hot path is untouched) and adds, on top, a hold-back window of
  the last ``holdback_tokens`` text chunks: a loop whose onset lies inside the window is cut
  before the client saw any of it. A continuation stage rewrites the engine's chunks to the
  first response's ``id``/``created``/``model`` and drops its role chunk, so the client reads one
  response.

Why a window and not "cut at the onset": text already sent cannot be unsent. When the onset lies
before what the client already holds, the cut moves forward to the end of what it holds, so what
the client reads is always exactly the text the continuation continues.
"""

from __future__ import annotations

import copy
import functools
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import orjson

from proxy import chunks
from proxy.chunks import Piece
from proxy.detect import Detector, Summary, Verdict
from proxy.errors import GuardError
from proxy.records import ChoiceRecord, Endpoint
from proxy.relay import ENGINE_REPETITION, BlockState, GuardPolicy, StreamGuard
from proxy.sse import DONE, DONE_EVENT, encode_data

if TYPE_CHECKING:
    from proxy.settings import Settings

#: vLLM's exact-loop stop (``repetition_detection``), sent as a backstop on continuations: an
#: n-gram of 2..64 tokens repeated 8 times in a row ends the continuation at the engine.
REPETITION_DETECTION: dict[str, int] = {
    "max_pattern_size": 64,
    "min_pattern_size": 2,
    "min_count": 8,
}
#: Highest penalties a continuation asks for (vLLM's own bounds are 2.0 for both).
_MAX_PENALTY = 2.0
_MAX_TEMPERATURE = 2.0


@dataclass(frozen=True, slots=True)
class HealPolicy:
    """How heal mode retries, resolved once from the GUARD_HEAL_* settings."""

    max_attempts: int = 2
    holdback_tokens: int = 64
    repetition_penalty_step: float = 0.1
    frequency_penalty_step: float = 0.3
    presence_penalty_step: float = 0.0
    temperature_step: float = 0.3
    repetition_detection: bool = True
    #: Hold-back window of a continuation stage (tokens): a continuation that degenerates is
    #: cut back to where it went wrong, so the window must span the detection delay of the
    #: signals that watch it (gibberish and salad need a few hundred characters).
    continuation_holdback_tokens: int = 160
    #: How far anti-repetition rises over the attempts (never below what the client asked):
    #: SmolLM2-135M on vLLM writes real-word salad from (1.3, 0.9, 0.6) on and gibberish from
    #: (1.6, 1.5, 0.9) (bench/data/gibberish.jsonl), so the bound stays at the second step.
    max_repetition_penalty: float = 1.2
    max_frequency_penalty: float = 0.6
    max_temperature: float = 0.6
    #: Share of a continuation's prose words missing from its language's word list above which
    #: (and above the kept answer's own share) it is not a heal (1.0: not judged).
    max_unknown_share: float = 0.2

    @classmethod
    def from_settings(cls, settings: Settings) -> HealPolicy:
        return cls(
            max_attempts=settings.heal_max_attempts,
            holdback_tokens=settings.heal_holdback_tokens,
            repetition_penalty_step=settings.heal_repetition_penalty_step,
            frequency_penalty_step=settings.heal_frequency_penalty_step,
            presence_penalty_step=settings.heal_presence_penalty_step,
            temperature_step=settings.heal_temperature_step,
            repetition_detection=settings.heal_repetition_detection,
            continuation_holdback_tokens=settings.heal_continuation_holdback_tokens,
            max_unknown_share=settings.heal_max_unknown_share,
        )


def unhealable(
    endpoint: Endpoint, body: dict[str, Any], n: int, *, client_stream: bool = False
) -> str | None:
    """Why this request cannot be healed (``None``: it can). Such requests are relayed as
    ``enforce`` would relay them.

    Only chat and completions have a way to continue a text (Responses and Messages requests
    are healed through the chat route when :mod:`proxy.surfaces.via_chat` can express them,
    and reach this check as chat); ``n > 1`` would need one continuation per choice with
    the others held back meanwhile; a completions prompt must be one string (token ids cannot
    be extended with text, and several prompts are several answers); ``echo`` would repeat the
    extended prompt.
    """
    if endpoint not in ("chat", "completions"):
        return "surface"
    if n != 1:
        return "n"
    if constrained(body) and client_stream:
        # A constrained answer cannot be continued (the engine's grammar starts again at the
        # continuation's first token), and a restart would follow what the client already read.
        return "constrained-stream"
    if endpoint == "completions":
        prompt = body.get("prompt")
        if isinstance(prompt, list):
            if len(prompt) != 1 or not isinstance(prompt[0], str):
                return "prompt"
        elif not isinstance(prompt, str):
            return "prompt"
        if body.get("echo"):
            return "echo"
    else:
        messages = body.get("messages")
        if not isinstance(messages, list):
            return "messages"
    return None


#: Request fields that constrain the output to a grammar (vLLM's structured outputs).
_CONSTRAINTS = (
    "guided_json",
    "guided_regex",
    "guided_choice",
    "guided_grammar",
    "structured_outputs",
)
#: Signals of a continuation that more anti-repetition only makes worse: the raised penalties
#: push a small model off its own words (gibberish, salad, another script or language).
NO_RETRY_SIGNALS: frozenset[str] = frozenset(
    {"gibberish", "salad", "script-intrusion", "language-drift", "entropy-collapse"}
)


def constrained(body: dict[str, Any]) -> bool:
    """Whether the request constrains its output to a grammar (``response_format`` with a JSON
    type, or one of vLLM's guided/structured-output fields)."""
    fmt = body.get("response_format")
    if isinstance(fmt, dict) and fmt.get("type") in ("json_object", "json_schema"):
        return True
    return any(body.get(k) is not None for k in _CONSTRAINTS)


def json_constrained(body: dict[str, Any]) -> bool:
    """Whether the constraint is JSON (then a healed answer must parse as JSON)."""
    fmt = body.get("response_format")
    if isinstance(fmt, dict) and fmt.get("type") in ("json_object", "json_schema"):
        return True
    so = body.get("structured_outputs")
    if isinstance(so, dict) and so.get("json") is not None:
        return True
    return body.get("guided_json") is not None


def valid_json(text: str) -> bool:
    """``text`` is one JSON value under the strict grammar (no raw control characters inside
    strings), as the openai SDK's ``.parse()`` and pydantic read it."""
    try:
        orjson.loads(text)
    except orjson.JSONDecodeError:
        return False
    return True


def continuation_request(
    body: dict[str, Any],
    endpoint: Endpoint,
    prefix: str,
    remaining_tokens: int,
    attempt: int,
    policy: HealPolicy,
    *,
    restart: bool = False,
) -> dict[str, Any]:
    """The request for attempt ``attempt`` (1, 2, ...): ``body`` (the rewritten request the
    first stage sent) continued from ``prefix`` with at most ``remaining_tokens`` new tokens
    (``restart``: the same request asked again, for a constrained answer, with the attempt's
    anti-repetition).

    Anti-repetition grows with the attempt: ``repetition_penalty`` (prompt and output tokens, so
    it also weighs against repeating the kept text) and ``frequency``/``presence_penalty``
    (output tokens only) by their steps; a greedy request (``temperature`` 0) gets a temperature
    step, since greedy decoding from the same prefix tends to walk back into the same loop.
    """
    out = copy.deepcopy(body)
    if restart:
        pass
    elif endpoint == "chat":
        messages = list(out.get("messages") or [])
        last = messages[-1] if messages else None
        if (
            out.get("continue_final_message")
            and isinstance(last, dict)
            and last.get("role") == "assistant"
            and isinstance(last.get("content"), str)
        ):
            messages[-1] = {**last, "content": last["content"] + prefix}
        else:
            messages.append({"role": "assistant", "content": prefix})
        out["messages"] = messages
        out["continue_final_message"] = True
        out["add_generation_prompt"] = False
    else:
        prompt = out.get("prompt")
        if isinstance(prompt, list):
            out["prompt"] = [prompt[0] + prefix]
        else:
            out["prompt"] = str(prompt) + prefix
    out["n"] = 1
    limited = False
    for key in ("max_tokens", "max_completion_tokens"):
        if key in out and out[key] is not None:
            out[key] = remaining_tokens
            limited = True
    if not limited:
        out["max_tokens"] = remaining_tokens
    if policy.repetition_penalty_step:
        base = max(_number(out.get("repetition_penalty"), 1.0), 1.0)
        raised = min(policy.max_repetition_penalty, base + policy.repetition_penalty_step * attempt)
        out["repetition_penalty"] = round(min(_MAX_PENALTY, max(base, raised)), 4)
    if policy.frequency_penalty_step:
        base = _number(out.get("frequency_penalty"), 0.0)
        raised = min(policy.max_frequency_penalty, base + policy.frequency_penalty_step * attempt)
        out["frequency_penalty"] = round(min(_MAX_PENALTY, max(base, raised)), 4)
    if policy.presence_penalty_step:
        base = _number(out.get("presence_penalty"), 0.0)
        out["presence_penalty"] = round(
            min(_MAX_PENALTY, base + policy.presence_penalty_step * attempt), 4
        )
    if policy.temperature_step and _number(out.get("temperature"), 1.0) == 0:
        raised = min(policy.max_temperature, policy.temperature_step * attempt)
        out["temperature"] = round(min(_MAX_TEMPERATURE, raised), 4)
    if policy.repetition_detection and "repetition_detection" not in out:
        out["repetition_detection"] = dict(REPETITION_DETECTION)
    return out


def _number(value: Any, default: float) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return default
    return float(value)


# ---------------------------------------------------------------------------- the relay stage


@dataclass(slots=True)
class _Held:
    """One event waiting in the hold-back window: its chunk (``None``: bytes that are not a
    JSON data event, passed as they are), the choice's text span ``[start, end)`` in the whole
    answer, and the stage's token count after it."""

    chunk: dict[str, Any] | None
    raw: bytes
    start: int
    end: int
    tokens: int
    #: The chunk was changed (cut at the onset): write it anew instead of ``raw``.
    modified: bool = False


@dataclass(slots=True)
class HealCarry:
    """What a stage hands the next one: the answer so far and the history of the heal."""

    prefix: str = ""
    #: Tokens of ``prefix`` (the kept text of earlier stages).
    base_tokens: int = 0
    #: The first response's id/object/created/model (the client's view).
    origin: dict[str, Any] | None = None
    prompt_tokens: int | None = None
    attempt: int = 0
    #: Tokens generated by the engine and cut away, over all earlier stages.
    discarded: int = 0
    #: Tokens the engine generated over all earlier stages (kept and discarded).
    generated: int = 0
    first_verdict: Verdict | None = None
    first_onset: int | None = None
    first_summary: Summary | None = None
    #: Non-streaming: the kept pieces of earlier stages (offsets in the whole answer).
    pieces: list[tuple[int, Piece]] = field(default_factory=list)
    #: The language the kept answer is written in, which its continuations are held to.
    language: str | None = None


class HealGuard(StreamGuard):
    """One stage of a healed request; see the module docstring.

    After :meth:`feed` set :attr:`done`, :attr:`needs_heal` says the stage ended on a verdict:
    the kept text is ``carry.prefix + text[:cut]`` and :meth:`continuation` builds the next stage
    (or :meth:`give_up` ends the choice as ``enforce`` does).
    """

    def __init__(
        self,
        policy: GuardPolicy,
        make_detector: Callable[[], Detector],
        heal: HealPolicy,
        carry: HealCarry | None = None,
        *,
        restart: bool = False,
        detector_for: Callable[[str], Detector] | None = None,
    ) -> None:
        super().__init__(policy, make_detector)
        # A continuation is judged when it ends, drift included (``_judged_at_end``).
        self.end_drift = True
        #: Builds a continuation's detector expecting a language (``None``: the request
        #: already named one, or no language is to be expected).
        self._detector_for = detector_for
        # Every event goes through :meth:`_event` below (hold-back, id rewriting, the text kept
        # for the cut): the relay's plain-text fast path would bypass it.
        self._fast = False
        self.heal = heal
        self.carry = carry or HealCarry()
        #: A constrained (structured-output) answer is asked again from its start rather than
        #: continued: the engine's grammar would start over at the continuation's first token.
        self.restart = restart
        self._window = (
            heal.holdback_tokens if self.carry.origin is None else heal.continuation_holdback_tokens
        )
        self.needs_heal = False
        self.gave_up = False
        #: Text of choice 0 that may still be cut: only what reasoning/tool channels never touched.
        self.healable = True
        #: Where the answer is cut (an offset in the whole answer), once a verdict asked for it.
        self.cut: int | None = None
        self.kept_tokens = 0
        self._held: deque[_Held] = deque()
        self._held_text = 0
        self._text_end = len(self.carry.prefix)
        self._released = len(self.carry.prefix)
        self._released_tokens = 0
        self._text: list[str] = []
        self._handled = False

    # ------------------------------------------------------------------ stage facts
    @property
    def attempt(self) -> int:
        return self.carry.attempt

    @property
    def origin(self) -> dict[str, Any]:
        return self.carry.origin or self.template or {}

    def answer_text(self) -> str:
        """The whole answer so far: the kept prefix and this stage's text (uncut)."""
        return self.carry.prefix + "".join(self._text)

    def stage_tokens(self) -> int:
        state = self.choices.get(0)
        return state.tokens if state is not None else 0

    def remaining_tokens(self, max_tokens: int) -> int:
        return max_tokens - self.carry.base_tokens - self.kept_tokens

    def new_block(self, index: int) -> BlockState:
        state = super().new_block(index)
        # Offsets of collected pieces count from the start of the whole answer.
        state.chars = len(self.carry.prefix)
        return state

    # ------------------------------------------------------------------ streaming
    def _event(self, raw: bytes, data: bytes | None) -> bytes:
        out = StreamGuard._event(self, raw, data)
        if data == DONE:
            return self._release_all() + self._final_usage() + out
        if not out:
            return b""
        chunk = _event_json(out)
        if chunk is None:
            return self._hold(_Held(None, out, self._text_end, self._text_end, self.stage_tokens()))
        choices = chunk.get("choices")
        if self.carry.origin is not None and not self._rewrite(chunk):
            return b""
        choice = choices[0] if isinstance(choices, list) and choices else None
        text = ""
        if isinstance(choice, dict) and choice.get("index", 0) == 0:
            delta = choice.get("delta")
            if isinstance(delta, dict) and any(
                delta.get(k) for k in (*chunks.REASONING_KEYS, "tool_calls")
            ):
                self.healable = False
            text = chunks.choice_text(choice)
            if text:
                self._text.append(text)
            if self.carry.origin is not None and choice.get("finish_reason") is not None:
                state = self.choices.get(0)
                # vLLM's own loop stop (repetition_detection, the backstop) ended it: not healed.
                engine_stop = state is not None and state.finish_reason == ENGINE_REPETITION
                if not engine_stop and state is not None and self._judged_at_end(state):
                    # The continuation degenerated in its last words (judged when it ended):
                    # this is not the answer's ending; the verdict below cuts it.
                    choice["finish_reason"] = None
                    if "stop_reason" in choice:
                        choice["stop_reason"] = None
                else:
                    choice["guard"] = self.guard_object("aborted" if engine_stop else "healed")
        start = self._text_end
        self._text_end += len(text)
        item = _Held(chunk, out, start, self._text_end, self.stage_tokens())
        state = self.choices.get(0)
        if state is not None and state.verdict is not None and not self._handled:
            self._handled = True
            return self._verdict(state, state.verdict, item)
        return self._hold(item)

    def _judged_at_end(self, state: BlockState) -> bool:
        """Judge a continuation once it ends, with the detector's end-of-stream checks (short
        loops, salad, gibberish the streaming windows had too little text for); True when it
        is degenerate (the verdict is recorded on ``state``)."""
        if state.verdict is not None or self._handled:
            return False
        summary = state.summary = state.detector.finish()
        verdict = summary.verdict
        if verdict is None and not self.restart:
            # (A restarted structured answer is JSON: its strings are not prose to judge.)
            verdict = self._worse_words(state.detector.expected_language)
        if verdict is None:
            return False
        state.verdict = verdict
        return True

    def _worse_words(self, language: str | None) -> Verdict | None:
        """The continuation's vocabulary against the answer it continues: more of its prose
        words missing from the language's word list than ``heal.max_unknown_share`` and than
        the kept answer itself had (a model's usual quality in a language is not the heal's
        doing; invented words the raised penalties brought are). Once per continuation."""
        from proxy.detect.salad import SALAD_LANGUAGES, lexicon, prose_words

        bar = self.heal.max_unknown_share
        if language not in SALAD_LANGUAGES or bar >= 1.0:
            return None
        words = prose_words("".join(self._text))
        lex = lexicon(language)
        if lex is None or len(words) < _MIN_JUDGED_WORDS:
            return None
        share = sum(map(lex.unknown, words)) / len(words)
        if share <= bar:
            return None
        before = prose_words(self.carry.prefix[-_LANGUAGE_CHARS:])
        if len(before) >= _MIN_JUDGED_WORDS and share <= sum(map(lex.unknown, before)) / len(
            before
        ):
            return None
        state = self.choices.get(0)
        tokens = state.tokens if state is not None else 0
        return Verdict("salad", share, sum(map(len, self._text)), tokens, 0)

    def retry_allowed(self) -> bool:
        """Whether another continuation may follow this stage's verdict. A continuation that
        turned into gibberish, salad or another language was pushed there by the raised
        anti-repetition, which a further attempt would only raise again: it ends as an abort."""
        state = self.choices.get(0)
        verdict = state.verdict if state is not None else None
        return self.carry.attempt == 0 or verdict is None or verdict.signal not in NO_RETRY_SIGNALS

    def _rewrite(self, chunk: dict[str, Any]) -> bool:
        """A continuation's chunk as part of the first response; False: drop it (the role
        chunk, the engine's own usage summary)."""
        origin = self.origin
        for key in ("id", "created", "model"):
            if key in origin:
                chunk[key] = origin[key]
        choices = chunk.get("choices")
        usage = chunk.get("usage")
        if isinstance(choices, list) and not choices:
            return False  # the final usage chunk: the proxy writes its own at [DONE]
        if isinstance(usage, dict):
            chunk["usage"] = self._usage(usage.get("completion_tokens"))
        if isinstance(choices, list) and len(choices) == 1:
            choice = choices[0]
            delta = choice.get("delta") if isinstance(choice, dict) else None
            if (
                isinstance(delta, dict)
                and "role" in delta
                and not delta.get("content")
                and choice.get("finish_reason") is None
                and len(delta) <= 2
            ):
                return False
        return True

    def _usage(self, stage_completion: Any) -> dict[str, Any]:
        done = stage_completion if isinstance(stage_completion, int) else self.stage_tokens()
        prompt = self.carry.prompt_tokens or 0
        completion = self.carry.base_tokens + done
        return {
            "prompt_tokens": prompt,
            "total_tokens": prompt + completion,
            "completion_tokens": completion,
        }

    def _final_usage(self) -> bytes:
        if self.carry.origin is None or not self.policy.client_wants_usage:
            return b""
        tpl = dict(self.origin)
        tpl.setdefault("object", _chunk_object(self.policy.endpoint))
        return encode_data(chunks.usage_chunk(tpl, self._usage(None)))

    def _hold(self, item: _Held) -> bytes:
        """Queue ``item``; release what falls out of the window (and non-text events at its
        front at once: the role chunk need not wait)."""
        self._held.append(item)
        if item.end > item.start:
            self._held_text += 1
        out = []
        window = self._window
        while self._held and (self._held_text > window or self._held[0].end == self._held[0].start):
            out.append(self._release(self._held.popleft()))
        return b"".join(out)

    def _release(self, item: _Held) -> bytes:
        if item.end > item.start:
            self._held_text -= 1
        self._released = max(self._released, item.end)
        self._released_tokens = item.tokens
        if item.chunk is None or (self.carry.origin is None and not item.modified):
            return item.raw  # the first stage's bytes, untouched
        return encode_data(orjson.dumps(item.chunk))

    def _release_all(self) -> bytes:
        out = [self._release(item) for item in self._held]
        self._held.clear()
        self._held_text = 0
        return b"".join(out)

    def _verdict(self, state: BlockState, verdict: Verdict, item: _Held) -> bytes:
        """The stage's loop: release what precedes the cut, drop the rest, stop reading."""
        self._held.append(item)
        if item.end > item.start:
            self._held_text += 1
        onset = len(self.carry.prefix) + verdict.onset_char
        cut = word_boundary(self.answer_text(), max(onset, self._released), self._released)
        if self.restart:
            cut = 0  # not streamed (nothing reached the client): asked again from the start
        out = []
        kept_tokens = self._released_tokens
        while self._held:
            held = self._held.popleft()
            if held.end == held.start:
                if held.start <= cut:
                    out.append(self._release(held))
                continue
            if held.end <= cut:
                out.append(self._release(held))
                kept_tokens = held.tokens
            elif held.start < cut and held.chunk is not None:
                _trim(held.chunk, cut - held.start)
                held.modified = True
                out.append(self._release(held))
                kept_tokens = held.tokens
        self._held_text = 0
        self.cut = cut
        self.kept_tokens = 0 if self.restart else kept_tokens
        self.needs_heal = True
        self.done = True
        state.action = "aborted"
        return b"".join(out)

    def upstream_failed(self, error: GuardError) -> bytes:
        """Release what the window holds, then end as the relay does."""
        held = self._release_all()
        return held + super().upstream_failed(error)

    # ------------------------------------------------------------------ the next stage
    def continuation(self) -> HealGuard:
        """The guard for the next attempt, which continues from the cut."""
        assert self.cut is not None
        carry = self.carry
        state = self.choices.get(0)
        generated = self.stage_tokens()
        summary = carry.first_summary
        if summary is None and state is not None:
            summary = state.finish()
        first = carry.first_verdict
        onset = carry.first_onset
        if first is None and state is not None and state.verdict is not None:
            first = state.verdict
            onset = self.cut
        pieces = list(carry.pieces)
        if state is not None:
            pieces += _cut_pieces(state.pieces, self.cut)
        prefix = self.answer_text()[: self.cut]
        language = carry.language
        if language is None and self._detector_for is not None:
            language = answer_language(prefix)
        make_detector = self._make_detector
        if language is not None and self._detector_for is not None:
            make_detector = functools.partial(self._detector_for, language)
        nxt = HealGuard(
            self.policy,
            make_detector,
            self.heal,
            HealCarry(
                prefix=prefix,
                language=language,
                base_tokens=carry.base_tokens + self.kept_tokens,
                origin=dict(self.origin),
                prompt_tokens=carry.prompt_tokens
                if carry.prompt_tokens is not None
                else self.prompt_tokens,
                attempt=carry.attempt + 1,
                discarded=carry.discarded + max(0, generated - self.kept_tokens),
                generated=carry.generated + generated,
                first_verdict=first,
                first_onset=onset,
                first_summary=summary,
                pieces=pieces,
            ),
            restart=self.restart,
            detector_for=self._detector_for,
        )
        return nxt

    def guard_object(self, action: str) -> dict[str, Any]:
        """The ``guard`` object of a healed (or, after the last attempt, aborted) choice."""
        carry = self.carry
        verdict = carry.first_verdict or self._stage_verdict()
        out: dict[str, Any] = {"action": action, "attempts": carry.attempt}
        if verdict is not None:
            out["signal"] = verdict.signal
            out["score"] = verdict.score
            out["channel"] = verdict.channel
            if verdict.language_source is not None:
                out["expected_language"] = verdict.expected_language
                out["language_source"] = verdict.language_source
        out["onset_char"] = carry.first_onset if carry.first_onset is not None else self.cut
        out["tokens_discarded"] = self.discarded_tokens()
        out["completion_tokens"] = self.answer_tokens()
        return out

    def _stage_verdict(self) -> Verdict | None:
        state = self.choices.get(0)
        return state.verdict if state is not None else None

    def discarded_tokens(self) -> int:
        extra = self.stage_tokens() - self.kept_tokens if self.cut is not None else 0
        return self.carry.discarded + max(0, extra)

    def answer_tokens(self) -> int:
        """Tokens of the answer the client gets."""
        if self.cut is not None:
            return self.carry.base_tokens + self.kept_tokens
        return self.carry.base_tokens + self.stage_tokens()

    def give_up(self) -> bytes:
        """End the choice as ``enforce`` would at the cut (no attempt left, nothing healable,
        or the continuation could not be opened): the streamed tail of that ending."""
        self.gave_up = True
        self.aborted = True
        self.needs_heal = False
        state = self.choices.get(0)
        verdict = self._stage_verdict() or self.carry.first_verdict
        reason = self.policy.abort_finish_reason
        stop = "coherence_guard:" + (verdict.signal if verdict is not None else "unknown")
        if state is not None:
            self._end(state, reason, stop)
        choice: dict[str, Any] = {"index": 0}
        if self.policy.endpoint == "chat":
            choice["delta"] = {"content": ""}
        else:
            choice["text"] = ""
        choice.update(
            {
                "logprobs": None,
                "finish_reason": reason,
                "stop_reason": stop,
                "guard": self.guard_object("aborted"),
            }
        )
        tpl = self.origin
        keys = ("id", "object", "created", "model")
        chunk: dict[str, Any] = {k: tpl[k] for k in keys if k in tpl}
        chunk.setdefault("object", _chunk_object(self.policy.endpoint))
        chunk["choices"] = [choice]
        tail = [encode_data(orjson.dumps(chunk))]
        if self.policy.client_wants_usage:
            tail.append(encode_data(chunks.usage_chunk(chunk, self.final_usage())))
        tail.append(DONE_EVENT)
        self.done = True
        return b"".join(tail)

    # ------------------------------------------------------------------ outcome, answer
    def final_usage(self) -> dict[str, Any]:
        if self.carry.attempt == 0 and not self.gave_up:
            return super().final_usage()
        prompt = (
            self.carry.prompt_tokens if self.carry.prompt_tokens is not None else self.prompt_tokens
        ) or 0
        completion = self.answer_tokens()
        return {
            "prompt_tokens": prompt,
            "total_tokens": prompt + completion,
            "completion_tokens": completion,
        }

    def healed(self) -> bool:
        """A continuation ran and ended the choice with ``stop``, with no verdict of its own."""
        state = self.choices.get(0)
        return (
            self.carry.attempt > 0
            and not self.gave_up
            and state is not None
            and state.verdict is None
            and state.finish_reason == "stop"
        )

    def records(self, max_tokens: int | None) -> list[ChoiceRecord]:
        """One record for the choice: every token the engine generated over all stages, the
        first stage's detector summary (the verdict that started the heal)."""
        if self.carry.attempt == 0 and not self.gave_up:
            return super().records(max_tokens)
        state = self.choices.get(0)
        summary = self.carry.first_summary
        if summary is None and state is not None:
            summary = state.finish()
        finish = state.finish_reason if state is not None else None
        return [
            ChoiceRecord(
                index=0,
                finish_reason=finish,
                completion_tokens=self.carry.generated + self.stage_tokens(),
                summary=summary,
                detection_action="aborted" if self.gave_up else "healed",
                max_tokens=max_tokens,
            )
        ]

    def response(self, endpoint: Endpoint | None = None, *, trim: bool) -> dict[str, Any]:
        """The non-streamed answer: kept pieces of every stage and this stage's own (cut where
        it gave up), as the first response."""
        if self.carry.attempt == 0 and not self.gave_up:
            return super().response(endpoint, trim=trim)
        from proxy.reassemble import chat_response

        state = self.choices.get(0)
        if state is None:
            state = self.new_block(0)
        own = state.pieces if self.cut is None else _cut_pieces(state.pieces, self.cut)
        saved_pieces, saved_action = state.pieces, state.action
        state.pieces = [*self.carry.pieces, *own]
        state.action = None
        saved_template = self.template
        self.template = self.origin
        try:
            out = chat_response(self, trim=False)
        finally:
            state.pieces, state.action, self.template = saved_pieces, saved_action, saved_template
        choice = out["choices"][0]
        choice["guard"] = self.guard_object("aborted" if self.gave_up else "healed")
        out["usage"] = self.final_usage()
        return out


#: Characters at the end of the kept answer its language is identified from, and the confidence
#: the identification needs (the prompt's language detection asks the same).
_LANGUAGE_CHARS = 2048
_LANGUAGE_CONFIDENCE = 0.8
#: Prose words a continuation (and the kept answer) needs before its vocabulary is judged.
_MIN_JUDGED_WORDS = 10


def answer_language(prefix: str) -> str | None:
    """The language the kept answer is written in, which a continuation must keep: the
    detector of a continuation expects it, so salad, gibberish and drift in the continuation
    are judged against the answer it continues (a request that names no language, and a
    prompt too short to identify, otherwise leave those signals without a language). Once per
    heal, on at most the last 2 KiB of the answer; ``None`` when unsure."""
    from proxy.language import identify_language

    found = identify_language(prefix[-_LANGUAGE_CHARS:])
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


def _event_json(out: bytes) -> dict[str, Any] | None:
    """The JSON object of one ``data: {...}\\n\\n`` event (as the relay writes and vLLM sends),
    or None for anything else."""
    if not (out.startswith(b"data: {") and out.endswith(b"\n\n")) or b"\n" in out[:-2]:
        return None
    try:
        value = orjson.loads(out[6:-2])
    except orjson.JSONDecodeError:
        return None
    return value if isinstance(value, dict) else None


def _trim(chunk: dict[str, Any], keep: int) -> None:
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


def _cut_pieces(pieces: list[tuple[int, Piece]], cut: int) -> list[tuple[int, Piece]]:
    out = []
    for offset, piece in pieces:
        if offset >= cut:
            break
        if offset + len(piece.text) > cut:
            piece = Piece(piece.channel, piece.text[: cut - offset], piece.tool_index)
        out.append((offset, piece))
    return out


def _chunk_object(endpoint: Endpoint) -> str:
    return "chat.completion.chunk" if endpoint == "chat" else "text_completion"
