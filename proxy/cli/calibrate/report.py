"""What ``coherence-guard calibrate`` writes: the summary, report.md, the plots, calibrate.env.

:func:`summarize` turns the answers of ``results.jsonl`` into per-model figures and
recommendations (with :mod:`proxy.cli.calibrate.stats`); :func:`summarize_histograms` does the same
from the proxy's Prometheus histograms; :func:`write_outputs` writes ``results.json``,
``report.md``, the PNG survival plots (matplotlib with the Agg backend: no display needed) and
``calibrate.env``.
"""

from __future__ import annotations

import json
import math
import re
from collections import defaultdict
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from proxy.cli.calibrate.stats import (
    CAP_BUDGET,
    Observation,
    Setting,
    best_setting,
    degeneration_rate,
    healthy_buckets,
    histogram_quantile,
    histogram_share_above,
    histogram_survival,
    positions,
    quantile,
    recommend_cap,
    signal_counts,
    survival_at,
    survival_curve,
    truncated_share,
)


def _observation(record: dict[str, Any]) -> Observation:
    return Observation(int(record["tokens"]), record.get("degenerate_at"), record.get("signal"))


def _share(k: int, n: int) -> str:
    return f"{k}/{n}"


def _sampling(
    by_setting: dict[Setting, list[Observation]], temperatures: int
) -> tuple[dict[str, float] | None, str]:
    """The sampling recommendation and the sentence that explains it."""
    best = best_setting(by_setting)
    if best is None:
        return None, ""
    baseline = min(by_setting)
    base_obs, best_obs = by_setting[baseline], by_setting[best]
    base_k = sum(o.degenerate for o in base_obs)
    best_k = sum(o.degenerate for o in best_obs)
    if base_k == 0:
        return None, f"no sampling change needed: {baseline.label()} had no degenerate answer"
    if degeneration_rate(best_obs) >= degeneration_rate(base_obs):
        return None, (
            f"no tested setting does better than {baseline.label()} "
            f"({_share(base_k, len(base_obs))} degenerate)"
        )
    fields = {"repetition_penalty": best.repetition_penalty}
    if temperatures > 1:
        fields["temperature"] = best.temperature
    verb = "removes the loops" if best_k == 0 else "reduces the loops"
    return fields, (
        f"{best.label()} {verb}: {_share(best_k, len(best_obs))} degenerate answers, against "
        f"{_share(base_k, len(base_obs))} with {baseline.label()}"
    )


def summarize(
    records: Sequence[dict[str, Any]], *, quantile: float, margin: int, max_tokens: int
) -> dict[str, Any]:
    """Per model: cells (task x language), settings, the pooled curve and the recommendation."""
    by_model: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for record in records:
        by_model[record["model"]].append(record)
    models: dict[str, Any] = {}
    for model, rows in sorted(by_model.items()):
        observations = [_observation(r) for r in rows]
        cells: dict[tuple[str, str], list[Observation]] = defaultdict(list)
        settings: dict[Setting, list[Observation]] = defaultdict(list)
        cell_settings: dict[tuple[str, str], dict[Setting, list[Observation]]] = defaultdict(
            lambda: defaultdict(list)
        )
        for row, obs in zip(rows, observations, strict=True):
            setting = Setting(row["repetition_penalty"], row["temperature"])
            cells[(row["task"], row["language"])].append(obs)
            settings[setting].append(obs)
            cell_settings[(row["task"], row["language"])][setting].append(obs)
        points = positions(observations)
        cap = recommend_cap(points, quantile, margin)
        if cap is None:
            cap_reason = f"no answer degenerated within max_tokens={max_tokens}: no cap to derive"
        elif (cut := truncated_share(observations, cap)) > CAP_BUDGET:
            cap_reason = (
                f"no cap recommended: no cap separates the loops from the coherent answers (the "
                f"{quantile:g} quantile of {len(points)} degeneration positions "
                f"({_quantile_text(points, quantile)}) minus {margin} is {cap}, which would cut "
                f"{cut:.0%} of the coherent answers, more than the {CAP_BUDGET:.0%} a cap may "
                "cut); against the loops use the sampling setting below or GUARD_MODE=heal"
            )
            cap = None
        else:
            cap_reason = (
                f"cap {cap} = the {quantile:g} quantile of {len(points)} degeneration positions "
                f"({_quantile_text(points, quantile)}) minus {margin}; it would cut "
                f"{cut:.0%} of the coherent answers"
            )
        temperatures = len({s.temperature for s in settings})
        sampling, sampling_reason = _sampling(settings, temperatures)
        models[model] = {
            "answers": len(observations),
            "degenerate": len(points),
            "positions": points,
            "signals": signal_counts(observations),
            "survival": survival_curve(observations, max_tokens),
            "cells": [
                {
                    "task": task,
                    "language": language,
                    "answers": len(obs),
                    "degenerate": sum(o.degenerate for o in obs),
                    "positions": positions(obs),
                    "signals": signal_counts(obs),
                    "survival": survival_curve(obs, max_tokens),
                    **_cell_cap(obs, quantile, margin),
                    "best_setting": _cell_best(cell_settings[(task, language)]),
                }
                for (task, language), obs in sorted(cells.items())
            ],
            "settings": [
                {
                    "repetition_penalty": s.repetition_penalty,
                    "temperature": s.temperature,
                    "answers": len(obs),
                    "degenerate": sum(o.degenerate for o in obs),
                    "positions": positions(obs),
                    "survival": survival_curve(obs, max_tokens),
                }
                for s, obs in sorted(settings.items())
            ],
            "recommendation": {
                "max_tokens_cap": cap,
                "cap_reason": cap_reason,
                "truncates_coherent_share": (
                    truncated_share(observations, cap) if cap is not None else 0.0
                ),
                "sampling": sampling,
                "sampling_reason": sampling_reason,
            },
        }
    return {"kind": "calibration", "quantile": quantile, "margin": margin, "models": models}


