"""The guard's per-request state machine: upstream SSE bytes in, client bytes out.

Pure and synchronous (no sockets, no asyncio): the app's I/O loop hands each upstream read to
:meth:`StreamGuard.feed`, writes what it returns, and stops reading (closing the upstream, which
makes vLLM abort the request and free its KV cache) as soon as :attr:`StreamGuard.done` says so.

Per event the guard parses the JSON once, feeds each choice's new text to that choice's own
:class:`~proxy.detect.Detector`, and forwards the upstream bytes untouched unless it must change
them: usage the client did not ask for is removed, and an aborted choice's last chunk is
rewritten to end it (``finish_reason``, ``stop_reason: "coherence_guard:<signal>"`` and the
``guard`` object). With ``n > 1`` an aborted choice ends alone; the stream ends when no live
choice remains. The same object reassembles a non-streaming answer from the stream
(:meth:`StreamGuard.response`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

import orjson

from proxy import chunks
from proxy.chunks import Piece
from proxy.detect import Detector, Summary, Verdict
from proxy.errors import GuardError, UpstreamError
from proxy.records import ChoiceRecord, DetectionAction, Outcome
from proxy.sse import DONE, DONE_EVENT, SSEParser, encode_data

Mode = Literal["enforce", "monitor", "off"]

#: vLLM's own loop stop (``repetition_detection``): the engine did the guard's job, so the client
#: sees it as ``GUARD_ABORT_FINISH_REASON`` says while metrics keep the engine's reason.
ENGINE_REPETITION = "repetition"
Endpoint = Literal["chat", "completions"]


@dataclass(slots=True)
class ChoiceState:
    index: int
    detector: Detector
    tokens: int = 0
    chars: int = 0
    finish_reason: str | None = None
    stop_reason: Any = None
    verdict: Verdict | None = None
    action: DetectionAction | None = None
    ended: bool = False
    #: Non-streaming only: (offset of the piece in the detector's text, piece).
    pieces: list[tuple[int, Piece]] = field(default_factory=list)
    tools: dict[int, dict[str, Any]] = field(default_factory=dict)
    logprobs: list[Any] | None = None
    completion_logprobs: dict[str, list[Any]] | None = None
    summary: Summary | None = None
    #: The delta that made the detector fire (logged only with GUARD_LOG_TEXT=true).
    trigger_text: str | None = None


class StreamGuard:
    """One request's relay state; see the module docstring.

    ``strip_chunk_usage`` / ``strip_final_usage`` remove the per-chunk and the final usage the
    proxy asked for on its own account; ``collect`` keeps the text for :meth:`response`.
    """

    def __init__(
        self,
        *,
        mode: Mode,
        n: int,
        make_detector: Callable[[], Detector],
        abort_finish_reason: str = "content_filter",
        strip_chunk_usage: bool = False,
        strip_final_usage: bool = False,
        client_wants_usage: bool = True,
        collect: bool = False,
        usage_null: bool = False,
    ) -> None:
        self.mode = mode
        self.n = n
        self._make_detector = make_detector
        self.abort_finish_reason = abort_finish_reason
        self.strip_chunk_usage = strip_chunk_usage
        self.strip_final_usage = strip_final_usage
        self.client_wants_usage = client_wants_usage
        self.collect = collect
        #: Stripped usage becomes ``"usage": null`` (vLLM's completions chunks) instead of going.
        self.usage_null = usage_null
        self._map_engine_repetition = mode != "off" and abort_finish_reason != ENGINE_REPETITION
        self.parser = SSEParser()
        self.choices: dict[int, ChoiceState] = {}
        self.done = False
        self.saw_done = False
        self.aborted = False
        self.error: dict[str, Any] | None = None
        self.prompt_tokens: int | None = None
        self.usage: dict[str, Any] | None = None
        self.template: dict[str, Any] | None = None
        self.first_content = False
        self._ended_count = 0

    # ------------------------------------------------------------------ streaming
    def feed(self, data: bytes) -> bytes:
        """Bytes to send the client for this upstream read (possibly empty)."""
        if self.done:
            return b""
        events = self.parser.feed(data)
        if not events:
            return b""
        if len(events) == 1:
            return self._event(events[0].raw, events[0].data)
        out = []
        for ev in events:
            if self.done:
                break
            out.append(self._event(ev.raw, ev.data))
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
            if usage is not None and self.strip_final_usage:
                return b""
            return raw
        if self.template is None:
            self.template = chunk

        modified = False
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
                state = self.choices[index] = ChoiceState(index, self._make_detector())
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
                if self.collect:
                    self._collect(state, chunks.choice_pieces(choice))
                lp = choice.get("logprobs")
                verdict = state.detector.feed(
                    text,
                    tokens=tokens,
                    logprobs=None if lp is None else chunks.logprobs_content(choice),
                )
                state.chars += len(text)
            if self.collect:
                self._collect_extra(state, choice)
            if verdict is not None and state.verdict is None:
                state.verdict = verdict
                state.trigger_text = text
                if self.mode == "enforce":
                    state.action = "aborted"
                    chunks.mark_aborted(choice, verdict, self.abort_finish_reason, state.tokens)
                    self._end(state, self.abort_finish_reason, choice["stop_reason"])
                    self.aborted = True
                    modified = True
                    continue
                state.action = "observed"
            finish = choice.get("finish_reason")
            if finish is not None:
                self._end(state, str(finish), choice.get("stop_reason"))
                if finish == ENGINE_REPETITION and self._map_engine_repetition:
                    choice["finish_reason"] = self.abort_finish_reason
                    modified = True

        if drop:
            chunk["choices"] = [c for c in choices if not any(c is d for d in drop)]
            modified = True
            if not chunk["choices"]:
                return self._maybe_finish(b"")
        if modified:
            if self.strip_chunk_usage:
                if self.usage_null:
                    chunk["usage"] = None
                else:
                    chunk.pop("usage", None)
            out = encode_data(orjson.dumps(chunk))
        elif usage is not None and self.strip_chunk_usage:
            out = encode_data(chunks.strip_usage(data, chunk, null=self.usage_null))
        else:
            return raw if not self.aborted else self._maybe_finish(raw)
        return self._maybe_finish(out)

    def _note_usage(self, usage: dict[str, Any]) -> None:
        self.usage = usage
        pt = usage.get("prompt_tokens")
        if isinstance(pt, int):
            self.prompt_tokens = pt

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
        tail = [out]
        if self.client_wants_usage and self.template is not None:
            tail.append(encode_data(chunks.usage_chunk(self.template, self.final_usage())))
        tail.append(DONE_EVENT)
        return b"".join(tail)

    def final_usage(self) -> dict[str, Any]:
        completion = sum(s.tokens for s in self.choices.values())
        prompt = self.prompt_tokens or 0
        return {
            "prompt_tokens": prompt,
            "total_tokens": prompt + completion,
            "completion_tokens": completion,
        }

    def upstream_failed(self, error: GuardError) -> bytes:
        """The upstream died mid-stream: an SSE error event, then ``[DONE]``, never a hang."""
        self.done = True
        self.error = error.to_dict()["error"]
        return encode_data(error.to_json()) + DONE_EVENT

    def eof(self) -> bytes:
        """The upstream closed the body. A stream that ended without ``[DONE]`` is an upstream
        failure; the bytes of an unterminated last event are dropped (see ``SSEParser.flush``)."""
        if self.done:
            return b""
        out = b"".join(self._event(ev.raw, ev.data) for ev in self.parser.close())
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
            summary = st.summary if st.summary is not None else st.detector.finish()
            st.summary = summary
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

    # ------------------------------------------------------------------ non-streaming
    def _collect(self, state: ChoiceState, pieces: list[Piece]) -> None:
        offset = state.chars
        for p in pieces:
            state.pieces.append((offset, p))
            offset += len(p.text)

    def _collect_extra(self, state: ChoiceState, choice: dict[str, Any]) -> None:
        delta = choice.get("delta")
        if isinstance(delta, dict):
            calls = delta.get("tool_calls")
            if isinstance(calls, list):
                for call in calls:
                    if not isinstance(call, dict):
                        continue
                    ti = call.get("index", 0)
                    slot = state.tools.setdefault(ti if isinstance(ti, int) else 0, {})
                    for key in ("id", "type"):
                        if call.get(key) is not None:
                            slot[key] = call[key]
                    fn = call.get("function")
                    if isinstance(fn, dict) and fn.get("name"):
                        slot["name"] = fn["name"]
        lp = choice.get("logprobs")
        if isinstance(lp, dict):
            content = lp.get("content")
            if isinstance(content, list):
                state.logprobs = (state.logprobs or []) + content
            elif "tokens" in lp:
                acc = state.completion_logprobs or {}
                for key in ("text_offset", "token_logprobs", "tokens", "top_logprobs"):
                    val = lp.get(key)
                    if isinstance(val, list):
                        acc.setdefault(key, []).extend(val)
                state.completion_logprobs = acc

    def response(self, endpoint: Endpoint, *, trim: bool) -> dict[str, Any]:
        """The ``chat.completion`` / ``text_completion`` object vLLM would have answered with.

        An aborted choice is cut at the detector's ``onset_char`` when ``trim`` is set.
        """
        tpl = self.template or {}
        choices = []
        for index in range(max(self.n, max(self.choices, default=-1) + 1)):
            st = self.choices.get(index)
            if st is None:
                continue
            cut = None
            if trim and st.action == "aborted" and st.verdict is not None:
                cut = st.verdict.onset_char
            texts: dict[str, list[str]] = {}
            tool_args: dict[int, list[str]] = {}
            for offset, p in st.pieces:
                text = p.text
                if cut is not None:
                    if offset >= cut:
                        break
                    if offset + len(text) > cut:
                        text = text[: cut - offset]
                if p.channel == "tool":
                    tool_args.setdefault(p.tool_index, []).append(text)
                else:
                    texts.setdefault(p.channel, []).append(text)
            choice: dict[str, Any] = {"index": index}
            if endpoint == "chat":
                message: dict[str, Any] = {"role": "assistant"}
                message["content"] = "".join(texts["content"]) if "content" in texts else None
                for key in chunks.REASONING_KEYS:
                    if key in texts:
                        message[key] = "".join(texts[key])
                calls = []
                for ti in sorted(set(st.tools) | set(tool_args)):
                    slot = st.tools.get(ti, {})
                    calls.append(
                        {
                            "id": slot.get("id"),
                            "type": slot.get("type", "function"),
                            "function": {
                                "name": slot.get("name"),
                                "arguments": "".join(tool_args.get(ti, [])),
                            },
                        }
                    )
                message["tool_calls"] = calls
                choice["message"] = message
                choice["logprobs"] = {"content": st.logprobs} if st.logprobs is not None else None
            else:
                choice["text"] = "".join(texts.get("text", []))
                choice["logprobs"] = st.completion_logprobs
            finish = st.finish_reason
            if finish == ENGINE_REPETITION and self._map_engine_repetition:
                finish = self.abort_finish_reason
            choice["finish_reason"] = finish
            choice["stop_reason"] = st.stop_reason
            if st.action == "aborted" and st.verdict is not None:
                choice["guard"] = chunks.guard_object(st.verdict, st.tokens)
            choices.append(choice)
        out: dict[str, Any] = {
            "id": tpl.get("id"),
            "object": "chat.completion" if endpoint == "chat" else "text_completion",
            "created": tpl.get("created"),
            "model": tpl.get("model"),
            "choices": choices,
        }
        if self.aborted or self.usage is None:
            out["usage"] = self.final_usage()
        else:
            out["usage"] = self.usage
        return out
