"""The HTTP shell: guarded routes, transparent pass-through, health and metrics.

``POST /v1/chat/completions`` and ``POST /v1/completions`` are served by raw ASGI callables that
the app dispatches to before FastAPI's router: per request they skip routing, dependency
injection and response models, and per chunk they cost one ``send``. Everything else that is
not the proxy's own (``/health``, ``/ready``, ``/metrics``, ``/metrics/quality``) is relayed to
the upstream as it is: method, query, headers minus hop-by-hop ones, body, status, streaming
body.

Every upstream request runs under a watcher of the client connection: when the client goes, the
watcher cancels the handler and its ``finally`` closes the upstream response, so vLLM aborts
the generation (the 100 ms budget is one event-loop turn).
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable, MutableMapping
from typing import Any, Literal

import httpx
import orjson
from fastapi import FastAPI
from fastapi.responses import Response

from proxy import upstream
from proxy.detect import Detector, DetectorConfig
from proxy.errors import BadRequest, GuardError, PayloadTooLarge, Unauthorized
from proxy.metrics import Metrics
from proxy.records import GenerationRecord
from proxy.relay import Mode, StreamGuard
from proxy.rewrite import Endpoint, Rewrite, RewritePolicy, rewrite_request
from proxy.settings import Settings, load_detector_config, load_settings
from proxy.upstream import UpstreamConfig
from proxy.upstream_http import Response as UpstreamResponse
from proxy.upstream_http import UpstreamClient, UpstreamFailure
from proxy.usage_options import UsageOptions, names_usage_option

log = logging.getLogger("coherence_guard")

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]

GUARDED: dict[str, Endpoint] = {"/v1/chat/completions": "chat", "/v1/completions": "completions"}
OWN_ROUTES = frozenset({"/health", "/ready", "/metrics", "/metrics/quality"})
_MODES = frozenset({"enforce", "monitor", "off"})
_JSON = [(b"content-type", b"application/json")]
#: Upstream response headers the proxy's server writes itself.
_OWN_HEADERS = ("date", "server")
#: How long to wait for the end of a body after ``[DONE]`` before giving the connection up.
_DRAIN_SECONDS = 1.0


class ClientGone(Exception):
    """The client disconnected before the request body was complete."""


class _Watch:
    """The client-connection watcher of one request (see the module docstring)."""

    __slots__ = ("cancellable", "gone", "task")

    def __init__(self) -> None:
        self.gone = False
        self.cancellable = True
        self.task: asyncio.Task[Any] | None = None


class GuardApp(FastAPI):
    """FastAPI for the proxy's own routes; the guarded and pass-through paths bypass routing."""

    proxy: Proxy

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            path = scope["path"]
            endpoint = GUARDED.get(path)
            if endpoint is not None and scope["method"] == "POST":
                await self.proxy.guarded(scope, receive, send, endpoint)
                return
            if path not in OWN_ROUTES:
                await self.proxy.passthrough(scope, receive, send)
                return
        await super().__call__(scope, receive, send)


