"""The block-loop signal: loops that change their words are caught; templated healthy text is not.

Real texts under ``tests/data/detect/blocks/`` (sources in its README): a SmolLM2-135M-Instruct
answer from the block-loop set that goes round in circles about its own function
(``circular_commentary.txt``), a healthy answer of the same model that re-checks its results
(``triangle_recheck.txt``), and healthy templated source: CPython's ``opcode.py`` table of
``def_op`` lines and a ``ctypes`` test module whose test methods repeat one body (PSF licence),
PostgreSQL's ``btree_gist`` extension script that declares the same three objects for
``gbtreekey4``, ``8``, ``16`` … (PostgreSQL licence).
"""

from __future__ import annotations

import random
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from proxy.detect import DetectorConfig, blocks
from proxy.detect.blocks import BlockLoop, masked_tokens
from tests.detect.conftest import stream
from tests.detect.texts import ENGLISH

DATA = Path(__file__).parents[1] / "data" / "detect" / "blocks"
# The signal is off by default (docs/detector.md says why): these tests turn it on.
ON = DetectorConfig(block_loop=True)
STREAMING = DetectorConfig(end_judgement=False, block_loop=True)
WITHOUT = DetectorConfig(end_judgement=False, block_loop=False)


def test_masking_makes_growing_counters_and_expressions_one_template() -> None:
    assert masked_tokens("sum_B_32[i] = B * B * B * B * B") == masked_tokens(
        "sum_B_3[i] = B * B * B"
    )
    assert masked_tokens("count7 += 1") == masked_tokens("count12 += 1")
    assert masked_tokens("total = a + b") != masked_tokens("total = a + c")


@settings(max_examples=400, deadline=None)
@given(
    st.text(
        alphabet=st.sampled_from(list("ab1_ -+*/%^&|\n.")) | st.characters(categories=["L", "N"]),
        max_size=60,
    )
)
def test_the_chain_check_never_skips_a_run_of_one_operator(unit: str) -> None:
    """The cheap check that keeps the collapsing pattern off most units holds on every unit that
    pattern would change: masking with and without it gives the same tokens."""
    text = blocks._DIGITS.sub("0", unit.lower())
    if blocks._OPERATOR_RUN.sub(r"\1", text) != text:
        assert blocks._OPERATOR_CHAIN.search(text)
    if "a" in unit:
        chained = unit.replace("a", " a * a * a ", 1)
        text = blocks._DIGITS.sub("0", chained.lower())
        assert blocks._OPERATOR_RUN.sub(r"\1", text) != text
        assert blocks._OPERATOR_CHAIN.search(text)


def test_circular_commentary_is_caught_early() -> None:
    """The answer restates what its function does, in shifting words, from char 2,676 on (the
    onset rule of the set); the exact-repetition signals need ~860 characters more."""
    text = (DATA / "circular_commentary.txt").read_text()
    assert stream(text, WITHOUT).verdict is None
    verdict = stream(text, STREAMING).verdict
    assert verdict is not None and verdict.signal == "block-loop"
    assert verdict.fired_at_char - 2676 <= 600


def test_templated_counter_code_with_growing_expression_fires() -> None:
    """The shape of the issue's example: one block per power, index and expression growing, so
    no two blocks are the same once numbers are normalised (the counter-loop check misses)."""
    blocks = "".join(
        f"sum_B_{k} = [0] * (N + 1)\nfor i in range(N):\n"
        f"    sum_B_{k}[i + 1] = sum_B_{k}[i] + {' * '.join(['B'] * k)}\n\n"
        for k in range(2, 17)
    )
    text = "Here is the code, one prefix-sum array per power:\n\n" + blocks
    assert stream(text, WITHOUT).verdict is None
    verdict = stream(text, STREAMING).verdict
    assert verdict is not None and verdict.signal in ("block-loop", "repetition")


def test_reasoning_that_restarts_the_same_steps_fires() -> None:
    """A restart marker, then the same steps again, four times: the markers let the run fire
    one copy sooner (written for this test after the shape of real restarted reasoning; the
    block-loop set has no reasoning model)."""
    rounds = [
        "Wait, this is getting confusing. Let me think again. ",
        "Hmm, let me re-examine this. ",
        "Wait, let me start over. ",
        "Let me re-check. ",
    ]
    steps = (
        "The train leaves at 3 pm at 60 km/h, so at 4 pm it is 60 km ahead of the second one. "
        "The second train gains 20 km every hour on the first one. "
        "So it needs 60 divided by 20, that is 3 hours, to catch up with the first train. "
    )
    text = ENGLISH[:300] + "\n\n" + "\n\n".join(r + steps for r in rounds)
    assert stream(text, WITHOUT).verdict is None
    verdict = stream(text, STREAMING).verdict
    assert verdict is not None and verdict.signal == "block-loop"


