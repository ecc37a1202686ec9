"""The HTTP shell: the app factory, the middleware stack and the dispatcher.

Request path (outermost first)::

    RequestId → CanonicalPath → Auth → app.add_middleware(...) → Dispatcher
        ├── POST /v1/chat/completions, /v1/completions → Guarded      (proxy/server/guarded.py)
        ├── /health, /ready, /metrics, /metrics/quality → FastAPI      (proxy/server/routes.py)
        ├── unguarded generating route, GUARD_UNGUARDED_ROUTES=reject → 403
        └── anything else → Passthrough                                (proxy/server/passthrough.py)

The guarded and pass-through endpoints are raw ASGI callables: per request they pay one dict
lookup in the dispatcher, per chunk one ``send`` — no routing, dependency injection, response
models, or Starlette's error middleware (which wraps ``send`` and so costs per chunk). They sit
*inside* the user's middleware, so ``app.add_middleware(...)`` sees every request; FastAPI's own
stack (error and exception middleware, router) serves only the proxy's own routes.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator

from fastapi import FastAPI
from starlette.applications import Starlette

from proxy.detect import DetectorConfig
from proxy.errors import Forbidden
from proxy.observability.metrics import Metrics
from proxy.server.asgi import ASGIApp, Message, Receive, Scope, Send, scope_headers, send_error
from proxy.server.guarded import Guarded
from proxy.server.middleware import Auth, CanonicalPath, RequestId
from proxy.server.passthrough import Passthrough
from proxy.server.paths import GUARDED, OWN_ROUTES, UNGUARDED_GENERATING
from proxy.server.routes import own_routes
from proxy.server.state import Proxy
from proxy.settings import Settings, load_detector_config, load_settings

log = logging.getLogger("coherence_guard")


class Dispatcher:
    """The innermost app: routes one request by its canonical path (set by CanonicalPath)."""

    def __init__(self, proxy: Proxy, own: ASGIApp) -> None:
        self.own = own
        self.guarded = {path: Guarded(proxy, endpoint) for path, endpoint in GUARDED.items()}
        self.passthrough = Passthrough(proxy)
        self.reject = (
            frozenset(UNGUARDED_GENERATING)
            if proxy.settings.unguarded_routes == "reject"
            else frozenset()
        )

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.own(scope, receive, send)
            return
        path = scope["path"]
        endpoint = self.guarded.get(path)
        if endpoint is not None and scope["method"] == "POST":
            await endpoint(scope, receive, send)
        elif path in OWN_ROUTES:
            await self.own(scope, receive, _with_headers(send, scope_headers(scope)))
        elif path in self.reject:
            error = Forbidden(
                f"{path} is not guarded by this deployment (GUARD_UNGUARDED_ROUTES=reject).",
                code="route_not_guarded",
            )
            await send_error(send, error, scope_headers(scope), path=path)
        else:
            await self.passthrough(scope, receive, send)


def _with_headers(send: Send, headers: list[tuple[bytes, bytes]]) -> Send:
    """``send`` adding ``headers`` to the response head (own routes only: not a hot path)."""
    if not headers:
        return send

    async def wrapped(message: Message) -> None:
        if message["type"] == "http.response.start":
            message["headers"] = [*message.get("headers", ()), *headers]
        await send(message)

    return wrapped


class GuardApp(FastAPI):
    """FastAPI whose middleware stack ends in the :class:`Dispatcher` (see the module doc)."""

    proxy: Proxy

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """A guarded route skips FastAPI's native OpenTelemetry layer (FastAPI >= 0.165).

        That layer switches itself on whenever a global tracer, meter or logger provider is
        set, as ``opentelemetry-instrument`` and the OpenTelemetry operator's injection do, and
        then wraps ``send`` for the whole request: every relayed chunk pays a Python layer and
        loses the direct write onto uvicorn's transport (a third more instructions per event),
        and the request gets a second server span beside the proxy's own (its GenAI span,
        ``proxy/observability/tracing.py``). Every other route — pass-through, the proxy's own —
        keeps FastAPI's behaviour, so each request has one server span either way. The user's
        middleware still sees every request: it is in the stack, which this does not touch.
        """
        if scope["type"] == "http" and scope["path"] in GUARDED:
            if self.root_path:
                scope["root_path"] = self.root_path
            await Starlette.__call__(self, scope, receive, send)
            return
        await super().__call__(scope, receive, send)

    def build_middleware_stack(self) -> ASGIApp:
        user, self.user_middleware = self.user_middleware, []
        try:
            own = super().build_middleware_stack()
        finally:
            self.user_middleware = user
        proxy = self.proxy
        settings = proxy.settings
        app: ASGIApp = Dispatcher(proxy, own)
        for cls, args, kwargs in reversed(user):
            app = cls(app, *args, **kwargs)
        app = Auth(
            app,
            api_keys=settings.api_keys,
            override_keys=settings.override_api_keys,
            metrics_keys=settings.metrics_api_keys,
            protect_metrics=settings.protect_metrics,
        )
        app = CanonicalPath(app)
        return RequestId(app)


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
        # The detector's data loads beside serving (proxy/server/preload.py): the port answers
        # at once, and a request that needs data not loaded yet waits for that load alone.
        proxy.preload.start()
        watcher: asyncio.Task[None] | None = None
        if settings.upstream_metrics_interval > 0:
            from proxy.server.engine_watch import watch_upstream_config

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
            await proxy.preload.aclose()
            await proxy.aclose()

    app = GuardApp(
        title="Coherence Guard", lifespan=lifespan, docs_url=None, redoc_url=None, openapi_url=None
    )
    app.proxy = proxy
    app.state.proxy = proxy
    app.state.metrics = metrics
    app.state.settings = settings
    app.include_router(own_routes(proxy))
    return app


def create_app_from_env() -> GuardApp:
    """Factory for ``uvicorn --factory`` (one app per worker process)."""
    from proxy.observability.logs import configure_logging

    settings = load_settings()
    configure_logging(settings)
    return create_app(settings)
