"""Packaging: ``pip install senslab`` keeps the torch an environment already has.

pyproject.toml asks for a torch *range* whose floor is the one docs/compatibility.md derives;
the exact CPU pin lives only in constraints.txt. The install tests are offline by construction:
pip runs with ``--no-index`` and with every configuration file and ``PIP_*`` variable removed
(these machines configure a local wheel directory holding torch), so it can install nothing but
the wheel or sdist built here, and the resolver has to make do with what the target environment
already holds.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import time
from importlib import metadata
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.version import Version

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    tomllib = None  # type: ignore[assignment]

ROOT = Path(__file__).resolve().parents[1]
#: the floor line of docs/compatibility.md
FLOOR_LINE = re.compile(r"^Floor: `torch>=([0-9][0-9.]*)`$", re.MULTILINE)


def _pyproject() -> dict:
    if tomllib is None:
        pytest.skip("tomllib needs Python 3.11")
    return tomllib.loads((ROOT / "pyproject.toml").read_text())


def _requirement(name: str) -> Requirement:
    reqs = [Requirement(r) for r in _pyproject()["project"]["dependencies"]]
    found = [r for r in reqs if r.name == name]
    assert len(found) == 1, f"pyproject.toml should list {name} once: {reqs}"
    return found[0]


def _documented_floor() -> Version:
    found = FLOOR_LINE.findall((ROOT / "docs" / "compatibility.md").read_text())
    assert len(found) == 1, "docs/compatibility.md should state one 'Floor: `torch>=X`' line"
    return Version(found[0])


# ---------------------------------------------------------------- metadata (fast)


def test_torch_is_a_range_whose_floor_is_documented():
    torch = _requirement("torch")
    ops = {s.operator: Version(s.version) for s in torch.specifier}
    assert "==" not in ops and "===" not in ops and "~=" not in ops, (
        f"pyproject.toml pins torch ({torch}): pip install senslab would replace the user's torch")
    assert ops.get(">=") == _documented_floor(), (
        f"pyproject.toml's torch floor ({torch}) differs from docs/compatibility.md "
        f"({_documented_floor()})")
    # the torch these machines run lies inside the range
    assert Version("2.13.0") in torch.specifier


def test_constraints_still_pin_the_local_torch():
    lines = [ln.split("#")[0].strip() for ln in (ROOT / "constraints.txt").read_text().splitlines()]
    assert "torch==2.13.0" in lines


def test_other_dependencies_are_ranges():
    for raw in _pyproject()["project"]["dependencies"]:
        req = Requirement(raw)
        assert all(s.operator not in ("==", "===") for s in req.specifier), raw


def test_extras():
    extras = _pyproject()["project"]["optional-dependencies"]
    names = {k: {Requirement(r).name for r in v} for k, v in extras.items()}
    assert names["hf"] == {"transformers", "accelerate"}
    assert names["timm"] == {"timm"}
    assert names["lightning"] == {"lightning", "torchmetrics"}
    assert names["wandb"] == {"wandb"}
    assert names["tensorboard"] == {"tensorboard"}
    assert {"pytest", "ruff", "build"} <= names["dev"]
    for reqs in extras.values():  # no extra pins torch behind the user's back
        assert all(Requirement(r).name != "torch" for r in reqs)


# ---------------------------------------------------------------- building and installing


def _offline_env() -> dict[str, str]:
    """The environment for an offline pip: no config file, no PIP_* variable (find-links!)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PIP_")}
    env.update(PIP_CONFIG_FILE=os.devnull, PIP_DISABLE_PIP_VERSION_CHECK="1",
               PIP_NO_INPUT="1", PYTHONNOUSERSITE="1")
    env.pop("PYTHONPATH", None)
    return env


def _pip(target_python: Path, *args: str, check: bool = True) -> subprocess.CompletedProcess:
    """This interpreter's pip, acting on the environment of ``target_python``."""
    if Version(metadata.version("pip")) < Version("22.3"):
        pytest.skip("pip install --python needs pip >= 22.3")
    cmd = [sys.executable, "-m", "pip", "--python", str(target_python), "install",
           "--no-index", *args]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=_offline_env(), timeout=300)
    if check:
        assert proc.returncode == 0, f"{' '.join(cmd)}\n{proc.stdout}\n{proc.stderr}"
    return proc


def _venv(path: Path) -> tuple[Path, Path]:
    """A bare virtual environment (no pip: pip is driven from outside): (python, site-packages)."""
    base = getattr(sys, "_base_executable", sys.executable)
    subprocess.run([base, "-m", "venv", "--without-pip", str(path)], check=True, timeout=120)
    python = path / "bin" / "python"
    purelib = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True, text=True, check=True, env=_offline_env()).stdout.strip()
    return python, Path(purelib)


def _stub_distribution(site: Path, name: str, version: str) -> None:
    """Installed-distribution metadata only (what pip's resolver reads), no code."""
    info = site / f"{name.replace('-', '_')}-{version}.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
    (info / "INSTALLER").write_text("pip\n")
    (info / "RECORD").write_text(
        "".join(f"{info.name}/{f},,\n" for f in ("METADATA", "INSTALLER", "RECORD")))


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> dict[str, Path]:
    """senslab's sdist, and its wheel built *from that sdist* (``python -m build``), from a copy
    of the sources (so nothing is written into the checkout)."""
    pytest.importorskip("build", reason="needs the dev extra's `build`")
    tmp = tmp_path_factory.mktemp("build")
    src = tmp / "senslab"
    src.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(ROOT / name, src / name)
    shutil.copytree(ROOT / "src", src / "src",
                    ignore=shutil.ignore_patterns("__pycache__", "*.egg-info", "*.pyc"))
    t0 = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, "-m", "build", "--no-isolation", "--outdir", str(tmp / "dist"), str(src)],
        capture_output=True, text=True, env=_offline_env(), timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    print(f"python -m build: {time.perf_counter() - t0:.1f} s")
    wheels = list((tmp / "dist").glob("senslab-*.whl"))
    sdists = list((tmp / "dist").glob("senslab-*.tar.gz"))
    assert len(wheels) == 1 and len(sdists) == 1, list((tmp / "dist").iterdir())
    return {"wheel": wheels[0], "sdist": sdists[0]}


