"""A long block restated with edits a third time is a loop: the block-loop signal needs one
copy less for it.

``logic_restated_summary.txt`` is a real runaway answer of the block-loop set
(``blockloop-reason-logic-n09``, sources in ``tests/data/detect/blocks/README.md``): the model
goes round "that's what you're going to have to do … I'm going to give it back" in shifting
words from char 1,430 on (the set's paraphrase onset rule).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from proxy.detect import DetectorConfig
from proxy.detect import blocks as blocks_module
from tests.detect.conftest import stream

DATA = Path(__file__).parents[1] / "data" / "detect" / "blocks"
STREAMING = DetectorConfig(end_judgement=False)
ONSET = 1430


def test_a_long_block_restated_a_third_time_fires() -> None:
    text = (DATA / "logic_restated_summary.txt").read_text()
    verdict = stream(text, STREAMING).verdict
    assert verdict is not None and verdict.signal == "block-loop"
    assert verdict.fired_at_char - ONSET <= 1350


def test_without_the_long_block_rule_it_needs_a_fourth_copy(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The same text, the rule off: nothing fires in the excerpt (the loop needs its fourth
    copy, ~400 characters later in the full answer)."""
    monkeypatch.setattr(blocks_module, "LONG_BLOCK_WORDS", 10**9)
    text = (DATA / "logic_restated_summary.txt").read_text()
    assert stream(text, STREAMING).verdict is None
