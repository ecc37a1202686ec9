"""The build ``bench/measure/relay/compiled_work.sh`` uses in its scratch copy of the tree: a
wheel whose modules of ``bench/measure/relay/mypyc/modules.py`` are compiled with mypyc
(pyproject.toml declares the rest; the script adds mypy to the build requirements)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from mypyc.build import mypycify
from setuptools import setup

ROOT = Path(__file__).resolve().parent
scope: dict[str, Any] = {}
MODULES = ROOT / "bench" / "measure" / "relay" / "mypyc" / "modules.py"
exec(MODULES.read_text(encoding="utf-8"), scope)
paths = [str(Path(*name.split(".")).with_suffix(".py")) for name in scope["MODULES"]]
setup(ext_modules=mypycify(paths, opt_level="3", debug_level="0"))