def _cell_cap(obs: list[Observation], quantile: float, margin: int) -> dict[str, Any]:
    """A cell's cap, held to the budget the model's cap is held to: one that would cut more
    than ``CAP_BUDGET`` of the cell's coherent answers is not recommended (``None``), and the
    share it would cut is reported either way."""
    cap = recommend_cap(positions(obs), quantile, margin)
    cut = truncated_share(obs, cap) if cap is not None else 0.0
    return {"max_tokens_cap": cap if cut <= CAP_BUDGET else None, "cap_cuts_coherent": cut}


def _cell_best(by_setting: dict[Setting, list[Observation]]) -> dict[str, Any] | None:
    """The cell's best setting, when it has fewer degenerate answers than the mildest one."""
    best = best_setting(by_setting)
    if best is None or degeneration_rate(by_setting[best]) >= degeneration_rate(
        by_setting[min(by_setting)]
    ):
        return None
    obs = by_setting[best]
    return {
        "repetition_penalty": best.repetition_penalty,
        "temperature": best.temperature,
        "answers": len(obs),
        "degenerate": sum(o.degenerate for o in obs),
    }


def _quantile_text(points: Sequence[int], q: float) -> str:
    return f"{quantile(points, q):.0f}"


def _buckets(vector: Sequence[dict[str, Any]]) -> dict[str, list[tuple[float, float]]]:
    out: dict[str, list[tuple[float, float]]] = defaultdict(list)
    for item in vector:
        labels, (_, value) = item["metric"], item["value"]
        out[labels.get("model", "")].append((float(labels["le"]), float(value)))
    return out


def _by_model(vector: Sequence[dict[str, Any]], label: str | None = None) -> dict[str, Any]:
    out: dict[str, Any] = defaultdict(dict) if label else {}
    for item in vector:
        labels, value = item["metric"], float(item["value"][1])
        model = labels.get("model", "")
        if label:
            out[model][labels.get(label, "")] = round(value, 3)
        else:
            out[model] = value
    return out


def summarize_histograms(
    aborts: Sequence[dict[str, Any]],
    by_signal: Sequence[dict[str, Any]],
    generations: Sequence[dict[str, Any]],
    finishes: Sequence[dict[str, Any]],
    *,
    quantile: float,
    margin: int,
    completions: Sequence[dict[str, Any]] = (),
) -> dict[str, Any]:
    """The recommendation from production: Prometheus instant vectors (``/api/v1/query``).
    ``completions`` (``guard_completion_tokens`` buckets by model) checks the cap against the
    healthy answers' lengths: one that would cut more than ``CAP_BUDGET`` of them is refused."""
    buckets = _buckets(aborts)
    lengths = _buckets(completions)
    totals = _by_model(generations)
    signals = _by_model(by_signal, "signal")
    finish = _by_model(finishes, "finish_reason")
    models: dict[str, Any] = {}
    for model in sorted(set(totals) | set(buckets)):
        cumulative = sorted(buckets.get(model, []))
        aborted = cumulative[-1][1] if cumulative else 0.0
        total = totals.get(model, 0.0)
        q = histogram_quantile(cumulative, quantile) if aborted > 0 else None
        cap = max(1, math.floor(q) - margin) if q is not None else None
        healthy = healthy_buckets(lengths.get(model, []), cumulative)
        cut = histogram_share_above(healthy, cap) if cap is not None else 0.0
        if cap is None:
            reason = "no aborts in the window: no cap to derive"
        else:
            reason = (
                f"cap {cap} = the {quantile:g} quantile of {aborted:.0f} abort positions "
                f"(~{q:.0f}, interpolated in the histogram's power-of-two buckets) minus {margin}; "
                f"it would cut ~{cut:.1%} of the healthy completions"
            )
            if cut > CAP_BUDGET:
                safe = histogram_quantile(healthy, 1 - CAP_BUDGET)
                reason = (
                    f"no cap recommended: {reason}, more than the {CAP_BUDGET:.0%} a cap may "
                    f"cut (a cap of ~{safe:.0f} or more, the healthy completions' "
                    f"{1 - CAP_BUDGET:.0%} quantile, would cut at most that); against the "
                    "loops use GUARD_MODE=heal or a sampling setting (calibrate --url)"
                )
                cap = None
        models[model] = {
            "answers": round(total, 3),
            "degenerate": round(aborted, 3),
            "signals": signals.get(model, {}),
            "finish_reasons": finish.get(model, {}),
            "survival": histogram_survival(cumulative, total),
            "recommendation": {
                "max_tokens_cap": cap,
                "cap_reason": reason,
                "truncates_coherent_share": cut,
                "sampling": None,
                "sampling_reason": "production metrics carry no sampling settings: run "
                "calibrate --url to compare them",
            },
        }
    return {"kind": "production", "quantile": quantile, "margin": margin, "models": models}


