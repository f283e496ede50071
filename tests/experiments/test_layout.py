"""The layout of ``senslab.experiments`` (read from the source with :mod:`ast`, nothing imported):

* a paper package (``experiments/<paper>/``) imports nothing from another paper's package;
* an experiment module (one figure: a file without a leading underscore, other than
  ``__init__``) imports no other experiment module — only shared modules (a leading underscore:
  ``_common``, ``_vision``, ``.._verdicts`` ...), ``..base`` and the layers below
  ``experiments`` (``senslab.train``, ``senslab.measure`` ...);
* a shared module imports no experiment module either;
* ``execute`` is defined once (base.py), and no module here trains (no optimizer, no backward).
"""

from __future__ import annotations

import ast
from pathlib import Path

import senslab.experiments

ROOT = Path(senslab.experiments.__file__).parent
PKG = "senslab.experiments"
PAPERS = sorted(p.name for p in ROOT.iterdir() if (p / "__init__.py").is_file())


def _module(path: Path) -> str:
    parts = [PKG, *path.relative_to(ROOT).with_suffix("").parts]
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: Path) -> list[str]:
    """Every module ``path`` imports (absolute names; ``from . import x`` counts as ``pkg.x``)."""
    package = _module(path) if path.name == "__init__.py" else _module(path).rsplit(".", 1)[0]
    out = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[:len(base) - node.level + 1]
                mod = ".".join(base + ([node.module] if node.module else []))
            else:
                mod = node.module or ""
            if node.module is None:  # from . import name: name is a module of the package
                out += [f"{mod}.{a.name}" for a in node.names]
            else:
                out.append(mod)
    return out


def _sources() -> list[Path]:
    return sorted(p for p in ROOT.rglob("*.py") if "__pycache__" not in p.parts)


def _is_experiment_module(mod: str) -> bool:
    """A module of one figure: inside ``senslab.experiments``, last name without a leading
    underscore, not a package, not ``base``."""
    if not mod.startswith(PKG + "."):
        return False
    last = mod.rsplit(".", 1)[-1]
    return not last.startswith("_") and last not in PAPERS and mod != f"{PKG}.base"


def test_the_layout_is_read() -> None:
    assert {"lowsens", "hahn_rofin", "implicit_bias"} <= set(PAPERS)
    imports = _imports(ROOT / "lowsens" / "sharpness.py")
    assert f"{PKG}.base" in imports and f"{PKG}.lowsens._vision" in imports
    assert "senslab.train.config" in imports


def test_no_paper_package_imports_another() -> None:
    bad = []
    for path in _sources():
        mod = _module(path)
        paper = mod.split(".")[2] if mod.count(".") >= 2 else None
        if paper not in PAPERS:
            continue
        for imp in _imports(path):
            other = imp.split(".")[2] if imp.startswith(PKG + ".") else None
            if other in PAPERS and other != paper:
                bad.append(f"{path.relative_to(ROOT)} imports {imp}")
    assert not bad, "cross-paper imports (move the shared piece to experiments/base.py, " \
                    "_verdicts.py or another shared module):\n" + "\n".join(bad)


def test_modules_import_no_experiment_module() -> None:
    bad = []
    for path in _sources():
        if path.name == "__init__.py":
            continue
        for imp in _imports(path):
            if _is_experiment_module(imp) and imp != _module(path):
                bad.append(f"{path.relative_to(ROOT)} imports {imp}")
    assert not bad, "experiment modules import only shared (_-prefixed) modules, base and the " \
                    "layers below experiments:\n" + "\n".join(bad)


def test_one_execute_and_no_training_code_in_experiments() -> None:
    """Every experiment is a spec on one base: ``execute`` is defined once, in base.py, and no
    experiment or shared module builds an optimizer or runs a step loop (trainers do, in
    ``senslab.train``)."""
    defs = {str(p.relative_to(ROOT)): p.read_text().count("def execute") for p in _sources()}
    assert {k: v for k, v in defs.items() if v} == {"base.py": 1}
    training = ("torch.optim", ".backward(", "opt.step(", "optimizer.step(")
    found = [f"{p.relative_to(ROOT)}: {t}" for p in _sources() for t in training
             if t in p.read_text()]
    assert not found, "training code in experiments (move it to a trainer):\n" + "\n".join(found)
