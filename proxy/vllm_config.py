"""Watch the upstream's own ``/metrics`` for risky engine configuration (fp8 KV cache).

NOTE: stand-in; built in the observability work (issue 4). The app's lifespan starts
:func:`watch_upstream_config` as a background task when ``GUARD_UPSTREAM_METRICS_INTERVAL`` > 0.
"""

from __future__ import annotations

import httpx

from proxy.metrics import Metrics


async def watch_upstream_config(
    client: httpx.AsyncClient, upstream_url: str, metrics: Metrics, interval: float
) -> None:
    """Run until cancelled."""
    return None