# -- files -------------------------------------------------------------------------------------


def slug(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "-", name).strip("-") or "model"


def _plot(
    path: Path,
    title: str,
    panels: Sequence[tuple[str, Sequence[tuple[str, Sequence[Sequence[float]]]]]],
    *,
    log_x: bool = False,
) -> None:
    """One PNG: a panel per (title, [(label, curve)]); curves are step functions."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    columns = min(3, len(panels))
    rows = math.ceil(len(panels) / columns)
    fig, axes = plt.subplots(
        rows, columns, figsize=(max(6.4, 4.2 * columns), 3.2 * rows), squeeze=False, sharey=True
    )
    for index, (panel_title, curves) in enumerate(panels):
        ax = axes[index // columns][index % columns]
        for label, curve in curves:
            if curve:
                xs = [p[0] for p in curve]
                ys = [p[1] for p in curve]
                ax.step(xs, ys, where="post", label=label)
        ax.set_title(panel_title, fontsize=10)
        ax.set_ylim(-0.02, 1.02)
        ax.set_xlabel("tokens generated")
        if log_x:
            ax.set_xscale("log", base=2)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7, loc="lower left")
    for index in range(len(panels), rows * columns):
        axes[index // columns][index % columns].set_visible(False)
    for row in axes:
        row[0].set_ylabel("share still coherent")
    fig.suptitle(title, fontsize=11)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def write_plots(summary: dict[str, Any], output: Path) -> dict[str, list[str]]:
    """PNG files per model; returns their names per model."""
    files: dict[str, list[str]] = {}
    for model, data in summary["models"].items():
        names = []
        if summary["kind"] == "calibration":
            tasks: dict[str, list[tuple[str, Sequence[Sequence[float]]]]] = defaultdict(list)
            for cell in data["cells"]:
                tasks[cell["task"]].append((cell["language"], cell["survival"]))
            name = f"survival-{slug(model)}-tasks.png"
            _plot(
                output / name, f"{model}: by task and language (all settings)", list(tasks.items())
            )
            names.append(name)
            curves = [
                (Setting(s["repetition_penalty"], s["temperature"]).label(), s["survival"])
                for s in data["settings"]
            ]
            name = f"survival-{slug(model)}-settings.png"
            _plot(output / name, f"{model}: by sampling setting (all prompts)", [("", curves)])
            names.append(name)
        else:
            name = f"survival-{slug(model)}.png"
            _plot(
                output / name, f"{model}: production (guard aborts)",
                [("", [("all generations", data["survival"])])], log_x=True,
            )  # fmt: skip
            names.append(name)
        files[model] = names
    return files


def _positions_text(points: Sequence[int]) -> str:
    if not points:
        return "-"
    if len(points) <= 6:
        return ", ".join(map(str, points))
    return f"{points[0]} … {points[-1]} (median {quantile(points, 0.5):.0f})"


def render_markdown(summary: dict[str, Any], plots: dict[str, list[str]]) -> str:
    source = summary.get("source", {})
    lines = ["# Coherence calibration", ""]
    stamp = datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")
    if summary["kind"] == "calibration":
        lines.append(
            f"{stamp}. Server `{source.get('url')}`, max_tokens {source.get('max_tokens')}, "
            f"{source.get('seeds')} seed(s) per setting. Every answer was streamed through the "
            "proxy's detector (monitor mode, `GUARD_*` thresholds of the environment); the "
            "reader hung up at its verdict."
        )
    else:
        lines.append(
            f"{stamp}. From Prometheus `{source.get('prometheus')}` over "
            f"`{source.get('range')}`: the proxy's `guard_abort_position_tokens` and "
            "`guard_completion_tokens` histograms."
        )
    lines.append("")
    for model, data in summary["models"].items():
        rec = data["recommendation"]
        lines += [f"## {model}", ""]
        lines.append(
            f"{data['answers']:g} answers, {data['degenerate']:g} degenerate"
            + (f" (signals: {_signals_text(data['signals'])})" if data["signals"] else "")
            + "."
        )
        lines += ["", "**Recommendation**", ""]
        lines.append(f"- `GUARD_MAX_TOKENS_CAP`: {rec['cap_reason']}.")
        if rec.get("sampling_reason"):
            lines.append(f"- sampling: {rec['sampling_reason']}.")
        lines.append("")
        if summary["kind"] == "calibration":
            lines += [
                "| task | language | degenerate | positions (tokens) | signals | cap "
                "| better with |",
                "|---|---|---:|---|---|---:|---|",
            ]
            for cell in data["cells"]:
                cap = cell["max_tokens_cap"] or (
                    f"- (would cut {cell['cap_cuts_coherent']:.0%})"
                    if cell["cap_cuts_coherent"]
                    else "-"
                )
                best = cell["best_setting"]
                fix = (
                    f"repetition_penalty={best['repetition_penalty']:g} "
                    f"temperature={best['temperature']:g}: "
                    f"{_share(best['degenerate'], best['answers'])}"
                    if best
                    else "-"
                )
                lines.append(
                    f"| {cell['task']} | {cell['language']} | "
                    f"{_share(cell['degenerate'], cell['answers'])} | "
                    f"{_positions_text(cell['positions'])} | "
                    f"{_signals_text(cell['signals']) or '-'} | {cap} | {fix} |"
                )
            lines += [
                "",
                "| repetition_penalty | temperature | degenerate | survival at max_tokens |",
                "|---:|---:|---:|---:|",
            ]
            for s in data["settings"]:
                end = survival_at(s["survival"], source.get("max_tokens", 0))
                lines.append(
                    f"| {s['repetition_penalty']:g} | {s['temperature']:g} | "
                    f"{_share(s['degenerate'], s['answers'])} | "
                    f"{f'{end:.0%}' if end is not None else '-'} |"
                )
        else:
            if data.get("finish_reasons"):
                lines.append(
                    "Finish reasons: "
                    + ", ".join(f"{k} {v:g}" for k, v in sorted(data["finish_reasons"].items()))
                    + "."
                )
        lines.append("")
        for name in plots.get(model, []):
            lines += [f"![{name}]({name})", ""]
    return "\n".join(lines)


def _signals_text(signals: dict[str, float]) -> str:
    return ", ".join(f"{name} {count:g}" for name, count in signals.items())


def render_env(summary: dict[str, Any]) -> str:
    """``calibrate.env``: the variables the proxy reads, with the reasons as comments."""
    lines = ["# Written by coherence-guard calibrate; see report.md for the figures."]
    caps: list[int] = []
    sampling: dict[str, dict[str, float]] = {}
    for model, data in summary["models"].items():
        rec = data["recommendation"]
        lines.append(f"# {model}: {rec['cap_reason']}")
        if rec.get("sampling_reason"):
            lines.append(f"# {model}: {rec['sampling_reason']}")
        if rec["max_tokens_cap"] is not None:
            caps.append(rec["max_tokens_cap"])
        if rec.get("sampling"):
            sampling[model] = rec["sampling"]
    if caps:
        if len(caps) > 1:
            lines.append("# one cap for every model: the smallest of the models' caps")
        lines.append(f"GUARD_MAX_TOKENS_CAP={min(caps)}")
        lines.append("# requests that set no max_tokens get the cap too")
        lines.append(f"GUARD_MAX_TOKENS_DEFAULT={min(caps)}")
    else:
        lines.append("# GUARD_MAX_TOKENS_CAP: none recommended (the reason is above)")
    if sampling:
        lines.append(
            "# vLLM's field name; llama.cpp's server reads repeat_penalty (and repeat_last_n "
            "covering the answer: calibrate sends both)"
        )
        lines.append(f"GUARD_SAMPLING_DEFAULTS='{json.dumps(sampling, sort_keys=True)}'")
    return "\n".join(lines) + "\n"


def write_outputs(summary: dict[str, Any], output: Path) -> None:
    """results.json, the plots, report.md and calibrate.env in ``output``."""
    output.mkdir(parents=True, exist_ok=True)
    plots = write_plots(summary, output)
    (output / "results.json").write_text(
        json.dumps(summary, indent=2, ensure_ascii=False) + "\n", encoding="utf-8"
    )
    (output / "report.md").write_text(render_markdown(summary, plots), encoding="utf-8")
    (output / "calibrate.env").write_text(render_env(summary), encoding="utf-8")
