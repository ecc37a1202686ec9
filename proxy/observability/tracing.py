"""OpenTelemetry traces: one span per guarded request, the guard's verdicts as its events.

Off unless the OpenTelemetry SDK's own variables ask for traces (``OTEL_EXPORTER_OTLP_ENDPOINT``,
``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`` or ``OTEL_TRACES_EXPORTER``; ``OTEL_SDK_DISABLED=true``
and ``OTEL_TRACES_EXPORTER=none`` switch it off): every other knob is the SDK's as well
(``OTEL_SERVICE_NAME``, ``OTEL_RESOURCE_ATTRIBUTES``, ``OTEL_TRACES_SAMPLER``, ``OTEL_BSP_*``,
``OTEL_EXPORTER_OTLP_HEADERS``, ``OTEL_PROPAGATORS``, …), so an operator configures the guard
the way they configure vLLM (``--otlp-traces-endpoint``) and every other traced service. The
SDK is an optional dependency (``coherence-guard[otel]``), imported only when traces are on.

Cost: nothing per chunk, on or off. Off, :attr:`proxy.server.state.Proxy.tracing` is ``None``
and each request pays one ``is None`` test at its start and end. On, a request opens one span
when its exchange starts (so the ``traceparent`` sent to the engine names it: vLLM's spans sit
under the guard's), the guard calls :meth:`RequestTrace.verdict` only when a verdict fires (it
notes the time and the block), and the span's attributes and events are written once, at the
end, from what the request left behind — the action a verdict led to (healed or aborted) is
only known then; each event keeps the moment its verdict fired as its timestamp.

Attributes follow the GenAI semantic conventions (``gen_ai.*``); the guard's own are
``coherence_guard.*``. No prompt or completion text is recorded unless ``GUARD_LOG_TEXT=true``,
which adds the delta that made the detector fire to its event, as the log line does.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any, Final

from proxy.core.guard import BlockState, StreamGuard
from proxy.core.heal import HealGuard
from proxy.core.records import ChoiceRecord

if TYPE_CHECKING:
    from opentelemetry.context import Context
    from opentelemetry.propagators.textmap import TextMapPropagator
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SpanExporter
    from opentelemetry.trace import Span, Tracer

    from proxy.core.requested_language import Expectation

log = logging.getLogger("coherence_guard")

SERVICE_NAME: Final = "coherence-guard"
VERDICT_EVENT: Final = "coherence_guard.verdict"
#: ``gen_ai.operation.name`` per guarded surface (the GenAI conventions' well-known values).
OPERATIONS: Final = {
    "chat": "chat",
    "completions": "text_completion",
    "responses": "chat",
    "messages": "chat",
}
#: The engine the guard fronts (``gen_ai.provider.name``; ``gen_ai.system`` before 1.37).
PROVIDER: Final = "vllm"


def wanted(env: Mapping[str, str] = os.environ) -> bool:
    """Whether the SDK's variables ask for traces (see the module docstring)."""
    if env.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return False
    exporters = _names(env.get("OTEL_TRACES_EXPORTER", ""))
    if exporters:
        return exporters != ["none"]
    return bool(
        env.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") or env.get("OTEL_EXPORTER_OTLP_ENDPOINT")
    )


def _names(value: str) -> list[str]:
    return [v.strip().lower() for v in value.split(",") if v.strip()]


def _exporters(env: Mapping[str, str]) -> list[SpanExporter]:
    """The exporters ``OTEL_TRACES_EXPORTER`` names (default ``otlp``): ``otlp`` over
    HTTP/protobuf (``OTEL_EXPORTER_OTLP[_TRACES]_PROTOCOL=grpc`` needs
    ``opentelemetry-exporter-otlp-proto-grpc``) and ``console``; others are refused with a
    warning. Each exporter reads its own ``OTEL_EXPORTER_OTLP_*`` variables."""
    out: list[SpanExporter] = []
    for name in _names(env.get("OTEL_TRACES_EXPORTER", "")) or ["otlp"]:
        if name == "console":
            from opentelemetry.sdk.trace.export import ConsoleSpanExporter

            out.append(ConsoleSpanExporter())
        elif name == "otlp":
            protocol = (
                env.get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL")
                or env.get("OTEL_EXPORTER_OTLP_PROTOCOL")
                or "http/protobuf"
            ).strip()
            if protocol == "grpc":
                try:
                    from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import (  # type: ignore[import-not-found,unused-ignore]
                        OTLPSpanExporter as GrpcExporter,
                    )
                except ImportError:
                    log.warning(
                        "OTLP over gRPC needs opentelemetry-exporter-otlp-proto-grpc; "
                        "no traces exported (or set OTEL_EXPORTER_OTLP_PROTOCOL=http/protobuf)"
                    )
                    continue
                out.append(GrpcExporter())
            elif protocol == "http/protobuf":
                from opentelemetry.exporter.otlp.proto.http.trace_exporter import (
                    OTLPSpanExporter,
                )

                out.append(OTLPSpanExporter())
            else:
                log.warning("OTLP protocol %r is not supported; no traces exported", protocol)
        elif name != "none":
            log.warning("OTEL_TRACES_EXPORTER=%s is not supported (otlp, console, none)", name)
    return out


