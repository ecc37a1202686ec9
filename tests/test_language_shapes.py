"""Request shapes written by writers who never read the language rule, as derivation tests.

``bench/data/language_shapes_*.jsonl`` (``bench/data/LANGUAGE_SHAPES.md``): each shape is a real-
looking request (chat, Responses or Messages; system and developer prompts, several turns, the
``x-guard-language`` header) with every language a correct answer may be in (``accept``), and
the one a request demands outright (``required``). The expectation the proxy derives must accept
every language a correct answer may be in (an answer in it is never cut for its language), and
``GUARD_LANGUAGE=auto`` may inject only a language the shape requires or declares.

The ``dev`` shapes were read while the rule was written; the ``held``, ``third`` and ``fourth``
shapes were each measured once before they were read (``docs/language.md`` has the figures
before and after). These are the derivation half of what
``bench/measure/language/measure_language_blind.py`` measures through a running proxy with real
answers.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from proxy.core.language_names import resolve
from proxy.core.rewrite import RewritePolicy, rewrite_request
from proxy.detect.drift import with_close_languages

DATA = Path(__file__).resolve().parent.parent / "bench" / "data"
SHAPES = [
    json.loads(line)
    for name in (
        "language_shapes_dev.jsonl",
        "language_shapes_held.jsonl",
        "language_shapes_third.jsonl",
        "language_shapes_fourth.jsonl",
    )
    for line in (DATA / name).read_text(encoding="utf-8").splitlines()
    if line.strip()
]


def derive(shape: dict[str, Any], policy: RewritePolicy) -> Any:
    header = (shape.get("headers") or {}).get("x-guard-language")
    body = {**shape["request"], "model": "m", "max_tokens": 100}
    return rewrite_request(
        body, shape["surface"], policy, language=resolve(header) if header else None
    )


@pytest.mark.parametrize("shape", SHAPES, ids=[s["id"] for s in SHAPES])
def test_every_language_a_correct_answer_may_be_in_is_accepted(shape: dict[str, Any]) -> None:
    found = derive(shape, RewritePolicy()).expectation
    if found.code is None:
        return  # no expectation: nothing is judged against a language
    accepted = with_close_languages(found.accepted)
    missing = [code for code in shape["accept"] if code not in accepted]
    assert not missing, f"{found.header()} (shape accepts {shape['accept']})"


@pytest.mark.parametrize("shape", SHAPES, ids=[s["id"] for s in SHAPES])
def test_auto_injects_only_what_a_shape_requires(shape: dict[str, Any]) -> None:
    rw = derive(shape, RewritePolicy(language="auto"))
    if rw.injected_language is not None:
        assert rw.injected_language in with_close_languages(frozenset(shape["accept"]))
