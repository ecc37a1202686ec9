"""What a calibration asks and what it was answered: the prompts, the matrix of requests, and the
``results.jsonl`` file that makes a rerun skip what is done.

A cell is one request (model x prompt x sampling setting x seed) and its key names it in
``results.jsonl``; a run killed mid-write leaves a torn last line, which the next run ends
(:func:`end_torn_line`) and :func:`read_results` ignores.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any


class CalibrateError(Exception):
    """The server, the prompts file or Prometheus could not be used; the message says why."""


@dataclass(frozen=True, slots=True)
class Prompt:
    task: str
    language: str  # ISO 639-1, or "any" for the operator's prompts without one
    text: str


@dataclass(frozen=True, slots=True)
class Cell:
    """One request of the matrix."""

    model: str
    prompt: Prompt
    repetition_penalty: float
    temperature: float
    seed: int

    @property
    def key(self) -> str:
        return "|".join(
            (self.model, self.prompt.task, self.prompt.language,
             f"{self.repetition_penalty:g}", f"{self.temperature:g}", str(self.seed))
        )  # fmt: skip


def load_prompts(path: Path) -> list[Prompt]:
    """The operator's prompts: JSONL objects, or one plain prompt per line."""
    prompts: list[Prompt] = []
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except OSError as exc:
        raise CalibrateError(f"--prompts {path}: {exc.strerror}") from None
    for number, line in enumerate(lines, 1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        if line.startswith("{"):
            try:
                item = json.loads(line)
                text = str(item["prompt"])
            except (ValueError, KeyError, TypeError):
                raise CalibrateError(
                    f'--prompts {path}:{number}: expected {{"task", "language"?, "prompt"}}'
                ) from None
            task = str(item.get("task") or f"prompt{number}")
            language = str(item.get("language") or "any")
            prompts.append(Prompt(task, language, text))
        else:
            prompts.append(Prompt(f"prompt{number}", "any", line))
    if not prompts:
        raise CalibrateError(f"--prompts {path}: no prompts")
    return prompts


def builtin_prompts(tasks: Sequence[str], languages: Sequence[str]) -> list[Prompt]:
    from proxy.cli.calibrate.prompts import PROMPTS

    unknown = [t for t in tasks if t not in PROMPTS]
    if unknown:
        raise CalibrateError(f"unknown task(s) {unknown}; built in: {sorted(PROMPTS)}")
    missing = sorted({lang for lang in languages for t in tasks if lang not in PROMPTS[t]})
    if missing:
        raise CalibrateError(
            f"no built-in prompts in {missing} (built in: {sorted(PROMPTS[tasks[0]])}); "
            "write your own with --prompts"
        )
    return [Prompt(t, lang, PROMPTS[t][lang]) for t in tasks for lang in languages]


def matrix(
    models: Sequence[str],
    prompts: Sequence[Prompt],
    penalties: Sequence[float],
    temperatures: Sequence[float],
    seeds: int,
) -> list[Cell]:
    return [
        Cell(model, prompt, penalty, temperature, seed)
        for model in models
        for prompt in prompts
        for penalty in penalties
        for temperature in temperatures
        for seed in range(seeds)
    ]


def read_results(path: Path) -> list[dict[str, Any]]:
    """Records of ``results.jsonl``; a torn last line (an interrupted run) is ignored."""
    if not path.is_file():
        return []
    records = []
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if isinstance(record, dict) and "key" in record:
            records.append(record)
    return records


def end_torn_line(results: Path) -> None:
    """A run killed mid-write leaves a torn last line: end it, so the next record starts on a
    line of its own instead of being glued to the fragment (and lost with it)."""
    if not results.is_file() or not results.stat().st_size:
        return
    with results.open("rb") as existing:
        existing.seek(-1, os.SEEK_END)
        torn = existing.read(1) != b"\n"
    if torn:
        with results.open("a", encoding="utf-8") as sink:
            sink.write("\n")
