"""The documentation: the site builds strictly, the README stays a guide, no page goes stale.

``mkdocs build --strict`` fails on a broken link or anchor and on a page left out of the nav
(``mkdocs.yml`` turns those into warnings), so a page that moves or a heading that is renamed
fails here, not on a reader. The README is the first thing a user reads: it stays within 400
lines, its test command is the one CI runs, and its links point at pages that exist.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.net import HANG_GUARD

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
DOCS = ROOT / "docs"

#: Sentences about where the project was built say nothing to a user and go stale.
_MACHINE_TALK = re.compile(
    r"shared (2-core|machine|cores|kit)|2-core development|development machine|other engineers"
    r"|local package mirror|measured here",
    re.IGNORECASE,
)


def _require_mkdocs() -> None:
    """Skip on a developer machine without mkdocs; fail under CI, which installs ``.[test]``
    (its ``docs`` extra brings mkdocs), so CI cannot lose the strict build without a sound."""
    try:
        import mkdocs  # noqa: F401
    except ImportError:
        message = "mkdocs not installed; pip install -e '.[docs]'"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)


def test_docs_site_builds_strictly(tmp_path: Path) -> None:
    """Every page is in the nav, every link and anchor resolves (the build fails otherwise)."""
    _require_mkdocs()
    done = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path)],
        cwd=ROOT, capture_output=True, text=True, timeout=HANG_GUARD, check=False,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    assert (tmp_path / "index.html").is_file()
    assert (tmp_path / "configuration" / "index.html").is_file()


def test_readme_is_a_short_guide() -> None:
    lines = README.read_text(encoding="utf-8").splitlines()
    assert len(lines) <= 400, f"README.md has {len(lines)} lines; move detail to docs/"


def test_readme_links_point_at_existing_files() -> None:
    text = README.read_text(encoding="utf-8")
    targets = re.findall(r"\]\(((?!https?://|#)[^)#]+)(?:#[^)]*)?\)", text)
    assert targets, "the README links to no page"
    missing = [t for t in targets if not (ROOT / t).exists()]
    assert not missing, f"README links to missing files: {missing}"


def test_readme_test_command_is_what_ci_runs() -> None:
    """The README's first screen gives the test command; .ci/run must run exactly that."""
    first_screen = "\n".join(README.read_text(encoding="utf-8").splitlines()[:40])
    assert "pip install -e '.[test]' && python -m pytest\n" in first_screen
    ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8")
    assert re.search(r"^python3 -m pytest$", ci, re.MULTILINE), "CI must run the README command"


def test_no_page_speaks_of_the_machine_it_was_written_on() -> None:
    pages = [README, *sorted(DOCS.glob("*.md"))]
    found = [
        f"{page.relative_to(ROOT)}: {m.group(0)!r}"
        for page in pages
        for m in _MACHINE_TALK.finditer(page.read_text(encoding="utf-8"))
    ]
    assert not found, found