def test_a_reasoning_that_rechecks_once_passes() -> None:
    steps = (
        "The second train gains 20 km every hour on the first one, which is 60 km ahead. "
        "So it needs 3 hours to catch up, at 7 pm. "
    )
    text = ENGLISH + "\n\n" + steps + "\n\nWait, let me check that again. " + steps + "\n\n"
    text += ENGLISH.replace("results", "figures")
    assert stream(text, ON).verdict is None


@pytest.mark.parametrize(
    "name",
    [
        "opcode_def_op.py.txt",
        "ctypes_test_prototypes.py.txt",
        "btree_gist_types.sql.txt",
        "triangle_recheck.txt",
    ],
)
def test_templated_healthy_text_passes(name: str) -> None:
    text = (DATA / name).read_text()
    assert stream(text, ON).verdict is None
    assert stream(f"Here it is:\n\n```\n{text}\n```\n", ON).verdict is None


def test_a_table_and_enum_arms_pass() -> None:
    rows = "".join(
        f"| {name} | {code} | {mass} |\n"
        for name, code, mass in [
            ("Alanine", "Ala", "89.09"), ("Arginine", "Arg", "174.20"),
            ("Asparagine", "Asn", "132.12"), ("Aspartic acid", "Asp", "133.10"),
            ("Cysteine", "Cys", "121.16"), ("Glutamine", "Gln", "146.15"),
            ("Glutamic acid", "Glu", "147.13"), ("Glycine", "Gly", "75.07"),
        ]
    )  # fmt: skip
    table = "| name | code | mass |\n|---|---|---|\n" + rows
    assert stream(ENGLISH + "\n\n" + table + "\n" + ENGLISH, ON).verdict is None
    arms = "".join(
        f"        case {i}:\n            // {name} has {days} days\n            days = {days};\n"
        "            break;\n"
        for i, (name, days) in enumerate(
            [("January", 31), ("February", 28), ("March", 31), ("April", 30), ("May", 31),
             ("June", 30), ("July", 31), ("August", 31), ("September", 30)], start=1
        )
    )  # fmt: skip
    assert stream("```java\nswitch (month) {\n" + arms + "}\n```\n", ON).verdict is None


def test_memory_stays_bounded_on_a_long_varied_stream() -> None:
    rng = random.Random(30)
    loop = BlockLoop()
    end = 0
    for _ in range(3000):
        words = ["".join(rng.choice("abcdefghij") for _ in range(6)) for _ in range(12)]
        line = " ".join(words) + ".\n"
        end += len(line)
        assert loop.update(line, end=end) is None
    assert len(loop._recent) + len(loop._older) < 40 * 32  # two generations of the history


def _rechecks(pairs: list[tuple[int, int]]) -> str:
    """A reasoning trace that works out each product, then says "Wait, let me check that
    again" and checks it another way (written for this test after the shape of real thinking
    traces; no reasoning model's output is in the repository)."""
    return "".join(
        f"Next, {a} times {b}. {a} times {b - 3} is {a * (b - 3)}, plus {a} times 3 is {3 * a}, "
        f"so {a * b}. Wait, let me check that again. {b} times {a - 7} is {b * (a - 7)}, plus "
        f"{b} times 7 is {7 * b}, which makes {a * b}. Yes, {a * b}.\n\n"
        for a, b in pairs
    )


def test_reasoning_that_rechecks_each_step_and_moves_on_passes() -> None:
    """Healthy thinking restates itself ("wait, let me check that again") and moves on: every
    re-check is of a new product, with new numbers, so nothing goes round."""
    pairs = [
        (17, 23),
        (19, 29),
        (31, 37),
        (41, 43),
        (47, 53),
        (59, 61),
        (67, 71),
        (73, 79),
        (83, 89),
    ]
    text = "Let me multiply these pairs one at a time.\n\n" + _rechecks(pairs)
    assert len(text) > 1500
    assert stream(text, ON).verdict is None


def test_reasoning_that_rechecks_the_same_step_again_and_again_fires() -> None:
    """The same re-check of the same product, word for word, again and again: it goes round."""
    text = "Let me multiply these pairs one at a time.\n\n" + _rechecks([(17, 23)] * 8)
    verdict = stream(text, ON).verdict
    assert verdict is not None and verdict.signal in ("repetition", "block-loop")
