"""OpenTelemetry traces: two spans per guarded request, the guard's verdicts as events.

Off unless the OpenTelemetry SDK's own variables ask for traces (``OTEL_EXPORTER_OTLP_ENDPOINT``,
``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`` or ``OTEL_TRACES_EXPORTER``; ``OTEL_SDK_DISABLED=true``
and ``OTEL_TRACES_EXPORTER=none`` switch it off): every other knob is the SDK's as well
(``OTEL_SERVICE_NAME``, ``OTEL_RESOURCE_ATTRIBUTES``, ``OTEL_TRACES_SAMPLER``, ``OTEL_BSP_*``,
``OTEL_EXPORTER_OTLP_HEADERS``, ``OTEL_PROPAGATORS``, …), so an operator configures the guard
the way they configure vLLM (``--otlp-traces-endpoint``) and every other traced service. The
SDK is an optional dependency (``coherence-guard[otel]``), imported only when traces are on.

The two spans follow the GenAI client conventions (``open-telemetry/semantic-conventions-genai``,
``client-inference.md``): a ``SERVER`` span for the request the client sent
(``POST /v1/chat/completions``, HTTP attributes, the guard's mode), and under it a ``CLIENT`` span
for the call the guard makes to the model (``chat {model}``: ``gen_ai.*``, ``server.*`` of the
engine, ``error.type``, the verdicts). The engine's own spans sit under the ``CLIENT`` span (the
``traceparent`` it receives names that one), so a trace store draws the edge guard → engine.

Cost: nothing per chunk, on or off. Off, :attr:`proxy.server.state.Proxy.tracing` is ``None``
and each request pays one ``is None`` test at its start and end. On, a request opens its spans
when its exchange starts; the guard calls back only when a verdict fires, and the request's
detector maker when the engine's first output chunk opens the first block (one clock read
each); the attributes and events are written once, at the end, from what the request left
behind — the action a verdict led to (healed or aborted) is only known then; each event keeps
the moment its verdict fired as its timestamp.

The request's own values are what ``gen_ai.request.*`` records (``max_tokens`` included: the
limit the guard sent, its default or a clamp, is ``coherence_guard.max_tokens``). The guard's own
attributes are ``coherence_guard.*``. No prompt or completion text is recorded unless
``GUARD_LOG_TEXT=true``, which adds the delta that made the detector fire to its event, as the
log line does.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Any, Final, Protocol

from proxy.core.guard import BlockState, StreamGuard
from proxy.core.heal import HealGuard
from proxy.core.records import ChoiceRecord
from proxy.observability.genai import (
    OPERATIONS,
    provider_name,
    request_attributes,
    server_attributes,
)

if TYPE_CHECKING:
    from opentelemetry.context import Context
    from opentelemetry.propagators.textmap import TextMapPropagator
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SpanExporter
    from opentelemetry.trace import Span, Tracer

    from proxy.core.requested_language import Expectation
    from proxy.core.rewrite import Rewrite

log = logging.getLogger("coherence_guard")

SERVICE_NAME: Final = "coherence-guard"
VERDICT_EVENT: Final = "coherence_guard.verdict"


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
        self,
        provider: TracerProvider,
        propagator: TextMapPropagator,
        *,
        log_text: bool,
        upstream_url: str = "",
    ) -> None:
        from opentelemetry.trace import SpanKind

        from proxy import __version__

        self.provider = provider
        self.tracer: Tracer = provider.get_tracer("coherence_guard", __version__)
        self.propagator = propagator
        self.fields = tuple(sorted(propagator.fields))
        self._drop = frozenset(f.encode() for f in self.fields)
        self.log_text = log_text
        #: ``server.address`` / ``server.port`` of the engine, on every model call's span.
        self.server = server_attributes(upstream_url)
        self._server_kind = SpanKind.SERVER
        self._client_kind = SpanKind.CLIENT

    @classmethod
    def from_env(
        cls,
        *,
        log_text: bool = False,
        upstream_url: str = "",
        env: Mapping[str, str] = os.environ,
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
        return cls(provider, get_global_textmap(), log_text=log_text, upstream_url=upstream_url)

    def start(
        self,
        headers: Mapping[bytes, bytes],
        *,
        endpoint: str,
        rw: Rewrite,
        body: Mapping[str, Any],
        mode: str,
        started: float,
        request_id: str | None,
        path: str,
        engine: str | None,
    ) -> RequestTrace:
        """The spans of one guarded request: the ``SERVER`` span of the client's request,
        continuing its ``traceparent`` and begun at its arrival (``started``, its
        ``time.perf_counter()``), and the ``CLIENT`` span of the model call under it, begun now.
        ``body`` is the client's request as sent, ``rw`` what goes to the engine, ``engine``
        the ``owned_by`` of the engine's model list when known."""
        from opentelemetry.trace import set_span_in_context

        carrier = {
            name: headers[key].decode("latin-1")
            for name in self.fields
            if (key := name.encode()) in headers
        }
        parent = self.propagator.extract(carrier)
        incoming: dict[str, Any] = {
            "http.request.method": "POST",
            "http.route": path,
            "coherence_guard.endpoint": endpoint,
            "coherence_guard.mode": mode,
            "coherence_guard.stream": rw.client_stream,
        }
        if request_id is not None:
            incoming["coherence_guard.request_id"] = request_id
        begun = time.time_ns() - int((time.perf_counter() - started) * 1e9)
        server = self.tracer.start_span(
            f"POST {path}",
            context=parent,
            kind=self._server_kind,
            attributes=incoming,
            start_time=begun,
        )
        operation = OPERATIONS.get(endpoint, "chat")
        model = rw.model
        call: dict[str, Any] = {
            "gen_ai.operation.name": operation,
            "gen_ai.provider.name": provider_name(engine),
            **self.server,
            **request_attributes(endpoint, body),
        }
        if model:
            call["gen_ai.request.model"] = model
        if rw.body.get("stream") is True:
            call["gen_ai.request.stream"] = True
        span = self.tracer.start_span(
            f"{operation} {model}" if model else operation,
            context=set_span_in_context(server, parent),
            kind=self._client_kind,
            attributes=call,
        )
        return RequestTrace(self, span, server, parent)

    def shutdown(self) -> None:
        """Export what is queued, then stop (the worker is exiting)."""
        self.provider.shutdown()


