"""Watch the upstream's own ``/metrics`` for risky engine configuration (fp8 KV cache).

vLLM exports its cache configuration as an info gauge, ``vllm:cache_config_info{cache_dtype=…}``.
An ``fp8`` KV cache with uncalibrated scales is a known cause of loops after a few hundred tokens:
exactly the degeneration this proxy aborts, but with a root cause the operator can fix. So the
proxy re-exports the dtype as ``guard_upstream_kv_cache_dtype_info{cache_dtype}`` (an alert rule
and a dashboard panel read it) and logs one warning per dtype change to fp8.

The app's lifespan starts :func:`watch_upstream_config` as a background task when
``GUARD_UPSTREAM_METRICS_INTERVAL`` > 0. It never raises out of its loop: an engine that is
down, restarting or not vLLM at all is counted (``guard_proxy_upstream_config_scrapes_total``)
and retried at the next interval.
"""

from __future__ import annotations

import asyncio
import logging
import re

import httpx

from proxy.metrics import Metrics

log = logging.getLogger(__name__)

INFO_METRIC = "vllm:cache_config_info"
SCRAPE_TIMEOUT = 5.0
# A whole vLLM exposition is ~100 KB; only the info line is parsed, the rest is skipped by a
# substring search so a scrape costs microseconds of event-loop time, not a full parse.
_LABEL = re.compile(r'([A-Za-z_][A-Za-z0-9_]*)="((?:[^"\\]|\\.)*)"')


def parse_cache_dtype(exposition: str) -> str | None:
    """``cache_dtype`` of the first ``vllm:cache_config_info`` sample, or None if there is none."""
    start = 0
    while True:
        at = exposition.find(INFO_METRIC + "{", start)
        if at < 0:
            return None
        if at == 0 or exposition[at - 1] == "\n":
            end = exposition.find("}", at)
            if end < 0:
                return None
            labels: dict[str, str] = dict(
                _LABEL.findall(exposition, at + len(INFO_METRIC) + 1, end)
            )
            dtype = labels.get("cache_dtype")
            if dtype is not None:
                return dtype.replace('\\"', '"').replace("\\\\", "\\")
        start = at + 1


def is_fp8(cache_dtype: str) -> bool:
    return cache_dtype.lower().startswith("fp8")


class _Watcher:
    def __init__(self, client: httpx.AsyncClient, upstream_url: str, metrics: Metrics) -> None:
        self._client = client
        self._url = upstream_url.rstrip("/") + "/metrics"
        self._metrics = metrics
        self._last_dtype: str | None = None
        self._failing = False

    async def scrape_once(self) -> str | None:
        try:
            response = await self._client.get(self._url, timeout=SCRAPE_TIMEOUT)
            response.raise_for_status()
            text = response.text
        except httpx.HTTPError as exc:
            self._metrics.upstream_config_scrape("error")
            if not self._failing:  # once per run of failures, not every interval
                log.info("could not read upstream metrics at %s: %s", self._url, exc)
            self._failing = True
            return None
        self._failing = False
        dtype = parse_cache_dtype(text)
        if dtype is None:
            self._metrics.upstream_config_scrape("not_vllm")
            return None
        self._metrics.upstream_config_scrape("ok")
        self._metrics.upstream_kv_cache_dtype(dtype)
        if dtype != self._last_dtype and is_fp8(dtype):
            log.warning(
                "upstream vLLM runs with an fp8 KV cache (cache_dtype=%s): uncalibrated FP8 KV "
                "scales are known to make models loop after ~500 tokens; calibrate the scales or "
                "serve with --kv-cache-dtype auto",
                dtype,
            )
        self._last_dtype = dtype
        return dtype


async def watch_upstream_config(
    client: httpx.AsyncClient, upstream_url: str, metrics: Metrics, interval: float
) -> None:
    """Scrape now, then every ``interval`` seconds, until cancelled; ``interval`` <= 0: return."""
    if interval <= 0:
        return
    watcher = _Watcher(client, upstream_url, metrics)
    while True:
        try:
            await watcher.scrape_once()
        except Exception:  # a bug here must not end the watcher (nor the app)
            metrics.upstream_config_scrape("error")
            log.exception("upstream config watcher failed; retrying in %.0f s", interval)
        await asyncio.sleep(interval)
