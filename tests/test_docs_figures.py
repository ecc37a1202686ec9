"""Figures and pointers the pages repeat agree: a reader who meets the e2e suite's time on two
pages, or a pointer to a table "above", finds the same number and the table."""

from __future__ import annotations

import re

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
