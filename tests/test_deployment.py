"""The deployment files, checked with the real tools: promtool, docker compose, the generator.

Every metric a dashboard panel, a template variable or an alert rule selects must exist in the
proxy's own exposition or in the vLLM / DCGM fixtures (real exposition text, see
``tests/data/exposition/README.md``): a misspelt metric fails here, not on an operator's
empty panel.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
import yaml

from proxy.core.records import ChoiceRecord, GenerationRecord
from proxy.detect import Summary, Verdict
from proxy.observability.metrics import Metrics
from tests.deploy_tools import (
    ALERTS_YML,
    COMPOSE,
    DASHBOARD,
    PROMETHEUS_YML,
    ROOT,
    alert_rules,
    compose_command,
    dashboard,
    metric_names,
    panel_queries,
    panels,
    require,
    variable_queries,
)
from tests.exposition_server import EXPOSITION_DIR, parse
from tests.net import HANG_GUARD

#: Series Prometheus makes itself for every target.
SYNTHETIC = {"up", "scrape_duration_seconds", "scrape_samples_scraped"}
PROMETHEUS_INSTALL = "apt-get install -y --no-install-recommends prometheus"


def _proxy_exposition() -> set[str]:
    """Sample names of a proxy whose every metric has been touched once."""
    m = Metrics()
    verdict = Verdict("repetition", 0.9, 400, 100, 200)
    summary = Summary(400, 100, 0.9, 0.2, 0.5, verdict)
    m.record_generation(
        GenerationRecord(
            "m",
            "chat",
            "aborted",
            [ChoiceRecord(0, "content_filter", 100, summary, "aborted", 1000)],
        )
    )
    m.max_tokens_rewritten("m", "clamped")
    m.heal_finished("m", attempts=1, success=True, discarded=40)
    m.language_constraint("m", "de")
    m.request_finished("/v1/chat/completions", 200, 0.1)
    m.time_to_first_token(0.1)
    m.stream_opened()
    m.upstream_error("timeout")
    m.upstream_kv_cache_dtype("auto")
    m.upstream_config_scrape("ok")
    names = {name for name, _ in parse(m.render_quality()[0])}
    return names | {name for name, _ in parse(m.render_infra()[0])}


def _known_metrics() -> set[str]:
    names = _proxy_exposition() | SYNTHETIC
    for path in EXPOSITION_DIR.glob("*.txt"):
        names |= {name for name, _ in parse(path.read_text())}
    return names


def _all_queries() -> list[tuple[str, str]]:
    board = dashboard()
    rules = [(f"alert {r['alert']}", r["expr"]) for r in alert_rules()]
    return panel_queries(board) + variable_queries(board) + rules


# -- metric names ------------------------------------------------------------------------------


def test_every_metric_in_dashboard_and_alerts_exists() -> None:
    known = _known_metrics()
    missing = {
        f"{where}: {name}"
        for where, expr in _all_queries()
        for name in metric_names(expr)
        if name not in known
    }
    assert not missing, f"unknown metrics: {sorted(missing)}"


def test_metric_name_check_catches_typos() -> None:
    """The extractor sees through functions, labels, ranges and grouping: a typo is caught."""
    known = _known_metrics()
    good = (
        "histogram_quantile(0.99, sum by (le, model) "
        '(rate(guard_repetition_score_bucket{model=~"a"}[5m]))) > 0.5 '
        "and on (model) sum by (model) (vllm:num_requests_running offset 5m)"
    )
    assert metric_names(good) == {"guard_repetition_score_bucket", "vllm:num_requests_running"}
    assert metric_names(good) <= known
    typo = 'sum(rate(guard_generation_total{outcome="aborted"}[5m]))'
    assert metric_names(typo) == {"guard_generation_total"}
    assert not metric_names(typo) <= known
    assert metric_names("label_values(guard_generations_total, model)") == {
        "guard_generations_total"
    }


def test_the_issue_names_every_quality_metric_the_dashboard_needs() -> None:
    used = set().union(*(metric_names(e) for _, e in _all_queries()))
    for name in (
        "DCGM_FI_DEV_GPU_UTIL",
        "DCGM_FI_DEV_FB_USED",
        "DCGM_FI_DEV_POWER_USAGE",
        "vllm:kv_cache_usage_perc",
        "vllm:num_requests_running",
        "vllm:num_requests_waiting",
        "vllm:time_to_first_token_seconds_bucket",
        "vllm:inter_token_latency_seconds_bucket",
        "vllm:generation_tokens_total",
        "guard_abort_position_tokens_bucket",
        "guard_completion_tokens_bucket",
        "guard_tokens_saved_total",
        "guard_detections_total",
        "guard_finish_reason_total",
        "guard_repetition_score_bucket",
        "guard_lexical_diversity_bucket",
        "guard_token_entropy_bucket",
        "guard_upstream_kv_cache_dtype_info",
    ):
        assert name in used, name


# -- dashboard structure -----------------------------------------------------------------------


def test_dashboard_layout_rows_and_variables() -> None:
    board = dashboard()
    assert board["title"] == "Coherence Guard — three planes"
    rows = [p["title"] for p in board["panels"] if p["type"] == "row"]
    assert [r.split(" —")[0] for r in rows] == [
        "System plane",
        "Model / decoding plane",
        "Architecture / context plane",
        "Proxy (infra)",
    ]
    variables = {v["name"]: v for v in board["templating"]["list"]}
    assert {"model", "instance", "datasource"} <= set(variables)
    for name in ("model", "instance"):
        assert variables[name]["includeAll"] and variables[name]["allValue"] == ".*"
    ids = [p["id"] for p in panels(board)]
    assert len(ids) == len(set(ids))
    heatmaps = [p for p in panels(board) if p["type"] == "heatmap"]
    assert {p["title"] for p in heatmaps} >= {"Abort position (tokens)"}
    for p in panels(board):
        if p["type"] == "row":
            continue
        assert p["targets"], p["title"]
        assert p["datasource"]["uid"] == "${datasource}"
        assert p.get("description"), f"panel {p['title']!r} has no description"
        grid = p["gridPos"]
        assert grid["x"] >= 0 and grid["x"] + grid["w"] <= 24


def test_quality_panels_honour_the_template_variables() -> None:
    for where, expr in panel_queries(dashboard()):
        for name in metric_names(expr):
            quality = name.startswith("guard_") and not name.startswith("guard_proxy_")
            per_instance = "process_cpu_seconds_total" in expr  # CPU is per process
            if quality and not per_instance and name != "guard_upstream_kv_cache_dtype_info":
                assert 'model=~"$model"' in expr, where
            if name.startswith(("guard_", "vllm:", "DCGM_")):
                assert 'instance=~"$instance"' in expr, where


def test_grafana_provisioning_points_at_the_stack() -> None:
    ds = yaml.safe_load((ROOT / "grafana/provisioning/datasources/prometheus.yml").read_text())
    (source,) = ds["datasources"]
    assert source["type"] == "prometheus"
    assert source["url"] == "http://prometheus:9090"
    dash = yaml.safe_load(
        (ROOT / "grafana/provisioning/dashboards/coherence-guard.yml").read_text()
    )
    (provider,) = dash["providers"]
    assert provider["options"]["path"] == "/var/lib/grafana/dashboards"


# -- traces: the exemplar link ---------------------------------------------------------------

#: Grafana data source types that open a trace by its id.
TRACE_SOURCES = {"jaeger", "tempo", "zipkin"}
_GRAFANA_VAR = re.compile(r"\$\{(\w+)\}|\$(\w+)")


def _provisioned_sources(config: dict[str, Any]) -> list[dict[str, Any]]:
    """Every data source Grafana provisions in the rendered stack: the files under the
    provisioning folder compose mounts, with ``$VAR`` / ``${VAR}`` expanded from Grafana's
    environment as Grafana expands them."""
    grafana = config["services"]["grafana"]
    env = grafana["environment"]
    mounts = {v["target"]: v.get("source") for v in grafana["volumes"]}
    folder = Path(mounts["/etc/grafana/provisioning"]) / "datasources"
    out = []
    for path in sorted(folder.glob("*.y*ml")):
        text = _GRAFANA_VAR.sub(lambda m: env.get(m[1] or m[2], ""), path.read_text())
        out += yaml.safe_load(text)["datasources"]
    return out


def _trace_link(config: dict[str, Any]) -> dict[str, Any] | None:
    """The traces data source the Prometheus exemplars link to, or None when none of that uid
    is provisioned."""
    sources = _provisioned_sources(config)
    (prometheus,) = [s for s in sources if s["type"] == "prometheus"]
    (link,) = prometheus["jsonData"]["exemplarTraceIdDestinations"]
    return next((s for s in sources if s.get("uid") == link["datasourceUid"]), None)


def _rendered(**env: str) -> dict[str, Any]:
    cmd = [*compose_command(), "-f", str(COMPOSE), "--project-directory", str(ROOT)]
    clean = {k: v for k, v in os.environ.items() if k not in ("GRAFANA_TRACES_DATASOURCE_UID",)}
    out = subprocess.run(
        [*cmd, "config", "--format", "json"], capture_output=True, text=True,
        timeout=HANG_GUARD, env={**clean, **env},
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    config: dict[str, Any] = json.loads(out.stdout)
    return config


def test_the_exemplar_link_opens_the_stacks_trace_store() -> None:
    """A diamond on the abort panel opens its trace: the uid the exemplar link names is a
    provisioned traces data source, which reads the stack's Jaeger, to which the proxy sends
    its spans."""
    config = _rendered()
    target = _trace_link(config)
    assert target is not None, "the exemplar link names no provisioned data source"
    assert target["type"] in TRACE_SOURCES
    services = config["services"]
    store = urlsplit(target["url"])
    assert store.hostname in services and store.port == 16686  # Jaeger's query API and UI
    exporter = urlsplit(services["proxy"]["environment"]["OTEL_EXPORTER_OTLP_ENDPOINT"])
    assert (exporter.hostname, exporter.port) == (store.hostname, 4318)  # OTLP over HTTP
    assert services[store.hostname]["image"].startswith("jaegertracing/jaeger:")


def test_the_link_follows_grafana_traces_datasource_uid() -> None:
    """The variable still chooses the data source: one of the operator's own (provisioned
    beside the stack's) is linked when named, and a uid nothing provisions is caught here
    (the old default, ``tempo``, named none)."""
    config = _rendered(GRAFANA_TRACES_DATASOURCE_UID="tempo")
    assert config["services"]["grafana"]["environment"]["GRAFANA_TRACES_DATASOURCE_UID"] == "tempo"
    assert _trace_link(config) is None


# -- Prometheus --------------------------------------------------------------------------------


def test_promtool_check_config_and_rules() -> None:
    promtool = require("promtool", PROMETHEUS_INSTALL)
    for args in (["check", "config", str(PROMETHEUS_YML)], ["check", "rules", str(ALERTS_YML)]):
        out = subprocess.run([promtool, *args], capture_output=True, text=True, timeout=HANG_GUARD)
        assert out.returncode == 0, out.stdout + out.stderr
    out = subprocess.run(
        [promtool, "check", "rules", str(ALERTS_YML)],
        capture_output=True,
        text=True,
        timeout=HANG_GUARD,
    )
    assert f"SUCCESS: {len(alert_rules())} rules found" in out.stdout


def test_alert_thresholds_with_promtool_test_rules() -> None:
    """prometheus/alerts_test.yml: each alert fires on synthetic series above its threshold
    after its ``for:``, not before, not below (promtool's rule unit tests)."""
    promtool = require("promtool", PROMETHEUS_INSTALL)
    tests = PROMETHEUS_YML.parent / "alerts_test.yml"
    out = subprocess.run(
        [promtool, "test", "rules", str(tests)], capture_output=True, text=True, timeout=HANG_GUARD
    )
    assert out.returncode == 0, out.stdout + out.stderr
    tested = set(re.findall(r"alertname: (\w+)", tests.read_text()))
    assert tested == {r["alert"] for r in alert_rules()}


def test_promtool_rejects_a_broken_rule(tmp_path: Path) -> None:
    promtool = require("promtool", PROMETHEUS_INSTALL)
    broken = ALERTS_YML.read_text().replace("> 0.2", "> > 0.2", 1)
    assert broken != ALERTS_YML.read_text()
    (tmp_path / "alerts.yml").write_text(broken)
    out = subprocess.run(
        [promtool, "check", "rules", str(tmp_path / "alerts.yml")],
        capture_output=True,
        timeout=HANG_GUARD,
    )
    assert out.returncode != 0


def test_prometheus_jobs() -> None:
    config = yaml.safe_load(PROMETHEUS_YML.read_text())
    jobs = {job["job_name"]: job for job in config["scrape_configs"]}
    assert set(jobs) == {"proxy-infra", "proxy-quality", "vllm", "dcgm"}
    assert jobs["proxy-infra"]["metrics_path"] == "/metrics"
    assert jobs["proxy-quality"]["metrics_path"] == "/metrics/quality"
    assert config["rule_files"] == ["alerts.yml"]
    alerts = {r["alert"] for r in alert_rules()}
    assert {
        "GuardAbortRateSpike",
        "GuardLengthFinishShareHigh",
        "GuardUpstreamErrors",
        "GuardUpstreamKVCacheFP8",
    } <= alerts


# -- docker compose ----------------------------------------------------------------------------


def _compose(*args: str, file: Path = COMPOSE) -> subprocess.CompletedProcess[str]:
    cmd = [*compose_command(), "-f", str(file), "--project-directory", str(ROOT), *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=HANG_GUARD, cwd=ROOT)


def test_compose_file_validates() -> None:
    out = _compose("config", "--format", "json")
    assert out.returncode == 0, out.stderr
    config: dict[str, Any] = json.loads(out.stdout)
    services = config["services"]
    assert set(services) == {"vllm", "proxy", "prometheus", "grafana", "jaeger"}  # dcgm: profile
    assert services["vllm"]["image"].startswith("vllm/vllm-openai:")
    devices = services["vllm"]["deploy"]["resources"]["reservations"]["devices"]
    assert devices[0]["capabilities"] == ["gpu"]
    assert services["proxy"]["build"]["context"] == str(ROOT)
    assert services["proxy"]["environment"]["GUARD_UPSTREAM_URL"] == "http://vllm:8000"
    grafana_env = services["grafana"]["environment"]
    home = grafana_env["GF_DASHBOARDS_DEFAULT_HOME_DASHBOARD_PATH"]
    assert home == "/var/lib/grafana/dashboards/" + DASHBOARD.name
    mounts = {v["target"]: v.get("source") for v in services["grafana"]["volumes"]}
    assert mounts["/var/lib/grafana/dashboards"] == str(DASHBOARD.parent)
    prom_mounts = {v["target"]: v.get("source") for v in services["prometheus"]["volumes"]}
    assert prom_mounts["/etc/prometheus"] == str(PROMETHEUS_YML.parent)
    targets = {
        t
        for job in yaml.safe_load(PROMETHEUS_YML.read_text())["scrape_configs"]
        for sc in job["static_configs"]
        for t in sc["targets"]
    }
    assert {t.split(":")[0] for t in targets} == {"proxy", "vllm", "dcgm-exporter"}


def test_compose_gpu_metrics_profile() -> None:
    out = _compose("--profile", "gpu-metrics", "config", "--services")
    assert out.returncode == 0, out.stderr
    assert "dcgm-exporter" in out.stdout.split()


def test_compose_rejects_a_typo(tmp_path: Path) -> None:
    text = COMPOSE.read_text()
    for good, bad in (
        ("    image: prom/prometheus", "    imagee: prom/prometheus"),
        ("    depends_on:\n      vllm:", "    depend_on:\n      vllm:"),
        ("start_period: 900s", "start_period: 900 seconds"),
        ("condition: service_started", "condition: service_startd"),
    ):
        assert good in text
        broken = tmp_path / f"compose-{len(bad)}.yml"
        broken.write_text(text.replace(good, bad, 1))
        out = _compose("config", "-q", file=broken)
        assert out.returncode != 0, f"compose accepted {bad!r}"


# -- Dockerfile --------------------------------------------------------------------------------


def test_dockerfile_shape() -> None:
    text = (ROOT / "Dockerfile").read_text()
    assert "ARG BASE_IMAGE=python:3.12-slim-bookworm" in text
    assert "\nUSER 10001:10001\n" in text
    assert "HEALTHCHECK" in text and "/health" in text
    assert 'ENTRYPOINT ["coherence-guard"]' in text and 'CMD ["serve"]' in text
    ignore = (ROOT / ".dockerignore").read_text().split()
    assert ignore[ignore.index("*") :][:4] == ["*", "!pyproject.toml", "!README.md", "!proxy/"]


# -- generated configuration docs --------------------------------------------------------------


def test_env_example_and_readme_table_are_current() -> None:
    out = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "env_example.py"), "--check"],
        capture_output=True,
        text=True,
        timeout=HANG_GUARD,
    )
    assert out.returncode == 0, out.stderr


