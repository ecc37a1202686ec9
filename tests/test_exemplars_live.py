"""A real Prometheus keeps the trace id of an aborted request as the verdict counter's exemplar.

Real parts: the proxy under uvicorn with traces on (exported to tests/otlp_receiver.py), the fake
vLLM over a real socket, and Debian's Prometheus 2.x with ``--enable-feature=exemplar-storage``
scraping ``/metrics/quality`` with the repository's job — it asks for OpenMetrics, the only
format that carries exemplars. ``/api/v1/query_exemplars`` must give back the trace id the
client's ``traceparent`` started, on ``guard_detections_total{action="aborted"}``.
"""

from __future__ import annotations

import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from proxy.observability.metrics import Metrics
from tests.deploy_tools import PROMETHEUS_YML, require
from tests.fakes.vllm import FakeVLLM, Script
from tests.net import free_port
from tests.otlp_receiver import Receiver, receiving

pytestmark = pytest.mark.prometheus

TRACE = "0af7651916cd43dd8448eb211c80319c"
LOOP = "Photosynthesis starts with light. " + "I will check the file again to be sure. " * 40


@pytest.fixture
def receiver(monkeypatch: pytest.MonkeyPatch) -> Iterator[Receiver]:
    with receiving(monkeypatch) as rec:
        yield rec


@pytest.fixture
def prometheus(tmp_path: Path) -> Iterator[Callable[[str], str]]:
    """``start(target) -> URL``: Prometheus with exemplar storage, scraping the repository's
    ``proxy-quality`` job (path and all) at ``target`` every second."""
    binary = require("prometheus", "apt-get install -y --no-install-recommends prometheus")
    procs: list[subprocess.Popen[bytes]] = []

    def start(target: str) -> str:
        jobs = yaml.safe_load(PROMETHEUS_YML.read_text())["scrape_configs"]
        job = next(j for j in jobs if j["job_name"] == "proxy-quality")
        job["static_configs"] = [{"targets": [target]}]
        config = {"global": {"scrape_interval": "1s", "scrape_timeout": "1s"}}
        (tmp_path / "prometheus.yml").write_text(
            yaml.safe_dump({**config, "scrape_configs": [job]})
        )
        port = free_port()
        log = (tmp_path / "prometheus.log").open("wb")
        procs.append(
            subprocess.Popen(
                [
                    binary,
                    f"--config.file={tmp_path / 'prometheus.yml'}",
                    f"--storage.tsdb.path={tmp_path / 'data'}",
                    f"--web.listen-address=127.0.0.1:{port}",
                    "--enable-feature=exemplar-storage",
                    "--log.level=warn",
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        )
        log.close()
        return f"http://127.0.0.1:{port}"

    yield start
    for proc in procs:
        proc.terminate()
        proc.wait(10)


def exemplars(url: str, query: str) -> list[dict[str, Any]]:
    now = time.time()
    params = {"query": query, "start": str(now - 600), "end": str(now + 60)}
    try:
        resp = httpx.get(url + "/api/v1/query_exemplars", params=params, timeout=5)
    except httpx.TransportError:
        return []  # not listening yet
    if resp.status_code == 503:
        return []  # not ready yet
    answer = resp.json()
    assert answer["status"] == "success", answer
    data: list[dict[str, Any]] = answer["data"]
    return data


def test_prometheus_stores_the_trace_id_of_an_abort(
    receiver: Receiver,
    fake_upstream: FakeVLLM,
    proxy_server: Callable[..., str],
    prometheus: Callable[[str], str],
) -> None:
    base = proxy_server(metrics=Metrics(), language="en")
    fake_upstream.script = Script(texts=[LOOP])
    r = httpx.post(
        base + "/v1/chat/completions",
        json={"model": "fake-model", "messages": [{"role": "user", "content": "Hi"}]},
        headers={"traceparent": f"00-{TRACE}-b7ad6b7169203331-01"},
        timeout=30,
    )
    assert r.json()["choices"][0]["finish_reason"] == "content_filter"
    prom = prometheus(base.removeprefix("http://"))

    query = 'guard_detections_total{action="aborted"}'
    deadline = time.monotonic() + 30
    while not (found := exemplars(prom, query)):
        assert time.monotonic() < deadline, "no exemplar stored"
        time.sleep(0.25)
    (series,) = found
    assert series["seriesLabels"]["signal"] == "repetition"
    assert [e["labels"] for e in series["exemplars"]] == [{"trace_id": TRACE}]
    # The same trace the exporter sent: the link from the panel leads to the guard's spans (the
    # request's SERVER span and the model call's CLIENT span under it).
    spans = receiver.wait_for(lambda spans: len(spans) >= 2)
    assert {span["trace_id"] for span in spans} == {TRACE}
