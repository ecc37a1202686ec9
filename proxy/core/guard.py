"""The guard's per-request state machine: upstream SSE bytes in, client bytes out.

Pure and synchronous (no sockets, no asyncio): the app's I/O loop hands each upstream read to
:meth:`StreamGuard.feed`, writes what it returns, and stops reading (closing the upstream, which
makes vLLM abort the request and free its KV cache) as soon as :attr:`StreamGuard.done` says so.

One state machine serves every generation surface. What is common lives here: SSE parsing, one
:class:`BlockState` (a detector and its counts) per unit of text the surface defines, the end of
the stream (terminal event, upstream failure, EOF), the outcome and the records. What differs per
surface is a :class:`Surface`: how text is read out of an event and which detector it feeds, which
events end the stream on a verdict, how an upstream failure is written, and how a non-streamed
answer is rebuilt (:mod:`proxy.core.reassemble`).

Chat and completions (this module, the hot path): per event the JSON is parsed once, each choice's
new text goes to that choice's own detector, and the upstream bytes are forwarded untouched unless
they must change: usage the client did not ask for is removed, and an aborted choice's last chunk
is rewritten to end it (``finish_reason``, ``stop_reason: "coherence_guard:<signal>"`` and the
``guard`` object). With ``n > 1`` an aborted choice ends alone; the stream ends when no live
choice remains. The Responses and Messages surfaces are in :mod:`proxy.core.surfaces`.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable
from typing import Any

import orjson

from proxy.core import channels, chunks
from proxy.core.channels import BlockState, Channel, feed_channel
from proxy.core.chunks import ENGINE_REPETITION, Piece
from proxy.core.policy import GuardPolicy, Mode
from proxy.core.reassemble import collect_extra, collect_pieces
from proxy.core.records import ChoiceRecord, Endpoint, Outcome
from proxy.core.relay_types import Surface
from proxy.core.sse import DONE, DONE_EVENT, SSEParser, encode_data
from proxy.core.surfaces import surface_for
from proxy.core.surfaces.chat import ChatSurface
from proxy.core.usage_book import UsageBook
from proxy.detect import Detector, Verdict
from proxy.errors import GuardError, UpstreamError

__all__ = ["BlockState", "ChoiceState", "GuardPolicy", "Mode", "StreamGuard", "Surface"]


#: The name the chat relay has always used.
ChoiceState = BlockState


#: A surface's byte-level path: ``(guard, read, pos)`` → the client bytes for the whole event at
#: ``pos`` and where it ends, the same state changes as parsing it; or ``None``, having touched
#: nothing, when the general path must decide.
Quick = Callable[["StreamGuard", bytes, int], "tuple[bytes, int] | None"]
#: A surface's handler of one parsed event (:meth:`Surface.event`, bound to the surface).
SurfaceEvent = Callable[["StreamGuard", bytes, "bytes | None"], bytes]


class StreamGuard(UsageBook):
    """One request's relay state; see the module docstring.

    ``policy`` says how to relay, ``make_detector`` builds one detector per block; ``surface``
    defaults to the one ``policy.endpoint`` names.
    """

    #: Called with the block the moment its verdict fires (the shell's tracing sets it; only
    #: verdicts pay for it, never a chunk).
    on_verdict: Callable[[BlockState], None] | None = None
    #: Set where a subclass judges a block's finish itself (a heal continuation), so that
    #: :meth:`judge_finish` leaves it alone.
    judges_own_finish = False

    def __init__(
        self,
        policy: GuardPolicy,
        make_detector: Callable[[], Detector],
        surface: Surface | None = None,
    ) -> None:
        self.policy = policy
        self.mode = policy.mode
        self.n = policy.n
        self._make_detector = make_detector
        self.surface: Surface = surface or surface_for(policy.endpoint)
        #: The handler of each parsed event: ``None`` for chat's own, :meth:`_event` (a method,
        #: which a subclass extends, and one call fewer on the hot path), else the surface's.
        #: An attribute, never a method assigned to the instance, so the class may be compiled.
        self._surface_event: SurfaceEvent | None = (
            None if isinstance(self.surface, ChatSurface) else self.surface.event
        )
        self.parser = SSEParser(policy.max_event_bytes)
        #: The surface's byte-level path for whole events it reads without parsing (chat's plain
        #: text chunks, the text deltas of Responses and Messages; see :data:`Quick`), only for
        #: a stream (a non-streamed answer keeps every piece, so it always parses).
        self._quick: Quick | None = None if policy.collect else getattr(self.surface, "quick", None)
        self.choices: dict[int, BlockState] = {}
        self.done = False
        #: The stream's terminal event arrived (``[DONE]``, ``response.completed``, ...).
        self.saw_done = False
        self.aborted = False
        self.error: dict[str, Any] | None = None
        self._last_prompt_tokens: int | None = None
        self._last_usage: dict[str, Any] | None = None
        #: The last plain text chunk that carried usage, read lazily (see :attr:`usage`).
        self._fast_usage: re.Match[bytes] | None = None
        self.template: dict[str, Any] | None = None
        self.first_content = False
        #: Per-surface state (the Responses/Messages surfaces keep theirs here).
        self.extra: Any = None
        self._ended_count = 0
        #: Whether an answer's drift is judged sentence by sentence when it ends. A streamed
        #: answer is judged too, at its finish event (:meth:`judge_finish`): its text has
        #: reached the client, but its finish reason, the metrics and heal still take the
        #: verdict, so the proxy and ``coherence-guard score`` agree on every answer.
        self.end_drift = True
        #: The ending of an aborted stream, held until the shell has asked the engine for the
        #: prompt's count (see :meth:`ending`); written by :meth:`release`.
        self.held: Callable[[], bytes] | None = None

    def new_block(self, index: int) -> BlockState:
        detector = self._make_detector()
        if not self.end_drift:
            detector.end_drift = False
        state = self.choices[index] = BlockState(index, detector)
        return state

    def feed_text(
        self, state: BlockState, text: str, channel: Channel = "content"
    ) -> Verdict | None:
        """One token of a surface's text, on ``channel``, to its block's detector for that
        channel; the verdict when it asks the stream to end here (``enforce``: state marked
        aborted, the guard done), else ``None``. The surfaces (:mod:`proxy.core.surfaces`) write
        their own ending events around it."""
        self.first_content = True
        state.tokens += 1
        verdict = feed_channel(state, channel, text, 1, None)
        state.chars += len(text)
        if verdict is None or state.verdict is not None:
            return None
        state.verdict = verdict
        state.trigger_text = text
        if self.on_verdict is not None:
            self.on_verdict(state)
        if self.mode != "enforce":
            state.action = "observed"
            return None
        state.action = "aborted"
        self.aborted = True
        self.done = True
        return verdict

    # ------------------------------------------------------------------ streaming
    def feed(self, data: bytes) -> bytes:
        """Bytes to send the client for this upstream read (possibly empty)."""
        if self.done:
            return b""
        quick = self._quick
        if quick is not None and not self.parser.pending:
            got = quick(self, data, 0)
            if got is not None:
                out, end = got
                if end == len(data) or self.done:
                    return out  # the usual read: one event
                return self._quick_rest(quick, data, end, out)
        return self._parse(data)

    def _quick_rest(self, quick: Quick, data: bytes, pos: int, first: bytes) -> bytes:
        """A read of several events (the engine ran ahead of the relay) after its first: each
        whole event the byte-level path reads, then the rest parsed from the first it does not
        (the parser holds nothing: every event before ``pos`` was whole)."""
        out = [first]
        end = len(data)
        while pos < end and not self.done:
            got = quick(self, data, pos)
            if got is None:
                out.append(self._parse(data[pos:]))
                break
            out.append(got[0])
            pos = got[1]
        return b"".join(out)

    def _parse(self, data: bytes) -> bytes:
        """The general path: SSE split, then each event by :meth:`_event`."""
        events = self.parser.feed(data)
        if not events:
            return b""
        other = self._surface_event
        if len(events) == 1:
            ev = events[0]
            return self._event(ev.raw, ev.data) if other is None else other(self, ev.raw, ev.data)
        out = []
        for ev in events:
            if self.done:
                break
            out.append(
                self._event(ev.raw, ev.data) if other is None else other(self, ev.raw, ev.data)
            )
        return b"".join(out)

    def _event(self, raw: bytes, data: bytes | None) -> bytes:
        if data is None:
            return raw
        if data == DONE:
            self.saw_done = True
            self.done = True
            return raw
        try:
            chunk = orjson.loads(data)
        except orjson.JSONDecodeError:
            return raw
        if type(chunk) is not dict:
            return raw
        usage = chunk.get("usage")
        if usage is not None:
            if type(usage) is dict:
                self._note_usage(usage)
            else:
                usage = None
        choices = chunk.get("choices")
        if type(choices) is not list:
            if "error" in chunk:
                err = chunk["error"]
                self.error = err if isinstance(err, dict) else {"message": str(err)}
            return raw
        if not choices:
            # The final usage chunk.
            if usage is not None and self.policy.strip_final_usage:
                return b""
            return raw
        if self.template is None:
            self.template = chunk

        modified = False
        stripped = False
        drop: list[dict[str, Any]] = []
        single = len(choices) == 1
        for choice in choices:
            if type(choice) is not dict:
                continue
            index = choice.get("index", 0)
            state = self.choices.get(index)
            if state is None:
                if type(index) is not int:
                    continue
                state = self.new_block(index)
            if state.ended:
                drop.append(choice)  # a choice the guard already ended (n > 1)
                continue
            text = chunks.choice_text(choice)
            if usage is not None and single:
                ct = usage.get("completion_tokens")
                tokens = ct - state.tokens if type(ct) is int and ct >= state.tokens else 1
            else:
                tokens = 1 if text else 0
            state.tokens += tokens
            verdict = None
            if text:
                self.first_content = True
                pieces = None
                if self.policy.collect:
                    pieces = chunks.choice_pieces(choice)
                    collect_pieces(state, pieces)
                lp = choice.get("logprobs")
                entries = None if lp is None else chunks.logprobs_entries(lp)
                if not chunks.has_side_text(choice):
                    verdict = state.detector.feed(text, tokens=tokens, logprobs=entries)
                    if verdict is not None and state.side is not None:
                        verdict = state.side.place(verdict, "content")
                    state.chars += len(text)
                else:
                    verdict = self._feed_pieces(
                        state, pieces or chunks.choice_pieces(choice), tokens, entries
                    )
            if self.policy.collect:
                collect_extra(state, choice, strip_logprobs=self.policy.strip_logprobs)
            if (
                verdict is not None
                and state.verdict is None
                and self._on_verdict(state, choice, verdict, text)
            ):
                modified = True
                continue
            finish = choice.get("finish_reason")
            if finish is not None:
                if finish != ENGINE_REPETITION:
                    ended = self.judge_finish(state)
                    if ended is not None:
                        reason = self.policy.abort_finish_reason
                        chunks.mark_aborted(choice, ended, reason, state.tokens)
                        finish = reason
                        modified = True
                self._end(state, str(finish), choice.get("stop_reason"))
                if finish == ENGINE_REPETITION and self.policy.map_engine_repetition:
                    choice["finish_reason"] = self.policy.abort_finish_reason
                    modified = True

        if self.policy.strip_logprobs:
            for choice in choices:
                if type(choice) is dict and choice.get("logprobs") is not None:
                    choice["logprobs"] = None
                    stripped = True
        if drop:
            chunk["choices"] = [c for c in choices if not any(c is d for d in drop)]
            modified = True
            if not chunk["choices"]:
                return self._maybe_finish(b"")
        if modified:
            if self.policy.strip_chunk_usage:
                if self.policy.usage_null:
                    chunk["usage"] = None
                else:
                    chunk.pop("usage", None)
            out = encode_data(orjson.dumps(chunk))
        elif stripped:
            nulled = chunks.null_logprobs(data)
            if nulled is None:
                nulled = orjson.dumps(chunk)  # a layout the byte cut does not know
            if usage is not None and self.policy.strip_chunk_usage:
                nulled = chunks.strip_usage(nulled, chunk, null=self.policy.usage_null)
            out = encode_data(nulled)
        elif usage is not None and self.policy.strip_chunk_usage:
            out = encode_data(chunks.strip_usage(data, chunk, null=self.policy.usage_null))
        else:
            return raw if not self.aborted else self._maybe_finish(raw)
        return self._maybe_finish(out)

    @staticmethod
    def _feed_pieces(
        state: BlockState, pieces: list[Piece], tokens: int, entries: list[Any] | None
    ) -> Verdict | None:
        """A delta that writes outside the answer: each piece to its channel's register (the
        delta's tokens and logprobs go with its first piece); the first verdict."""
        verdict = None
        for piece in pieces:
            channel = channels.channel_of(piece.channel)
            found = feed_channel(state, channel, piece.text, tokens, entries)
            tokens, entries = 0, None
            state.chars += len(piece.text)
            if verdict is None:
                verdict = found
        return verdict

    def _on_verdict(
        self, state: BlockState, choice: dict[str, Any], verdict: Verdict, text: str
    ) -> bool:
        """Record the block's first verdict; in ``enforce`` end ``choice`` (returns True: the
        chunk changed)."""
        state.verdict = verdict
        state.trigger_text = text
        if self.on_verdict is not None:
            self.on_verdict(state)
        if self.mode == "enforce":
            state.action = "aborted"
            chunks.mark_aborted(choice, verdict, self.policy.abort_finish_reason, state.tokens)
            self._end(state, self.policy.abort_finish_reason, choice["stop_reason"])
            self.aborted = True
            return True
        state.action = "observed"
        return False

    def judge_finish(self, state: BlockState) -> Verdict | None:
        """The block's end-of-answer judgement, as its finish arrives (once): what the
        streaming windows had too little text for (a short answer wholly in another language,
        a loop or salad in its last words; see :meth:`proxy.detect.Detector.finish`). The
        verdict is recorded on ``state``; returned when it asks for the guard's ending
        (``enforce``: the surface ends the block as an abort does, though nothing is left to
        stop), else ``None``."""
        if state.verdict is not None or state.summary is not None or self.judges_own_finish:
            return None
        verdict = state.finish(end_drift=True).verdict
        if verdict is None:
            return None
        state.verdict = verdict
        state.trigger_text = ""
        if self.on_verdict is not None:
            self.on_verdict(state)
        if self.mode != "enforce":
            state.action = "observed"
            return None
        state.action = "aborted"
        return verdict

    def _end(self, state: ChoiceState, finish_reason: str, stop_reason: Any) -> None:
        state.finish_reason = finish_reason
        state.stop_reason = stop_reason
        if not state.ended:
            state.ended = True
            self._ended_count += 1

    def _maybe_finish(self, out: bytes) -> bytes:
        """After a guard abort, end the client stream once no live choice remains."""
        if not self.aborted or self._ended_count < self.n:
            return out
        self.done = True
        if self.policy.client_wants_usage and self.template is not None:
            return out + self.ending(functools.partial(self._usage_end, self.template))
        return out + DONE_EVENT

    def _usage_end(self, template: dict[str, Any]) -> bytes:
        """The usage chunk (ids from ``template``) and ``[DONE]``: an aborted stream's end."""
        return encode_data(chunks.usage_chunk(template, self.final_usage())) + DONE_EVENT

    def final_usage(self) -> dict[str, Any]:
        completion = sum(s.tokens for s in self.choices.values())
        return chunks.chat_usage(self.prompt_tokens, completion)

    def upstream_failed(self, error: GuardError) -> bytes:
        """The upstream died mid-stream: the surface's error events, never a hang."""
        self.done = True
        self.error = error.to_dict()["error"]
        return self.surface.failure(self, error)

    def eof(self) -> bytes:
        """The upstream closed the body. A stream that ended without its terminal event
        (``[DONE]`` on chat) is an upstream failure; the bytes of an unterminated last event
        are dropped (see ``SSEParser.flush``)."""
        if self.done:
            return b""
        other = self._surface_event
        out = b"".join(
            self._event(ev.raw, ev.data) if other is None else other(self, ev.raw, ev.data)
            for ev in self.parser.close()
        )
        self.parser.flush()
        if self.done:
            return out
        return out + self.upstream_failed(
            UpstreamError("The upstream closed the stream before it was complete.")
        )

    # ------------------------------------------------------------------ outcome
    def outcome(self, *, client_gone: bool = False) -> Outcome:
        if self.aborted:
            return "aborted"
        if client_gone:
            return "client_disconnected"
        if self.error is not None or not self.saw_done:
            return "upstream_error"
        return "completed"

    def records(self, max_tokens: int | None) -> list[ChoiceRecord]:
        out = []
        for index in sorted(self.choices):
            st = self.choices[index]
            summary = st.finish(end_drift=self.end_drift)
            if st.action is None and summary.verdict is not None:
                st.action = "observed"  # judged when the choice ended: nothing left to stop
            out.append(
                ChoiceRecord(
                    index=index,
                    finish_reason=st.finish_reason,
                    completion_tokens=st.tokens,
                    summary=summary,
                    detection_action=st.action,
                    max_tokens=max_tokens,
                )
            )
        return out

    def response(self, endpoint: Endpoint | None = None, *, trim: bool) -> dict[str, Any]:
        """The answer the engine would have given a non-streaming client (see
        :mod:`proxy.core.reassemble`); an aborted block is cut at its onset when ``trim`` is set.
        ``endpoint`` may only repeat the policy's (chat and completions share a surface)."""
        if endpoint is not None and endpoint != self.policy.endpoint:
            raise ValueError(f"this guard relays {self.policy.endpoint}, not {endpoint}")
        return self.surface.response(self, trim)