class Proxy:
    """Request handling state shared by all requests of one app (one per worker)."""

    def __init__(
        self,
        settings: Settings,
        metrics: Metrics,
        detector_config: DetectorConfig,
    ) -> None:
        self.settings = settings
        self.metrics = metrics
        self.detector_config = detector_config
        self.policy = RewritePolicy.from_settings(settings)
        self._client: httpx.AsyncClient | None = None
        #: One upstream configuration (TLS, timeouts, limits, key) for both clients.
        self.upstream = UpstreamConfig.from_settings(settings)
        #: The guarded POSTs' own client (see proxy/upstream_http.py); httpx for the rest.
        self.fast = UpstreamClient(self.upstream)
        #: Off for a while once this upstream rejected the usage stream options.
        self.usage_options = UsageOptions(on_change=metrics.usage_options_fallback)
        self._keys = [k.encode() for k in settings.api_keys]

    @property
    def client(self) -> httpx.AsyncClient:
        if self._client is None:
            self._client = self.upstream.httpx_client()
        return self._client

    async def aclose(self) -> None:
        await self.fast.aclose()
        if self._client is not None:
            await self._client.aclose()
            self._client = None

    # ------------------------------------------------------------------ helpers
    def _check_auth(self, headers: dict[bytes, bytes]) -> None:
        if not self._keys:
            return
        auth = headers.get(b"authorization", b"")
        scheme, _, key = auth.partition(b" ")
        if scheme.lower() == b"bearer" and any(
            hmac.compare_digest(key.strip(), k) for k in self._keys
        ):
            return
        raise Unauthorized("Invalid or missing API key.", code="invalid_api_key")

    def _mode(self, headers: dict[bytes, bytes]) -> Mode:
        mode: Mode = self.settings.mode
        if self.settings.allow_client_override:
            asked = headers.get(b"x-guard-mode")
            if asked is not None:
                value = asked.decode("latin-1").strip().lower()
                if value not in _MODES:
                    raise BadRequest(
                        "'x-guard-mode' must be one of enforce, monitor, off.",
                        param="x-guard-mode",
                    )
                mode = value  # type: ignore[assignment]
        return mode

    async def _read_body(self, receive: Receive, headers: dict[bytes, bytes]) -> bytes:
        limit = self.settings.max_body_bytes
        declared = headers.get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > limit:
            raise PayloadTooLarge(
                f"The request body is larger than this deployment's limit of {limit} bytes.",
                code="payload_too_large",
            )
        parts: list[bytes] = []
        size = 0
        while True:
            msg = await receive()
            if msg["type"] == "http.disconnect":
                raise ClientGone
            body = msg.get("body", b"")
            if body:
                size += len(body)
                if size > limit:
                    raise PayloadTooLarge(
                        f"The request body is larger than this deployment's limit of {limit} "
                        "bytes.",
                        code="payload_too_large",
                    )
                parts.append(body)
            if not msg.get("more_body", False):
                break
        return parts[0] if len(parts) == 1 else b"".join(parts)

    async def _send_error(self, send: Send, error: GuardError) -> None:
        body = error.to_json()
        await send(
            {
                "type": "http.response.start",
                "status": error.status,
                "headers": [*_JSON, (b"content-length", str(len(body)).encode())],
            }
        )
        await send({"type": "http.response.body", "body": body})

    async def _watched(
        self,
        receive: Receive,
        work: Callable[[_Watch], Awaitable[None]],
        watch: _Watch | None = None,
    ) -> _Watch:
        """Run ``work`` cancelled as soon as the client disconnects."""
        watch = watch or _Watch()
        task = watch.task = asyncio.current_task()

        async def watcher() -> None:
            while True:
                msg = await receive()
                if msg["type"] == "http.disconnect":
                    break
            if watch.cancellable and task is not None:
                watch.gone = True
                task.cancel()

        w = asyncio.create_task(watcher())
        try:
            # One loop turn lets the watcher see a client that is already gone, before the
            # upstream request is opened (queued requests of departed clients never reach it).
            await asyncio.sleep(0)
            await work(watch)
        except asyncio.CancelledError:
            if not watch.gone or task is None:
                raise
            task.uncancel()
        finally:
            w.cancel()
        return watch

    # ------------------------------------------------------------------ guarded routes
    async def guarded(self, scope: Scope, receive: Receive, send: Send, endpoint: Endpoint) -> None:
        started = time.perf_counter()
        route = scope["path"]
        headers = dict(scope["headers"])
        try:
            self._check_auth(headers)
            mode = self._mode(headers)
            raw = await self._read_body(receive, headers)
            try:
                body = orjson.loads(raw)
            except orjson.JSONDecodeError as exc:
                raise BadRequest(f"The request body is not valid JSON: {exc}.") from None
            rw = self._rewrite(body, endpoint, mode)
        except ClientGone:
            self.metrics.request_finished(route, 499, time.perf_counter() - started)
            return
        except GuardError as exc:
            await self._send_error(send, exc)
            self.metrics.request_finished(route, exc.status, time.perf_counter() - started)
            return

        opts = body.get("stream_options") if isinstance(body, dict) else None
        call = _GuardedCall(self, scope, send, endpoint, rw, mode, headers, started)
        call.client_body = body
        call.client_continuous = (
            isinstance(opts, dict) and opts.get("continuous_usage_stats") is True
        )
        watch = _Watch()
        try:
            await self._watched(receive, call.run, watch)
        finally:
            # Also after a bug in the relay: gauges and records stay balanced.
            call.finish(client_gone=watch.gone)

    def _rewrite(self, body: Any, endpoint: Endpoint, mode: Mode) -> Rewrite:
        try:
            usage = self.usage_options.wanted() and mode != "off"
            rw = rewrite_request(body, endpoint, self.policy, usage_options=usage)
        except BadRequest as exc:
            if exc.code == "max_tokens_over_cap":
                model = body.get("model") if isinstance(body, dict) else None
                self.metrics.max_tokens_rewritten(str(model or "unknown"), "rejected")
            raise
        model = rw.model or "unknown"
        if rw.max_tokens_action is not None:
            self.metrics.max_tokens_rewritten(model, rw.max_tokens_action)
        if rw.injected_language is not None:
            self.metrics.language_constraint(model, rw.injected_language)
        if mode == "off":
            rw.body["stream"] = rw.client_stream
        return rw

    def make_detector(self, rw: Rewrite) -> Callable[[], Detector]:
        config = self.detector_config
        lang = rw.expected_language
        structured = rw.structured

        def make() -> Detector:
            return Detector(config, expected_language=lang, structured=structured)

        return make

    def upstream_headers(self, headers: dict[bytes, bytes]) -> list[tuple[bytes, bytes]]:
        """The client's headers (``Authorization`` included) for the rewritten JSON body; the
        guard must read the stream uncompressed."""
        out = self.upstream.forward_headers(
            headers.items(), drop=("accept-encoding", "content-type", "x-guard-mode")
        )
        out.append((b"content-type", b"application/json"))
        out.append((b"accept-encoding", b"identity"))
        return out

    # ------------------------------------------------------------------ pass-through
    async def passthrough(self, scope: Scope, receive: Receive, send: Send) -> None:
        started = time.perf_counter()
        headers = dict(scope["headers"])
        try:
            self._check_auth(headers)
            body = await self._read_body(receive, headers)
        except ClientGone:
            return
        except GuardError as exc:
            await self._send_error(send, exc)
            self.metrics.request_finished("passthrough", exc.status, time.perf_counter() - started)
            return
        path = scope.get("raw_path") or scope["path"].encode()
        target = path.decode("latin-1")
        if scope.get("query_string"):
            target += "?" + scope["query_string"].decode("latin-1")
        status = 0

        async def work(watch: _Watch) -> None:
            nonlocal status
            req = self.client.build_request(
                scope["method"],
                target,
                headers=self.upstream.forward_headers(scope["headers"]),
                content=body,
            )
            try:
                resp = await self.client.send(req, stream=True)
            except httpx.HTTPError as exc:
                self.metrics.upstream_error(upstream.error_kind(exc))
                err = upstream.translate(exc)
                status = err.status
                await self._send_error(send, err)
                return
            try:
                status = resp.status_code
                await send_upstream_response(send, resp, watch)
            finally:
                watch.cancellable = False
                await resp.aclose()

        watch = await self._watched(receive, work)
        self.metrics.request_finished(
            "passthrough", 499 if watch.gone else status, time.perf_counter() - started
        )


