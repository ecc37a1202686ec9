"""The upstream config watcher against a real HTTP server serving vLLM's exposition text."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

import httpx
import pytest

from proxy.observability.metrics import Metrics
from proxy.server.engine_watch import parse_cache_dtype, watch_upstream_config
from tests.exposition_server import fixture, parse, serve_exposition, value
from tests.net import HANG_GUARD

INFO = "guard_upstream_kv_cache_dtype_info"
SCRAPES = "guard_proxy_upstream_config_scrapes_total"
FP8_WARNING = "fp8 KV cache"


def test_parse_cache_dtype_from_real_exposition() -> None:
    assert parse_cache_dtype(fixture("vllm.txt")) == "auto"
    assert parse_cache_dtype(fixture("vllm_fp8.txt")) == "fp8_e4m3"
    assert parse_cache_dtype(fixture("dcgm.txt")) is None
    assert parse_cache_dtype("") is None
    # HELP/TYPE lines and other metrics that merely contain the name are not the sample.
    text = (
        "# HELP vllm:cache_config_info{x} help\n"
        'not_vllm:cache_config_info{cache_dtype="bad"} 1\n'
        'vllm:cache_config_info{block_size="16",cache_dtype="fp8"} 1.0\n'
    )
    assert parse_cache_dtype(text) == "fp8"


async def wait_for(predicate: Callable[[], bool]) -> None:
    deadline = asyncio.get_running_loop().time() + HANG_GUARD
    while not predicate():
        assert asyncio.get_running_loop().time() < deadline, "condition not reached in time"
        await asyncio.sleep(0.02)


def scrapes_ok(metrics: Metrics) -> float:
    return value(parse(metrics.render_infra()[0]), SCRAPES, result="ok")


async def test_watcher_exports_dtype_and_warns_once_on_fp8(
    caplog: pytest.LogCaptureFixture,
) -> None:
    metrics = Metrics()
    caplog.set_level(logging.INFO, logger="proxy.server.engine_watch")
    with serve_exposition({"/metrics": fixture("vllm.txt")}) as upstream:
        async with httpx.AsyncClient() as client:
            task = asyncio.create_task(
                watch_upstream_config(client, upstream.url + "/", metrics, 0.02)
            )
            try:
                # Wait on the watcher's own count, not the server's hits: a request the server
                # has seen may not be processed by the watcher yet.
                await wait_for(lambda: scrapes_ok(metrics) >= 2)
                infra = parse(metrics.render_infra()[0])
                assert value(infra, INFO, cache_dtype="auto") == 1
                assert FP8_WARNING not in caplog.text

                upstream.routes["/metrics"] = fixture("vllm_fp8.txt")
                seen = scrapes_ok(metrics)
                await wait_for(lambda: scrapes_ok(metrics) >= seen + 4)
            finally:
                task.cancel()
                with pytest.raises(asyncio.CancelledError):
                    await task
    infra = parse(metrics.render_infra()[0])
    assert value(infra, INFO, cache_dtype="fp8_e4m3") == 1
    assert value(infra, INFO, cache_dtype="auto") == 0
    assert value(infra, SCRAPES, result="ok") >= 6
    warnings = [r for r in caplog.records if FP8_WARNING in r.getMessage()]
    assert len(warnings) == 1
    assert warnings[0].levelno == logging.WARNING
    assert "fp8_e4m3" in warnings[0].getMessage()


async def test_watcher_survives_errors_and_non_vllm_upstreams() -> None:
    metrics = Metrics()
    with serve_exposition({"/metrics": 500}) as upstream:
        async with httpx.AsyncClient() as client:
            task = asyncio.create_task(watch_upstream_config(client, upstream.url, metrics, 0.02))
            try:
                await wait_for(lambda: upstream.hits.get("/metrics", 0) >= 2)
                upstream.routes["/metrics"] = fixture("dcgm.txt")  # some other exporter
                seen = upstream.hits["/metrics"]
                await wait_for(lambda: upstream.hits["/metrics"] >= seen + 2)
                upstream.routes["/metrics"] = fixture("vllm.txt")  # vLLM came up
                seen = upstream.hits["/metrics"]
                await wait_for(lambda: upstream.hits["/metrics"] >= seen + 2)
                assert not task.done()
            finally:
                task.cancel()
                with pytest.raises(asyncio.CancelledError):
                    await task
    infra = parse(metrics.render_infra()[0])
    assert value(infra, SCRAPES, result="error") >= 2
    assert value(infra, SCRAPES, result="not_vllm") >= 2
    assert value(infra, SCRAPES, result="ok") >= 1
    assert value(infra, INFO, cache_dtype="auto") == 1


async def test_watcher_counts_connection_refused() -> None:
    metrics = Metrics()
    with serve_exposition({}) as gone:
        url = gone.url  # the port is closed once the server stops
    async with httpx.AsyncClient() as client:
        task = asyncio.create_task(watch_upstream_config(client, url, metrics, 0.02))
        try:
            await wait_for(
                lambda: value(parse(metrics.render_infra()[0]), SCRAPES, result="error") >= 2
            )
        finally:
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task


async def test_interval_zero_disables_the_watcher() -> None:
    metrics = Metrics()
    with serve_exposition({"/metrics": fixture("vllm.txt")}) as upstream:
        async with httpx.AsyncClient() as client:
            await asyncio.wait_for(
                watch_upstream_config(client, upstream.url, metrics, 0), HANG_GUARD
            )
        assert upstream.hits == {}
