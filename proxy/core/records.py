"""What the relay reports when a generation ends: plain data, built once per stream end.

The relay builds one :class:`GenerationRecord` per request (streaming or not) and hands it to
:meth:`proxy.observability.metrics.Metrics.record_generation`. Keeping this as data (not metric
calls spread through the relay) is what lets the hot path touch Prometheus exactly once per stream.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from proxy.detect import Summary

Outcome = Literal["completed", "aborted", "client_disconnected", "upstream_error"]
Endpoint = Literal["chat", "completions", "responses", "messages"]
DetectionAction = Literal["aborted", "observed", "healed"]


@dataclass(slots=True)
class ChoiceRecord:
    """One choice (``index``) of a generation, as it ended: a chat/completions choice, a
    Responses output item (``index`` = ``output_index``) or an Anthropic message (index 0).

    ``finish_reason`` is what the client saw (the guard's configured reason for an aborted
    choice, ``None`` if the stream ended without one). ``detection_action`` is set when the
    detector fired: ``aborted`` in enforce mode, ``observed`` in monitor mode, ``healed``
    when heal mode continued the choice.
    ``max_tokens`` is the effective limit sent upstream, for tokens-saved accounting.
    """

    index: int
    finish_reason: str | None
    completion_tokens: int
    summary: Summary | None
    detection_action: DetectionAction | None = None
    max_tokens: int | None = None


@dataclass(slots=True)
class GenerationRecord:
    model: str
    endpoint: Endpoint
    outcome: Outcome
    choices: list[ChoiceRecord] = field(default_factory=list)
    #: The request's trace (32 hex digits) when traces are on and it was sampled: the counters
    #: of its verdicts carry it as an OpenMetrics exemplar.
    trace_id: str | None = None
