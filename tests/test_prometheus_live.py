"""A real Prometheus scrapes a live proxy; every dashboard and alert query must return data.

Set-up, all real processes and sockets on 127.0.0.1:

* the relay's fake vLLM (``tests/fakes/vllm.py``), extended here with vLLM's ``/metrics`` (fp8
  KV cache) and with chat logprobs when a request asks for them;
* the proxy under uvicorn (``proxy_server`` fixture), in front of it, with the upstream config
  watcher on;
* two small static endpoints serving the vLLM and DCGM exposition fixtures (counters growing
  with each scrape, so rates are non-zero);
* Prometheus 2.x from Debian, configured from ``prometheus/prometheus.yml`` (same jobs and
  paths, targets pointed at the above, 1 s intervals) with ``prometheus/alerts.yml``.

Traffic: two rounds of healthy (stop and length), aborted, monitor-mode, client-disconnected
and upstream-error generations, so every series exists before it grows and ``rate()`` sees it
grow. Then every PromQL expression of every panel (template variables at All) and every alert
rule goes through Prometheus's HTTP API and must parse and return data; every alert must be
pending or firing; and the aborted count in Prometheus must equal the aborted streams made.
"""

from __future__ import annotations

import json
import math
import re
import shutil
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest
import yaml
from openai import OpenAI

from proxy.observability.metrics import Metrics
from tests.deploy_tools import (
    ALERTS_YML,
    PROMETHEUS_YML,
    alert_rules,
    dashboard,
    panel_queries,
    require,
    substitute,
    variable_queries,
)
from tests.exposition_server import fixture, parse, serve_exposition, value
from tests.fakes.vllm import FakeVLLM, Script, tokenize
from tests.net import HANG_GUARD, free_port

pytestmark = pytest.mark.prometheus

MODEL = "Qwen/Qwen2.5-7B-Instruct"
LOOP = "I will check the file again to make sure it is correct. " * 60
HEALTHY = (
    "Photosynthesis is the process by which green plants, algae and some bacteria turn light "
    "into chemical energy. In the chloroplasts, chlorophyll absorbs mostly red and blue light; "
    "that energy splits water molecules, releasing oxygen as a by-product, and drives the "
    "production of ATP and NADPH. In the Calvin cycle these carriers power the fixation of "
    "carbon dioxide into three-carbon sugars, which the plant then builds into glucose, starch "
    "and cellulose. The rate of photosynthesis depends on light intensity, the concentration of "
    "carbon dioxide and temperature: each can become the limiting factor. Because nearly every "
    "food chain starts with it, and because it keeps the oxygen in the atmosphere replenished, "
    "photosynthesis is arguably the most important chemical process on Earth. "
)
#: Long enough (> 256 tokens) to fill the detector's entropy window when logprobs come back.
LONG_HEALTHY = HEALTHY + (
    "Scientists study it to improve crop yields, for instance by engineering plants whose "
    "Rubisco enzyme wastes less energy on photorespiration, and to design artificial leaves "
    "that store sunlight as fuel. Satellites measure the faint fluorescence of chlorophyll to "
    "map how actively forests and oceans grow from season to season, which feeds climate "
    "models with estimates of how much carbon the biosphere absorbs each year. Students often "
    "meet the topic first through a simple experiment: a water plant under a lamp releases "
    "bubbles of oxygen, and counting them at different distances from the light shows how the "
    "rate falls as the light weakens. Greenhouse growers use the same relationship when they "
    "enrich the air with carbon dioxide and add lamps during the short days of winter, while "
    "ecologists compare the productivity of grasslands, wetlands and tropical forests to "
    "understand where new growth is concentrated and how drought or heat waves reduce it. "
    "Even the coal and oil burned today hold energy that ancient plants captured this way "
    "hundreds of millions of years ago, long before the first animals walked on land."
)

ROUND = {"aborted": 3, "completed": 5, "client_disconnected": 1, "upstream_error": 1}


class FakeVLLMWithMetrics(FakeVLLM):
    """The relay's fake vLLM plus ``GET /metrics`` (vLLM's exposition, fp8 KV cache) and chat
    logprobs (``logprobs.content`` with two top alternatives) when the request asks."""

    exposition = fixture("vllm_fp8.txt").encode()

    async def _respond(self, rec: Any, reader: Any, writer: Any) -> bool:
        if rec.method == "GET" and rec.path.split("?")[0] == "/metrics":
            return self._send(writer, 200, self.exposition, "text/plain; version=0.0.4")
        keep: bool = await super()._respond(rec, reader, writer)
        return keep

    def _events(
        self, req: dict[str, Any], chat: bool, script: Script, request_id: str | None = None
    ) -> list[bytes | None]:
        events = super()._events(req, chat, script, request_id)
        if not (chat and req.get("logprobs")):
            return events
        out: list[bytes | None] = []
        for event in events:
            if event is None or not event.startswith(b"data: {"):
                out.append(event)
                continue
            chunk = orjson.loads(event[6:])
            for choice in chunk.get("choices", []):
                piece = (choice.get("delta") or {}).get("content")
                if piece:
                    alt = {"token": " the", "logprob": -2.3, "bytes": list(b" the")}
                    top = {"token": piece, "logprob": -0.11, "bytes": list(piece.encode())}
                    choice["logprobs"] = {"content": [{**top, "top_logprobs": [top, alt]}]}
            out.append(b"data: " + orjson.dumps(chunk) + b"\n\n")
        return out


