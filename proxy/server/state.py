"""Per-worker state the endpoints share: settings, metrics, upstream clients, bounds.

One :class:`Proxy` per app (one app per worker process). Everything here is resolved once at
start-up so the per-request code only reads fields.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable

import httpx

from proxy.core.rewrite import RewritePolicy
from proxy.detect import DetectorConfig
from proxy.observability.metrics import Metrics
from proxy.observability.tracing import Tracing
from proxy.server.bounds import Bounds, Expiry
from proxy.server.engine_context import EngineContexts
from proxy.server.preload import Preload, preload_steps
from proxy.server.upstream import UpstreamConfig
from proxy.server.upstream_http import UpstreamClient
from proxy.server.usage_options import UsageOptions
from proxy.settings import Settings

log = logging.getLogger("coherence_guard")

#: Client headers never sent to the engine, whatever the route: ``expect`` (the proxy has read
#: the body already; a forwarded ``100-continue`` only confuses the exchange) and the request id
#: (replaced by the one the proxy chose).
_NEVER_FORWARDED = ("expect", "x-request-id")


class Proxy:
    """Request handling state shared by all requests of one app (one per worker)."""

    def __init__(self, settings: Settings, metrics: Metrics, detector_config: DetectorConfig):
        self.settings = settings
        self.metrics = metrics
        self.detector_config = detector_config
        self.policy = RewritePolicy.from_settings(settings)
        #: One upstream configuration (TLS, timeouts, limits, key) for both clients.
        self.upstream = UpstreamConfig.from_settings(settings)
        self.engine_url = self.upstream.url
        self._client: httpx.AsyncClient | None = None
        #: The guarded POSTs' own client (see proxy/server/upstream_http.py); httpx for the rest.
        self.fast = UpstreamClient(self.upstream)
        #: Off for a while once this upstream rejected the usage stream options.
        self.usage_options = UsageOptions(on_change=metrics.usage_options_fallback)
        #: Each model's context, so a default limit never exceeds it
        #: (proxy/server/engine_context.py).
        self.contexts = EngineContexts()
        #: OpenTelemetry traces (``None``: off, the default; see proxy/observability/tracing.py).
        self.tracing = Tracing.from_env(log_text=settings.log_text, upstream_url=self.engine_url)
        #: The detector's data, loaded beside serving (started by the app's lifespan).
        self.preload = Preload(preload_steps(settings, detector_config))
        self.bounds = Bounds(
            write_timeout=settings.client_write_timeout,
            deadline=settings.request_deadline,
            on_expire=self._expired,
        )

    def _expired(self, kind: Expiry) -> None:
        self.metrics.client_timeout(kind)

    @property
    def client(self) -> httpx.AsyncClient:
        if self._client is None:
            self._client = self.upstream.httpx_client()
        return self._client

    async def aclose(self) -> None:
        self.bounds.close()
        if self.tracing is not None:
            # Exports what is queued: network I/O, so off the event loop.
            await asyncio.to_thread(self.tracing.shutdown)
        await self.fast.aclose()
        if self._client is not None:
            await self._client.aclose()
            self._client = None

    def forward_headers(
        self,
        raw: Iterable[tuple[bytes, bytes]],
        request_id: str | None,
        drop: Iterable[str] = (),
    ) -> list[tuple[bytes, bytes]]:
        """The client's headers for the engine: hop-by-hop ones and ``drop`` removed, the
        request id forwarded, ``Authorization`` replaced by GUARD_UPSTREAM_API_KEY when set."""
        out = self.upstream.forward_headers(raw, drop=(*_NEVER_FORWARDED, *drop))
        if request_id is not None:
            out.append((b"x-request-id", request_id.encode()))
        return out