class Tracing:
    """One worker's tracer: built at start-up when traces are on, shut down (flushed) at exit."""

    def __init__(
        self, provider: TracerProvider, propagator: TextMapPropagator, *, log_text: bool
    ) -> None:
        from opentelemetry.trace import SpanKind

        from proxy import __version__

        self.provider = provider
        self.tracer: Tracer = provider.get_tracer("coherence_guard", __version__)
        self.propagator = propagator
        self.fields = tuple(sorted(propagator.fields))
        self._drop = frozenset(f.encode() for f in self.fields)
        self.log_text = log_text
        self._server = SpanKind.SERVER

    @classmethod
    def from_env(
        cls, *, log_text: bool = False, env: Mapping[str, str] = os.environ
    ) -> Tracing | None:
        """The worker's tracing, or ``None`` when traces are off or the SDK is missing."""
        if not wanted(env):
            return None
        try:
            from opentelemetry.propagate import get_global_textmap
            from opentelemetry.sdk.resources import Resource
            from opentelemetry.sdk.trace import TracerProvider
            from opentelemetry.sdk.trace.export import BatchSpanProcessor
        except ImportError:
            log.warning(
                "OTEL_* asks for traces but the OpenTelemetry SDK is not installed: "
                "pip install 'coherence-guard[otel]'; no traces"
            )
            return None
        from proxy import __version__

        # OTEL_SERVICE_NAME / OTEL_RESOURCE_ATTRIBUTES win; the SDK's fallback name does not.
        resource = Resource.create({"service.version": __version__})
        if str(resource.attributes.get("service.name", "")).startswith("unknown_service"):
            resource = resource.merge(Resource({"service.name": SERVICE_NAME}))
        exporters = _exporters(env)
        if not exporters:
            return None
        provider = TracerProvider(resource=resource)  # sampler: OTEL_TRACES_SAMPLER
        for exporter in exporters:
            provider.add_span_processor(BatchSpanProcessor(exporter))
        log.info(
            "OpenTelemetry traces on: service %s, exporters %s",
            resource.attributes.get("service.name"),
            ", ".join(type(e).__name__ for e in exporters),
        )
        return cls(provider, get_global_textmap(), log_text=log_text)

    def start(
        self,
        headers: Mapping[bytes, bytes],
        *,
        endpoint: str,
        model: str | None,
        max_tokens: int,
        mode: str,
        stream: bool,
        started: float,
        request_id: str | None,
        path: str,
    ) -> RequestTrace:
        """The span of one guarded request, continuing the client's ``traceparent``;
        ``started`` is the request's ``time.perf_counter()`` at arrival."""
        carrier = {
            name: headers[key].decode("latin-1")
            for name in self.fields
            if (key := name.encode()) in headers
        }
        parent = self.propagator.extract(carrier)
        operation = OPERATIONS.get(endpoint, "chat")
        attributes: dict[str, Any] = {
            "gen_ai.operation.name": operation,
            "gen_ai.provider.name": PROVIDER,
            "gen_ai.system": PROVIDER,
            "gen_ai.request.max_tokens": max_tokens,
            "http.request.method": "POST",
            "http.route": path,
            "coherence_guard.endpoint": endpoint,
            "coherence_guard.mode": mode,
            "coherence_guard.stream": stream,
        }
        if model:
            attributes["gen_ai.request.model"] = model
        if request_id is not None:
            attributes["coherence_guard.request_id"] = request_id
        begun = time.time_ns() - int((time.perf_counter() - started) * 1e9)
        span = self.tracer.start_span(
            f"{operation} {model}" if model else operation,
            context=parent,
            kind=self._server,
            attributes=attributes,
            start_time=begun,
        )
        return RequestTrace(self, span, parent)

    def shutdown(self) -> None:
        """Export what is queued, then stop (the worker is exiting)."""
        self.provider.shutdown()


