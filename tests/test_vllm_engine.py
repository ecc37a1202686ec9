"""The engine monitor: is the engine answering, which models it lists, and what it logs."""

from __future__ import annotations

import logging

import httpx
import pytest

from proxy.observability.labels import OTHER
from proxy.observability.metrics import Metrics
from proxy.server.engine_context import EngineContexts
from proxy.server.engine_watch import (
    EngineMonitor,
    EngineStatus,
    describe_models,
    engine_status,
    model_ids,
    probe_engine,
    watch_engine,
)
from tests.fakes.vllm import FakeVLLM, Script
from tests.net import HANG_GUARD, free_port

LOGGER = "proxy.server.engine_watch"


def test_model_ids_read_an_openai_model_list() -> None:
    body = b'{"object":"list","data":[{"id":"a","object":"model"},{"id":"b"},{"x":1},"junk"]}'
    assert model_ids(body) == ("a", "b")
    assert model_ids(b"not json") is None
    assert model_ids(b'{"detail":"Not Found"}') is None
    assert model_ids(b"[1,2]") is None


@pytest.mark.parametrize(
    ("health", "models", "answers", "listed"),
    [
        (200, 200, True, ("m",)),
        (404, 200, True, ("m",)),  # no /health: not vLLM, judged by /v1/models
        (503, 200, False, None),
        (200, 401, True, None),  # answers, but the list needs a key the proxy lacks
        (404, 404, False, None),
    ],
)
def test_engine_status_from_the_two_answers(
    health: int, models: int, answers: bool, listed: tuple[str, ...] | None
) -> None:
    status = engine_status(health, models, b'{"data":[{"id":"m"}]}')
    assert (status.answers, status.models) == (answers, listed)
    assert status.detail


def test_engine_status_when_the_connection_fails() -> None:
    status = engine_status(httpx.ConnectError("refused"), None, b"")
    assert not status.answers and "cannot connect" in status.detail


async def test_probe_reads_health_and_models_from_the_fake_engine(
    fake_upstream: FakeVLLM,
) -> None:
    async with httpx.AsyncClient() as client:
        status = await probe_engine(client, fake_upstream.url + "/")
    # vLLM names itself in its model list (owned_by), as the fake does.
    assert status == EngineStatus(True, "/health 200", (fake_upstream.script.model,), {}, "vllm")
    assert [r.path for r in fake_upstream.requests] == ["/health", "/v1/models"]


async def test_the_monitor_keeps_each_models_context(fake_upstream: FakeVLLM) -> None:
    """What vLLM lists as max_model_len, and the name it gives itself, reach the proxy's
    contexts at every check."""
    fake_upstream.script = Script(max_model_len=4096)
    fake_upstream.owned_by = "llamacpp"
    contexts = EngineContexts()
    async with httpx.AsyncClient() as client:
        monitor = EngineMonitor(
            client, fake_upstream.url, Metrics(), interval=30, contexts=contexts
        )
        status = await monitor.check()
    assert status.contexts == {"fake-model": 4096}
    assert contexts.get("fake-model") == 4096
    assert status.owner == contexts.owner == "llamacpp"


async def test_probe_of_a_closed_port_says_it_cannot_connect() -> None:
    async with httpx.AsyncClient() as client:
        status = await probe_engine(client, f"http://127.0.0.1:{free_port()}")
    assert not status.answers and "cannot connect" in status.detail


def test_monitor_logs_down_on_every_check_then_back_once(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger=LOGGER)
    now = [100.0]
    metrics = Metrics()
    monitor = EngineMonitor(
        httpx.AsyncClient(), "http://e:8000", metrics, interval=30, clock=lambda: now[0]
    )
    down = EngineStatus(False, "cannot connect (refused)")
    monitor.observe(down)
    now[0] += 30
    monitor.observe(down)
    now[0] += 30
    monitor.observe(EngineStatus(True, "/health 200", ("m1",)))
    now[0] += 30
    monitor.observe(EngineStatus(True, "/health 200", ("m1",)))  # nothing new: silent
    monitor.observe(EngineStatus(True, "/health 200", ("m1", "m2")))
    messages = [(r.levelname, r.getMessage()) for r in caplog.records if r.name == LOGGER]
    assert messages == [
        (
            "WARNING",
            "engine at http://e:8000 does not answer: cannot connect (refused); guarded "
            "requests get 502 until it does (checking every 30 s)",
        ),
        (
            "WARNING",
            "engine at http://e:8000 still does not answer after 30 s: cannot connect (refused)",
        ),
        ("INFO", "engine at http://e:8000 answers again after 60 s (/health 200; serves m1)"),
        ("INFO", "engine at http://e:8000 now serves m1, m2"),
    ]
    assert metrics.model_label("m2") == "m2" and metrics.model_label("junk") == OTHER


def test_monitor_keeps_the_last_list_when_the_engine_stops_listing(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A /v1/models that fails (401, 500) leaves the known list in force."""
    metrics = Metrics()
    monitor = EngineMonitor(httpx.AsyncClient(), "http://e", metrics, interval=1)
    monitor.observe(EngineStatus(True, "/health 200", ("m1",)))
    monitor.observe(EngineStatus(True, "/health 200; /v1/models answered 500", None))
    assert monitor.models == ("m1",)
    assert metrics.model_label("m1") == "m1" and metrics.model_label("x") == OTHER


def test_describe_models_is_short() -> None:
    assert describe_models(None) == "model list unknown"
    assert describe_models(()) == "serves no models"
    assert describe_models([f"m{i}" for i in range(8)]) == "serves m0, m1, m2, m3, m4 and 3 more"


async def test_watch_engine_sees_an_engine_that_starts_late(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The real loop against a port nobody listens on, then the fake engine on that port."""
    import asyncio

    caplog.set_level(logging.INFO, logger=LOGGER)
    port = free_port()
    metrics = Metrics()
    async with httpx.AsyncClient() as client:
        task = asyncio.create_task(watch_engine(client, f"http://127.0.0.1:{port}", metrics, 0.05))
        try:

            def said(text: str) -> bool:
                return any(text in r.getMessage() for r in caplog.records if r.name == LOGGER)

            deadline = asyncio.get_running_loop().time() + HANG_GUARD
            while not said("still does not answer"):
                assert asyncio.get_running_loop().time() < deadline
                await asyncio.sleep(0.02)
            with FakeVLLM(port=port) as fake:
                while not said("answers again"):
                    assert asyncio.get_running_loop().time() < deadline
                    await asyncio.sleep(0.02)
                assert metrics.model_label(fake.script.model) == fake.script.model
                assert metrics.model_label("made-up") == OTHER
        finally:
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task


async def test_watch_engine_with_interval_zero_does_nothing() -> None:
    async with httpx.AsyncClient() as client:
        await watch_engine(client, "http://127.0.0.1:1", Metrics(), 0)