class FirstBlock(Protocol):
    """What tells the trace of the engine's first output chunk
    (:class:`proxy.server.detectors.DetectorMaker`): a callback it calls once."""

    on_first: Callable[[], None] | None


class RequestTrace:
    """One guarded request's spans, and the verdicts and moments noted while it ran."""

    __slots__ = (
        "_first_chunk",
        "_sent",
        "_verdicts",
        "ctx",
        "server",
        "span",
        "stages",
        "tracing",
    )

    def __init__(self, tracing: Tracing, span: Span, server: Span, parent: Context) -> None:
        from opentelemetry.trace import set_span_in_context

        self.tracing = tracing
        #: The model call (``CLIENT``): the guard's span, parent of the engine's.
        self.span = span
        #: The client's request (``SERVER``), parent of :attr:`span`.
        self.server = server
        self.ctx = set_span_in_context(span, set_span_in_context(server, parent))
        #: (time in ns, guard, block) per verdict, in the order they fired.
        self._verdicts: list[tuple[int, StreamGuard, BlockState]] = []
        #: Heal mode's stages, in order (the last is the request's final guard).
        self.stages: list[StreamGuard] = []
        #: ``time.perf_counter()`` when the request went to the engine, and seconds from then
        #: to the engine's first output chunk.
        self._sent = time.perf_counter()
        self._first_chunk: float | None = None

    @property
    def trace_id(self) -> str | None:
        """The trace id (32 hex digits) for exemplars; ``None`` for a trace not sampled."""
        sc = self.span.get_span_context()
        return format(sc.trace_id, "032x") if sc.trace_flags.sampled else None

    def upstream_headers(self, out: list[tuple[bytes, bytes]]) -> list[tuple[bytes, bytes]]:
        """``out`` with the client's trace headers replaced by the model call's, so the
        engine's spans are children of the guard's ``CLIENT`` span. Asked for as the request
        goes to the engine, which is the moment the first chunk is timed from."""
        if self._first_chunk is None:
            self._sent = time.perf_counter()
        carrier: dict[str, str] = {}
        self.tracing.propagator.inject(carrier, context=self.ctx)
        drop = self.tracing._drop
        kept = [(k, v) for k, v in out if k.lower() not in drop]
        kept += [(k.encode(), v.encode("latin-1")) for k, v in carrier.items()]
        return kept

    def first_chunk(self) -> None:
        """The engine's first output chunk arrived (``gen_ai.response.time_to_first_chunk``;
        the request's detector maker calls this as the guard opens its first block on it)."""
        if self._first_chunk is None:
            self._first_chunk = time.perf_counter() - self._sent

    def watch(self, guard: StreamGuard, maker: FirstBlock | None = None) -> None:
        """Have ``guard`` report its verdicts the moment they fire, and ``maker`` (the
        request's detector maker, which the guard asks as the engine's first output chunk opens
        its first block) that first chunk."""
        guard.on_verdict = lambda state: self.verdict(guard, state)
        if maker is not None:
            maker.on_first = self.first_chunk

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
        rw: Rewrite,
        status: int,
        failure: str | None = None,
    ) -> None:
        """Write the spans' attributes and verdict events, then end them (once per request);
        ``failure`` is the upstream failure's ``error.type`` when the request had one."""
        span, server = self.span, self.server
        try:
            if span.is_recording():
                self._write(guard, outcome, list(choices), rw, failure)
            if server.is_recording():
                self._write_server(status)
        finally:
            span.end()
            server.end()

    def _write_server(self, status: int) -> None:
        """The client's request: its status; a 5xx is an error of the request (HTTP server
        conventions: a 4xx, the client's own mistake, is not)."""
        server = self.server
        server.set_attribute("http.response.status_code", status)
        if status >= 500:
            from opentelemetry.trace import Status, StatusCode

            server.set_attribute("error.type", str(status))
            server.set_status(Status(StatusCode.ERROR))

    def _write(
        self,
        guard: StreamGuard | None,
        outcome: str,
        records: list[ChoiceRecord],
        rw: Rewrite,
        failure: str | None,
    ) -> None:
        span = self.span
        expectation = rw.expectation
        attrs: dict[str, Any] = {
            "coherence_guard.outcome": outcome,
            "coherence_guard.expected_language": expectation.code or "none",
            "coherence_guard.language_source": expectation.source,
        }
        if not rw.engine_limited:
            attrs["coherence_guard.max_tokens"] = rw.max_tokens
        if self._first_chunk is not None and rw.body.get("stream") is True:
            attrs["gen_ai.response.time_to_first_chunk"] = self._first_chunk
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
        error = self._error_type(guard, outcome, failure)
        if error is not None:
            attrs["error.type"] = error
        span.set_attributes(attrs)
        for fired, stage, state in self._verdicts:
            span.add_event(VERDICT_EVENT, self._event(stage, state, expectation), timestamp=fired)
        if error is not None:
            from opentelemetry.trace import Status, StatusCode

            span.set_status(Status(StatusCode.ERROR))

    def _error_type(
        self, guard: StreamGuard | None, outcome: str, failure: str | None
    ) -> str | None:
        """``error.type`` of the model call, from a small fixed set: the guard's abort (what
        the client sees as ``stop_reason``, ``coherence_guard:<signal>``), the upstream failure
        (its kind — ``connect``, ``timeout``, ``disconnect``, ``protocol``, ``deadline`` — or
        the engine's HTTP status), an error the engine wrote into its stream
        (``engine_error``), a stream that ended without its terminal event
        (``incomplete``), or the client leaving (``client_disconnected``: the guard closed the
        call). A completed, healed or monitored answer has none."""
        if outcome == "aborted":
            # The verdict that ended the answer: the last abort (heal's earlier cuts were
            # continued), else what the final guard judged.
            states = [s for _, _, s in reversed(self._verdicts) if s.action == "aborted"]
            states += [] if guard is None else list(guard.choices.values())
            signals = [s.verdict.signal for s in states if s.verdict is not None]
            return f"coherence_guard:{signals[0]}" if signals else "coherence_guard"
        if outcome == "client_disconnected":
            return "client_disconnected"
        if outcome != "upstream_error":
            return None
        if failure is not None:
            return failure
        if guard is not None and guard.error is not None:
            return "engine_error"
        return "incomplete"

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