@pytest.fixture
def fake_upstream() -> Iterator[FakeVLLM]:
    """Overrides conftest's fake for this module (``proxy_server`` picks it up)."""
    with FakeVLLMWithMetrics() as fake:
        yield fake


class Prometheus:
    def __init__(self, url: str) -> None:
        self.url = url
        self.http = httpx.Client(base_url=url, timeout=HANG_GUARD)

    def query(self, expr: str) -> dict[str, Any]:
        data: dict[str, Any] = self.http.get("/api/v1/query", params={"query": expr}).json()
        return data

    def vector(self, expr: str) -> list[dict[str, Any]]:
        answer = self.query(expr)
        assert answer["status"] == "success", f"{expr}: {answer}"
        result: list[dict[str, Any]] = answer["data"]["result"]
        return result

    def scalar(self, expr: str) -> float | None:
        result = self.vector(expr)
        return float(result[0]["value"][1]) if result else None

    def wait(self, what: str, predicate: Callable[[], bool], timeout: float = HANG_GUARD) -> None:
        """Until ``predicate()`` holds; ``timeout`` is a hang guard, not a margin."""
        deadline = time.monotonic() + timeout
        while not predicate():
            assert time.monotonic() < deadline, f"Prometheus: {what} not reached in {timeout}s"
            time.sleep(0.25)


