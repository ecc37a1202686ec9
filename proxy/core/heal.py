"""``GUARD_MODE=heal``: cut a degenerate choice back to where the loop began and let the engine
finish the answer from there, as the same choice of the same response.

Pure (the I/O is :mod:`proxy.server.heal_stages`'s). Which requests can be healed and what is
asked: :mod:`proxy.core.heal_request`; where to cut: :mod:`.heal_cut`.
:class:`HealGuard` is a :class:`proxy.core.guard.StreamGuard` for one *stage* (the first request or
one continuation). It relays through the ordinary chat/completions event handler (so the
``enforce``/``monitor``/``off`` hot path is untouched) and adds, on top, a hold-back window of the
last ``holdback_tokens`` text chunks: a loop whose onset lies inside the window is cut before the
client saw any of it. A continuation stage rewrites the engine's chunks to the first response's
``id``/``created``/``model`` and drops its role chunk, so the client reads one response.

Why a window and not "cut at the onset": text already sent cannot be unsent. When the onset lies
before what the client already holds, the cut moves forward to the end of what it holds, so what
the client reads is always exactly the text the continuation continues.
"""

from __future__ import annotations

import functools
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import orjson

from proxy.core import chunks
from proxy.core.chunks import ENGINE_REPETITION
from proxy.core.guard import BlockState, StreamGuard
from proxy.core.heal_cut import (
    answer_language,
    chunk_object,
    cut_pieces,
    event_json,
    trim_choice,
    word_boundary,
    worse_vocabulary,
)
from proxy.core.heal_request import NO_RETRY_SIGNALS, HealCarry, HealPolicy
from proxy.core.policy import GuardPolicy
from proxy.core.reassemble import chat_response
from proxy.core.records import ChoiceRecord, Endpoint
from proxy.core.sse import DONE, DONE_EVENT, encode_data
from proxy.detect import Detector, Verdict
from proxy.errors import GuardError


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
        #: Builds a continuation's detector expecting a language (``None``: the request
        #: already named one, or no language is to be expected).
        self._detector_for = detector_for
        # Every event goes through :meth:`_event` (hold-back, id rewriting, the kept text).
        self._quick = None
        self.heal = heal
        self.carry = carry or HealCarry()
        # A continuation judges itself when it ends, its words against the answer it continues.
        self.judges_own_finish = self.carry.origin is not None
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
        chunk = event_json(out)
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
        """The continuation's vocabulary against the answer it continues
        (:func:`~proxy.core.heal_cut.worse_vocabulary`); once per continuation."""
        text = "".join(self._text)
        share = worse_vocabulary(text, self.carry.prefix, language, self.heal.max_unknown_share)
        if share is None:
            return None
        state = self.choices.get(0)
        return Verdict("salad", share, len(text), state.tokens if state is not None else 0, 0)

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
        return chunks.chat_usage(self.carry.prompt_tokens, self.carry.base_tokens + done)

    def _final_usage(self) -> bytes:
        if self.carry.origin is None or not self.policy.client_wants_usage:
            return b""
        tpl = dict(self.origin)
        tpl.setdefault("object", chunk_object(self.policy.endpoint))
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
                trim_choice(held.chunk, cut - held.start)
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
            pieces += cut_pieces(state.pieces, self.cut)
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
        chunk.setdefault("object", chunk_object(self.policy.endpoint))
        chunk["choices"] = [choice]
        self.done = True
        out = encode_data(orjson.dumps(chunk))
        if not self.policy.client_wants_usage:
            return out + DONE_EVENT
        return out + self.ending(functools.partial(self._usage_end, chunk))  # held as enforce

    # ------------------------------------------------------------------ outcome, answer
    def final_usage(self) -> dict[str, Any]:
        if self.carry.attempt == 0 and not self.gave_up:
            return super().final_usage()
        prompt = (
            self.carry.prompt_tokens if self.carry.prompt_tokens is not None else self.prompt_tokens
        )
        return chunks.chat_usage(prompt, self.answer_tokens())

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
        state = self.choices.get(0)
        if state is None:
            state = self.new_block(0)
        own = state.pieces if self.cut is None else cut_pieces(state.pieces, self.cut)
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
