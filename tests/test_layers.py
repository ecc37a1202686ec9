"""The package layout is the architecture: a walk of the import graph keeps it honest.

* No import circles anywhere in ``proxy``, the imports under ``if TYPE_CHECKING:`` included:
  they never run, but a reader meets them, and a circle means two modules are one module split
  in the wrong place (a shared type goes down into a module both import, or a protocol names
  what the lower module uses of the upper one).
* The pure layers (:mod:`proxy.detect`, :mod:`proxy.core`) import no I/O library and nothing of
  the shell above them, so a folder name says which code is pure.
* Layers only import downwards: ``cli`` → ``server`` → ``observability`` → ``core`` →
  ``detect``, with ``settings`` and ``errors`` as the vocabulary every layer shares.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "proxy"

#: Lower index = lower layer; a module may import its own layer and the ones below.
LAYERS = ["detect", "errors", "core", "settings", "observability", "server", "cli"]
IO_LIBRARIES = {
    "asyncio", "socket", "ssl", "subprocess", "httpx", "httptools", "uvicorn", "starlette",
    "fastapi", "prometheus_client", "aiohttp", "urllib.request",
}  # fmt: skip


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


MODULES = {_module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _imports(module: str, *, type_checking: bool = False) -> set[str]:
    """Every module ``module`` imports when it runs (at import time or inside a function),
    and with ``type_checking`` those it imports for the type checker too."""
    path = MODULES[module]
    tree = ast.parse(path.read_text(encoding="utf-8"))
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found: set[str] = set()

    def visit(node: ast.AST) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and _is_type_checking(child) and not type_checking:
                for sub in child.orelse:
                    visit(sub)
                continue
            if isinstance(child, ast.Import):
                found.update(alias.name for alias in child.names)
            elif isinstance(child, ast.ImportFrom):
                base = child.module or ""
                if child.level:
                    anchor = package.split(".")
                    anchor = anchor[: len(anchor) - child.level + 1]
                    base = ".".join([*anchor, base]) if base else ".".join(anchor)
                found.add(base)
                found.update(f"{base}.{alias.name}" for alias in child.names)
            visit(child)

    visit(tree)
    return found


def _internal_edges(module: str, *, type_checking: bool = False) -> set[str]:
    return {
        name
        for name in _imports(module, type_checking=type_checking)
        if name in MODULES and name != module
    }


def _cycles(*, type_checking: bool = False) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    graph = {m: _internal_edges(m, type_checking=type_checking) for m in MODULES}
    # a package's __init__ importing its own submodules is how packages re-export; the
    # submodules importing the package's names back would be the circle, and counts
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []
    counter = [0]

    def strong(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on_stack.add(v)
        for w in graph[v]:
            if w not in index:
                strong(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                out.append(sorted(component))

    for v in graph:
        if v not in index:
            strong(v)
    return out


def _layer(module: str) -> str | None:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 and parts[1] in LAYERS else None


def test_the_walk_sees_the_package() -> None:
    """The walk reads real edges (a walk that found nothing would pass every test below)."""
    assert "proxy.core.guard" in MODULES and "proxy.server.guarded" in MODULES
    assert "proxy.core.guard" in _internal_edges("proxy.server.guarded")


@pytest.mark.parametrize("type_checking", [False, True], ids=["run-time", "with-type-imports"])
def test_no_import_circles(type_checking: bool) -> None:
    assert _cycles(type_checking=type_checking) == []


def test_the_walk_sees_type_imports() -> None:
    """Type-only imports are edges of the second walk, not of the first."""
    assert "proxy.core.relay_types" not in _internal_edges("proxy.core.surfaces.chat")
    assert "proxy.core.relay_types" in _internal_edges(
        "proxy.core.surfaces.chat", type_checking=True
    )


@pytest.mark.parametrize("layer", ["detect", "core"])
def test_pure_layers_do_no_io(layer: str) -> None:
    offenders = {
        module: sorted(
            name for name in _imports(module)
            if name.split(".")[0] in IO_LIBRARIES or name in IO_LIBRARIES
        )
        for module in MODULES
        if _layer(module) == layer
    }  # fmt: skip
    assert {m: names for m, names in offenders.items() if names} == {}


def test_layers_import_only_downwards() -> None:
    upward = []
    for module in MODULES:
        own = _layer(module)
        if own is None:
            continue
        for target in _internal_edges(module):
            other = _layer(target)
            if other is not None and LAYERS.index(other) > LAYERS.index(own):
                upward.append(f"{module} -> {target}")
    assert upward == []


def test_the_architecture_page_maps_every_module() -> None:
    """docs/architecture.md's module map is generated from the tree; a module added, moved or
    re-described without ``python scripts/module_map.py`` fails here."""
    import subprocess
    import sys

    done = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "module_map.py"), "--check"],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    page = (ROOT / "docs" / "architecture.md").read_text(encoding="utf-8")
    assert "| `guard.py` | The guard's per-request state machine" in page


def test_no_module_over_500_lines() -> None:
    """A module is one idea a reader holds at once; past 500 lines it has become two."""
    long = {m: n for m, p in MODULES.items() if (n := len(p.read_text().splitlines())) > 500}
    assert long == {}
