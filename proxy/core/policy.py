"""How one request is relayed: the mode and every choice about the stream the guard writes,
resolved once before the first byte, so the hot path reads fields and never re-derives them.

:meth:`GuardPolicy.for_request` is the one place a rewritten request (:mod:`proxy.core.rewrite`)
and the settings become the policy of its :class:`proxy.core.guard.StreamGuard`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from proxy.core.chunks import ENGINE_REPETITION
from proxy.core.records import Endpoint
from proxy.core.sse import MAX_EVENT_BYTES

if TYPE_CHECKING:
    from proxy.core.rewrite import Rewrite


Mode = Literal["enforce", "monitor", "off", "heal"]


@dataclass(frozen=True, slots=True)
class GuardPolicy:
    """How one request is relayed, resolved once before the first byte (the hot path reads
    fields, it never re-derives them).

    ``strip_chunk_usage`` / ``strip_final_usage`` remove the per-chunk and the final usage the
    proxy asked for on its own account (``usage_null``: written as ``"usage": null``, as vLLM's
    completions chunks do, instead of removed); ``collect`` keeps the text for a non-streamed
    answer; ``map_engine_repetition`` shows vLLM's own ``repetition`` stop as
    ``abort_finish_reason``.
    """

    endpoint: Endpoint = "chat"
    mode: Mode = "enforce"
    n: int = 1
    abort_finish_reason: str = "content_filter"
    strip_chunk_usage: bool = False
    strip_final_usage: bool = False
    client_wants_usage: bool = True
    collect: bool = False
    usage_null: bool = False
    map_engine_repetition: bool = True
    #: GUARD_MAX_EVENT_BYTES: one SSE event larger than this ends the stream with an error.
    max_event_bytes: int = MAX_EVENT_BYTES
    #: The proxy asked for logprobs the client did not: fed to the detector, then each choice's
    #: ``logprobs`` is written ``null``, as the engine writes it when nobody asks.
    strip_logprobs: bool = False
    #: GUARD_RESPONSES_ABORT_EVENT: the event that ends an aborted Responses stream
    #: (``completed``: vLLM's own early-stop ending; ``incomplete``: ``response.incomplete``).
    abort_event: str = "completed"
    #: The shell can ask the engine for the prompt's count (GUARD_PROMPT_COUNT_TIMEOUT > 0): a
    #: streamed abort whose ending would carry usage without the engine's count holds that
    #: ending until the shell has asked (:attr:`StreamGuard.held`). Only aborts wait for it.
    hold_ending: bool = False

    @classmethod
    def create(
        cls,
        *,
        endpoint: Endpoint = "chat",
        mode: Mode = "enforce",
        n: int = 1,
        abort_finish_reason: str = "content_filter",
        strip_chunk_usage: bool = False,
        strip_final_usage: bool = False,
        client_wants_usage: bool = True,
        collect: bool = False,
        usage_null: bool = False,
        max_event_bytes: int = MAX_EVENT_BYTES,
        strip_logprobs: bool = False,
        abort_event: str = "completed",
        hold_ending: bool = False,
    ) -> GuardPolicy:
        """The policy with its derived fields filled in."""
        return cls(
            endpoint=endpoint,
            mode=mode,
            n=n,
            abort_finish_reason=abort_finish_reason,
            strip_chunk_usage=strip_chunk_usage,
            strip_final_usage=strip_final_usage,
            client_wants_usage=client_wants_usage,
            collect=collect,
            usage_null=usage_null,
            map_engine_repetition=mode != "off" and abort_finish_reason != ENGINE_REPETITION,
            max_event_bytes=max_event_bytes,
            strip_logprobs=strip_logprobs,
            abort_event=abort_event,
            hold_ending=hold_ending and not collect,
        )

    @classmethod
    def for_request(
        cls,
        endpoint: Endpoint,
        rw: Rewrite,
        mode: Mode,
        *,
        abort_finish_reason: str,
        injected_usage: bool,
        client_continuous: bool,
        max_event_bytes: int = MAX_EVENT_BYTES,
        abort_event: str = "completed",
        count_prompt: bool = False,
    ) -> GuardPolicy:
        """What the app relays for a rewritten request: ``injected_usage`` says the proxy asked
        for usage itself, ``client_continuous`` that the client asked for per-chunk usage,
        ``count_prompt`` that the shell can ask the engine for the prompt's count."""
        wants = rw.client_wants_usage and rw.client_stream
        return cls.create(
            endpoint=endpoint,
            mode=mode,
            n=rw.n,
            abort_finish_reason=abort_finish_reason,
            strip_chunk_usage=injected_usage and rw.client_stream and not client_continuous,
            strip_final_usage=injected_usage and rw.client_stream and not wants,
            client_wants_usage=wants,
            collect=not rw.client_stream,
            usage_null=endpoint == "completions",
            max_event_bytes=max_event_bytes,
            strip_logprobs=rw.injected_logprobs,
            abort_event=abort_event,
            hold_ending=count_prompt,
        )
