"""The proxy's own routes: ``/health``, ``/ready``, ``/metrics``, ``/metrics/quality``.

Ordinary FastAPI routes (nothing here is on a hot path); who may call them is decided by
:class:`proxy.server.middleware.Auth` before they are reached.
"""

from __future__ import annotations

import httpx
import orjson
from fastapi import APIRouter, Request
from fastapi.responses import Response

from proxy.server import upstream
from proxy.server.state import Proxy

_JSON = "application/json"


def own_routes(proxy: Proxy) -> APIRouter:
    router = APIRouter()
    settings = proxy.settings
    metrics = proxy.metrics

    @router.get("/health")
    async def health() -> Response:
        return Response(b'{"status":"ok"}', media_type=_JSON)

    @router.get("/ready")
    async def ready() -> Response:
        for path in ("/health", "/v1/models"):
            try:
                resp = await proxy.client.get(path, timeout=settings.connect_timeout)
            except httpx.HTTPError as exc:
                body = {"status": "unavailable", "reason": upstream.translate(exc).message}
                return Response(orjson.dumps(body), 503, media_type=_JSON)
            if resp.status_code == 404:
                continue
            if resp.status_code < 400:
                return Response(b'{"status":"ready"}', media_type=_JSON)
            body2 = {"status": "unavailable", "upstream_status": resp.status_code}
            return Response(orjson.dumps(body2), 503, media_type=_JSON)
        return Response(b'{"status":"unavailable","upstream_status":404}', 503, media_type=_JSON)

    @router.get("/metrics")
    async def infra_metrics() -> Response:
        body, ctype = metrics.render_infra()
        return Response(body, headers={"content-type": ctype})

    @router.get("/metrics/quality")
    async def quality_metrics(request: Request) -> Response:
        # OpenMetrics when the scraper asks for it (Prometheus does): the format with exemplars.
        body, ctype = metrics.render_quality(request.headers.get("accept", ""))
        return Response(body, headers={"content-type": ctype})

    return router