@pytest.fixture
def prometheus_factory(tmp_path: Path) -> Iterator[Callable[[dict[str, str]], Prometheus]]:
    """Starts Prometheus with the repository's config, its targets replaced per job."""
    binary = require("prometheus", "apt-get install -y --no-install-recommends prometheus")
    procs: list[subprocess.Popen[bytes]] = []
    started: list[Prometheus] = []

    def start(targets: dict[str, str]) -> Prometheus:
        config = yaml.safe_load(PROMETHEUS_YML.read_text())
        config["global"].update(
            {"scrape_interval": "1s", "evaluation_interval": "1s", "scrape_timeout": "1s"}
        )
        for job in config["scrape_configs"]:
            job["static_configs"] = [{"targets": [targets[job["job_name"]]]}]
        (tmp_path / "prometheus.yml").write_text(yaml.safe_dump(config))
        shutil.copy(ALERTS_YML, tmp_path / "alerts.yml")
        port = free_port()
        with (tmp_path / "prometheus.log").open("wb") as log:  # the child keeps its own fd
            proc = subprocess.Popen(
                [
                    binary,
                    f"--config.file={tmp_path / 'prometheus.yml'}",
                    f"--storage.tsdb.path={tmp_path / 'data'}",
                    f"--web.listen-address=127.0.0.1:{port}",
                    "--log.level=warn",
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        procs.append(proc)
        prom = Prometheus(f"http://127.0.0.1:{port}")
        started.append(prom)

        def ready() -> bool:
            assert procs[-1].poll() is None, (tmp_path / "prometheus.log").read_text()
            try:
                return prom.http.get("/-/ready").status_code == 200
            except httpx.TransportError:
                return False

        prom.wait("ready", ready)
        return prom

    yield start
    for prom in started:
        prom.http.close()
    for proc in procs:
        proc.terminate()
        try:
            proc.wait(HANG_GUARD)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


# -- traffic ---------------------------------------------------------------------------------


def one_round(base: str, fake: FakeVLLM) -> None:
    """ROUND's generations, sequentially, each through the real proxy."""
    with OpenAI(base_url=base + "/v1", api_key="unused", max_retries=0) as client:
        _round(client, base, fake)


def _round(client: OpenAI, base: str, fake: FakeVLLM) -> None:
    messages = [{"role": "user", "content": "Explain photosynthesis."}]

    # Healthy: one with logprobs (fills the entropy window) that stops, two that hit length.
    fake.script = Script(texts=[LONG_HEALTHY], finish_reason="stop", model=MODEL)
    stream = client.chat.completions.create(
        model=MODEL,
        messages=messages,
        stream=True,
        logprobs=True,
        top_logprobs=2,
    )
    assert "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
    for _ in range(2):
        fake.script = Script(texts=[HEALTHY], finish_reason="length", model=MODEL)
        stream = client.chat.completions.create(
            model=MODEL,
            messages=messages,
            stream=True,
            max_tokens=120,
        )
        finishes = [c.choices[0].finish_reason for c in stream if c.choices]
        assert finishes[-1] == "length"

    # Degenerate: aborted by the guard (enforce mode).
    for _ in range(ROUND["aborted"]):
        fake.script = Script(texts=[LOOP], model=MODEL)
        stream = client.chat.completions.create(
            model=MODEL,
            messages=messages,
            stream=True,
        )
        finishes = [c.choices[0].finish_reason for c in stream if c.choices]
        assert finishes[-1] == "content_filter"

    # Degenerate in monitor mode: observed, relayed to the end (ends by length).
    fake.script = Script(texts=[LOOP], finish_reason="length", model=MODEL)
    r = httpx.post(
        base + "/v1/chat/completions",
        headers={"x-guard-mode": "monitor"},
        json={"model": MODEL, "messages": messages, "max_tokens": 2000},
        timeout=HANG_GUARD,
    )
    assert r.status_code == 200 and r.json()["choices"][0]["finish_reason"] == "length"

    # Degenerate in heal mode: cut at the onset, continued to a healthy stop (completed).
    fake.scripts = [
        Script(texts=["Photosynthesis starts with light. " + LOOP], model=MODEL),
        Script(texts=[HEALTHY], finish_reason="stop", model=MODEL),
    ]
    r = httpx.post(
        base + "/v1/chat/completions",
        headers={"x-guard-mode": "heal"},
        json={"model": MODEL, "messages": messages, "max_tokens": 2000},
        timeout=HANG_GUARD,
    )
    assert r.status_code == 200 and r.json()["choices"][0]["guard"]["action"] == "healed"

    # Client goes away mid-stream.
    fake.script = Script(texts=[LONG_HEALTHY], chunk_delay=0.02, model=MODEL)
    body = {"model": MODEL, "messages": messages, "stream": True}
    with httpx.stream("POST", base + "/v1/chat/completions", json=body, timeout=HANG_GUARD) as resp:
        lines = resp.iter_lines()
        for _ in range(3):
            next(lines)

    # The engine fails.
    fake.script = Script(status=500, error_body=b'{"error":{"message":"boom"}}', model=MODEL)
    r = httpx.post(
        base + "/v1/chat/completions", json={**body, "stream": False}, timeout=HANG_GUARD
    )
    assert r.status_code >= 500


def generations(metrics: Metrics) -> dict[str, float]:
    q = parse(metrics.render_quality()[0])
    return {
        outcome: value(q, "guard_generations_total", model=MODEL, endpoint="chat", outcome=outcome)
        for outcome in ROUND
    }


#: Scrapes so far of the job scraped least (a count, not a time).
SCRAPES = 'min(count_over_time(up{job=~"proxy-.*"}[1h]))'


def threshold(expr: str) -> tuple[str, str]:
    """An alert's expression split into the value it compares and its comparison."""
    found = re.fullmatch(r"(.*?)\s*((?:[<>]=?|==|!=)\s*[0-9.]+)\s*", expr, flags=re.DOTALL)
    assert found, f"no threshold in {expr!r}"
    return found[1], found[2]


def wait_for_proxy(metrics: Metrics, rounds: int) -> None:
    """Until the proxy has recorded ``rounds`` rounds (disconnects are recorded asynchronously)."""
    expected = {k: float(v * rounds) for k, v in ROUND.items()}
    deadline = time.monotonic() + HANG_GUARD
    while generations(metrics) != expected:
        assert time.monotonic() < deadline, f"proxy recorded {generations(metrics)}"
        time.sleep(0.05)


# -- the test --------------------------------------------------------------------------------


def test_every_panel_and_alert_query_returns_data(
    fake_upstream: FakeVLLM,
    proxy_server: Callable[..., str],
    prometheus_factory: Callable[[dict[str, str]], Prometheus],
) -> None:
    metrics = Metrics()
    base = proxy_server(
        metrics=metrics,
        upstream_metrics_interval=0.5,
        allow_client_override=True,
        language="en",
    )
    proxy_target = base.removeprefix("http://")
    with (
        serve_exposition({"/metrics": fixture("vllm_fp8.txt")}, grow=True) as vllm,
        serve_exposition({"/metrics": fixture("dcgm.txt")}) as dcgm,
    ):
        prom = prometheus_factory(
            {
                "proxy-infra": proxy_target,
                "proxy-quality": proxy_target,
                "vllm": vllm.url.removeprefix("http://"),
                "dcgm": dcgm.url.removeprefix("http://"),
            }
        )
        prom.wait("all four jobs up", lambda: prom.scalar("count(up == 1)") == 4)

        aborted_total = 0
        for rounds in (1, 2):
            one_round(base, fake_upstream)
            aborted_total += ROUND["aborted"]
            wait_for_proxy(metrics, rounds)
            want = float(sum(ROUND.values()) * rounds)
            prom.wait(
                f"round {rounds} scraped",
                lambda want=want: prom.scalar("sum(guard_generations_total)") == want,
            )
            # Two more scrapes of every job, so rate() has points on both sides.
            seen = prom.scalar(SCRAPES) or 0.0
            prom.wait("two more scrapes", lambda seen=seen: (prom.scalar(SCRAPES) or 0) >= seen + 2)

        # The value check: Prometheus holds exactly the aborted streams made.
        assert prom.scalar('sum(guard_generations_total{outcome="aborted"})') == aborted_total
        assert prom.scalar(f'guard_generations_total{{model="{MODEL}",outcome="aborted"}}') == (
            aborted_total
        )

        failures = []
        board = dashboard()
        checked = 0
        for where, expr in panel_queries(board):
            query = substitute(expr, rate_interval="1m", range_="5m")
            answer = prom.query(query)
            checked += 1
            if answer.get("status") != "success":
                failures.append(f"{where}: does not parse: {answer.get('error')}\n  {query}")
                continue
            result = answer["data"]["result"]
            if not result:
                failures.append(f"{where}: no data\n  {query}")
                continue
            values = [float(r["value"][1]) for r in result]
            if not any(math.isfinite(v) for v in values):
                failures.append(f"{where}: only NaN/Inf {values}\n  {query}")
        for where, expr in variable_queries(board):
            metric, label = (
                expr.removeprefix("label_values(").removesuffix(")").replace(" ", "").split(",")
            )
            answer = prom.http.get(
                f"/api/v1/label/{label}/values", params={"match[]": metric}
            ).json()
            checked += 1
            if answer.get("status") != "success" or not answer["data"]:
                failures.append(f"{where}: no values for {label} of {metric}: {answer}")
        for rule in alert_rules():
            # The value an alert compares, not the comparison: whether a ratio of a few scrapes'
            # rate() clears its threshold depends on when each lazily created series was first
            # scraped (promtool's alerts_test.yml pins the thresholds on exact series).
            answer = prom.query(threshold(rule["expr"])[0])
            checked += 1
            if answer.get("status") != "success":
                failures.append(f"alert {rule['alert']}: does not parse: {answer.get('error')}")
            elif not answer["data"]["result"]:
                failures.append(f"alert {rule['alert']}: no data\n  {rule['expr']}")
            elif not all(math.isfinite(float(r["value"][1])) for r in answer["data"]["result"]):
                failures.append(f"alert {rule['alert']}: NaN/Inf\n  {rule['expr']}")
        assert not failures, "\n".join(failures)
        assert checked == len(panel_queries(board)) + len(variable_queries(board)) + len(
            alert_rules()
        )

        # Prometheus's own rule evaluation agrees with the values: an alert whose value clears its
        # threshold is pending (its `for:` running) or firing, one whose value does not is
        # inactive, the fp8 alerts (exact, not ratios) are on, and every rule evaluates cleanly.
        rules = {r["alert"]: r["expr"] for r in alert_rules()}

        def alert_states() -> dict[str, str]:
            groups = prom.http.get("/api/v1/rules").json()["data"]["groups"]
            return {r["name"]: r["state"] for g in groups for r in g["rules"]}

        def agrees() -> bool:
            states = alert_states()
            return set(states) == set(rules) and all(
                (states[name] in ("pending", "firing")) == bool(prom.vector(expr))
                for name, expr in rules.items()
            )

        prom.wait("every alert in the state its value calls for", agrees, timeout=HANG_GUARD)
        states = alert_states()
        assert all(states[name] != "inactive" for name in rules if "FP8" in name), states
        groups = prom.http.get("/api/v1/rules").json()["data"]["groups"]
        health = {r["name"]: r["health"] for g in groups for r in g["rules"]}
        assert set(health) == {r["alert"] for r in alert_rules()}
        assert all(h == "ok" for h in health.values()), json.dumps(health)

    # The proxy's side of the same story: fp8 seen through its watcher of the upstream.
    infra = parse(metrics.render_infra()[0])
    assert value(infra, "guard_upstream_kv_cache_dtype_info", cache_dtype="fp8_e4m3") == 1
    q = parse(metrics.render_quality()[0])
    assert value(q, "guard_detections_total", model=MODEL, signal="repetition", action="observed")
    assert value(q, "guard_token_entropy_count", model=MODEL) >= 2
    assert tokenize(LONG_HEALTHY).__len__() > 256
