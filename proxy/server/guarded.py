"""The guarded routes: ``POST /v1/chat/completions`` and ``POST /v1/completions``.

A raw ASGI endpoint: per request it reads and rewrites the body and opens the engine's stream;
per chunk it feeds :class:`proxy.core.guard.StreamGuard` and writes what the guard returns. In the
steady state of a stream that happens inside the upstream connection's read callback, straight
onto uvicorn's transport (:meth:`_GuardedCall._relay_direct`,
:class:`proxy.server.asgi.DirectBody`); everything else — endings, errors, a client that reads
slowly, a ``send`` that is not uvicorn's — goes through the task's loop: one ``send`` per chunk plus
two integer bumps for the write-timeout sweep (:mod:`proxy.server.bounds`).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

import orjson

from proxy.core.chunks import named_event
from proxy.core.guard import GuardPolicy, Mode, StreamGuard
from proxy.core.heal import HealGuard
from proxy.core.heal_request import (
    HealPolicy,
    constrained,
    continuation_request,
    json_constrained,
    unhealable,
    valid_json,
)
from proxy.core.records import Endpoint, GenerationRecord
from proxy.core.retries import AbortMemory, defended, retry_keys
from proxy.core.rewrite import Rewrite, rewrite_request
from proxy.core.sse import DONE_EVENT, encode_data
from proxy.core.surfaces import messages, via_chat
from proxy.detect import Detector
from proxy.errors import (
    BadRequest,
    DeadlineExceeded,
    Forbidden,
    GuardError,
    UpstreamError,
    UpstreamFailure,
    anthropic_error_object,
)
from proxy.server.asgi import (
    JSON_HEADERS,
    MAY_OVERRIDE,
    REQUEST_ID,
    ClientGone,
    DirectBody,
    Message,
    Receive,
    Scope,
    Send,
    cut_response,
    read_body,
    response_headers,
    scope_headers,
    send_error,
)
from proxy.server.bounds import Watch, watched
from proxy.server.engine_context import ContextError, context_error
from proxy.server.paths import wire_path
from proxy.server.state import Proxy
from proxy.server.upstream_http import Response as UpstreamResponse
from proxy.server.usage_options import names_usage_option
from proxy.settings import check_language

log = logging.getLogger("coherence_guard")

_MODES = frozenset({"enforce", "monitor", "off", "heal"})
#: How long to wait for the end of a body after ``[DONE]`` before giving the connection up.
_DRAIN_SECONDS = 1.0


def deadline_error() -> DeadlineExceeded:
    return DeadlineExceeded(
        "The request ran past this deployment's time limit.", code="request_deadline"
    )


def upstream_failed(proxy: Proxy, kind: str, status: int = 0) -> None:
    """Count and log an upstream failure (never any text; the request id is in the context).

    An engine 4xx is the client's mistake relayed (info); 5xx, timeouts and broken
    connections are the deployment's problem (warning)."""
    proxy.metrics.upstream_error(kind)
    if not status:
        log.warning("upstream failed (kind=%s)", kind)
    elif status >= 500:
        log.warning("upstream answered %d", status)
    else:
        log.info("upstream answered %d", status)


