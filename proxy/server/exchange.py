"""One guarded request's exchange with the engine, from opening its stream to the last byte the
client gets.

Per chunk it feeds :class:`proxy.core.guard.StreamGuard` and writes what the guard returns. In the
steady state of a stream that happens inside the upstream connection's read callback, straight
onto uvicorn's transport (:meth:`Exchange._relay_direct`, :class:`proxy.server.asgi.DirectBody`);
everything else — endings, errors, a client that reads slowly, a ``send`` that is not uvicorn's —
goes through the task's loop: one ``send`` per chunk plus two integer bumps for the write-timeout
sweep (:mod:`proxy.server.bounds`). Heal mode's stages are :mod:`proxy.server.heal_stages`'s.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import Any

import orjson

from proxy.core.guard import StreamGuard
from proxy.core.heal import HealGuard
from proxy.core.heal_request import (
    HealPolicy,
    constrained,
    unhealable,
)
from proxy.core.policy import GuardPolicy, Mode
from proxy.core.prompt_count import prompt_count_ask
from proxy.core.records import Endpoint
from proxy.core.rewrite import Rewrite, rewrite_request
from proxy.errors import (
    GuardError,
    UpstreamError,
    UpstreamFailure,
    anthropic_error_object,
)
from proxy.observability.tracing import RequestTrace
from proxy.server.asgi import (
    JSON_HEADERS,
    REQUEST_ID,
    DirectBody,
    Scope,
    Send,
    cut_response,
    response_headers,
    scope_headers,
    send_error,
)
from proxy.server.bounds import Watch, deadline_error
from proxy.server.detectors import DetectorMaker, language_detector
from proxy.server.engine_context import ContextError, context_error
from proxy.server.heal_stages import run_heal
from proxy.server.paths import wire_path
from proxy.server.prompt_count import count_prompt
from proxy.server.state import Proxy
from proxy.server.surface_send import failure_event, is_sse
from proxy.server.upstream import upstream_failed
from proxy.server.upstream_http import DRAIN_SECONDS
from proxy.server.upstream_http import Response as UpstreamResponse
from proxy.server.usage_options import names_usage_option

log = logging.getLogger("coherence_guard")

#: The client's headers an ask of the proxy's own carries to the engine (the engine's key
#: replaces them where GUARD_UPSTREAM_API_KEY is set).
_CREDENTIAL_HEADERS = (b"authorization", b"x-api-key")


class Exchange:
    """One guarded request from upstream open to the end of the client response."""

    def __init__(
        self,
        proxy: Proxy,
        scope: Scope,
        send: Send,
        endpoint: Endpoint,
        rw: Rewrite,
        mode: Mode,
        headers: dict[bytes, bytes],
        started: float,
    ) -> None:
        self.proxy = proxy
        self.scope = scope
        self.send = send
        self.endpoint: Endpoint = endpoint
        #: The protocol the engine speaks for this call: the route's, or ``chat`` when a
        #: Responses/Messages request is healed through the chat route.
        self.protocol: Endpoint = endpoint
        self.upstream_path = wire_path(scope["path"])
        #: Turns a rewritten surface request into its chat form (heal through chat).
        self.convert: Callable[[Rewrite], Rewrite | str | None] | None = None
        self.rw = rw
        self.mode: Mode = mode
        self.headers = headers
        self.started = started
        self.status = 0
        self.guard: StreamGuard | None = None
        #: The detectors' maker, made when the request goes to the engine (not in ``off``).
        self.detectors: DetectorMaker | None = None
        self.stream_open = False
        #: The response head went out (after that, errors are written into the body).
        self.head_sent = False
        #: The body being relayed is an SSE stream (an error can still be an event).
        self.sse_body = False
        #: What failed upstream, if anything: its kind or the engine's status (``error.type``).
        self.failure: str | None = None
        self.client_continuous = False
        self.client_body: Any = None
        #: The largest limit the engine accepts (the model's context), when known.
        self.engine_limit: int | None = None
        self.heal = HealPolicy()
        self.watch = Watch()
        #: This request's span, when traces are on (proxy/observability/tracing.py).
        self.trace: RequestTrace | None = None
        self.extra = [
            (b"x-guard-max-tokens", rw.max_tokens_header.encode()),
            (b"x-guard-language", rw.expectation.header().encode()),
            *scope_headers(scope),
        ]

    def upstream_headers(self) -> list[tuple[bytes, bytes]]:
        """The client's headers for the rewritten JSON body; the guard must read the stream
        uncompressed."""
        out = self.proxy.forward_headers(
            self.scope["headers"],  # every line as sent: repeats matter (Connection)
            self.scope.get(REQUEST_ID),
            drop=("accept-encoding", "content-type", "x-guard-mode", "x-guard-language"),
        )
        out.append((b"content-type", b"application/json"))
        out.append((b"accept-encoding", b"identity"))
        return out if self.trace is None else self.trace.upstream_headers(out)

    async def _open(self) -> UpstreamResponse | None:
        """Open the engine's stream. Two refusals are answered by asking again, each once: of
        the usage stream options the proxy added, and of the default limit it added (a context
        smaller than the default: proxy/server/engine_context.py)."""
        proxy = self.proxy
        path = self.upstream_path
        headers = self.upstream_headers()
        retry_usage = retry_limit = True
        while True:
            try:
                resp = await proxy.fast.post(path, headers, orjson.dumps(self.rw.body))
            except UpstreamFailure as exc:
                self.failure = upstream_failed(proxy.metrics, exc.kind)
                await self._error(exc.error)
                return None
            usage = retry_usage and self._injected_usage()
            limit = retry_limit and self.rw.max_tokens_action == "defaulted"
            if resp.status_code not in (400, 422) or not (usage or limit):
                return resp
            body = await self._read_all(resp)
            if body is None:
                return None
            if usage and names_usage_option(resp.status_code, body):
                log.warning(
                    "upstream rejected stream_options; without exact token counts for %.0f s",
                    proxy.usage_options.retry_after,
                )
                proxy.usage_options.rejected()
                retry_usage = False
                self._rewrite_again(usage_options=False)
                continue
            error = context_error(resp.status_code, body) if limit else None
            if error is not None:
                self._fit(error)
                retry_limit = False
                continue
            self.failure = upstream_failed(proxy.metrics, "status", resp.status_code)
            await self._relay_body(resp, body)
            return None

    def _fit(self, error: ContextError) -> None:
        """The engine refused the proxy's default limit: send none (its own limit, the rest of
        the context, is below the default it refused), and remember the model's context."""
        log.info(
            "engine refused the default limit (context %d tokens); sent again without it",
            error.max_model_len,
        )
        self.proxy.contexts.learned(self.rw.model, error)
        self.engine_limit = error.allowed
        self._rewrite_again(usage_options=self._injected_usage())

    def _rewrite_again(self, *, usage_options: bool) -> None:
        """Rewriting is pure: run it again on the client's request with what was learned."""
        said = self.rw.expectation  # the client's own x-guard-language stays the client's
        rw = rewrite_request(
            self.client_body,
            self.endpoint,
            self.proxy.policy,
            usage_options=usage_options,
            engine_limit=self.engine_limit,
            language=(said.code or "none") if said.reason == "header" else None,
        )
        if self.mode == "off":
            rw.body["stream"] = rw.client_stream
        if self.convert is not None:
            chat = self.convert(rw)
            assert isinstance(chat, Rewrite)  # the same request converted before
            rw = chat
        self.rw = rw
        self.extra[0] = (b"x-guard-max-tokens", rw.max_tokens_header.encode())

    async def _read_all(self, resp: UpstreamResponse) -> bytes | None:
        try:
            return await resp.aread()
        except UpstreamFailure as exc:
            self.failure = upstream_failed(self.proxy.metrics, exc.kind)
            await self._error(exc.error)
            return None
        finally:
            await resp.aclose()

    def _injected_usage(self) -> bool:
        opts = self.rw.body.get("stream_options")
        return isinstance(opts, dict) and opts.get("continuous_usage_stats") is True

    async def _error(self, error: GuardError) -> None:
        self.status = error.status
        self.head_sent = True
        await send_error(self.send, error, scope_headers(self.scope), path=self.scope["path"])

    async def start(self, status: int, headers: list[tuple[bytes, bytes]]) -> None:
        self.status = status
        self.head_sent = True
        await self.send({"type": "http.response.start", "status": status, "headers": headers})

    async def _relay_body(self, resp: UpstreamResponse, body: bytes) -> None:
        headers = response_headers(resp.headers, self.proxy.engine_url, keep_length=False)
        headers.append((b"content-length", str(len(body)).encode()))
        await self.start(resp.status_code, headers + self.extra)
        await self.send({"type": "http.response.body", "body": body})

    async def _relay_stream(self, resp: UpstreamResponse, watch: Watch) -> None:
        """The upstream's answer as it is (``off`` mode, upstream errors)."""
        headers = response_headers(resp.headers, self.proxy.engine_url, keep_length=True)
        self.sse_body = is_sse(resp.headers)
        await self.start(resp.status_code, headers + self.extra)
        send = self.send
        try:
            direct = DirectBody.of(send)
            if direct is not None:
                await resp.relay(direct.write)  # the bytes as they are, from the callback
            while data := await resp.read():
                watch.seq += 1
                await send({"type": "http.response.body", "body": data, "more_body": True})
                watch.seq += 1
        except UpstreamFailure as exc:
            # The engine cut its answer: the surface's error event on a stream, then a cut
            # body (never the clean end of a complete one; docs/failures.md).
            self.failure = upstream_failed(self.proxy.metrics, exc.kind)
            if self.sse_body:
                await self.send_body(failure_event(self.protocol, exc.error), watch)
            watch.cancellable = False
            await cut_response(send, self.proxy.bounds.write_timeout)
            return
        await watch.send_last(send, {"type": "http.response.body", "body": b""})

    async def run(self, watch: Watch) -> None:
        if self.mode != "off":
            # Built while the request is on its way and the engine computes the first token.
            self.detectors = DetectorMaker(self.proxy, self.rw)
            asyncio.get_running_loop().call_soon(self.detectors.prepare)
        resp = await self._open()
        if resp is None:
            return
        try:
            if resp.status_code != 200:
                self.failure = upstream_failed(self.proxy.metrics, "status", resp.status_code)
                await self._relay_stream(resp, watch)
                return
            if self.rw.body.get("stream") and not is_sse(resp.headers):
                # Not a stream: buffering it to EOF to find out what it is would hold the
                # request for as long as the engine likes; the client gets a clear 502 now.
                self.failure = upstream_failed(self.proxy.metrics, "protocol")
                await self._error(
                    UpstreamError(
                        "The upstream answered a streaming request without an event stream.",
                        code="upstream_not_streaming",
                    )
                )
                return
            if self.mode == "off":
                await self._relay_stream(resp, watch)
                return
            guard = self.guard = self._make_guard()
            if self.trace is not None:
                self.trace.watch(guard, self.detectors)
            if isinstance(guard, HealGuard):
                resp = await run_heal(self, resp, guard, watch)
                return
            if self.rw.client_stream:
                await self._stream(resp, guard, watch)
            else:
                await self._collect(resp, guard, watch)
            if guard.saw_done and not guard.aborted:
                await resp.drain(DRAIN_SECONDS)
        finally:
            watch.cancellable = False
            await resp.aclose()

    def _make_guard(self) -> StreamGuard:
        mode = self.mode
        heal = mode == "heal"
        if (
            heal
            and unhealable(
                self.protocol, self.rw.body, self.rw.n, client_stream=self.rw.client_stream
            )
            is not None
        ):
            mode, heal = "enforce", False  # no way to continue this answer: end it as enforce
        policy = GuardPolicy.for_request(
            self.protocol,
            self.rw,
            mode,
            abort_finish_reason=self.proxy.settings.abort_finish_reason,
            injected_usage=self._injected_usage(),
            client_continuous=self.client_continuous,
            max_event_bytes=self.proxy.settings.max_event_bytes,
            abort_event=self.proxy.settings.responses_abort_event,
            count_prompt=self.proxy.settings.prompt_count_timeout > 0,
        )
        maker = self.detectors
        if maker is None or not maker.serves(self.rw):
            maker = self.detectors = DetectorMaker(self.proxy, self.rw)
        if heal:
            # A constrained answer (only non-streamed ones reach here) is asked again whole.
            restart = constrained(self.rw.body)
            return HealGuard(
                policy,
                maker,
                self.heal,
                restart=restart,
                detector_for=language_detector(self.proxy, self.rw),
            )
        return StreamGuard(policy, maker)

    async def send_body(self, out: bytes, watch: Watch) -> None:
        watch.seq += 1
        await self.send({"type": "http.response.body", "body": out, "more_body": True})
        watch.seq += 1

    async def pump(
        self, resp: UpstreamResponse, guard: StreamGuard, watch: Watch, stream: bool, first: bool
    ) -> None:
        """One stage: the engine's stream through ``guard``, to the client when ``stream``
        (``first``: this stage's first content is the answer's, timed as such). The per-chunk
        path: one ``feed``, one ``send`` and the two bumps of the write-timeout sweep."""
        send = self.send
        try:
            direct = DirectBody.of(send) if stream else None
            if direct is not None or not stream:
                first = await self._relay_direct(resp, guard, direct, first)
                if guard.done:
                    return
            while data := await resp.read():
                out = guard.feed(data)
                if out and stream:
                    watch.seq += 1
                    await send({"type": "http.response.body", "body": out, "more_body": True})
                    watch.seq += 1
                    if first and guard.first_content:
                        first = False
                        self.proxy.metrics.time_to_first_token(time.perf_counter() - self.started)
                if guard.done:
                    break
            else:
                out = guard.eof()
                if out and stream:
                    await self.send_body(out, watch)
        except UpstreamFailure as exc:
            self.failure = upstream_failed(self.proxy.metrics, exc.kind)
            out = guard.upstream_failed(exc.error)
            if stream:
                await self.send_body(out, watch)

    async def _relay_direct(
        self, resp: UpstreamResponse, guard: StreamGuard, direct: DirectBody | None, first: bool
    ) -> bool:
        """The steady state of :meth:`pump`, run from the upstream connection's callback: each
        read through ``guard`` and (when ``direct``) straight to the client, without waking
        this task per chunk. It hands back to the task's loop — the same path as without it,
        so every ending, error and slow client is handled there once — when the guard is done,
        the client is gone or not reading, the body ends or the read fails. Returns whether
        the first content is still to come (``first`` on entry)."""
        error: BaseException | None = None
        ttft = self.proxy.metrics.time_to_first_token

        def on_data(data: bytes) -> bool:
            nonlocal first, error
            try:
                out = guard.feed(data)
                if out and direct is not None:
                    if first and guard.first_content:
                        first = False
                        ttft(time.perf_counter() - self.started)
                    if not direct.write(out):
                        return False
                return not guard.done
            except BaseException as exc:  # raised again in the task, not in the event loop
                error = exc
                return False

        await resp.relay(on_data)
        if error is not None:
            raise error
        return first

    async def answer(self, guard: StreamGuard) -> None:
        """The non-streamed answer (or the engine's error) once the guard is done."""
        if guard.error is not None and not guard.aborted:
            err = guard.error
            code = err.get("code")
            status = code if isinstance(code, int) and 400 <= code < 600 else 502
            if self.protocol == "messages":
                error = anthropic_error_object(err)
                rid = self.scope.get(REQUEST_ID)
                body = orjson.dumps({"type": "error", "error": error, "request_id": rid})
            else:
                body = orjson.dumps({"error": err})
        else:
            status = 200
            body = orjson.dumps(guard.response(trim=self.proxy.settings.trim_on_abort))
        await self.start(
            status, [*JSON_HEADERS, (b"content-length", str(len(body)).encode()), *self.extra]
        )
        await self.send({"type": "http.response.body", "body": body})

    async def _stream(self, resp: UpstreamResponse, guard: StreamGuard, watch: Watch) -> None:
        headers = response_headers(resp.headers, self.proxy.engine_url, keep_length=False)
        self.sse_body = True
        await self.start(200, headers + self.extra)
        self.stream_open = True
        self.proxy.metrics.stream_opened()
        await self.pump(resp, guard, watch, True, True)
        if guard.held is not None:
            # An abort whose ending waits for the engine's count of the prompt.
            await resp.aclose()  # the engine stops generating before it is asked anything
            await self.count_prompt(guard)
            await self.send_body(guard.release(), watch)
        await watch.send_last(self.send, {"type": "http.response.body", "body": b""})

    async def _collect(self, resp: UpstreamResponse, guard: StreamGuard, watch: Watch) -> None:
        await self.pump(resp, guard, watch, False, False)
        if guard.prompt_uncounted:
            await resp.aclose()
            await self.count_prompt(guard)
        watch.cancellable = False
        await self.answer(guard)

    async def count_prompt(self, guard: StreamGuard) -> None:
        """Ask the engine how many tokens the prompt is, for an aborted answer whose engine
        sent no count (:mod:`proxy.core.prompt_count`); within GUARD_PROMPT_COUNT_TIMEOUT, or
        the answer's usage leaves the count out."""
        ask = prompt_count_ask(self.protocol, self.rw.body)
        timeout = self.proxy.settings.prompt_count_timeout
        if isinstance(ask, int):
            count: int | None = ask
        elif ask is None or timeout <= 0:
            return
        else:
            proxy = self.proxy
            credentials = [
                (k, v) for k, v in self.scope["headers"] if k.lower() in _CREDENTIAL_HEADERS
            ]
            headers = {
                k.decode("latin-1"): v.decode("latin-1")
                for k, v in proxy.upstream.forward_headers(credentials)
            }
            count = await count_prompt(proxy.client, proxy.engine_url, headers, ask, timeout)
        if count is not None:
            guard.counted(count)

    async def deadline(self) -> None:
        """GUARD_REQUEST_DEADLINE passed (the upstream is closed already): end the answer."""
        error = deadline_error()
        self.failure = "deadline"
        if not self.head_sent:
            await self._error(error)
            return
        guard = self.guard if self.rw.client_stream else None
        guarded = guard is not None
        if self.sse_body:
            out = (
                failure_event(self.protocol, error)
                if guard is None
                else guard.upstream_failed(error)
            )
            await self.send_body(out, self.watch)
        if guarded:
            await self.watch.send_last(self.send, {"type": "http.response.body", "body": b""})
        else:  # the engine's own body, relayed (off mode, an error): cut, never complete
            await cut_response(self.send, self.proxy.bounds.write_timeout)
