"""The channels of one generated block and the register each is judged in.

A reasoning model writes two texts in one generation: its thinking (chat ``delta.reasoning`` /
``reasoning_content``, Responses ``response.reasoning_text.delta``, Messages ``thinking_delta``)
and its answer (``content``, completions ``text``, ``output_text``, ``text_delta``); a tool call
writes a third, its JSON arguments. They are different texts with different expectations:

* ``content`` — the answer. Judged as it always was, against the request's expected language.
* ``reasoning`` — the thinking. The model chooses the language it thinks in (most reasoning
  models think in English, or Chinese, whatever the question's language) and reasoning models
  switch that language mid-thought as a known trait ("language mixing", DeepSeek-R1 report), so
  none of the language signals judges it: no language drift, no word salad (both need an
  expected language, and the answer's is the wrong one here), and no script intrusion either
  (relative to the thinking's own first script it would call a thought that moves from English
  to Chinese, or quotes a Russian question at length, degenerate; neither costs the answer
  anything). Loops, floods, near-copies, low diversity, compression and entropy collapse are
  kept: a model looping in its thinking is the most expensive loop there is, as the thinking
  is usually the longest part of the generation and the client sees none of it.
* ``tool`` — tool-call arguments: JSON, in no natural language, so no language signal either;
  judged as structured output (repetition thresholds relaxed, as inside JSON), which still
  catches a call whose arguments loop.

Each channel has its own register (its own :class:`~proxy.detect.Detector`), so the switch from
thinking to answer is not itself a signal and one channel's text never dilutes another's window.
The answer's detector is the block's own (``BlockState.detector``: the relay's fast path for
plain content chunks is untouched); the other channels' detectors are made on their first text.

Offsets: every consumer of a verdict (the non-streamed answer's trim, heal's cut, the ``guard``
object) reads ``onset_char`` as an offset in the block's whole text (all channels in the order
they arrived), as it was when one detector read everything. :class:`SideChannels` remembers
where each side channel's text sits in that whole and maps a channel's own offsets back.

Pure: no I/O.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from proxy.detect import Detector, Summary, Verdict

if TYPE_CHECKING:
    from proxy.core.chunks import Piece
    from proxy.core.records import DetectionAction
    from proxy.detect import DetectorConfig

Channel = Literal["content", "reasoning", "tool"]
#: Every channel a verdict can fire on (a small fixed set, fit for a metric label).
CHANNELS: tuple[Channel, ...] = ("content", "reasoning", "tool")

#: The channel of each text field or delta type the surfaces read.
_CHANNEL_OF: dict[str, Channel] = {
    "content": "content",
    "text": "content",
    "text_delta": "content",
    "reasoning": "reasoning",
    "reasoning_content": "reasoning",
    "thinking_delta": "reasoning",
    "tool": "tool",
    "input_json_delta": "tool",
}


def channel_of(name: str) -> Channel:
    """The channel a surface's text field (``Piece.channel``, a delta type) belongs to; anything
    unknown is answer text, judged as the answer always was."""
    return _CHANNEL_OF.get(name, "content")


def side_config(config: DetectorConfig) -> DetectorConfig:
    """The thresholds of a non-answer channel: the answer's, with the language signals off
    (see the module docstring)."""
    return dataclasses.replace(
        config, language_drift=False, salad=False, script=False, turn_leak=False
    )


class SideChannels:
    """The non-answer channels of one block: their detectors and where their text sits in the
    block's whole text. Made on the block's first non-answer text; a block that only ever
    writes answer text never has one."""

    __slots__ = ("_config", "_ranges", "detectors")

    def __init__(self, config: DetectorConfig) -> None:
        self._config = side_config(config)
        self.detectors: dict[Channel, Detector] = {}
        #: ``[block_start, length, channel, local_start]`` per run of one side channel's text,
        #: in block order (consecutive pieces of one channel extend the last run).
        self._ranges: list[tuple[int, int, Channel, int]] = []

    def detector(self, channel: Channel) -> Detector:
        det = self.detectors.get(channel)
        if det is None:
            det = self.detectors[channel] = Detector(
                self._config, expected_language=None, structured=channel == "tool"
            )
        return det

    def note(self, channel: Channel, block_start: int, length: int) -> None:
        """``length`` characters of ``channel`` were fed at ``block_start`` in the block."""
        ranges = self._ranges
        if ranges:
            start, n, ch, local = ranges[-1]
            if ch == channel and start + n == block_start:
                ranges[-1] = (start, n + length, ch, local)
                return
        local = sum(n for _, n, ch, _ in ranges if ch == channel)
        ranges.append((block_start, length, channel, local))

    def to_block(self, channel: Channel, offset: int) -> int:
        """The block offset of ``offset`` in ``channel``'s own text."""
        if channel == "content":
            # The answer's text is everything the side channels did not write.
            at = offset
            for start, n, _, _ in self._ranges:
                if start > at:
                    break
                at += n
            return at
        end = 0
        total = 0
        for start, n, ch, local in self._ranges:
            if ch != channel:
                continue
            if offset < local + n:
                return start + max(0, offset - local)
            end = start + n
            total = local + n
        return end + (offset - total)

    def place(self, verdict: Verdict, channel: Channel) -> Verdict:
        """``verdict`` (from ``channel``'s detector) with its onset in block offsets and its
        channel named."""
        return dataclasses.replace(
            verdict, onset_char=self.to_block(channel, verdict.onset_char), channel=channel
        )