class Guarded:
    """The ASGI endpoint of one guarded route."""

    def __init__(self, proxy: Proxy, endpoint: Endpoint) -> None:
        self.proxy = proxy
        self.endpoint: Endpoint = endpoint
        self.heal = HealPolicy.from_settings(proxy.settings)
        settings = proxy.settings
        #: Digests of requests aborted as loops a moment ago (this worker, this route).
        self.aborts = (
            AbortMemory(settings.retry_memory, settings.retry_window)
            if settings.retry_after_abort != "off" and settings.retry_window > 0
            else None
        )

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        proxy = self.proxy
        started = time.perf_counter()
        route = scope["path"]
        headers = dict(scope["headers"])
        try:
            mode = self._mode(scope, headers)
            raw = await read_body(receive, headers, proxy.settings.max_body_bytes)
            try:
                body = orjson.loads(raw)
            except orjson.JSONDecodeError as exc:
                raise BadRequest(f"The request body is not valid JSON: {exc}.") from None
            limit = await self._engine_limit(body, headers)
            rw = self._rewrite(body, mode, limit, self._language(scope, headers))
        except ClientGone:
            proxy.metrics.request_finished(route, 499, time.perf_counter() - started)
            return
        except GuardError as exc:
            await send_error(send, exc, scope_headers(scope), path=route)
            proxy.metrics.request_finished(route, exc.status, time.perf_counter() - started)
            return

        retry_key = None
        retried = False
        if mode == "enforce" and self.aborts is not None:
            retry_key, reask = retry_keys(self.endpoint, body)
            now = time.monotonic()
            if self.aborts.aborted_recently(retry_key, now) or (
                reask is not None and self.aborts.aborted_recently(reask, now)
            ):
                retried = True
                mode = self._retry(rw)
        opts = body.get("stream_options") if isinstance(body, dict) else None
        chat = self._via_chat(rw) if mode == "heal" else None
        answer: Send = send
        if isinstance(chat, Rewrite):
            # Heal on Responses/Messages: the chat route serves it, the surface's protocol is
            # written on the way out (proxy.core.surfaces.via_chat). ``watched`` keeps the server's
            # own send, through which it aborts a client that stopped reading.
            out = via_chat.writer(
                self.endpoint,
                rw.body,
                proxy.settings.abort_finish_reason,
                proxy.settings.responses_abort_event,
            )
            answer = SurfaceSend(send, out)
        call = _GuardedCall(proxy, scope, answer, self.endpoint, rw, mode, headers, started)
        call.heal = self.heal
        call.client_body = body
        call.engine_limit = limit
        call.client_continuous = (
            isinstance(opts, dict) and opts.get("continuous_usage_stats") is True
        )
        if isinstance(chat, Rewrite):
            call.rw = chat
            call.protocol = "chat"
            call.upstream_path = wire_path("/v1/chat/completions")
            call.client_continuous = True  # the writer reads input tokens from the first chunk
            call.convert = self._via_chat
        watch = call.watch
        try:
            await watched(receive, send, call.run, watch, proxy.bounds, call.deadline)
        finally:
            # Also after a bug in the relay: gauges and records stay balanced.
            call.finish(client_gone=watch.gone)
            if retry_key is not None:
                self._note_retry(retry_key, call.guard, retried)

    def _retry(self, rw: Rewrite) -> Mode:
        """The mode of a request the guard aborted as a loop moments ago, sent again unchanged
        or re-asked (GUARD_RETRY_AFTER_ABORT, :func:`proxy.core.retries.retry_keys`): heal, so the
        loop is cut and the answer goes on; a structured answer or one with tools (a
        continuation would restart its schema mid-string), or any with ``defend``, goes out as
        enforce with the engine's repetition defences raised instead."""
        settings = self.proxy.settings
        structured = rw.structured or bool(rw.body.get("tools"))
        if settings.retry_after_abort == "heal" and not structured:
            log.info("retry of an aborted request on %s: relayed in heal mode", self.endpoint)
            return "heal"
        if self.endpoint in ("chat", "completions"):
            rw.body = defended(
                rw.body,
                repetition_penalty=settings.heal_repetition_penalty_step,
                frequency_penalty=settings.heal_frequency_penalty_step,
                temperature=settings.heal_temperature_step,
            )
        log.info("retry of an aborted request on %s: repetition defences raised", self.endpoint)
        return "enforce"

    def _note_retry(self, key: bytes, guard: StreamGuard | None, retried: bool) -> None:
        """Remember an aborted request (its digest only); forget one whose retry ended well."""
        assert self.aborts is not None
        if guard is None:
            return
        if guard.aborted:
            self.aborts.remember(key, time.monotonic())
        elif retried and guard.saw_done:
            self.aborts.forget(key)

    def _via_chat(self, rw: Rewrite) -> Rewrite | str | None:
        """The chat form of a Responses/Messages request in heal mode (a reason string when the
        request needs its native route; ``None`` on chat and completions)."""
        if self.endpoint not in ("responses", "messages"):
            return None
        policy = self.proxy.policy
        chat = via_chat.to_chat(
            self.endpoint,
            rw,
            usage=self.proxy.usage_options.wanted() and policy.request_usage,
            logprobs=policy.request_logprobs,
        )
        if isinstance(chat, str):
            log.debug("heal on %s relayed natively as enforce (%s)", self.endpoint, chat)
        return chat

    def _mode(self, scope: Scope, headers: dict[bytes, bytes]) -> Mode:
        settings = self.proxy.settings
        mode: Mode = settings.mode
        if settings.allow_client_override:
            asked = headers.get(b"x-guard-mode")
            if asked is not None:
                if not scope.get(MAY_OVERRIDE, True):
                    raise Forbidden(
                        "This API key may not set 'x-guard-mode'.",
                        param="x-guard-mode",
                        code="override_not_allowed",
                    )
                value = asked.decode("latin-1").strip().lower()
                if value not in _MODES:
                    raise BadRequest(
                        "'x-guard-mode' must be one of enforce, monitor, off, heal.",
                        param="x-guard-mode",
                    )
                mode = value  # type: ignore[assignment]
        return mode

    async def _engine_limit(self, body: Any, headers: dict[bytes, bytes]) -> int | None:
        """The model's context, so that no default above it is sent (one dict lookup; the first
        request for a model not known yet waits for one ``GET /v1/models``)."""
        model = body.get("model") if isinstance(body, dict) else None
        model = model if isinstance(model, str) else None
        contexts = self.proxy.contexts
        if contexts.should_learn(model):
            auth = headers.get(b"authorization")
            pairs = self.proxy.upstream.forward_headers([(b"authorization", auth)] if auth else [])
            await contexts.learn(
                self.proxy.client,
                self.proxy.engine_url,
                {k.decode("latin-1"): v.decode("latin-1") for k, v in pairs},
            )
        return contexts.get(model)

    def _language(self, scope: Scope, headers: dict[bytes, bytes]) -> str | None:
        """The client's ``x-guard-language`` (a code, a language name, or ``none``), allowed
        where the operator allows ``x-guard-mode``; None when absent or not allowed."""
        asked = headers.get(b"x-guard-language")
        if asked is None or not self.proxy.settings.allow_client_override:
            return None
        if not scope.get(MAY_OVERRIDE, True):
            raise Forbidden(
                "This API key may not set 'x-guard-language'.",
                param="x-guard-language",
                code="override_not_allowed",
            )
        value = asked.decode("latin-1").strip().lower()
        if value in ("none", "off"):
            return "none"
        try:
            code = check_language(value)
        except ValueError as exc:
            raise BadRequest(f"'x-guard-language' {exc}.", param="x-guard-language") from None
        return None if code == "auto" else code

    def _rewrite(
        self, body: Any, mode: Mode, limit: int | None, language: str | None = None
    ) -> Rewrite:
        proxy = self.proxy
        try:
            rw = rewrite_request(
                body,
                self.endpoint,
                proxy.policy,
                usage_options=proxy.usage_options.wanted() and mode != "off",
                engine_limit=limit,
                language=language,
            )
        except BadRequest as exc:
            if exc.code == "max_tokens_over_cap":
                model = body.get("model") if isinstance(body, dict) else None
                proxy.metrics.max_tokens_rewritten(str(model or "unknown"), "rejected")
            raise
        model = rw.model or "unknown"
        if rw.max_tokens_action is not None:
            proxy.metrics.max_tokens_rewritten(model, rw.max_tokens_action)
        if rw.injected_language is not None:
            proxy.metrics.language_constraint(model, rw.injected_language)
        if mode != "off":
            proxy.metrics.language_expectation(model, rw.expectation.source)
        if mode == "off":
            rw.body["stream"] = rw.client_stream
        return rw


