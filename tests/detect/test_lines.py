"""Near-identical loops: lines and sentences that repeat with small edits."""

from __future__ import annotations

import pytest

from proxy.detect import DetectorConfig
from proxy.detect.lines import LineLoop, similar
from tests.detect.conftest import stream
from tests.detect.texts import ENGLISH

EXCHANGE = (
    "Customer: I would like to return these shoes because they are far too small for me.\n"
    "Clerk: Of course, do you have the receipt from the day you bought them here?\n"
)
# The first copy differs by one word: the exact periodic check sees three copies, not four.
FIRST = EXCHANGE.replace("far too small", "far too large")


def words(text: str) -> tuple[str, ...]:
    return tuple(text.split(" "))


def test_one_word_edits_are_similar_and_templates_are_not() -> None:
    a = words("the clerk asked for the receipt again today")
    assert similar(a, a)
    assert similar(a, words("the clerk asked for the ticket again today"))
    assert similar(a, words("the clerk asked for the receipt today"))
    assert not similar(a, words("the clerk asked for a new receipt again today"))
    assert not similar(words("for want of a nail"), words("for want of a shoe"))


def test_a_dialogue_repeated_four_times_with_an_edited_first_copy_fires() -> None:
    text = ENGLISH[:299] + "\n" + FIRST + EXCHANGE * 3
    exact_only = DetectorConfig(line_loop=False, block_loop=False, end_judgement=False)
    assert stream(text, exact_only).verdict is None
    lines_only = DetectorConfig(block_loop=False, end_judgement=False)
    verdict = stream(text, lines_only).verdict
    assert verdict is not None and verdict.signal == "near-repetition"
    # The repeating starts with the second copy: the first is content, a trim keeps it.
    assert verdict.onset_char == 300 + len(FIRST)
    # While streaming: a fifth copy is not needed to see the loop.
    longer = stream(text + EXCHANGE * 2, lines_only).verdict
    assert longer is not None and longer.fired_at_char <= len(text) + 128  # the next check


def test_numbered_items_repeating_with_only_the_number_changing_fire() -> None:
    item = (
        "Practice speaking with native speakers every day, and write down the new words "
        "you hear so that you can review them in the evening before going to sleep.\n"
    )
    text = ENGLISH[:200] + "".join(f"{i}. {item}" for i in range(1, 10))
    verdict = stream(text).verdict
    assert verdict is not None
    assert verdict.fired_at_char < 200 + 5 * len(item)


@pytest.mark.parametrize(
    "text",
    [
        "".join(
            f"For want of a {a} the {b} was lost.\n"
            for a, b in [("nail", "shoe"), ("shoe", "horse"), ("horse", "rider"),
                         ("rider", "message"), ("message", "battle"), ("battle", "kingdom")]
        ) + "And all for the want of a nail.\n",
        "".join(
            f"{n}. AI and {topic}: a discussion of how AI is changing the way {topic.lower()} "
            f"is produced and distributed, including {extra}.\n"
            for n, (topic, extra) in enumerate(
                [("Film", "computer vision"), ("Music", "recommendation algorithms"),
                 ("Television", "audience analytics"), ("Podcasts", "automatic transcription"),
                 ("News", "automated fact checking"), ("Games", "procedural generation")], 1)
        ),
        "".join(
            f"{n} bottles of beer on the wall, {n} bottles of beer.\n"
            f"Take one down and pass it around, {n - 1} bottles of beer on the wall.\n\n"
            for n in range(99, 90, -1)
        ),
        "".join(f" src/plugins/elements/gst{name}.c\n src/plugins/elements/gst{name}.h\n"
                for name in ["queue", "queue2", "tee", "fakesink", "fakesrc", "filesink"]),
    ],
    ids=["proverb", "list-template", "countdown", "file-list"],
)  # fmt: skip
def test_templates_countdowns_and_file_lists_pass(text: str) -> None:
    assert stream(ENGLISH[:300] + text).verdict is None


def test_a_loop_that_has_ended_is_not_reported() -> None:
    loop = LineLoop()
    found = loop.update(EXCHANGE * 4, end=4 * len(EXCHANGE))
    assert found is not None and found[0] >= 400 and found[3] == 2
    assert loop.update(ENGLISH[:400] + "\n", end=4 * len(EXCHANGE) + 401) is None


def test_units_split_across_checks_are_joined() -> None:
    loop = LineLoop()
    text = EXCHANGE * 4
    found = None
    for i in range(0, len(text), 7):
        found = loop.update(text[i : i + 7], end=min(len(text), i + 7)) or found
    assert found is not None and found[5] == 0 and found[1] == len(EXCHANGE) and found[3] == 2
