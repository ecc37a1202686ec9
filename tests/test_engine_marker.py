"""Which tests the default run leaves out as engine tests: those under ``tests/e2e``, wherever
the checkout lies (one under a folder named ``e2e`` once made every test an engine test)."""

from __future__ import annotations

from pathlib import Path

from tests.conftest import in_engine_suite


def test_only_the_path_inside_tests_decides(tmp_path: Path) -> None:
    for checkout in (tmp_path / "work" / "repo", tmp_path / "e2e" / "repo", tmp_path / "e2e"):
        tests = checkout / "tests"
        assert in_engine_suite(tests / "e2e" / "test_engines.py", tests)
        assert not in_engine_suite(tests / "test_relay.py", tests)
        assert not in_engine_suite(tests / "detect" / "test_e2e_like.py", tests)
        assert not in_engine_suite(checkout / "elsewhere" / "test_x.py", tests)
