"""The dashboard's split by surface: every guarded route can be told apart and filtered."""

from __future__ import annotations

from proxy.core.records import Endpoint
from proxy.observability.metrics import ENDPOINTS
from tests.deploy_tools import dashboard, panel_queries


def test_surface_variable_and_panels() -> None:
    board = dashboard()
    variables = {v["name"]: v for v in board["templating"]["list"]}
    surface = variables["endpoint"]
    assert surface["definition"] == "label_values(guard_generations_total, endpoint)"
    assert surface["includeAll"] and surface["allValue"] == ".*"
    titles = {p["title"] for p in board["panels"]}
    assert {"Generations by surface", "Abort share by surface"} <= titles


def test_every_generations_query_honours_the_surface_variable() -> None:
    queries = [(w, e) for w, e in panel_queries(dashboard()) if "guard_generations_total" in e]
    assert queries
    for where, expr in queries:
        selectors = expr.count("guard_generations_total{")
        assert expr.count('endpoint=~"$endpoint"') == selectors, where


def test_the_endpoint_label_is_the_bounded_set_of_routes() -> None:
    assert (
        set(Endpoint.__args__)
        == ENDPOINTS
        == {  # type: ignore[attr-defined]
            "chat",
            "completions",
            "responses",
            "messages",
        }
    )
