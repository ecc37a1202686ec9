"""Another script inside code is data, not the answer's language.

``tests/data/detect/moment_locale_el.js``: the first 4,000 characters of moment.js's Greek
locale (``/usr/share/javascript/moment/locale/el.js`` of Debian's libjs-moment, MIT licence),
one of the real files (``bench/data/realfiles.jsonl.gz``, ``javascript-0052``) an English request
for a file was cut on: its month and day names are Greek string literals.
"""

from __future__ import annotations

from pathlib import Path

from tests.detect.conftest import stream
from tests.detect.texts import ENGLISH

LOCALE = (
    Path(__file__).resolve().parent.parent / "data" / "detect" / "moment_locale_el.js"
).read_text(encoding="utf-8")
GREEK = (
    "Η Ελλάδα είναι μια χώρα της νοτιοανατολικής Ευρώπης με πλούσια ιστορία και πολιτισμό. "
    "Η πρωτεύουσα της χώρας είναι η Αθήνα, μια από τις αρχαιότερες πόλεις του κόσμου. "
    "Οι επισκέπτες θαυμάζουν τα αρχαία μνημεία, τα νησιά και την παραδοσιακή κουζίνα. "
)


def test_a_locale_file_shown_in_a_code_fence_passes() -> None:
    """A model showing the file as asked: the Greek strings sit inside the fence."""
    text = "Here is the Greek locale file:\n\n```javascript\n" + LOCALE + "\n```\n"
    assert stream(text, expected_language="en").verdict is None


def test_greek_prose_in_an_english_answer_still_intrudes() -> None:
    """The same script written as the answer's prose, not inside code, is an intrusion."""
    verdict = stream(ENGLISH[:400] + " " + GREEK * 3, expected_language="en").verdict
    assert verdict is not None and verdict.signal in ("script-intrusion", "language-drift")


def test_greek_prose_after_a_closed_fence_still_intrudes() -> None:
    """Code that has ended protects nothing after it."""
    text = "Here is the file:\n\n```javascript\n" + LOCALE[:1500] + "\n```\n\n" + GREEK * 3
    verdict = stream(text, expected_language="en").verdict
    assert verdict is not None and verdict.signal in ("script-intrusion", "language-drift")