def _make_detector(proxy: Proxy, rw: Rewrite) -> Callable[[], Detector]:
    config = proxy.detector_config
    lang = rw.expected_language
    source = rw.expectation.source
    structured = rw.structured

    def make() -> Detector:
        return Detector(
            config, expected_language=lang, structured=structured, language_source=source
        )

    return make


def _language_detector(proxy: Proxy, rw: Rewrite) -> Callable[[str], Detector] | None:
    """For heal: a continuation's detector held to the language of the answer it continues,
    when the request itself named none (a named language stays the expectation)."""
    if rw.expected_language is not None or proxy.settings.expect_language == "off":
        return None
    config = proxy.detector_config
    structured = rw.structured

    def make(language: str) -> Detector:
        return Detector(config, expected_language=language, structured=structured)

    return make


class _GuardedCall:
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
        self.stream_open = False
        #: The response head went out (after that, errors are written into the body).
        self.head_sent = False
        #: The body being relayed is an SSE stream (an error can still be an event).
        self.sse_body = False
        self.upstream_failed = False
        self.client_continuous = False
        self.client_body: Any = None
        #: The largest limit the engine accepts (the model's context), when known.
        self.engine_limit: int | None = None
        self.heal = HealPolicy()
        self.watch = Watch()
        self.extra = [
            (b"x-guard-max-tokens", rw.max_tokens_header.encode()),
            (b"x-guard-language", rw.expectation.header().encode()),
            *scope_headers(scope),
        ]

    def _upstream_headers(self) -> list[tuple[bytes, bytes]]:
        """The client's headers for the rewritten JSON body; the guard must read the stream
        uncompressed."""
        out = self.proxy.forward_headers(
            self.scope["headers"],  # every line as sent: repeats matter (Connection)
            self.scope.get(REQUEST_ID),
            drop=("accept-encoding", "content-type", "x-guard-mode", "x-guard-language"),
        )
        out.append((b"content-type", b"application/json"))
        out.append((b"accept-encoding", b"identity"))
        return out

    async def _open(self) -> UpstreamResponse | None:
        """Open the engine's stream. Two refusals are answered by asking again, each once: of
        the usage stream options the proxy added, and of the default limit it added (a context
        smaller than the default: proxy/server/engine_context.py)."""
        proxy = self.proxy
        path = self.upstream_path
        headers = self._upstream_headers()
        retry_usage = retry_limit = True
        while True:
            try:
                resp = await proxy.fast.post(path, headers, orjson.dumps(self.rw.body))
            except UpstreamFailure as exc:
                upstream_failed(proxy, exc.kind)
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
            upstream_failed(proxy, "status", resp.status_code)
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
            upstream_failed(self.proxy, exc.kind)
            await self._error(exc.error)
            return None
        finally:
            await resp.aclose()

    def _injected_usage(self) -> bool:
        opts = self.rw.body.get("stream_options")
        return isinstance(opts, dict) and opts.get("continuous_usage_stats") is True

    async def _error(self, error: GuardError) -> None:
        self.status = error.status
        self.upstream_failed = True
        self.head_sent = True
        await send_error(self.send, error, scope_headers(self.scope), path=self.scope["path"])

    async def _start(self, status: int, headers: list[tuple[bytes, bytes]]) -> None:
        self.status = status
        self.head_sent = True
        await self.send({"type": "http.response.start", "status": status, "headers": headers})

    async def _relay_body(self, resp: UpstreamResponse, body: bytes) -> None:
        headers = response_headers(resp.headers, self.proxy.engine_url, keep_length=False)
        headers.append((b"content-length", str(len(body)).encode()))
        await self._start(resp.status_code, headers + self.extra)
        await self.send({"type": "http.response.body", "body": body})

    async def _relay_stream(self, resp: UpstreamResponse, watch: Watch) -> None:
        """The upstream's answer as it is (``off`` mode, upstream errors)."""
        headers = response_headers(resp.headers, self.proxy.engine_url, keep_length=True)
        self.sse_body = _is_sse(resp.headers)
        await self._start(resp.status_code, headers + self.extra)
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
            upstream_failed(self.proxy, exc.kind)
            self.upstream_failed = True
            if self.sse_body:
                await self._send_body(failure_event(self.protocol, exc.error), watch)
            watch.cancellable = False
            await cut_response(send, self.proxy.bounds.write_timeout)
            return
        await watch.send_last(send, {"type": "http.response.body", "body": b""})

    async def run(self, watch: Watch) -> None:
        resp = await self._open()
        if resp is None:
            return
        try:
            if resp.status_code != 200:
                upstream_failed(self.proxy, "status", resp.status_code)
                await self._relay_stream(resp, watch)
                return
            if self.rw.body.get("stream") and not _is_sse(resp.headers):
                # Not a stream: buffering it to EOF to find out what it is would hold the
                # request for as long as the engine likes; the client gets a clear 502 now.
                upstream_failed(self.proxy, "protocol")
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
            if isinstance(guard, HealGuard):
                resp = await self._run_heal(resp, guard, watch)
                return
            if self.rw.client_stream:
                await self._stream(resp, guard, watch)
            else:
                await self._collect(resp, guard, watch)
            if guard.saw_done and not guard.aborted:
                await resp.drain(_DRAIN_SECONDS)
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
        )
        if heal:
            # A constrained answer (only non-streamed ones reach here) is asked again whole.
            restart = constrained(self.rw.body)
            return HealGuard(
                policy,
                _make_detector(self.proxy, self.rw),
                self.heal,
                restart=restart,
                detector_for=_language_detector(self.proxy, self.rw),
            )
        return StreamGuard(policy, _make_detector(self.proxy, self.rw))

    # ------------------------------------------------------------------ heal mode
    async def _run_heal(
        self, resp: UpstreamResponse, guard: HealGuard, watch: Watch
    ) -> UpstreamResponse:
        """Relay stage after stage: on a verdict close the engine's stream, ask it to continue
        from the cut, and relay that as the same choice; after the last attempt (or when the
        continuation cannot be had) end the choice as enforce does. Returns the response it
        read last (the caller closes it)."""
        stream = self.rw.client_stream
        if stream:
            headers = response_headers(resp.headers, self.proxy.engine_url, keep_length=False)
            self.sse_body = True
            await self._start(200, headers + self.extra)
            self.stream_open = True
            self.proxy.metrics.stream_opened()
        while True:
            await self._pump(resp, guard, watch, stream, guard.attempt == 0)
            if not guard.needs_heal:
                if guard.restart and guard.attempt > 0 and not self._restart_valid(guard):
                    guard.give_up()  # not what the client's schema reads: enforce's ending
                break
            nxt = None
            remaining = guard.remaining_tokens(self.rw.max_tokens)
            if (
                guard.healable
                and guard.attempt < self.heal.max_attempts
                and remaining > 0
                and guard.retry_allowed()
            ):
                await resp.aclose()
                nxt = await self._continue(guard, remaining)
            if nxt is None:
                tail = guard.give_up()
                if stream:
                    await self._send_body(tail, watch)
                break
            resp, guard = nxt
            self.guard = guard
        if stream:
            await watch.send_last(self.send, {"type": "http.response.body", "body": b""})
        else:
            watch.cancellable = False
            await self._answer(guard)
        if guard.saw_done and not guard.aborted:
            await resp.drain(_DRAIN_SECONDS)
        return resp

    def _restart_valid(self, guard: HealGuard) -> bool:
        """A restarted constrained answer counts as healed only when it ended by itself and,
        for a JSON constraint, is one strict JSON value (the engine's grammar does not forbid
        raw control characters inside strings on every version; ``.parse()`` does)."""
        state = guard.choices.get(0)
        if state is None or state.finish_reason != "stop":
            return False
        return not json_constrained(self.rw.body) or valid_json(guard.answer_text())

    async def _continue(
        self, guard: HealGuard, remaining: int
    ) -> tuple[UpstreamResponse, HealGuard] | None:
        """Open the continuation of ``guard``'s cut answer; None when the engine will not give
        one (the failure is counted and logged; the client gets enforce's ending instead)."""
        nxt = guard.continuation()
        body = continuation_request(
            self.rw.body,
            self.protocol,
            nxt.carry.prefix,
            remaining,
            nxt.attempt,
            self.heal,
            restart=nxt.restart,
        )
        if self.rw.engine_limited:  # the engine's own limit: the rest of the context
            body.pop("max_tokens", None)
        for refit in (True, False):
            try:
                resp = await self.proxy.fast.post(
                    self.upstream_path, self._upstream_headers(), orjson.dumps(body)
                )
            except UpstreamFailure as exc:
                upstream_failed(self.proxy, exc.kind)
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
                upstream_failed(self.proxy, "status", 400)
                return None
            for key in fields:
                body[key] = min(body[key], error.allowed)
        if resp.status_code != 200 or not _is_sse(resp.headers):
            upstream_failed(self.proxy, "status", resp.status_code)
            await resp.aclose()
            return None
        return resp, nxt

    async def _send_body(self, out: bytes, watch: Watch) -> None:
        watch.seq += 1
        await self.send({"type": "http.response.body", "body": out, "more_body": True})
        watch.seq += 1

    async def _pump(
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
                    await self._send_body(out, watch)
        except UpstreamFailure as exc:
            upstream_failed(self.proxy, exc.kind)
            self.upstream_failed = True
            out = guard.upstream_failed(exc.error)
            if stream:
                await self._send_body(out, watch)

    async def _relay_direct(
        self, resp: UpstreamResponse, guard: StreamGuard, direct: DirectBody | None, first: bool
    ) -> bool:
        """The steady state of :meth:`_pump`, run from the upstream connection's callback: each
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

    async def _answer(self, guard: StreamGuard) -> None:
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
        await self._start(
            status, [*JSON_HEADERS, (b"content-length", str(len(body)).encode()), *self.extra]
        )
        await self.send({"type": "http.response.body", "body": body})

    async def _stream(self, resp: UpstreamResponse, guard: StreamGuard, watch: Watch) -> None:
        headers = response_headers(resp.headers, self.proxy.engine_url, keep_length=False)
        self.sse_body = True
        await self._start(200, headers + self.extra)
        self.stream_open = True
        self.proxy.metrics.stream_opened()
        await self._pump(resp, guard, watch, True, True)
        await watch.send_last(self.send, {"type": "http.response.body", "body": b""})

    async def _collect(self, resp: UpstreamResponse, guard: StreamGuard, watch: Watch) -> None:
        await self._pump(resp, guard, watch, False, False)
        watch.cancellable = False
        await self._answer(guard)

    async def deadline(self) -> None:
        """GUARD_REQUEST_DEADLINE passed (the upstream is closed already): end the answer."""
        error = deadline_error()
        self.upstream_failed = True
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
            await self._send_body(out, self.watch)
        if guarded:
            await self.watch.send_last(self.send, {"type": "http.response.body", "body": b""})
        else:  # the engine's own body, relayed (off mode, an error): cut, never complete
            await cut_response(self.send, self.proxy.bounds.write_timeout)

    def finish(self, *, client_gone: bool) -> None:
        proxy = self.proxy
        elapsed = time.perf_counter() - self.started
        if self.stream_open:
            proxy.metrics.stream_closed()
        guard = self.guard
        if guard is not None:
            outcome = guard.outcome(client_gone=client_gone)
            limit = self.rw.max_tokens
            if self.rw.engine_limited and guard.prompt_tokens is not None:
                limit -= guard.prompt_tokens  # the engine's own: the rest of the context
            choices = guard.records(limit)
            model = self.rw.model or str((guard.template or {}).get("model") or "unknown")
        else:
            outcome = (
                "client_disconnected"
                if client_gone
                else "upstream_error"
                if self.upstream_failed or self.status >= 400
                else "completed"
            )
            choices = []
            model = self.rw.model or "unknown"
        # Heal counts first: a generation recorded means its heal counts are there too.
        if isinstance(guard, HealGuard) and (guard.attempt > 0 or guard.gave_up):
            proxy.metrics.heal_finished(
                model,
                attempts=guard.attempt,
                success=guard.healed(),
                discarded=guard.discarded_tokens(),
            )
            log.info(
                "degenerate generation %s: model=%s endpoint=%s attempts=%d tokens_discarded=%d",
                "healed" if guard.healed() else "not healed",
                model,
                self.endpoint,
                guard.attempt,
                guard.discarded_tokens(),
            )
        proxy.metrics.record_generation(
            GenerationRecord(model=model, endpoint=self.endpoint, outcome=outcome, choices=choices)
        )
        if guard is not None and (guard.aborted or any(c.action for c in guard.choices.values())):
            self._log_detections(guard, model)
        proxy.metrics.request_finished(
            self.scope["path"], 499 if client_gone else self.status, elapsed
        )

    def _log_detections(self, guard: StreamGuard, model: str) -> None:
        """One line per detection; the text only with GUARD_LOG_TEXT=true."""
        log_text = self.proxy.settings.log_text
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
                self.endpoint,
                state.index,
                v.signal,
                v.score,
                state.tokens,
                v.onset_char,
                extra,
            )


class SurfaceSend:
    """``send`` for a Responses/Messages request served through the chat route: what the chat
    relay writes goes to the client in the surface's protocol (:mod:`proxy.core.surfaces.via_chat`).

    A streamed 200 is converted event by event as it goes; any other answer (a non-streamed
    answer, an error) is held until complete, converted once and sent with its new length.
    """

    __slots__ = ("_held", "_send", "_start", "_stream", "_writer")

    def __init__(self, send: Send, writer: via_chat.Writer) -> None:
        self._send = send
        self._writer = writer
        self._stream = False
        self._start: Message | None = None
        self._held: list[bytes] = []

    @property
    def transport(self) -> Any:
        """The server's transport behind the wrapped ``send`` (see :func:`cut_response`)."""
        return getattr(getattr(self._send, "__self__", None), "transport", None)

    async def __call__(self, message: Message) -> None:
        if message["type"] == "http.response.start":
            self._stream = message["status"] == 200 and _is_sse(message.get("headers", []))
            if self._stream:
                await self._send(message)
            else:
                self._start = message
            return
        if message["type"] != "http.response.body":
            await self._send(message)
            return
        body = message.get("body", b"")
        more = message.get("more_body", False)
        if self._stream:
            out = self._writer.stream(body) if body else b""
            if out or not more:
                await self._send({"type": "http.response.body", "body": out, "more_body": more})
            return
        self._held.append(body)
        if more:
            return
        start = self._start or {"type": "http.response.start", "status": 502, "headers": []}
        out = self._writer.answer(start["status"], b"".join(self._held))
        headers = [(k, v) for k, v in start.get("headers", []) if k.lower() != b"content-length"]
        headers.append((b"content-length", str(len(out)).encode()))
        await self._send({**start, "headers": headers})
        await self._send({"type": "http.response.body", "body": out})


def failure_event(protocol: Endpoint, error: GuardError) -> bytes:
    """The event that tells a stream's client the answer failed, in the surface's protocol
    (for a stream the guard did not follow: ``off`` mode, a deadline)."""
    if protocol == "messages":
        return messages.error_event(error)
    if protocol == "responses":
        err = error.to_dict()["error"]
        event = {"type": "error", "code": err.get("type"), "message": err.get("message")}
        return named_event(event)
    return encode_data(error.to_json()) + DONE_EVENT


def _is_sse(headers: list[tuple[bytes, bytes]]) -> bool:
    for name, value in headers:
        if name.lower() == b"content-type":
            return value.split(b";", 1)[0].strip().lower() == b"text/event-stream"
    return False