class RequestTrace:
    """One guarded request's span and the verdicts noted while it ran."""

    __slots__ = ("_verdicts", "ctx", "span", "stages", "tracing")

    def __init__(self, tracing: Tracing, span: Span, parent: Context) -> None:
        from opentelemetry.trace import set_span_in_context

        self.tracing = tracing
        self.span = span
        self.ctx = set_span_in_context(span, parent)
        #: (time in ns, guard, block) per verdict, in the order they fired.
        self._verdicts: list[tuple[int, StreamGuard, BlockState]] = []
        #: Heal mode's stages, in order (the last is the request's final guard).
        self.stages: list[StreamGuard] = []

    @property
    def trace_id(self) -> str | None:
        """The trace id (32 hex digits) for exemplars; ``None`` for a trace not sampled."""
        sc = self.span.get_span_context()
        return format(sc.trace_id, "032x") if sc.trace_flags.sampled else None

    def upstream_headers(self, out: list[tuple[bytes, bytes]]) -> list[tuple[bytes, bytes]]:
        """``out`` with the client's trace headers replaced by this span's, so the engine's
        spans are children of the guard's (``traceparent`` names this span)."""
        carrier: dict[str, str] = {}
        self.tracing.propagator.inject(carrier, context=self.ctx)
        drop = self.tracing._drop
        kept = [(k, v) for k, v in out if k.lower() not in drop]
        kept += [(k.encode(), v.encode("latin-1")) for k, v in carrier.items()]
        return kept

    def watch(self, guard: StreamGuard) -> None:
        """Have ``guard`` report its verdicts the moment they fire."""
        guard.on_verdict = lambda state: self.verdict(guard, state)

    def verdict(self, guard: StreamGuard, state: BlockState) -> None:
        """A verdict fired on ``state`` (once per block; later calls for it are ignored)."""
        if not any(s is state for _, _, s in self._verdicts):
            self._verdicts.append((time.time_ns(), guard, state))

    def stage_ended(self, guard: StreamGuard) -> None:
        """A heal stage's relay ended (on its verdict, when it had one: that is now)."""
        self.stages.append(guard)
        for state in guard.choices.values():
            if state.verdict is not None:
                self.verdict(guard, state)

    def end(
        self,
        guard: StreamGuard | None,
        *,
        outcome: str,
        choices: Iterable[ChoiceRecord],
        expectation: Expectation,
        status: int,
    ) -> None:
        """Write the span's attributes and verdict events, then end it (once per request)."""
        span = self.span
        try:
            if span.is_recording():
                self._write(guard, outcome, list(choices), expectation, status)
        finally:
            span.end()

    def _write(
        self,
        guard: StreamGuard | None,
        outcome: str,
        records: list[ChoiceRecord],
        expectation: Expectation,
        status: int,
    ) -> None:
        span = self.span
        attrs: dict[str, Any] = {
            "coherence_guard.outcome": outcome,
            "http.response.status_code": status,
            "coherence_guard.expected_language": expectation.code or "none",
            "coherence_guard.language_source": expectation.source,
        }
        reasons = [r.finish_reason or "none" for r in records]
        if reasons:
            attrs["gen_ai.response.finish_reasons"] = reasons
            attrs["gen_ai.usage.output_tokens"] = sum(r.completion_tokens for r in records)
        if guard is not None:
            template = guard.template or {}
            if isinstance(template.get("model"), str):
                attrs["gen_ai.response.model"] = template["model"]
            if isinstance(template.get("id"), str):
                attrs["gen_ai.response.id"] = template["id"]
            prompt = guard.prompt_tokens
            if isinstance(guard, HealGuard):
                prompt = guard.carry.prompt_tokens if prompt is None else prompt
                attrs["coherence_guard.heal.attempts"] = guard.attempt
                attrs["coherence_guard.heal.healed"] = guard.healed()
            if prompt is not None:
                attrs["gen_ai.usage.input_tokens"] = prompt
            for state in guard.choices.values():
                summary = state.summary
                if summary is not None and summary.verdict is not None and state.verdict is None:
                    self.verdict(guard, state)  # judged when the choice ended
        span.set_attributes(attrs)
        for fired, stage, state in self._verdicts:
            span.add_event(VERDICT_EVENT, self._event(stage, state, expectation), timestamp=fired)
        if outcome == "upstream_error":
            from opentelemetry.trace import Status, StatusCode

            span.set_status(Status(StatusCode.ERROR, "upstream error"))

    def _event(
        self, stage: StreamGuard, state: BlockState, expectation: Expectation
    ) -> dict[str, Any]:
        verdict = state.verdict or (state.summary.verdict if state.summary else None)
        assert verdict is not None
        action = state.action or "observed"
        if isinstance(stage, HealGuard) and stage is not (self.stages or [stage])[-1]:
            action = "healed"  # a continuation followed this stage's cut
        attrs: dict[str, Any] = {
            "coherence_guard.signal": verdict.signal,
            "coherence_guard.score": float(verdict.score),
            "coherence_guard.action": action,
            "coherence_guard.choice": state.index,
            "coherence_guard.channel": verdict.channel,
            "coherence_guard.fired_at_token": verdict.fired_at_token,
            "coherence_guard.fired_at_char": verdict.fired_at_char,
            "coherence_guard.onset_char": verdict.onset_char,
            "coherence_guard.expected_language": verdict.expected_language
            or expectation.code
            or "none",
            "coherence_guard.language_source": verdict.language_source or expectation.source,
        }
        if isinstance(stage, HealGuard):
            attrs["coherence_guard.heal.attempt"] = stage.attempt
        if self.tracing.log_text and state.trigger_text is not None:
            attrs["coherence_guard.trigger_text"] = state.trigger_text
        return attrs