def _response_headers(
    raw: list[tuple[bytes, bytes]], *, keep_length: bool
) -> list[tuple[bytes, bytes]]:
    drop = _OWN_HEADERS if keep_length else (*_OWN_HEADERS, "content-length")
    skip = (upstream.HOP_BY_HOP - {"content-length"}) | set(drop)
    return [(k, v) for k, v in raw if k.decode("latin-1").lower() not in skip]


async def send_upstream_response(send: Send, resp: httpx.Response, watch: _Watch) -> None:
    """Relay an httpx upstream response as it is (status, headers, streaming raw body)."""
    await send(
        {
            "type": "http.response.start",
            "status": resp.status_code,
            "headers": _response_headers(resp.headers.raw, keep_length=True),
        }
    )
    try:
        async for data in resp.aiter_raw():
            await send({"type": "http.response.body", "body": data, "more_body": True})
    except httpx.HTTPError:
        # Headers are out: all that is left is to end the body; the client sees a short body.
        pass
    watch.cancellable = False
    await send({"type": "http.response.body", "body": b""})


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
        self.endpoint: Literal["chat", "completions"] = endpoint
        self.rw = rw
        self.mode: Mode = mode
        self.headers = headers
        self.started = started
        self.status = 0
        self.guard: StreamGuard | None = None
        self.stream_open = False
        self.upstream_failed = False
        self.client_continuous = False
        self.client_body: Any = None
        self.extra = [(b"x-guard-max-tokens", rw.max_tokens_header.encode())]

    async def _open(self) -> UpstreamResponse | None:
        proxy = self.proxy
        for attempt in range(2):
            try:
                resp = await proxy.fast.post(
                    self.scope["path"],
                    proxy.upstream_headers(self.headers),
                    orjson.dumps(self.rw.body),
                )
            except UpstreamFailure as exc:
                proxy.metrics.upstream_error(exc.kind)
                await self._error(exc.error)
                return None
            if resp.status_code in (400, 422) and attempt == 0 and self._injected_usage():
                body = await self._read_all(resp)
                if body is None:
                    return None
                if names_usage_option(resp.status_code, body):
                    log.warning(
                        "upstream rejected stream_options; without exact token counts for %.0f s",
                        proxy.usage_options.retry_after,
                    )
                    proxy.usage_options.rejected()
                    # Rewriting is pure: run it again on the client's request, without them.
                    self.rw = rewrite_request(
                        self.client_body, self.endpoint, proxy.policy, usage_options=False
                    )
                    continue
                proxy.metrics.upstream_error("status")
                await self._relay_body(resp, body)
                return None
            return resp
        return None

    async def _read_all(self, resp: UpstreamResponse) -> bytes | None:
        try:
            return await resp.aread()
        except UpstreamFailure as exc:
            self.proxy.metrics.upstream_error(exc.kind)
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
        await self.proxy._send_error(self.send, error)

    async def _relay_body(self, resp: UpstreamResponse, body: bytes) -> None:
        self.status = resp.status_code
        headers = _response_headers(resp.headers, keep_length=False)
        headers.append((b"content-length", str(len(body)).encode()))
        await self.send(
            {"type": "http.response.start", "status": self.status, "headers": headers + self.extra}
        )
        await self.send({"type": "http.response.body", "body": body})

    async def _relay_stream(self, resp: UpstreamResponse, watch: _Watch) -> None:
        """The upstream's answer as it is (``off`` mode, upstream errors)."""
        self.status = resp.status_code
        headers = _response_headers(resp.headers, keep_length=True)
        await self.send(
            {"type": "http.response.start", "status": self.status, "headers": headers + self.extra}
        )
        send = self.send
        try:
            while data := await resp.read():
                await send({"type": "http.response.body", "body": data, "more_body": True})
        except UpstreamFailure as exc:
            self.proxy.metrics.upstream_error(exc.kind)
            self.upstream_failed = True
        watch.cancellable = False
        await send({"type": "http.response.body", "body": b""})

    async def run(self, watch: _Watch) -> None:
        resp = await self._open()
        if resp is None:
            return
        try:
            if resp.status_code != 200:
                self.proxy.metrics.upstream_error("status")
                await self._relay_stream(resp, watch)
                return
            if self.mode == "off":
                await self._relay_stream(resp, watch)
                return
            guard = self.guard = self._make_guard()
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
        rw = self.rw
        injected = self._injected_usage()
        wants = rw.client_wants_usage and rw.client_stream
        return StreamGuard(
            mode=self.mode,
            n=rw.n,
            make_detector=self.proxy.make_detector(rw),
            abort_finish_reason=self.proxy.settings.abort_finish_reason,
            strip_chunk_usage=injected and rw.client_stream and not self.client_continuous,
            strip_final_usage=injected and rw.client_stream and not wants,
            client_wants_usage=wants,
            collect=not rw.client_stream,
            usage_null=self.endpoint == "completions",
        )

    async def _stream(self, resp: UpstreamResponse, guard: StreamGuard, watch: _Watch) -> None:
        send = self.send
        self.status = 200
        await send(
            {
                "type": "http.response.start",
                "status": 200,
                "headers": _response_headers(resp.headers, keep_length=False) + self.extra,
            }
        )
        self.stream_open = True
        self.proxy.metrics.stream_opened()
        first = True
        try:
            while data := await resp.read():
                out = guard.feed(data)
                if out:
                    await send({"type": "http.response.body", "body": out, "more_body": True})
                    if first and guard.first_content:
                        first = False
                        self.proxy.metrics.time_to_first_token(time.perf_counter() - self.started)
                if guard.done:
                    break
            else:
                out = guard.eof()
                if out:
                    await send({"type": "http.response.body", "body": out, "more_body": True})
        except UpstreamFailure as exc:
            self.proxy.metrics.upstream_error(exc.kind)
            self.upstream_failed = True
            out = guard.upstream_failed(exc.error)
            await send({"type": "http.response.body", "body": out, "more_body": True})
        watch.cancellable = False
        await send({"type": "http.response.body", "body": b""})

    async def _collect(self, resp: UpstreamResponse, guard: StreamGuard, watch: _Watch) -> None:
        try:
            while data := await resp.read():
                guard.feed(data)
                if guard.done:
                    break
            else:
                guard.eof()
        except UpstreamFailure as exc:
            self.proxy.metrics.upstream_error(exc.kind)
            self.upstream_failed = True
            guard.upstream_failed(exc.error)
        watch.cancellable = False
        if guard.error is not None and not guard.aborted:
            err = guard.error
            code = err.get("code")
            status = code if isinstance(code, int) and 400 <= code < 600 else 502
            body = orjson.dumps({"error": err})
        else:
            status = 200
            body = orjson.dumps(
                guard.response(self.endpoint, trim=self.proxy.settings.trim_on_abort)
            )
        self.status = status
        await self.send(
            {
                "type": "http.response.start",
                "status": status,
                "headers": [*_JSON, (b"content-length", str(len(body)).encode()), *self.extra],
            }
        )
        await self.send({"type": "http.response.body", "body": body})

    def finish(self, *, client_gone: bool) -> None:
        proxy = self.proxy
        elapsed = time.perf_counter() - self.started
        if self.stream_open:
            proxy.metrics.stream_closed()
        guard = self.guard
        if guard is not None:
            outcome = guard.outcome(client_gone=client_gone)
            choices = guard.records(self.rw.max_tokens)
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


