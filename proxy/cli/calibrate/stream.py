"""One streamed chat answer, read the way a client reads it, judged by the proxy's own detector.

``coherence-guard demo`` and ``coherence-guard calibrate`` both need the same thing from an
OpenAI-compatible server (the engine itself or the proxy in front of it): stream one chat
completion, count its tokens, keep the finish reason and the guard's finish object when there is
one, and feed each delta to a :class:`~proxy.detect.Detector` in monitor mode. When the detector
judges the answer degenerate the caller can hang up, so the engine stops generating the rest of a
loop nobody will read (closing the connection is what makes vLLM and llama.cpp free the slot).

Token positions: with ``stream_options.include_usage`` plus ``continuous_usage_stats`` (vLLM, and
the proxy, which asks the engine for it) every chunk carries the running ``completion_tokens``
and a delta counts what it adds; otherwise (llama.cpp) each content chunk is one token, which is
how llama-server streams.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import orjson

from proxy.core.sse import SSEParser

if TYPE_CHECKING:
    import httpx

    from proxy.detect import Detector


class StreamError(Exception):
    """The server answered with an HTTP error or an error event instead of a completion."""


@dataclass(slots=True)
class Answer:
    """What one streamed answer (choice 0) came to."""

    text: str = ""
    tokens: int = 0
    finish_reason: str | None = None
    #: The proxy's ``guard`` object from the last chunk, when the guard ended the choice.
    guard: dict[str, Any] | None = None
    #: The monitor detector's first verdict: signal and token position.
    signal: str | None = None
    degenerate_at: int | None = None
    #: True when the reader hung up after the detector's verdict (the engine stopped there).
    closed_on_verdict: bool = False
    seconds: float = 0.0
    usage: dict[str, Any] | None = field(default=None, repr=False)


#: Called with the tokens seen so far, for progress displays.
Progress = Callable[[int], None]


async def stream_chat(
    client: httpx.AsyncClient,
    body: dict[str, Any],
    *,
    detector: Detector | None = None,
    hang_up_on_verdict: bool = False,
    progress: Progress | None = None,
) -> Answer:
    """POST ``body`` (``stream`` and ``stream_options`` are set here) to ``/v1/chat/completions``
    and read the answer to its end, or to the detector's verdict if ``hang_up_on_verdict``."""
    request = {
        **body,
        "stream": True,
        "stream_options": {"include_usage": True, "continuous_usage_stats": True},
    }
    answer = Answer()
    parts: list[str] = []
    parser = SSEParser()
    started = time.monotonic()
    usage_tokens: int | None = None
    async with client.stream("POST", "/v1/chat/completions", json=request) as response:
        if response.status_code != 200:
            await response.aread()
            raise StreamError(f"HTTP {response.status_code}: {response.text[:300]}")
        done = False
        async for raw in response.aiter_raw():
            for event in parser.feed(raw):
                if event.data is None:
                    continue
                if event.is_done:
                    done = True
                    break
                chunk = orjson.loads(event.data)
                if "error" in chunk:
                    raise StreamError(str(chunk["error"].get("message", chunk["error"])))
                usage = chunk.get("usage")
                before = answer.tokens
                running = usage.get("completion_tokens") if isinstance(usage, dict) else None
                for choice in chunk.get("choices") or []:
                    if choice.get("index", 0) != 0:
                        continue
                    piece = (choice.get("delta") or {}).get("content") or ""
                    if piece:
                        parts.append(piece)
                        # A chunk without running usage is one token (llama.cpp streams so).
                        step = running - before if running is not None else 1
                        answer.tokens += max(step, 0)
                        if detector is not None:
                            verdict = detector.feed(piece, tokens=max(step, 0))
                            if verdict is not None:
                                answer.signal = verdict.signal
                                answer.degenerate_at = verdict.fired_at_token
                    if choice.get("finish_reason"):
                        answer.finish_reason = choice["finish_reason"]
                        guard = choice.get("guard")
                        answer.guard = guard if isinstance(guard, dict) else None
                if running is not None:
                    usage_tokens = running
                    answer.usage = usage
                if progress is not None and answer.tokens != before:
                    progress(answer.tokens)
                if hang_up_on_verdict and answer.degenerate_at is not None:
                    # Leaving the block closes the connection: the engine stops generating.
                    answer.closed_on_verdict = True
                    done = True
                    break
            if done:
                break
    answer.seconds = time.monotonic() - started
    answer.text = "".join(parts)
    if detector is not None and answer.degenerate_at is None and not answer.closed_on_verdict:
        summary = detector.finish()
        if summary.verdict is not None:
            answer.signal = summary.verdict.signal
            answer.degenerate_at = summary.verdict.fired_at_token
    if usage_tokens is not None and not answer.closed_on_verdict:
        answer.tokens = max(answer.tokens, usage_tokens)
    return answer
