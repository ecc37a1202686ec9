"""List cycles: a list that repeats its own items is caught; lists that repeat on purpose pass.

``tests/data/detect/list_cycles.jsonl`` holds real answers of the tuning half of the real
answers (``../shared/realanswers/alpacaeval-dev.jsonl``; ``source`` names each) that readers
labelled as lists going round their items (``cycle``), real answers whose lists repeat items on
purpose, and two real files of the real-file set whose list items open alike (``healthy``).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from proxy.detect import DetectorConfig
from proxy.detect.items import ListCycle
from tests.detect.conftest import stream

ROWS = [
    json.loads(line)
    for line in (Path(__file__).parents[1] / "data" / "detect" / "list_cycles.jsonl")
    .read_text("utf-8")
    .splitlines()
]
CYCLES = [r for r in ROWS if r["label"] == "cycle"]
HEALTHY = [r for r in ROWS if r["label"] == "healthy"]
# The list cycle alone: the exact and near-identical loop signals off.
ITEMS_ONLY = DetectorConfig(block_loop=False, ngram=False, diversity=False, compression=False)


@pytest.mark.parametrize("row", CYCLES, ids=[r["id"] for r in CYCLES])
def test_a_list_that_repeats_its_own_items_is_a_loop(row: dict[str, Any]) -> None:
    """The verdict's onset is the first item that repeats an earlier one: the items before it
    are content, and a trimmed answer keeps them."""
    verdict = stream(row["text"]).verdict
    assert verdict is not None and verdict.signal == "repetition", row["why"]
    first = row["text"][verdict.onset_char :].split("\n", 1)[0]
    assert first.strip() and row["text"].index(first[3:]) < verdict.onset_char


@pytest.mark.parametrize("row", HEALTHY, ids=[r["id"] for r in HEALTHY])
def test_lists_that_repeat_on_purpose_pass(row: dict[str, Any]) -> None:
    assert stream(row["text"]).verdict is None, row["why"]


def test_adjectives_listed_again_are_caught_at_the_third_repeat() -> None:
    """Items 12, 13 and 14 repeat items 1, 2 and 3: the verdict comes at the first check
    (every 128 characters) once item 14 is complete."""
    text = next(r["text"] for r in CYCLES if r["id"] == "ae-tulu-2-dpo-7b-681")
    verdict = stream(text, ITEMS_ONLY).verdict
    assert verdict is not None
    assert verdict.onset_char == text.index("12. Innovative")
    assert verdict.fired_at_char <= text.index("15. Progressive") + 128


def test_items_split_across_checks_are_joined() -> None:
    cycle = ListCycle()
    text = "Some colours:\n" + "".join(f"- {c}\n" for c in ["red", "green", "blue"] * 3)
    found = None
    for i in range(0, len(text), 5):
        found = cycle.update(text[i : i + 5], end=min(len(text), i + 5)) or found
    assert found is not None and found.period == 3 and found.items >= 3
    assert found.onset == text.index("- red", text.index("- blue"))


def test_a_new_numbering_or_a_line_of_prose_starts_a_new_list() -> None:
    """Restarting at 1, or prose between, makes the items another list's: a summary that
    repeats the points above is no cycle."""
    points = "".join(f"{i}. {p}\n" for i, p in enumerate(["Fast", "Cheap", "Safe"], start=1))
    assert stream("Option A:\n" + points + "Option B:\n" + points * 1).verdict is None
    assert stream("Pros:\n" + points + "\nIn short:\n" + points).verdict is None


def test_numbers_in_items_are_content_and_a_counter_inside_a_cycle_is_not() -> None:
    """Street numbers that differ make different items; a cycle of several items whose only
    change is a counter stepping on as before (instruction 30, 36, 42) is the same again."""
    streets = "".join(f"- Turn right onto W {n}th St\n" for n in range(20, 80, 3))
    assert stream("Directions:\n" + streets).verdict is None
    steps = "".join(
        f"{k}. At instruction {30 + 6 * (k // 3)}, push the value '{c}' onto the stack.\n"
        for k, c in zip(range(1, 16), "lma" * 5, strict=True)
    )
    verdict = stream("The program:\n" + steps, ITEMS_ONLY).verdict
    assert verdict is not None and verdict.signal == "repetition"
