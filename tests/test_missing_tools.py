"""A test that needs a tool or library the README's install leaves out skips with the line that
installs it, and fails under CI, which installs everything: CI cannot go green by skipping."""

from __future__ import annotations

import sys

import pytest

from tests import test_docs
from tests.e2e import libraries


@pytest.fixture
def no_ci(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CI", raising=False)
    monkeypatch.delenv("COHERENCE_GUARD_E2E", raising=False)


def test_a_missing_client_library_skips_with_its_install_line(
    no_ci: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(libraries.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(pytest.skip.Exception, match=r"pip install --no-deps instructor==1\.17\.0"):
        libraries.require_client_library("instructor")
    libraries.require_client_library("openai-chat")  # an extras' library: nothing to check


@pytest.mark.parametrize(("name", "value"), [("CI", "1"), ("COHERENCE_GUARD_E2E", "require")])
def test_a_missing_client_library_fails_under_ci(
    no_ci: None, monkeypatch: pytest.MonkeyPatch, name: str, value: str
) -> None:
    monkeypatch.setenv(name, value)
    monkeypatch.setattr(libraries.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(pytest.fail.Exception, match="instructor is not installed"):
        libraries.require_client_library("instructor")


def test_missing_mkdocs_skips_on_a_laptop_and_fails_under_ci(
    no_ci: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "mkdocs", None)  # import mkdocs: ImportError
    with pytest.raises(pytest.skip.Exception, match=r"\.\[docs\]"):
        test_docs._require_mkdocs()
    monkeypatch.setenv("CI", "1")
    with pytest.raises(pytest.fail.Exception, match="mkdocs not installed"):
        test_docs._require_mkdocs()


def test_the_install_line_is_the_one_ci_runs_and_the_readme_gives() -> None:
    _, install = libraries.OUTSIDE_THE_EXTRAS["instructor"]
    ci = (test_docs.ROOT / ".ci" / "run").read_text(encoding="utf-8")
    assert install.removeprefix("pip install ") in ci
    assert install in test_docs.README.read_text(encoding="utf-8")
    assert install in (test_docs.DOCS / "testing.md").read_text(encoding="utf-8")