#: versions for the stub distributions of senslab's other dependencies
_OTHER_DEPS = {"numpy": "2.1.0", "scikit-learn": "1.5.0", "scipy": "1.14.0",
               "tokenizers": "0.20.0", "matplotlib": "3.9.0", "safetensors": "0.4.5",
               "filelock": "3.16.0", "tqdm": "4.66.0"}


def _stub_env(tmp_path: Path, torch_version: str) -> tuple[Path, Path]:
    python, site = _venv(tmp_path / "env")
    _stub_distribution(site, "torch", torch_version)
    for name, version in _OTHER_DEPS.items():
        _stub_distribution(site, name, version)
    return python, site


def test_pip_keeps_an_installed_torch_of_another_version(built, tmp_path):
    """An environment with (the metadata of) a CUDA-era torch 2.5.1: pip's plan for
    ``pip install senslab`` installs senslab alone, and after the install torch is still 2.5.1."""
    python, _ = _stub_env(tmp_path, "2.5.1")
    deps = {Requirement(r).name for r in _pyproject()["project"]["dependencies"]}
    assert deps == {"torch", *_OTHER_DEPS}, "keep _OTHER_DEPS in step with pyproject.toml"

    report = tmp_path / "report.json"
    _pip(python, "--dry-run", "--quiet", "--report", str(report), str(built["wheel"]))
    planned = {item["metadata"]["name"] for item in json.loads(report.read_text())["install"]}
    assert planned == {"senslab"}, f"pip would install {planned}"

    _pip(python, "--quiet", str(built["wheel"]))
    versions = subprocess.run(
        [str(python), "-c", "import importlib.metadata as m; "
         "print(m.version('torch'), m.version('senslab'))"],
        capture_output=True, text=True, check=True, env=_offline_env()).stdout.split()
    assert versions == ["2.5.1", "0.1.0"]


def test_pip_refuses_a_torch_below_the_floor(built, tmp_path):
    """torch 2.0.1 (< the floor) must be replaced, not silently kept: offline, pip has no
    candidate and fails on torch."""
    python, _ = _stub_env(tmp_path, "2.0.1")
    proc = _pip(python, "--dry-run", "--quiet", str(built["wheel"]), check=False)
    assert proc.returncode != 0
    assert f"torch>={_documented_floor()}" in proc.stderr, proc.stderr


def _readme_example() -> str:
    """The README's "Measure your own model in three lines" code block."""
    text = (ROOT / "README.md").read_text()
    section = text.split("## Measure your own model in three lines", 1)[1]
    block = re.search(r"```python\n(.*?)```", section, re.DOTALL)
    assert block, "README: no python block under 'Measure your own model in three lines'"
    return block.group(1)


def _exposed_site_packages(tmp_path: Path) -> Path:
    """This environment's site-packages (real torch, numpy, ...) minus senslab itself, as a
    folder of links: a fresh environment sees the dependencies but not the editable checkout."""
    here = Path(sysconfig.get_paths()["purelib"])
    exposed = tmp_path / "deps"
    exposed.mkdir()
    for entry in here.iterdir():
        name = entry.name.lower()
        if name.startswith(("senslab", "__editable__", "__pycache__")) or name.endswith(".pth"):
            continue
        (exposed / entry.name).symlink_to(entry)
    return exposed


@pytest.mark.parametrize("kind", ["wheel", "sdist"])
@pytest.mark.heavy
def test_built_package_installs_and_runs_the_readme_example(built, tmp_path, kind):
    """The wheel (and the sdist, built on install) installs into a fresh environment whose
    dependencies are already there, and the README's three-line example runs from it."""
    python, site = _venv(tmp_path / "env")
    (site / "deps.pth").write_text(f"{_exposed_site_packages(tmp_path)}\n")
    args = ["--no-build-isolation"] if kind == "sdist" else []
    t0 = time.perf_counter()
    _pip(python, "--quiet", *args, str(built[kind]))
    print(f"install {kind}: {time.perf_counter() - t0:.1f} s")

    script = "\n".join([
        "import torch, senslab",
        "torch.manual_seed(0)",
        "model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(64, 3)).eval()",
        "images = torch.randn(32, 1, 8, 8)",
        _readme_example(),
        "print('SENSLAB_FILE', senslab.__file__)",
        "print('TORCH', torch.__version__)",
    ])
    t0 = time.perf_counter()
    proc = subprocess.run([str(python), "-c", script], capture_output=True, text=True,
                          cwd=tmp_path, env=_offline_env(), timeout=300)
    print(f"README example: {time.perf_counter() - t0:.1f} s")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "sensitivity" in proc.stdout, proc.stdout
    where = re.search(r"^SENSLAB_FILE (.*)$", proc.stdout, re.MULTILINE).group(1)
    assert Path(where).is_relative_to(site), f"imported {where}, not the installed {kind}"
    assert f"TORCH {metadata.version('torch')}" in proc.stdout
