"""Unfenced source code is judged like fenced code: a code completion, a header's enumeration or
a data table repeats its structure by design.

The excerpts are real files the detector never saw (``tests/data/detect/source/``): the decoding
table of CPython 3.11's ``Lib/encodings/iso8859_3.py`` (PSF licence) and the ``GL_VERSION_1_3``
enumeration of the Khronos ``GL/glext.h`` as Debian ships it (MIT licence). Both fired as loops
before; on 900 random stdlib/site-packages/``/usr/include`` files of 2,000+ characters the
false-positive share went from 4.1 % to 1.7 % (what remains are very long tables); on the
development corpus one loop is caught later and nothing else moves.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from proxy.detect.drift import source_like
from tests.detect.conftest import stream
from tests.detect.texts import ENGLISH

SOURCE = Path(__file__).parents[1] / "data" / "detect" / "source"


@pytest.mark.parametrize("name", ["iso8859_3_table.py.txt", "glext_enums.h.txt"])
def test_real_source_files_are_not_loops(name: str) -> None:
    text = (SOURCE / name).read_text()
    assert stream(text, expected_language="en").verdict is None
    # The same file inside a fenced block was already judged as code.
    assert stream(f"Here it is:\n\n```\n{text}\n```\n", expected_language="en").verdict is None


def test_a_loop_of_one_code_like_line_is_still_a_loop() -> None:
    """Judged on distinct lines: an equation repeated is one line, not a source file."""
    text = ENGLISH[:300] + "\n\\begin{aligned}\n" + "&= \\frac{5}{64} * (2^2 - 1)^2 \\\\\n" * 30
    verdict = stream(text, expected_language="en").verdict
    assert verdict is not None and verdict.signal in ("repetition", "token-flood")
    assert not source_like("x = f(1);\n" * 12)


def test_the_same_enumeration_in_prose_is_still_a_counter_loop() -> None:
    """What makes the difference is the code around it, not the repetition: numbered prose
    lines identical but for their numbers stay a loop."""
    item = "The fox looked at the river and thought about the long way home again."
    text = ENGLISH[:300] + "".join(f"\nParagraph {i}. {item}" for i in range(1, 40))
    verdict = stream(text, expected_language="en").verdict
    assert verdict is not None and verdict.signal in ("repetition", "near-repetition")


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("#define A_B 1\n#define A_C 2\n#define A_D 3\n#define A_E 4\n", True),
        ("int f(void);\nint g(void);\nstatic int x = 1;\nreturn y;\n", True),
        ("    0x10,  # ten\n    0x11,  # eleven\n    0x12,\n    0x13,\n", True),
        (
            "# Title\n\nThe fox ran home.\n\n* one thing\n* another thing\n"
            "The river was wide and cold.\nIt rained all day.\n",
            False,
        ),
        ("1. The fox ran home.\n2. The fox ran home.\n3. The fox ran home.\n", False),
        ("short\n", False),
    ],
)
def test_source_like(text: str, expected: bool) -> None:
    assert source_like(text) is expected
