"""Figures and pointers the pages repeat agree: a reader who meets the e2e suite's time on two
pages, or a pointer to a table "above", finds the same number and the table."""

from __future__ import annotations

import re
import statistics
from pathlib import Path

from tests.test_docs import DOCS, README

PAGES = [README, *sorted(DOCS.glob("*.md"))]


def test_every_page_gives_the_e2e_suite_the_same_time() -> None:
    times = {
        f"{page.name}:{n}": m.group(1)
        for page in PAGES
        for n, line in enumerate(page.read_text(encoding="utf-8").splitlines(), 1)
        if "pytest -m e2e " in line and (m := re.search(r"~(\d+) min", line))
    }
    assert len(times) >= 2, times
    assert len(set(times.values())) == 1, times


def test_no_page_points_at_a_table_it_does_not_have() -> None:
    """A pointer to the table above or below only where the page has a table there."""
    found = []
    for page in PAGES:
        lines = page.read_text(encoding="utf-8").splitlines()
        for n, line in enumerate(lines):
            m = re.search(r"\btable[:]? (above|below)\b", line)
            if not m:
                continue
            span = lines[:n] if m.group(1) == "above" else lines[n + 1 :]
            if not any(s.startswith("|") or s.startswith("<!-- demo-table") for s in span):
                found.append(f"{page.name}:{n + 1}: {line.strip()}")
    assert not found, found


#: A cell of a table of rotated runs: each run's figure, the median, and the ratio to nginx.
_RUNS_CELL = re.compile(r"^([\d.]+(?:, [\d.]+)+) → \*\*([\d.]+)\*\*(?: \(([\d.]+)×\))?$")
#: A cell of the README's cost table: the median and its ratio to nginx.
_COST_CELL = re.compile(r"^([\d.]+)(?: \(([\d.]+)×\))?$")


def _tables(page: Path, cell: re.Pattern[str]) -> list[list[tuple[str, list[re.Match[str]]]]]:
    """Every table of ``page`` whose data cells all match ``cell``: rows of (label, cells)."""
    tables: list[list[tuple[str, list[re.Match[str]]]]] = []
    rows: list[tuple[str, list[re.Match[str]]]] = []
    for line in [*page.read_text(encoding="utf-8").splitlines(), ""]:
        cells = (
            [c.strip() for c in line.strip().strip("|").split("|")] if line.startswith("|") else []
        )
        found = [m for c in cells[1:] if (m := cell.match(c))]
        if cells and found and len(found) == len(cells) - 1:
            rows.append((cells[0], found))
        elif rows:
            tables.append(rows)
            rows = []
    return tables


def _run_ratio_bounds(values: list[float], nginx: list[float]) -> tuple[float, float]:
    """The least and the most the median of the runs' ratios to nginx can be, given that the
    page rounds each figure to a tenth (the ratios were taken from the unrounded figures)."""
    low = [(v - 0.05) / (n + 0.05) for v, n in zip(values, nginx, strict=True)]
    high = [(v + 0.05) / (n - 0.05) for v, n in zip(values, nginx, strict=True)]
    return statistics.median(low), statistics.median(high)


def test_rotated_run_tables_give_the_median_and_the_median_of_the_runs_ratios() -> None:
    """In a table of rotated runs (``a, b, c → **median** (ratio)``) the bold figure is the
    median of the runs, and the ratio the median of each run's ratio to nginx in that same run
    (not the ratio of the two medians: the runs' minutes differ, each is compared with its own
    nginx)."""
    checked = 0
    for page in PAGES:
        for table in _tables(page, _RUNS_CELL):
            (nginx,) = [cells for label, cells in table if label.startswith("nginx")]
            for label, cells in table:
                for column, (match, base) in enumerate(zip(cells, nginx, strict=True)):
                    values = [float(v) for v in match.group(1).split(", ")]
                    where = f"{page.name}: {label}, column {column + 1}"
                    assert float(match.group(2)) == statistics.median(values), where
                    if match.group(3) is None:
                        continue
                    low, high = _run_ratio_bounds(
                        values, [float(v) for v in base.group(1).split(", ")]
                    )
                    assert low - 0.005 <= float(match.group(3)) <= high + 0.005, where
                    checked += 1
    assert checked >= 40, checked


def test_the_readme_cost_table_is_the_floor_runs_and_says_what_its_ratios_are() -> None:
    """The README's cost table repeats the medians and ratios of the rotated runs in
    docs/performance.md ("The floor"), row by row, and says that a ratio is the median of the
    runs' ratios, which is why it differs from the ratio of the medians it prints."""
    text = README.read_text(encoding="utf-8")
    section = text[text.index("## What it costs") :]
    section = section[: section.index("\n## ", 1)]
    assert "median of the three runs' ratios to nginx" in " ".join(section.split())
    (readme,) = _tables(README, _COST_CELL)
    performance = DOCS / "performance.md"
    page = performance.read_text(encoding="utf-8")
    floor = page[page.index("### The floor") :]
    # the section alone: later sections have tables of runs too
    ends = [i for h in ("\n## ", "\n### ") if (i := floor.find(h, 1)) > 0]
    floor = floor[: min(ends, default=len(floor))]
    runs = [t for t in _tables(performance, _RUNS_CELL) if t[0][1][0].group(0) in floor]
    assert len(runs) == 1 and len(runs[0]) == len(readme)
    for (label, cells), (_, measured) in zip(readme, runs[0], strict=True):
        shown = [(m.group(1), m.group(2)) for m in cells]
        assert shown == [(m.group(2), m.group(3)) for m in measured], label
