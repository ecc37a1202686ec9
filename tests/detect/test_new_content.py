"""Text that keeps bringing new content is not a loop: real texts the repetition signals cut.

``tests/data/detect/new_content.jsonl`` holds real answers of the tuning half of the real
answers (``../shared/realanswers/alpacaeval-dev.jsonl``, each row's ``source`` names the answer)
and pieces of real files of the real-file set (``bench/data/realfiles.jsonl.gz``: the path and
the characters taken), up to a little past where the repetition family used to cut them
(``main``: its signal then). Each is healthy and each moves on: a list item with a new subject,
a row with new figures, a count, a table whose rows have their own cells, a grid with one more
cell filled, a version list. Read as streamed answers they get no verdict, every signal on
(block-loop too, which is off by default).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from proxy.detect import Detector, DetectorConfig
from tests.detect.texts import as_deltas

ROWS = [
    json.loads(line)
    for line in (Path(__file__).parents[1] / "data" / "detect" / "new_content.jsonl")
    .read_text("utf-8")
    .splitlines()
]


@pytest.mark.parametrize("row", ROWS, ids=[r["id"] for r in ROWS])
def test_text_that_brings_new_content_is_not_cut(row: dict[str, Any]) -> None:
    detector = Detector(DetectorConfig(block_loop=True))  # every signal on
    verdicts = [v for d in as_deltas(row["text"]) if (v := detector.feed(d)) is not None]
    assert verdicts == [], row["cls"]
    assert detector.finish(end_drift=False).verdict is None, row["cls"]