_WARM_UP_TEXT = (
    "The proxy reads a few sentences at start-up so that every lazily loaded part of the "
    "detector is ready before the first request arrives. Nothing here is sent anywhere. "
) * 4


def _warm_up(config: DetectorConfig) -> None:
    from proxy.language import identify_language

    identify_language(_WARM_UP_TEXT)
    detector = Detector(config, expected_language="en")
    for word in _WARM_UP_TEXT.split(" "):
        detector.feed(word + " ")
    detector.finish()


def create_app(
    settings: Settings | None = None,
    *,
    metrics: Metrics | None = None,
    detector_config: DetectorConfig | None = None,
) -> GuardApp:
    """Build the proxy (one per worker process); ``settings`` default to the environment."""
    settings = settings or load_settings()
    metrics = metrics or Metrics.from_settings(settings)
    proxy = Proxy(settings, metrics, detector_config or load_detector_config())

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        if settings.mode != "off":
            # Lazy parts of the detector (the language model: ~0.4 s) load now, not inside the
            # first request, where they would stall every stream of this worker.
            await asyncio.to_thread(_warm_up, proxy.detector_config)
        watcher: asyncio.Task[None] | None = None
        if settings.upstream_metrics_interval > 0:
            from proxy.vllm_config import watch_upstream_config

            watcher = asyncio.create_task(
                watch_upstream_config(
                    proxy.client, settings.upstream_url, metrics, settings.upstream_metrics_interval
                )
            )
        try:
            yield
        finally:
            if watcher is not None:
                watcher.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await watcher
            await proxy.aclose()

    app = GuardApp(
        title="Coherence Guard", lifespan=lifespan, docs_url=None, redoc_url=None, openapi_url=None
    )
    app.proxy = proxy
    app.state.proxy = proxy
    app.state.metrics = metrics
    app.state.settings = settings

    @app.get("/health")
    async def health() -> Response:
        return Response(b'{"status":"ok"}', media_type="application/json")

    @app.get("/ready")
    async def ready() -> Response:
        for path in ("/health", "/v1/models"):
            try:
                resp = await proxy.client.get(path, timeout=settings.connect_timeout)
            except httpx.HTTPError as exc:
                body = {"status": "unavailable", "reason": upstream.translate(exc).message}
                return Response(orjson.dumps(body), 503, media_type="application/json")
            if resp.status_code == 404:
                continue
            if resp.status_code < 400:
                return Response(b'{"status":"ready"}', media_type="application/json")
            body2 = {"status": "unavailable", "upstream_status": resp.status_code}
            return Response(orjson.dumps(body2), 503, media_type="application/json")
        return Response(
            b'{"status":"unavailable","upstream_status":404}', 503, media_type="application/json"
        )

    @app.get("/metrics")
    async def infra_metrics() -> Response:
        body, ctype = metrics.render_infra()
        return Response(body, headers={"content-type": ctype})

    @app.get("/metrics/quality")
    async def quality_metrics() -> Response:
        body, ctype = metrics.render_quality()
        return Response(body, headers={"content-type": ctype})

    return app


def create_app_from_env() -> GuardApp:
    """Factory for ``uvicorn --factory`` (one app per worker process)."""
    settings = load_settings()
    if not log.handlers:
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
        log.addHandler(handler)
        log.setLevel(settings.log_level.upper())
    return create_app(settings)
