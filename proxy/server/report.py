"""What one guarded request leaves behind when it ends: its generation record, heal counts, a log
line per detection (never the text unless GUARD_LOG_TEXT=true), its span when traces are on
(the counters carry its trace id as an exemplar), and the request's metrics.

Called once per request by the endpoint (:mod:`proxy.server.guarded`) whatever the ending, so a
generation is counted exactly once: completed, aborted, healed, client gone or upstream failed.
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING

from proxy.core.guard import StreamGuard
from proxy.core.heal import HealGuard
from proxy.core.records import GenerationRecord

if TYPE_CHECKING:
    from proxy.server.exchange import Exchange

log = logging.getLogger("coherence_guard")


def finish(call: Exchange, *, client_gone: bool) -> None:
    """Record what one guarded request leaves behind, once, when it ends: heal counts first (a
    generation recorded means its heal counts are there too), the generation, a log line per
    detection, the request's infrastructure metrics."""
    proxy = call.proxy
    elapsed = time.perf_counter() - call.started
    if call.stream_open:
        proxy.metrics.stream_closed()
    guard = call.guard
    if guard is not None:
        outcome = guard.outcome(client_gone=client_gone)
        limit = call.rw.max_tokens
        if call.rw.engine_limited and guard.prompt_tokens is not None:
            limit -= guard.prompt_tokens  # the engine's own: the rest of the context
        choices = guard.records(limit)
        model = call.rw.model or str((guard.template or {}).get("model") or "unknown")
    else:
        outcome = (
            "client_disconnected"
            if client_gone
            else "upstream_error"
            if call.failure is not None or call.status >= 400
            else "completed"
        )
        choices = []
        model = call.rw.model or "unknown"
    trace = call.trace
    trace_id = None
    if trace is not None:
        trace_id = trace.trace_id
        status = 499 if client_gone else call.status
        trace.end(
            guard,
            outcome=outcome,
            choices=choices,
            rw=call.rw,
            status=status,
            failure=call.failure,
        )
    # Heal counts first: a generation recorded means its heal counts are there too.
    if isinstance(guard, HealGuard) and (guard.attempt > 0 or guard.gave_up):
        proxy.metrics.heal_finished(
            model,
            attempts=guard.attempt,
            success=guard.healed(),
            discarded=guard.discarded_tokens(),
            trace_id=trace_id,
        )
        log.info(
            "degenerate generation %s: model=%s endpoint=%s attempts=%d tokens_discarded=%d",
            "healed" if guard.healed() else "not healed",
            model,
            call.endpoint,
            guard.attempt,
            guard.discarded_tokens(),
        )
    proxy.metrics.record_generation(
        GenerationRecord(
            model=model,
            endpoint=call.endpoint,
            outcome=outcome,
            choices=choices,
            trace_id=trace_id,
        )
    )
    if guard is not None and (guard.aborted or any(c.action for c in guard.choices.values())):
        log_detections(call, guard, model)
    proxy.metrics.request_finished(call.scope["path"], 499 if client_gone else call.status, elapsed)


def log_detections(call: Exchange, guard: StreamGuard, model: str) -> None:
    """One line per detection; the text only with GUARD_LOG_TEXT=true."""
    log_text = call.proxy.settings.log_text
    for state in guard.choices.values():
        v = state.verdict
        if v is None or state.action is None:
            continue
        extra = f" text={state.trigger_text!r}" if log_text else ""
        log.info(
            "degenerate generation %s: model=%s endpoint=%s choice=%d signal=%s score=%.3f "
            "tokens=%d onset_char=%d%s",
            state.action,
            model,
            call.endpoint,
            state.index,
            v.signal,
            v.score,
            state.tokens,
            v.onset_char,
            extra,
        )
