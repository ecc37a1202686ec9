"""Heal mode's stages on a guarded request: relay, cut, ask the engine to go on, relay again.

The pure part (what to cut, what to ask, when to stop) is :mod:`proxy.core.heal` and
:mod:`proxy.core.heal_request`; this is the I/O around it, on one exchange
(:class:`HealCall`): closing the engine's stream at a verdict, opening the continuation
(refitting its limit once when the engine finds the grown prompt too long) and relaying it to
the client as the same choice.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

import orjson

from proxy.core.heal import HealGuard
from proxy.core.heal_request import continuation_request, json_constrained, valid_json
from proxy.errors import UpstreamFailure
from proxy.server.asgi import response_headers
from proxy.server.engine_context import context_error
from proxy.server.surface_send import is_sse
from proxy.server.upstream import upstream_failed
from proxy.server.upstream_http import DRAIN_SECONDS

if TYPE_CHECKING:
    from proxy.core.guard import StreamGuard
    from proxy.core.heal_request import HealPolicy
    from proxy.core.records import Endpoint
    from proxy.core.rewrite import Rewrite
    from proxy.observability.tracing import RequestTrace
    from proxy.server.asgi import Send
    from proxy.server.bounds import Watch
    from proxy.server.state import Proxy
    from proxy.server.upstream_http import Response as UpstreamResponse


class HealCall(Protocol):
    """What the stages use of one guarded exchange (:class:`proxy.server.exchange.Exchange`,
    which calls :func:`run_heal`): named here, so this module imports nothing from it."""

    proxy: Proxy
    rw: Rewrite
    heal: HealPolicy
    protocol: Endpoint
    upstream_path: str
    send: Send
    extra: list[tuple[bytes, bytes]]
    guard: StreamGuard | None
    sse_body: bool
    stream_open: bool
    trace: RequestTrace | None

    def upstream_headers(self) -> list[tuple[bytes, bytes]]: ...

    async def start(self, status: int, headers: list[tuple[bytes, bytes]]) -> None: ...

    async def pump(
        self, resp: UpstreamResponse, guard: StreamGuard, watch: Watch, stream: bool, first: bool
    ) -> None: ...

    async def send_body(self, out: bytes, watch: Watch) -> None: ...

    async def answer(self, guard: StreamGuard) -> None: ...

    async def count_prompt(self, guard: StreamGuard) -> None: ...


async def run_heal(
    call: HealCall, resp: UpstreamResponse, guard: HealGuard, watch: Watch
) -> UpstreamResponse:
    """Relay stage after stage: on a verdict close the engine's stream, ask it to continue
    from the cut, and relay that as the same choice; after the last attempt (or when the
    continuation cannot be had) end the choice as enforce does. Returns the response it
    read last (the caller closes it)."""
    stream = call.rw.client_stream
    if stream:
        headers = response_headers(resp.headers, call.proxy.engine_url, keep_length=False)
        call.sse_body = True
        await call.start(200, headers + call.extra)
        call.stream_open = True
        call.proxy.metrics.stream_opened()
    while True:
        await call.pump(resp, guard, watch, stream, guard.attempt == 0)
        if call.trace is not None:
            call.trace.stage_ended(guard)
        if not guard.needs_heal:
            if guard.restart and guard.attempt > 0 and not restart_valid(call, guard):
                guard.give_up()  # not what the client's schema reads: enforce's ending
            break
        nxt = None
        remaining = guard.remaining_tokens(call.rw.max_tokens)
        if (
            guard.healable
            and guard.attempt < call.heal.max_attempts
            and remaining > 0
            and guard.retry_allowed()
        ):
            await resp.aclose()
            nxt = await continue_answer(call, guard, remaining)
        if nxt is None:
            tail = guard.give_up()
            if guard.held is not None:
                await resp.aclose()  # the engine stops before it is asked for the count
                await call.count_prompt(guard)
                tail += guard.release()
            if stream:
                await call.send_body(tail, watch)
            break
        resp, guard = nxt
        call.guard = guard
    if stream:
        await watch.send_last(call.send, {"type": "http.response.body", "body": b""})
    else:
        if guard.prompt_uncounted:
            await resp.aclose()
            await call.count_prompt(guard)
        watch.cancellable = False
        await call.answer(guard)
    if guard.saw_done and not guard.aborted:
        await resp.drain(DRAIN_SECONDS)
    return resp


def restart_valid(call: HealCall, guard: HealGuard) -> bool:
    """A restarted constrained answer counts as healed only when it ended by itself and,
    for a JSON constraint, is one strict JSON value (the engine's grammar does not forbid
    raw control characters inside strings on every version; ``.parse()`` does)."""
    state = guard.choices.get(0)
    if state is None or state.finish_reason != "stop":
        return False
    return not json_constrained(call.rw.body) or valid_json(guard.answer_text())


async def continue_answer(
    call: HealCall, guard: HealGuard, remaining: int
) -> tuple[UpstreamResponse, HealGuard] | None:
    """Open the continuation of ``guard``'s cut answer; None when the engine will not give
    one (the failure is counted and logged; the client gets enforce's ending instead)."""
    nxt = guard.continuation()
    body = continuation_request(
        call.rw.body,
        call.protocol,
        nxt.carry.prefix,
        remaining,
        nxt.attempt,
        call.heal,
        restart=nxt.restart,
    )
    if call.rw.engine_limited:  # the engine's own limit: the rest of the context
        body.pop("max_tokens", None)
    for refit in (True, False):
        try:
            resp = await call.proxy.fast.post(
                call.upstream_path, call.upstream_headers(), orjson.dumps(body)
            )
        except UpstreamFailure as exc:
            upstream_failed(call.proxy.metrics, exc.kind)
            return None
        if not (refit and resp.status_code == 400):
            break
        # The prompt grew by the kept text, re-tokenized: the budget left may now overrun
        # the context by a few tokens on engines that check prompt + limit (older vLLM).
        try:
            error = context_error(400, await resp.aread())
        except UpstreamFailure:
            error = None
        finally:
            await resp.aclose()
        fields = [k for k in ("max_tokens", "max_completion_tokens") if k in body]
        if error is None or error.allowed < 1 or not fields:
            upstream_failed(call.proxy.metrics, "status", 400)
            return None
        for key in fields:
            body[key] = min(body[key], error.allowed)
    if resp.status_code != 200 or not is_sse(resp.headers):
        upstream_failed(call.proxy.metrics, "status", resp.status_code)
        await resp.aclose()
        return None
    return resp, nxt