def test_env_example_lists_every_variable_with_its_default() -> None:
    from proxy.detect import DetectorConfig
    from proxy.settings import Settings

    text = (ROOT / ".env.example").read_text()
    for name in Settings.model_fields:
        assert f"\n# GUARD_{name.upper()}=" in text, name
    for field in DetectorConfig.__dataclass_fields__.values():
        default = field.default
        shown = str(default).lower() if isinstance(default, bool) else str(default)
        assert f"\n# GUARD_{field.name.upper()}={shown}\n" in text, field.name


def test_env_example_values_load(monkeypatch: pytest.MonkeyPatch) -> None:
    """Uncommented, .env.example's values pass the proxy's own validation (read from the
    environment, as a .env is)."""
    from proxy.settings import load_detector_config, load_settings

    for line in (ROOT / ".env.example").read_text().splitlines():
        if line.startswith("# GUARD_") and "=" in line:
            key, _, value = line[2:].partition("=")
            monkeypatch.setenv(key, value)
    monkeypatch.chdir(ROOT / "tests")  # no stray .env
    settings = load_settings()
    assert settings.port == 8080
    load_detector_config()


@pytest.mark.parametrize("name", ["docker-compose.yml", "prometheus/prometheus.yml"])
def test_yaml_parses(name: str) -> None:
    assert yaml.safe_load((ROOT / name).read_text())
