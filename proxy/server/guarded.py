"""The guarded routes' endpoint: chat, completions, Responses and Messages.

A raw ASGI endpoint: per request it picks the mode (``x-guard-mode``, retry memory, whether heal
can run on this surface natively or through the chat route), reads and rewrites the body
(:mod:`proxy.core.rewrite`, with the engine's context when known) and hands the request to an
:class:`~proxy.server.exchange.Exchange`, which relays the engine's stream through the guard;
what the request leaves behind is recorded once at the end (:mod:`proxy.server.report`).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable
from typing import Any

import orjson

from proxy.core.guard import StreamGuard
from proxy.core.heal_request import (
    HealPolicy,
)
from proxy.core.policy import Mode
from proxy.core.records import Endpoint
from proxy.core.retries import AbortMemory, defended, raised, retry_keys
from proxy.core.rewrite import SURFACE_SAMPLING_FIELDS, Rewrite, rewrite_request
from proxy.core.surfaces import via_chat
from proxy.errors import (
    BadRequest,
    Forbidden,
    GuardError,
)
from proxy.server.asgi import (
    MAY_OVERRIDE,
    REQUEST_ID,
    ClientGone,
    Receive,
    Scope,
    Send,
    read_body,
    scope_headers,
    send_error,
)
from proxy.server.bounds import watched
from proxy.server.exchange import Exchange
from proxy.server.paths import wire_path
from proxy.server.preload import REWRITE, salad_key
from proxy.server.report import finish
from proxy.server.state import Proxy
from proxy.server.surface_send import SurfaceSend
from proxy.settings import check_language

log = logging.getLogger("coherence_guard")

_MODES = frozenset({"enforce", "monitor", "off", "heal"})


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
            await proxy.preload.wait(REWRITE)
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
        if mode != "off":
            await proxy.preload.wait(self._word_lists(mode, rw))
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
        call = Exchange(proxy, scope, answer, self.endpoint, rw, mode, headers, started)
        if proxy.tracing is not None:
            call.trace = proxy.tracing.start(
                headers,
                endpoint=self.endpoint,
                rw=rw,
                body=body,
                mode=mode,
                started=started,
                request_id=scope.get(REQUEST_ID),
                path=route,
                engine=proxy.contexts.owner,
            )
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
            finish(call, client_gone=watch.gone)
            if retry_key is not None:
                self._note_retry(retry_key, call.guard, retried)

    def _word_lists(self, mode: Mode, rw: Rewrite) -> Iterable[str]:
        """The salad word lists this request's answer may be judged with: its expected
        language's; in heal mode any (a continuation is held to, and its vocabulary judged in,
        the language of the answer it continues)."""
        if mode == "heal":
            return self.proxy.preload.salad_keys
        language = rw.expected_language
        return (salad_key(language),) if language is not None else ()

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
        before = rw.body
        rw.body = defended(
            before,
            repetition_penalty=settings.heal_repetition_penalty_step,
            frequency_penalty=settings.heal_frequency_penalty_step,
            temperature=settings.heal_temperature_step,
            fields=SURFACE_SAMPLING_FIELDS.get(self.endpoint),
        )
        log.info(
            "retry of an aborted request on %s: repetition defences raised (%s)",
            self.endpoint,
            ", ".join(raised(before, rw.body)) or "none left to raise on this route",
        )
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
                _check_override(scope, "x-guard-mode")
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
        _check_override(scope, "x-guard-language")
        # A client sends a name in its own script as UTF-8 ("Français", "中文"); HTTP calls
        # header bytes Latin-1, which is what bytes that are not UTF-8 are read as.
        try:
            value = asked.decode("utf-8").strip().lower()
        except UnicodeDecodeError:
            value = asked.decode("latin-1").strip().lower()
        if value in ("none", "off"):
            return "none"
        try:
            code = check_language(value, names=True)
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
            proxy.metrics.language_expectation(
                model, rw.expectation.source, rw.expectation.strength
            )
        if mode == "off":
            rw.body["stream"] = rw.client_stream
        return rw


def _check_override(scope: Scope, header: str) -> None:
    """A per-request override header from a key the operator did not allow to set it: 403."""
    if not scope.get(MAY_OVERRIDE, True):
        raise Forbidden(
            f"This API key may not set '{header}'.", param=header, code="override_not_allowed"
        )
