"""``calibrate --from-prometheus``: the recommendation read from production instead of measured.

The proxy's own ``guard_abort_position_tokens`` and ``guard_completion_tokens`` histograms over a
window give the same summary shape a calibration run gives (:func:`from_prometheus`), so the report
and ``calibrate.env`` are written the same way.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from proxy.cli.calibrate.matrix import CalibrateError

if TYPE_CHECKING:
    import httpx


def prom_vector(client: httpx.Client, expr: str) -> list[dict[str, Any]]:
    import httpx

    try:
        response = client.get("/api/v1/query", params={"query": expr})
        payload = response.json()
    except (httpx.HTTPError, ValueError) as exc:
        raise CalibrateError(f"Prometheus query failed: {exc}") from None
    if payload.get("status") != "success":
        raise CalibrateError(f"Prometheus refused {expr!r}: {payload.get('error')}")
    result: list[dict[str, Any]] = payload["data"]["result"]
    return result


def from_prometheus(
    prometheus_url: str, window: str, *, quantile: float, margin: int, models: Sequence[str] | None
) -> dict[str, Any]:
    """The proxy's histograms over ``window`` → the same summary shape as a calibration run."""
    import httpx

    from proxy.cli.calibrate.report import summarize_histograms

    with httpx.Client(base_url=prometheus_url.rstrip("/"), timeout=30) as client:
        aborts = prom_vector(
            client,
            f"sum by (model, le) (increase(guard_abort_position_tokens_bucket[{window}]))",
        )
        by_signal = prom_vector(
            client,
            f"sum by (model, signal) (increase(guard_abort_position_tokens_count[{window}]))",
        )
        generations = prom_vector(
            client, f"sum by (model) (increase(guard_completion_tokens_count[{window}]))"
        )
        completions = prom_vector(
            client,
            f"sum by (model, le) (increase(guard_completion_tokens_bucket[{window}]))",
        )
        finishes = prom_vector(
            client,
            f"sum by (model, finish_reason) (increase(guard_finish_reason_total[{window}]))",
        )
    summary = summarize_histograms(
        aborts, by_signal, generations, finishes, quantile=quantile, margin=margin,
        completions=completions,
    )  # fmt: skip
    if models:
        summary["models"] = {m: v for m, v in summary["models"].items() if m in models}
    summary["source"] = {"prometheus": prometheus_url, "range": window}
    return summary
