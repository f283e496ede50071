"""The layering of ``measure/`` and ``train/`` (STYLE.md: lower layers never import higher ones).

Every module of the two packages is parsed with :mod:`ast` (nothing is imported), and every
import in it — at module level *and* inside functions, relative or absolute — becomes an edge
of the intra-package import graph. No package may hold an import circle (an import hidden in a
function to dodge one is still a circle), and ``measure`` may not reach up into ``train``,
``experiments``, ``report`` or the CLI.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src"
PACKAGES = ("senslab.measure", "senslab.train", "senslab.train.loops")
#: what measure/ must never import (higher layers)
ABOVE_MEASURE = ("senslab.train", "senslab.experiments", "senslab.report", "senslab.cli")


def _modules(package: str) -> dict[str, Path]:
    """Dotted module name → file, for every module of ``package`` (``__init__`` = the package)."""
    root = SRC.joinpath(*package.split("."))
    out = {}
    for path in sorted(root.glob("*.py")):
        out[package if path.stem == "__init__" else f"{package}.{path.stem}"] = path
    return out


def _all_modules() -> set[str]:
    names = set()
    for path in SRC.joinpath("senslab").rglob("*.py"):
        parts = path.relative_to(SRC).with_suffix("").parts
        names.add(".".join(parts[:-1] if parts[-1] == "__init__" else parts))
    return names


def imports(module: str, path: Path, known: set[str]) -> set[str]:
    """Every module ``module`` imports anywhere in its file, as absolute dotted names.

    ``from P import name`` counts as an import of ``P.name`` when that is a module, else of
    ``P``; relative imports are resolved against the module's package.
    """
    package = module if path.stem == "__init__" else module.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            for alias in node.names:
                sub = f"{target}.{alias.name}"
                found.add(sub if sub in known else target)
    return found


def graph(package: str) -> dict[str, set[str]]:
    """The import graph among ``package``'s own modules."""
    mods, known = _modules(package), _all_modules()
    return {m: (imports(m, p, known) & set(mods)) - {m} for m, p in mods.items()}


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with a cycle (Tarjan), each as a sorted list."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(edges.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                found.append(sorted(comp))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return found


def test_cycle_finder_sees_a_circle():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_import_resolution(tmp_path):
    path = tmp_path / "mod.py"
    path.write_text("from . import x\nfrom .y import f\n\ndef g():\n    from ..z import h\n")
    known = {"p.q.x", "p.q.y", "p.z"}
    assert imports("p.q.mod", path, known) == {"p.q.x", "p.q.y", "p.z"}


@pytest.mark.parametrize("package", PACKAGES)
def test_no_import_circles(package):
    edges = graph(package)
    assert len(edges) > 3, f"found no modules of {package} under {SRC}"
    found = cycles(edges)
    detail = "; ".join(
        " ↔ ".join(c) + " (" + ", ".join(f"{a}→{b}" for a in c for b in sorted(edges[a])
                                         if b in c) + ")"
        for c in found
    )
    assert not found, f"import circles in {package}: {detail}"


def test_measure_imports_no_higher_layer():
    known = _all_modules()
    bad = sorted(
        f"{module} imports {target}"
        for module, path in _modules("senslab.measure").items()
        for target in imports(module, path, known)
        if any(target == up or target.startswith(up + ".") for up in ABOVE_MEASURE)
    )
    assert not bad, "measure/ must not import higher layers: " + "; ".join(bad)
