"""The client's bytes and the guard's end state, per stream, surface, policy and way of cutting
reads, against the golden digests written from the relay before its per-event path was last
rewritten (see ``tests/relay_golden.py``): healthy streams byte for byte the same, every
verdict at the same character, the same usage and token counts."""

from __future__ import annotations

import json

from tests import relay_golden


def test_relay_matches_the_golden_outputs() -> None:
    golden = json.loads(relay_golden.GOLDEN.read_text())
    now = relay_golden.compute()
    assert now.keys() == golden.keys()
    differ = {name: (golden[name], now[name]) for name in golden if golden[name] != now[name]}
    assert not differ, (
        f"{len(differ)} of {len(golden)} cases differ, e.g. {next(iter(differ.items()))}"
    )


def test_the_golden_cases_cover_aborts_and_clean_ends_on_every_surface() -> None:
    golden = json.loads(relay_golden.GOLDEN.read_text())
    for surface in ("chat", "completions", "responses", "messages"):
        ours = {k: v for k, v in golden.items() if k.startswith(surface + "/")}
        assert any(v["verdicts"] for v in ours.values())
        assert any(not v["verdicts"] for k, v in ours.items() if "healthy" in k)
        assert not any(v["verdicts"] for k, v in ours.items() if "healthy" in k)
