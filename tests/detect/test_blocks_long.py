"""A long block restated a third time is a loop: the block-loop signal needs one copy less for
it.

``summary_block_thrice.txt`` is the end of a real answer of the tuning half of the real answers
(``ae-guanaco-13b-619``, from its "In terms of awards and honors" on; sources in
``tests/data/detect/blocks/README.md``): after its table and comparison, the paragraph "Based on
the table …", the intangibles and four bullets come back word for word, three times, to the
token limit. ``logic_restated_summary.txt`` is a real runaway answer of the block-loop set
(``blockloop-reason-logic-n09``) that goes round "that's what you're going to have to do … I'm
going to give it back" in shifting words from char 1,430 on (the set's paraphrase onset rule).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from proxy.detect import DetectorConfig
from proxy.detect import blocks as blocks_module
from tests.detect.conftest import stream

DATA = Path(__file__).parents[1] / "data" / "detect" / "blocks"
STREAMING = DetectorConfig(end_judgement=False, block_loop=True)


def test_a_long_block_restated_a_third_time_fires() -> None:
    """Three copies of a block of 120 words, the exact-repetition signals need a fourth."""
    text = (DATA / "summary_block_thrice.txt").read_text()
    exact_only = DetectorConfig(end_judgement=False, line_loop=False, block_loop=False)
    assert stream(text, exact_only).verdict is None
    verdict = stream(text, STREAMING).verdict
    assert verdict is not None and verdict.signal == "block-loop"
    second = text.index("Based on the table", text.index("Based on the table") + 1)
    third = text.index("Based on the table", second + 1)
    assert third < verdict.fired_at_char <= third + 600


def test_without_the_long_block_rule_it_needs_a_fourth_copy(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The same text, the rule off: nothing fires (the answer ends before a fourth copy)."""
    monkeypatch.setattr(blocks_module, "LONG_BLOCK_WORDS", 10**9)
    text = (DATA / "summary_block_thrice.txt").read_text()
    assert stream(text, STREAMING).verdict is None


def test_a_paraphrase_loop_fires_once_its_copies_bring_nothing_new() -> None:
    """The runaway goes round the same few sentences, now and then with a word swapped in
    ("labelled correctly" for "not labelled"); the verdict comes once a whole copy brings
    nothing new, within 1,700 characters of the onset."""
    text = (DATA / "logic_restated_summary.txt").read_text()
    verdict = stream(text, STREAMING).verdict
    assert verdict is not None and verdict.signal == "block-loop"
    assert verdict.fired_at_char - 1430 <= 1700
