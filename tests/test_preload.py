"""The detector's data loads beside serving (proxy/server/preload.py): the server answers
before the word lists are loaded, and a request that needs a list still loading waits for that
load (never starts its own, never stalls other requests) and is judged with it as any later
request is."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest

from proxy.cli.serve import create_served_app
from proxy.detect import DetectorConfig, salad
from proxy.detect.salad import SALAD_LANGUAGES
from proxy.server.preload import (
    FREQUENCIES,
    MODEL,
    NAMES,
    Preload,
    preload_steps,
    salad_languages,
)
from proxy.settings import load_settings
from tests.conftest import ProxyServer
from tests.fakes.vllm import FakeVLLM, Script
from tests.net import HANG_GUARD

SAMPLES = Path(__file__).resolve().parent / "data" / "salad" / "samples.jsonl"


@pytest.mark.parametrize(
    ("overrides", "expected"),
    [
        ({"language": "it"}, {"it"}),
        ({"language": "en", "expect_language": "off"}, {"en"}),
        ({"language": "ja", "expect_language": "off"}, set()),
        ({"language": "off", "expect_language": "off"}, set()),
        ({"language": "off", "expect_language": "prompt"}, set(SALAD_LANGUAGES)),
        ({"language": "auto", "expect_language": "off"}, set(SALAD_LANGUAGES)),
    ],
)
def test_which_word_lists_a_worker_loads(overrides: dict[str, str], expected: set[str]) -> None:
    assert salad_languages(load_settings(**overrides)) == expected


@pytest.mark.parametrize(
    ("overrides", "salad_on", "expected"),
    [
        ({}, True, [MODEL, NAMES, FREQUENCIES, *(f"salad:{c}" for c in sorted(SALAD_LANGUAGES))]),
        ({"language": "it", "expect_language": "off"}, True, [MODEL, NAMES, "salad:it"]),
        ({"language": "it", "expect_language": "off"}, False, [MODEL, NAMES]),
        ({"mode": "off"}, True, []),
    ],
)
def test_what_loads_first(overrides: dict[str, str], salad_on: bool, expected: list[str]) -> None:
    """What every request's rewrite and detector read comes first, the salad lists after; a
    worker in mode off loads nothing ahead."""
    config = DetectorConfig(salad=salad_on)
    assert [key for key, _ in preload_steps(load_settings(**overrides), config)] == expected


async def test_a_request_waits_for_the_steps_it_names_and_no_other() -> None:
    """A step held in its thread holds the requests that name it, not the others, and not the
    event loop; once it has run they go on."""
    hold = threading.Event()
    preload = Preload([("fast", lambda: None), ("held", hold.wait), ("after", lambda: None)])
    preload.start()
    try:
        await asyncio.wait_for(preload.wait(["fast", "unknown"]), HANG_GUARD)
        waiter = asyncio.create_task(preload.wait(["held"]))
        await asyncio.sleep(0)  # one turn of the loop: the waiter reaches its wait
        assert preload.waiting == 1 and not waiter.done() and not preload.done
        hold.set()
        await asyncio.wait_for(waiter, HANG_GUARD)
        await asyncio.wait_for(preload.wait(["after"]), HANG_GUARD)
        assert preload.waiting == 0
    finally:
        hold.set()
        await preload.aclose()


async def test_a_step_that_fails_is_logged_and_holds_nobody(
    caplog: pytest.LogCaptureFixture,
) -> None:
    def broken() -> None:
        raise OSError("no such file")

    preload = Preload([("broken", broken), ("next", lambda: None)])
    preload.start()
    with caplog.at_level(logging.ERROR, logger="coherence_guard"):
        await asyncio.wait_for(preload.wait(["broken", "next"]), HANG_GUARD)
        await preload.aclose()
    assert "could not load broken ahead of requests" in caplog.text
    assert preload.done


async def test_shutdown_releases_requests_still_waiting() -> None:
    hold = threading.Event()
    preload = Preload([("held", hold.wait)])
    preload.start()
    try:
        waiter = asyncio.create_task(preload.wait(["held"]))
        await asyncio.sleep(0)
        assert preload.waiting == 1
        await preload.aclose()
        await asyncio.wait_for(waiter, HANG_GUARD)
    finally:
        hold.set()  # the thread ends its step: the loop's executor can shut down


@dataclasses.dataclass
class HeldList:
    """A word list whose load, once :attr:`entered`, waits for :attr:`release`;
    :attr:`loader` is the real, cached loader behind it (its ``cache_info().misses`` counts
    the lists really read)."""

    entered: threading.Event
    release: threading.Event
    loader: Any


@pytest.fixture
def held_polish_list(monkeypatch: pytest.MonkeyPatch) -> Iterator[HeldList]:
    """The Polish salad list's load held until released (every other list loads as usual);
    the process's loaded lists are dropped first, so the load really happens. Asked for after
    ``served``, it is released before a server is stopped (which waits for the load)."""
    real = salad.lexicon
    real.cache_clear()
    held = HeldList(threading.Event(), threading.Event(), real)

    def lexicon(language: str) -> salad.Lexicon | None:
        if language == "pl":
            held.entered.set()
            held.release.wait(HANG_GUARD)
        return real(language)

    monkeypatch.setattr(salad, "lexicon", lexicon)
    yield held
    held.release.set()


@pytest.fixture
def served(
    fake_upstream: FakeVLLM, monkeypatch: pytest.MonkeyPatch
) -> Iterator[Callable[..., tuple[ProxyServer, Any]]]:
    """``served(**GUARD_vars) -> (server, app)``: the app ``coherence-guard serve`` runs in each
    worker (:func:`proxy.cli.serve.create_served_app`), under uvicorn, its settings from the
    environment as ``serve`` sets them; ``ProxyServer.start`` returns once uvicorn reports the
    application started (its lifespan done)."""
    started: list[ProxyServer] = []

    def start(**env: str) -> tuple[ProxyServer, Any]:
        monkeypatch.setenv("GUARD_UPSTREAM_URL", fake_upstream.url)
        monkeypatch.setenv("GUARD_UPSTREAM_METRICS_INTERVAL", "0")
        for name, value in env.items():
            monkeypatch.setenv("GUARD_" + name.upper(), value)
        app = create_served_app()
        server = ProxyServer(app).start()
        started.append(server)
        return server, app

    yield start
    for server in started:
        server.stop()


def test_serve_is_ready_while_a_word_list_is_still_loading(
    fake_upstream: FakeVLLM,
    served: Callable[..., tuple[ProxyServer, Any]],
    held_polish_list: HeldList,
) -> None:
    """Start-up does not wait for the word lists: the application starts and ``/health``
    answers while the Polish list's load is held. A Polish answer asked for meanwhile waits for
    that load — nothing reaches the engine until it is done — and is then cut as salad, as it
    is once the list is loaded; the list was loaded once, by the preload."""
    server, app = served(language="pl", expect_language="off")
    assert held_polish_list.entered.wait(HANG_GUARD)  # the last step: all before it are done
    assert not held_polish_list.release.is_set()
    assert httpx.get(server.url + "/health").status_code == 200
    assert not app.proxy.preload.done

    (row,) = [
        r
        for r in map(json.loads, SAMPLES.read_text(encoding="utf-8").splitlines())
        if r["expect"] == "salad-streaming"
    ]
    fake_upstream.script = Script(texts=[row["text"]])
    body = {"model": "m", "messages": [{"role": "user", "content": "x"}], "stream": True}
    with ThreadPoolExecutor(1) as pool:
        answer = pool.submit(httpx.post, server.url + "/v1/chat/completions", json=body)
        assert fake_upstream.wait_for(lambda: app.proxy.preload.waiting == 1)
        assert fake_upstream.guarded_requests() == []
        assert httpx.get(server.url + "/health").status_code == 200  # the loop is not held
        held_polish_list.release.set()
        resp = answer.result(HANG_GUARD)
    events = [
        orjson.loads(block[6:])
        for block in resp.content.split(b"\n\n")
        if block.startswith(b"data: ") and block != b"data: [DONE]"
    ]
    final = [c for e in events for c in e.get("choices") or [] if c.get("finish_reason")][-1]
    assert final["stop_reason"] == "coherence_guard:salad"
    # Read once, by the preload; not again by the stream.
    assert held_polish_list.loader.cache_info().misses == 1


def test_a_request_waits_only_for_the_lists_its_answer_may_be_judged_with(
    fake_upstream: FakeVLLM,
    served: Callable[..., tuple[ProxyServer, Any]],
    held_polish_list: HeldList,
) -> None:
    """While the Polish list loads, an English prompt (no expected language: no salad list)
    goes to the engine at once; the same prompt in heal mode waits, as a continuation is judged
    in the language of the answer it continues, whichever list that is."""
    server, app = served(allow_client_override="true")
    assert held_polish_list.entered.wait(HANG_GUARD)
    fake_upstream.script = Script(texts=["A short and quiet answer."])
    body = {"model": "m", "messages": [{"role": "user", "content": "Tell me a story."}]}
    url = server.url + "/v1/chat/completions"
    assert httpx.post(url, json=body).status_code == 200
    assert len(fake_upstream.guarded_requests()) == 1
    with ThreadPoolExecutor(1) as pool:
        healed = pool.submit(httpx.post, url, json=body, headers={"x-guard-mode": "heal"})
        assert fake_upstream.wait_for(lambda: app.proxy.preload.waiting == 1)
        assert len(fake_upstream.guarded_requests()) == 1
        held_polish_list.release.set()
        assert healed.result(HANG_GUARD).status_code == 200
    assert len(fake_upstream.guarded_requests()) == 2