def merge(
    answer: Summary, side: SideChannels | None, verdict: Verdict | None, *, end_drift: bool = True
) -> Summary:
    """One summary for the block: characters and tokens summed over its channels, the worst
    window of each signal, and the block's verdict (``verdict``, the first that fired while
    streaming, already in block offsets; else the first channel whose end-of-stream judgement
    found one; ``end_drift`` as in :meth:`proxy.detect.Detector.finish`)."""
    found = verdict
    if side is None or not side.detectors:
        if found is None:
            found = answer.verdict
        return answer if found is answer.verdict else dataclasses.replace(answer, verdict=found)
    if found is None and answer.verdict is not None:
        found = side.place(answer.verdict, "content")
    parts = [answer]
    for channel, det in side.detectors.items():
        summary = det.finish(end_drift=end_drift)
        parts.append(summary)
        if found is None and summary.verdict is not None:
            found = side.place(summary.verdict, channel)
    return Summary(
        sum(p.chars for p in parts),
        sum(p.tokens for p in parts),
        _worst(max, [p.repetition_score for p in parts]),
        _worst(min, [p.lexical_diversity for p in parts]),
        _worst(min, [p.token_entropy for p in parts]),
        found,
    )


def _worst(pick: Callable[[list[float]], float], values: list[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return pick(present) if present else None


def feed_channel(
    state: BlockState, channel: Channel, text: str, tokens: int, logprobs: list[Any] | None
) -> Verdict | None:
    """``text`` to ``state``'s detector for ``channel`` (see :mod:`proxy.core.channels`); a verdict
    comes back with its onset in block offsets and its channel named. ``state.chars`` is the
    block offset of ``text`` (the caller adds its length after)."""
    if channel == "content":
        verdict = state.detector.feed(text, tokens=tokens, logprobs=logprobs)
        if verdict is not None and state.side is not None:
            verdict = state.side.place(verdict, "content")
        return verdict
    side = state.side
    if side is None:
        side = state.side = SideChannels(state.detector.config)
    side.note(channel, state.chars, len(text))
    verdict = side.detector(channel).feed(text, tokens=tokens, logprobs=logprobs)
    return None if verdict is None else side.place(verdict, channel)


@dataclass(slots=True)
class BlockState:
    """One unit of generated text with its own detector: a chat/completions choice, a Responses
    output item, an Anthropic message."""

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
    #: The thinking and tool-argument channels, each in its own register (``detector`` is the
    #: answer's); ``None`` until the block writes text outside its answer (see
    #: :mod:`proxy.core.channels`).
    side: SideChannels | None = None

    def finish(self, *, end_drift: bool = True) -> Summary:
        """The block's summary over all its channels, computed once when it ends;
        ``end_drift`` as in :meth:`Detector.finish`."""
        if self.summary is None:
            answer = self.detector.finish(end_drift=end_drift)
            self.summary = merge(answer, self.side, self.verdict, end_drift=end_drift)
        return self.summary
