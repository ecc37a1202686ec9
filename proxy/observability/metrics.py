"""Prometheus metrics: a quality registry and an infrastructure registry, never mixed.

Two registries because they answer to different people and scrape intervals: ``/metrics``
(``guard_proxy_*``, process and upstream-config metrics) is the usual service health a platform
team scrapes everywhere; ``/metrics/quality`` (``guard_*`` without the ``proxy_`` part) is the
model/decoding plane, whose names are a contract with dashboards, alerts and users' queries.
A family lives in exactly one of them (tests check it).

Hot-path rules this module keeps: quality metrics are touched once per stream end
(:meth:`Metrics.record_generation`), infra metrics through a handful of cheap counters, nothing
per token; labelled children are cached and label values bounded (:mod:`.labels`); model names
are bounded further by the engine's own ``/v1/models`` once the engine watcher has read it
(:meth:`Metrics.set_engine_models`). With several workers the counts are merged across processes
(:mod:`.multiprocess`).
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Sequence
from typing import Any, Final

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    ProcessCollector,
    disable_created_metrics,
    generate_latest,
)
from prometheus_client.exposition import choose_encoder

from proxy.core.channels import CHANNELS
from proxy.core.records import ChoiceRecord, GenerationRecord
from proxy.core.requested_language import SOURCES, STRENGTHS
from proxy.detect import SIGNALS
from proxy.observability.labels import OTHER, CappedLabel, Children, fixed
from proxy.observability.multiprocess import (
    MULTIPROC_ENV,
    MultiProcessFamilies,
    family_names,
    multiprocess_enabled,
)

CONTENT_TYPE: Final = "text/plain; version=0.0.4; charset=utf-8"

OUTCOMES: Final = frozenset({"completed", "aborted", "client_disconnected", "upstream_error"})
ENDPOINTS: Final = frozenset({"chat", "completions", "responses", "messages"})
DETECTION_ACTIONS: Final = frozenset({"aborted", "observed", "healed"})
MAX_TOKENS_ACTIONS: Final = frozenset({"defaulted", "clamped", "rejected"})
LANGUAGE_SOURCES: Final = frozenset(SOURCES)
LANGUAGE_STRENGTHS: Final = frozenset(STRENGTHS)
UPSTREAM_ERROR_KINDS: Final = frozenset({"connect", "timeout", "status", "protocol", "disconnect"})
CLIENT_TIMEOUT_KINDS: Final = frozenset({"write", "deadline"})
#: What vLLM and the OpenAI enum can say, ``none`` for a choice that ended without one, and
#: ``guard`` for every choice the guard aborted: whatever finish_reason the client was sent
#: (``GUARD_ABORT_FINISH_REASON`` may be ``length``), so ``length`` keeps meaning "hit max_tokens".
FINISH_REASONS: Final = frozenset({
    "stop", "length", "tool_calls", "function_call", "content_filter", "abort", "error",
    "repetition", "none", "guard",
})  # fmt: skip

_SIGNALS: Final = frozenset(SIGNALS)
_CHANNELS: Final = frozenset(CHANNELS)

# Token counts: 16 .. 131072 by powers of two (a 128K context is the longest common limit).
TOKEN_BUCKETS: Final = tuple(float(2**i) for i in range(4, 18))
# Distinct-word ratio, in [0, 1].
UNIT_BUCKETS: Final = (0.05, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 0.95, 1.0)
# Repetition score: how many times the periodic tail repeats (the detector fires at
# GUARD_REPETITION_MIN_REPEATS, 4 by default); healthy text stays near 1-2.
REPEAT_BUCKETS: Final = (1.0, 1.5, 2.0, 2.5, 3.0, 4.0, 5.0, 6.0, 8.0, 10.0, 15.0, 20.0, 50.0)
# Shannon entropy of the next-token distribution, nats; near 0 is collapse.
ENTROPY_BUCKETS: Final = (0.05, 0.1, 0.25, 0.5, 0.75, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, 8.0)
DURATION_BUCKETS: Final = (
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0,
)  # fmt: skip
TTFT_BUCKETS: Final = (
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
)  # fmt: skip

# ``*_created`` samples: in the 0.0.4 text format Prometheus 2.x stores them as separate gauge
# series, doubling the series count for nothing a dashboard uses. Process-wide by design (this is
# the proxy's own process; prometheus-client only has the global switch).
disable_created_metrics()  # type: ignore[no-untyped-call]

_GLOB = re.compile(r"[*?\[]")


class Metrics:
    """All metrics of one proxy process; the relay calls only the methods below."""

    def __init__(self, *, max_models: int = 20, models: Sequence[str] = ()) -> None:
        self.quality_registry = CollectorRegistry(auto_describe=True)
        self.infra_registry = CollectorRegistry(auto_describe=True)
        self._model = CappedLabel(max_models, models)
        self._configured_models = tuple(models)
        self._engine_models: frozenset[str] | None = None
        self._language = CappedLabel(32)
        self._route = CappedLabel(32)
        self._dtype = CappedLabel(8)
        q = self.quality_registry
        model_signal = ("model", "signal")

        self._generations = Children(
            Counter(
                "guard_generations",
                "Generations (requests) that ended, by outcome.",
                ("model", "endpoint", "outcome"),
                registry=q,
            )
        )
        self._detections = Children(
            Counter(
                "guard_detections",
                "Choices judged degenerate, by signal; action=observed in monitor mode and for "
                "a verdict that came when nothing was left to stop. A streamed answer counts "
                "when a check fired while it streamed or when it ended; the end-of-stream "
                "language judgement sentence by sentence (answers too short for the streaming "
                "drift check) runs on non-streamed answers only.",
                ("model", "signal", "action"),
                registry=q,
            )
        )
        self._channel_detections = Children(
            Counter(
                "guard_channel_detections",
                "Choices judged degenerate, by the channel the verdict fired on: content (the "
                "answer), reasoning (the thinking) or tool (tool-call arguments).",
                ("model", "channel", "action"),
                registry=q,
            )
        )
        self._abort_position = Children(
            Histogram(
                "guard_abort_position_tokens",
                "Completion tokens generated when degeneration was detected.",
                model_signal,
                buckets=TOKEN_BUCKETS,
                registry=q,
            )
        )
        self._completion_tokens = Children(
            Histogram(
                "guard_completion_tokens",
                "Generated length per choice, in tokens.",
                ("model",),
                buckets=TOKEN_BUCKETS,
                registry=q,
            )
        )
        self._finish_reason = Children(
            Counter(
                "guard_finish_reason",
                "Choices by finish_reason; guard = aborted by the guard.",
                ("model", "finish_reason"),
                registry=q,
            )
        )
        self._tokens_saved = Children(
            Counter(
                "guard_tokens_saved",
                "max_tokens minus tokens generated, summed over aborted choices.",
                ("model",),
                registry=q,
            )
        )
        self._max_tokens_rewritten = Children(
            Counter(
                "guard_max_tokens_rewritten",
                "Requests whose token limit the guard set (defaulted), lowered (clamped) or "
                "refused (rejected).",
                ("model", "action"),
                registry=q,
            )
        )
        self._language_constraint = Children(
            Counter(
                "guard_language_constraint",
                "Requests into which a language instruction was injected.",
                ("model", "language"),
                registry=q,
            )
        )
        self._language_expectation = Children(
            Counter(
                "guard_language_expectation",
                "Guarded requests by where the expected answer language came from: the client's "
                "request (header or instruction), the prompt's language, the configuration, or "
                "none; and how sure (strong: that language; weak: the prompt's and those named).",
                ("model", "source", "strength"),
                registry=q,
            )
        )
        self._repetition = Children(
            Histogram(
                "guard_repetition_score",
                "Worst-window repetition score per choice (repeats of the periodic tail).",
                ("model",),
                buckets=REPEAT_BUCKETS,
                registry=q,
            )
        )
        self._diversity = Children(
            Histogram(
                "guard_lexical_diversity",
                "Worst-window lexical diversity per choice (distinct/total; low = looping).",
                ("model",),
                buckets=UNIT_BUCKETS,
                registry=q,
            )
        )
        self._entropy = Children(
            Histogram(
                "guard_token_entropy",
                "Worst-window mean token entropy per choice, nats (low = collapsed).",
                ("model",),
                buckets=ENTROPY_BUCKETS,
                registry=q,
            )
        )

        self._heals = Children(
            Counter(
                "guard_heals",
                "Choices heal mode continued after a verdict (at least one continuation).",
                ("model",),
                registry=q,
            )
        )
        self._heal_attempts = Children(
            Counter(
                "guard_heal_attempts",
                "Continuation requests heal mode sent.",
                ("model",),
                registry=q,
            )
        )
        self._heal_successes = Children(
            Counter(
                "guard_heal_successes",
                "Healed choices whose last continuation ended with stop and no verdict.",
                ("model",),
                registry=q,
            )
        )
        self._heal_discarded = Children(
            Counter(
                "guard_heal_discarded_tokens",
                "Generated tokens heal mode cut away (the loop after its onset).",
                ("model",),
                registry=q,
            )
        )

        i = self.infra_registry
        self._requests = Children(
            Counter(
                "guard_proxy_requests",
                "HTTP requests through the proxy, by route and status.",
                ("route", "status"),
                registry=i,
            )
        )
        self._duration = Children(
            Histogram(
                "guard_proxy_request_duration_seconds",
                "Request duration through the proxy, to the last byte.",
                ("route",),
                buckets=DURATION_BUCKETS,
                registry=i,
            )
        )
        self._ttft = Histogram(
            "guard_proxy_time_to_first_token_seconds",
            "From request received to first content byte relayed to the client.",
            buckets=TTFT_BUCKETS,
            registry=i,
        )
        self._in_flight = Gauge(
            "guard_proxy_streams_in_flight",
            "Streams being relayed now.",
            registry=i,
            multiprocess_mode="livesum",
        )
        self._upstream_errors = Children(
            Counter(
                "guard_proxy_upstream_errors",
                "Upstream failures, by kind.",
                ("kind",),
                registry=i,
            )
        )
        self._client_timeouts = Children(
            Counter(
                "guard_proxy_client_timeouts",
                "Requests ended by a bound: write = the client accepted no bytes for "
                "GUARD_CLIENT_WRITE_TIMEOUT, deadline = GUARD_REQUEST_DEADLINE passed.",
                ("kind",),
                registry=i,
            )
        )
        self._kv_dtype = Children(
            Gauge(
                "guard_upstream_kv_cache_dtype_info",
                "KV cache dtype the upstream vLLM reports (1 = current).",
                ("cache_dtype",),
                registry=i,
                multiprocess_mode="livemax",
            )
        )
        self._kv_dtypes_set: set[str] = set()
        self._usage_fallback = Gauge(
            "guard_proxy_usage_options_fallback",
            "1 while guarded requests go upstream without the usage stream options because the "
            "engine rejected them (exact token counts off; re-probed after a while).",
            registry=i,
            multiprocess_mode="livemax",
        )
        self._config_scrapes = Children(
            Counter(
                "guard_proxy_upstream_config_scrapes",
                "Scrapes of the upstream's /metrics for its configuration, by result.",
                ("result",),
                registry=i,
            )
        )

        self._multiprocess_path = os.environ[MULTIPROC_ENV] if multiprocess_enabled() else None
        if self._multiprocess_path is None:
            # Process CPU and memory: only meaningful per process, so single-worker only.
            ProcessCollector(registry=i)
        self._render_quality = self._renderer(self.quality_registry)
        self._render_infra = self._renderer(self.infra_registry)

    @classmethod
    def from_settings(cls, settings: Any) -> Metrics:
        """Cap from ``GUARD_METRICS_MAX_MODELS``; models named in sampling defaults come first
        (exact names only: those keys may be globs)."""
        models = [m for m in getattr(settings, "sampling_defaults", {}) if not _GLOB.search(m)]
        return cls(max_models=settings.metrics_max_models, models=models)

    def _renderer(self, registry: CollectorRegistry) -> CollectorRegistry:
        if self._multiprocess_path is None:
            return registry
        merged = CollectorRegistry(auto_describe=False)
        merged.register(MultiProcessFamilies(self._multiprocess_path, family_names(registry)))
        return merged

    # -- rendering ---------------------------------------------------------------------------

    def render_quality(self, accept: str = "") -> tuple[bytes, str]:
        """Exposition of the quality registry for ``GET /metrics/quality``: (body, content type);
        OpenMetrics, with the verdict counters' trace exemplars, when ``accept`` asks for it."""
        encode, content_type = choose_encoder(accept)
        return encode(self._render_quality), content_type

    def render_infra(self) -> tuple[bytes, str]:
        """Exposition of the infrastructure registry for ``GET /metrics``."""
        return generate_latest(self._render_infra), CONTENT_TYPE

    # -- quality plane -----------------------------------------------------------------------

    def set_engine_models(self, models: Iterable[str]) -> None:
        """The models the engine lists (``/v1/models``): from now on only these and the ones
        configured (GUARD_SAMPLING_DEFAULTS) get a ``model`` label; anything else is ``other``.
        Called by the engine watcher on every successful read; a no-op when nothing changed."""
        listed = frozenset(models)
        if listed == self._engine_models:
            return
        self._engine_models = listed
        self._model.restrict(listed | set(self._configured_models))

    def model_label(self, model: str | None) -> str:
        """The label value ``model`` gets (capped); exposed for callers that cache per model."""
        return self._model(model)

    def record_generation(self, record: GenerationRecord) -> None:
        """Once per request, when its stream ends (any outcome)."""
        model = self._model(record.model)
        self._generations(
            model, fixed(record.endpoint, ENDPOINTS), fixed(record.outcome, OUTCOMES)
        ).inc()
        trace = {"trace_id": record.trace_id} if record.trace_id else None
        for choice in record.choices:
            self._record_choice(model, choice, trace)

    def _record_choice(
        self, model: str, choice: ChoiceRecord, trace: dict[str, str] | None
    ) -> None:
        action = choice.detection_action
        if action == "aborted":
            reason = "guard"
        elif choice.finish_reason is None:
            reason = "none"
        else:
            reason = fixed(choice.finish_reason, FINISH_REASONS)
        self._finish_reason(model, reason).inc()
        self._completion_tokens(model).observe(choice.completion_tokens)

        summary = choice.summary
        if summary is not None:
            if summary.repetition_score is not None:
                self._repetition(model).observe(summary.repetition_score)
            if summary.lexical_diversity is not None:
                self._diversity(model).observe(summary.lexical_diversity)
            if summary.token_entropy is not None:
                self._entropy(model).observe(summary.token_entropy)
            verdict = summary.verdict
            if verdict is not None and action is not None:
                signal = fixed(verdict.signal, _SIGNALS)
                act = fixed(action, DETECTION_ACTIONS)
                self._detections(model, signal, act).inc(exemplar=trace)
                self._channel_detections(model, fixed(verdict.channel, _CHANNELS), act).inc()
                self._abort_position(model, signal).observe(verdict.fired_at_token)

        if action == "aborted" and choice.max_tokens is not None:
            saved = choice.max_tokens - choice.completion_tokens
            if saved > 0:
                self._tokens_saved(model).inc(saved)

    def heal_finished(
        self,
        model: str,
        *,
        attempts: int,
        success: bool,
        discarded: int,
        trace_id: str | None = None,
    ) -> None:
        """Once per healed choice (``attempts`` continuations; ``trace_id`` as an exemplar)."""
        label = self._model(model)
        if attempts > 0:
            self._heals(label).inc(exemplar={"trace_id": trace_id} if trace_id else None)
            self._heal_attempts(label).inc(attempts)
        if success:
            self._heal_successes(label).inc()
        if discarded > 0:
            self._heal_discarded(label).inc(discarded)

    def max_tokens_rewritten(self, model: str, action: str) -> None:
        """action in defaulted | clamped | rejected."""
        self._max_tokens_rewritten(self._model(model), fixed(action, MAX_TOKENS_ACTIONS)).inc()

    def language_constraint(self, model: str, language: str) -> None:
        """A language instruction was injected into the request."""
        self._language_constraint(self._model(model), self._language(language.lower())).inc()

    def language_expectation(self, model: str, source: str, strength: str = "none") -> None:
        """source in request | prompt | config | none, strength in strong | weak | none
        (:data:`proxy.core.requested_language.SOURCES`, ``STRENGTHS``)."""
        source, strength = fixed(source, LANGUAGE_SOURCES), fixed(strength, LANGUAGE_STRENGTHS)
        self._language_expectation(self._model(model), source, strength).inc()

    # -- infrastructure ----------------------------------------------------------------------

    def request_finished(self, route: str, status: int, seconds: float) -> None:
        """Infra: every HTTP request through the proxy; route is a small fixed set."""
        route_label = self._route(route)
        status_label = str(status) if 100 <= status <= 599 else OTHER
        self._requests(route_label, status_label).inc()
        self._duration(route_label).observe(seconds)

    def time_to_first_token(self, seconds: float) -> None:
        """Infra: from request received to first content byte relayed to the client."""
        self._ttft.observe(seconds)

    def stream_opened(self) -> None:
        """Infra: in-flight streams gauge up."""
        self._in_flight.inc()

    def stream_closed(self) -> None:
        """Infra: in-flight streams gauge down."""
        self._in_flight.dec()

    def upstream_error(self, kind: str) -> None:
        """Infra: kind in connect | timeout | status | protocol | disconnect."""
        self._upstream_errors(fixed(kind, UPSTREAM_ERROR_KINDS)).inc()

    def client_timeout(self, kind: str) -> None:
        """Infra: kind in write | deadline."""
        self._client_timeouts(fixed(kind, CLIENT_TIMEOUT_KINDS)).inc()

    def upstream_kv_cache_dtype(self, cache_dtype: str) -> None:
        """The upstream's current KV cache dtype: its series is 1, any earlier one drops to 0."""
        current = self._dtype(cache_dtype)
        for old in self._kv_dtypes_set - {current}:
            self._kv_dtype(old).set(0)
        self._kv_dtypes_set.add(current)
        self._kv_dtype(current).set(1)

    def usage_options_fallback(self, active: bool) -> None:
        """Infra: the engine rejected the usage stream options (1) or takes them again (0)."""
        self._usage_fallback.set(1 if active else 0)

    def upstream_config_scrape(self, result: str) -> None:
        """result in ok | error | not_vllm (the upstream's /metrics had no vLLM config)."""
        self._config_scrapes(fixed(result, frozenset({"ok", "error", "not_vllm"}))).inc()
