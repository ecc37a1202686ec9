"""What the relay reports: metrics records once per request, log lines without text."""

from __future__ import annotations

import logging
from collections.abc import Callable

import httpx
import pytest

from proxy.core.records import GenerationRecord
from proxy.observability.metrics import Metrics
from tests.fakes.vllm import FakeVLLM, Script
from tests.net import HANG_GUARD

ProxyFactory = Callable[..., str]
LOOP = "The answer is the answer. " * 300
SECRET = "zebra-umbrella-7731"


class Recorder(Metrics):
    """The real metrics, plus the records the relay handed over."""

    def __init__(self) -> None:
        super().__init__()
        self.records: list[GenerationRecord] = []
        self.streams = 0

    def record_generation(self, record: GenerationRecord) -> None:
        self.records.append(record)
        super().record_generation(record)

    def stream_opened(self) -> None:
        self.streams += 1
        super().stream_opened()

    def stream_closed(self) -> None:
        self.streams -= 1
        super().stream_closed()


def _wait(predicate: Callable[[], bool]) -> None:
    import time

    deadline = time.monotonic() + HANG_GUARD
    while not predicate() and time.monotonic() < deadline:
        time.sleep(0.01)


@pytest.mark.parametrize("stream", [True, False])
def test_aborted_generation_is_recorded_once(
    fake_upstream: FakeVLLM, proxy_server: ProxyFactory, stream: bool
) -> None:
    fake_upstream.script = Script(texts=["Fine start. " + LOOP])
    metrics = Recorder()
    base = proxy_server(metrics=metrics)
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "stream": stream}
    httpx.post(base + "/v1/chat/completions", json=body)
    _wait(lambda: bool(metrics.records))
    [record] = metrics.records
    assert (record.model, record.endpoint, record.outcome) == ("m", "chat", "aborted")
    [choice] = record.choices
    assert choice.detection_action == "aborted" and choice.finish_reason == "content_filter"
    assert choice.max_tokens == 8192 and 0 < choice.completion_tokens < 600
    assert choice.summary is not None and choice.summary.verdict is not None
    assert metrics.streams == 0
    exposition = httpx.get(base + "/metrics/quality").text
    assert 'outcome="aborted"' in exposition


def test_n2_non_streaming_with_one_looping_choice(
    fake_upstream: FakeVLLM, proxy_server: ProxyFactory
) -> None:
    healthy = "A calm and varied answer that says what it needs to and then stops."
    fake_upstream.script = Script(texts=[healthy, "Sure. " + LOOP], chunk_delay=0.001)
    metrics = Recorder()
    base = proxy_server(metrics=metrics)
    body = {"model": "m", "prompt": "x", "n": 2, "max_tokens": 2000}
    resp = httpx.post(base + "/v1/completions", json=body).json()
    first, second = resp["choices"]
    assert first["text"] == healthy and first["finish_reason"] == "stop"
    assert second["finish_reason"] == "content_filter" and "guard" in second
    assert "guard" not in first
    _wait(lambda: bool(metrics.records))
    assert [c.detection_action for c in metrics.records[0].choices] == [None, "aborted"]


@pytest.mark.parametrize("log_text", [False, True])
def test_text_is_logged_only_when_asked(
    fake_upstream: FakeVLLM,
    proxy_server: ProxyFactory,
    caplog: pytest.LogCaptureFixture,
    log_text: bool,
) -> None:
    caplog.set_level(logging.DEBUG)
    fake_upstream.script = Script(texts=[f"{SECRET} says. " + LOOP])
    base = proxy_server(log_text=log_text)
    body = {"model": "m", "messages": [{"role": "user", "content": f"prompt {SECRET}"}]}
    httpx.post(base + "/v1/chat/completions", json=body)
    _wait(lambda: any("degenerate generation" in r.getMessage() for r in caplog.records))
    lines = [r.getMessage() for r in caplog.records if r.name == "coherence_guard"]
    [line] = [m for m in lines if "degenerate generation" in m]
    assert "signal=" in line and "model=m" in line
    assert ("text=" in line) is log_text
    assert all(SECRET not in r.getMessage() for r in caplog.records)
