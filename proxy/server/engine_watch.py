"""Watch the engine: does it answer, which models does it serve, is its KV cache fp8.

Two background tasks of each worker, both never raising out of their loops:

* :func:`watch_engine` (every ``GUARD_UPSTREAM_CHECK_INTERVAL``) asks ``/health`` then
  ``/v1/models``. While the engine does not answer it says so at every check (a proxy that only
  returns 502s must not stay silent) and says when it comes back. The model list it reads bounds
  the metrics' ``model`` label (:meth:`Metrics.set_engine_models`): a client sending junk model
  names gets ``other``, never a series of its own, and each model's ``max_model_len`` keeps the
  default token limit within the context (:mod:`proxy.server.engine_context`). ``serve``'s app
  factory (:func:`proxy.cli.serve.create_served_app`) starts it; :func:`probe_engine_sync` is the
  same check for ``serve``'s start-up report in the parent process.
* :func:`watch_upstream_config` reads the engine's ``/metrics`` (below).

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
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import httpx

from proxy.observability.metrics import Metrics
from proxy.server.engine_context import (
    EngineContexts,
    model_contexts,
    model_entries,
    model_owner,
)

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


# ------------------------------------------------------------------------------------ engine

#: Seconds one check of the engine may take: it answers /health in milliseconds when it is up.
CHECK_TIMEOUT = 3.0
#: Models named in one log line; the rest are counted.
_MODELS_SHOWN = 5


@dataclass(frozen=True, slots=True)
class EngineStatus:
    """One check of the engine: whether it answers, why not, and the models it lists."""

    answers: bool
    detail: str
    #: Model ids from /v1/models; None when the list could not be read.
    models: tuple[str, ...] | None = None
    #: Each listed model's ``max_model_len`` (vLLM lists it; other engines may not).
    contexts: Mapping[str, int] | None = None
    #: The engine's name for itself in that list (``owned_by``: ``vllm``, ``llamacpp``, ...).
    owner: str | None = None


def _describe(exc: httpx.HTTPError) -> str:
    if isinstance(exc, httpx.ConnectError):
        return f"cannot connect ({exc or type(exc).__name__})"
    if isinstance(exc, httpx.TimeoutException):
        return f"no answer within {CHECK_TIMEOUT:g} s ({type(exc).__name__})"
    return f"{type(exc).__name__}: {exc}"


def model_ids(body: bytes) -> tuple[str, ...] | None:
    """The ``id`` of each entry of an OpenAI ``/v1/models`` answer, or None if it is not one."""
    entries = model_entries(body)
    if entries is None:
        return None
    return tuple(e["id"] for e in entries if isinstance(e.get("id"), str))


def engine_status(
    health: int | httpx.HTTPError, models: int | httpx.HTTPError | None, models_body: bytes
) -> EngineStatus:
    """Judge the answers to ``GET /health`` and ``GET /v1/models`` (status or the error).

    An engine without /health (404: not vLLM) is judged by /v1/models, as ``/ready`` does.
    """
    if isinstance(health, httpx.HTTPError):
        return EngineStatus(False, _describe(health))
    listed = model_ids(models_body) if models == 200 else None
    if health == 404 and models == 200:
        return EngineStatus(
            True, "/v1/models 200 (no /health)", listed, owner=model_owner(models_body)
        )
    if health >= 400:
        return EngineStatus(False, f"/health answered {health}")
    if isinstance(models, httpx.HTTPError):
        return EngineStatus(True, f"/health {health}; /v1/models failed: {_describe(models)}")
    if models != 200 or listed is None:
        return EngineStatus(True, f"/health {health}; /v1/models answered {models}")
    return EngineStatus(
        True, f"/health {health}", listed, model_contexts(models_body), model_owner(models_body)
    )


async def probe_engine(
    client: httpx.AsyncClient, upstream_url: str, headers: Mapping[str, str] | None = None
) -> EngineStatus:
    """``GET /health`` then ``GET /v1/models`` with a short timeout; never raises for HTTP."""
    base = upstream_url.rstrip("/")
    try:
        health: int | httpx.HTTPError = (
            await client.get(base + "/health", headers=headers, timeout=CHECK_TIMEOUT)
        ).status_code
    except httpx.HTTPError as exc:
        return engine_status(exc, None, b"")
    models: int | httpx.HTTPError
    body = b""
    try:
        resp = await client.get(base + "/v1/models", headers=headers, timeout=CHECK_TIMEOUT)
        models, body = resp.status_code, resp.content
    except httpx.HTTPError as exc:
        models = exc
    return engine_status(health, models, body)


def probe_engine_sync(
    client: httpx.Client, upstream_url: str, headers: Mapping[str, str] | None = None
) -> EngineStatus:
    """:func:`probe_engine` for a process without an event loop (``serve``'s parent)."""
    base = upstream_url.rstrip("/")
    try:
        health: int | httpx.HTTPError = client.get(
            base + "/health", headers=headers, timeout=CHECK_TIMEOUT
        ).status_code
    except httpx.HTTPError as exc:
        return engine_status(exc, None, b"")
    models: int | httpx.HTTPError
    body = b""
    try:
        resp = client.get(base + "/v1/models", headers=headers, timeout=CHECK_TIMEOUT)
        models, body = resp.status_code, resp.content
    except httpx.HTTPError as exc:
        models = exc
    return engine_status(health, models, body)


def describe_models(models: Sequence[str] | None) -> str:
    """``serves a, b`` for a log line (the first few, then a count)."""
    if models is None:
        return "model list unknown"
    if not models:
        return "serves no models"
    shown = ", ".join(models[:_MODELS_SHOWN])
    more = f" and {len(models) - _MODELS_SHOWN} more" if len(models) > _MODELS_SHOWN else ""
    return f"serves {shown}{more}"


class EngineMonitor:
    """Logs the engine's state changes (and every check while it is down) and keeps the
    metrics' model list current. :meth:`observe` holds the logic; :meth:`check` adds the I/O."""

    def __init__(
        self,
        client: httpx.AsyncClient,
        upstream_url: str,
        metrics: Metrics,
        *,
        interval: float,
        headers: Mapping[str, str] | None = None,
        clock: Callable[[], float] = time.monotonic,
        contexts: EngineContexts | None = None,
    ) -> None:
        self._contexts = contexts
        self._client = client
        self._url = upstream_url
        self._metrics = metrics
        self._interval = interval
        self._headers = headers
        self._clock = clock
        self.answers: bool | None = None
        self.models: tuple[str, ...] | None = None
        self._down_since = 0.0

    async def check(self) -> EngineStatus:
        status = await probe_engine(self._client, self._url, self._headers)
        self.observe(status)
        return status

    def observe(self, status: EngineStatus) -> None:
        now = self._clock()
        if not status.answers:
            if self.answers is not False:
                self._down_since = now
                log.warning(
                    "engine at %s does not answer: %s; guarded requests get 502 until it does "
                    "(checking every %g s)",
                    self._url,
                    status.detail,
                    self._interval,
                )
            else:
                log.warning(
                    "engine at %s still does not answer after %.0f s: %s",
                    self._url,
                    now - self._down_since,
                    status.detail,
                )
            self.answers = False
            return
        if self.answers is False:
            log.info(
                "engine at %s answers again after %.0f s (%s; %s)",
                self._url,
                now - self._down_since,
                status.detail,
                describe_models(status.models),
            )
        elif self.answers is None:
            log.info(
                "engine at %s answers (%s; %s)",
                self._url,
                status.detail,
                describe_models(status.models),
            )
        elif status.models is not None and self.models is not None and status.models != self.models:
            log.info("engine at %s now %s", self._url, describe_models(status.models))
        self.answers = True
        if status.models is not None:
            self.models = status.models
            self._metrics.set_engine_models(status.models)
        if self._contexts is not None:
            if status.contexts is not None:
                self._contexts.update(status.contexts)
            self._contexts.owner = status.owner or self._contexts.owner


async def watch_engine(
    client: httpx.AsyncClient,
    upstream_url: str,
    metrics: Metrics,
    interval: float,
    *,
    headers: Mapping[str, str] | None = None,
    contexts: EngineContexts | None = None,
) -> None:
    """Check now, then every ``interval`` seconds, until cancelled; ``interval`` <= 0: return.

    Start it as a background task of each worker's lifespan (keep a reference; cancel it at
    shutdown); it never blocks start-up. ``contexts`` gets each model's context as listed.
    """
    if interval <= 0:
        return
    monitor = EngineMonitor(
        client, upstream_url, metrics, interval=interval, headers=headers, contexts=contexts
    )
    while True:
        try:
            await monitor.check()
        except Exception:  # a bug here must not end the monitor (nor the app)
            log.exception("engine monitor failed; retrying in %g s", interval)
        await asyncio.sleep(interval)


def upstream_headers(settings: Any) -> dict[str, str] | None:
    """The Authorization the proxy's own requests to the engine carry, if it needs one."""
    key = getattr(settings, "upstream_api_key", None)
    return {"authorization": f"Bearer {key}"} if key else None
