"""``python -m senslab`` runs the ``senslab`` command (it failed: "No module named
senslab.__main__"), with its exit status."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

SRC = str(Path(__file__).resolve().parents[1] / "src")


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": SRC + os.pathsep + os.environ.get("PYTHONPATH", "")}
    return subprocess.run([sys.executable, "-m", "senslab", *args], capture_output=True,
                          text=True, env=env, timeout=120)


def test_python_m_senslab_is_the_command() -> None:
    done = _run("--help")
    assert done.returncode == 0, done.stderr
    assert "usage: senslab" in done.stdout and "reproduction" in done.stdout


def test_python_m_senslab_keeps_the_exit_status() -> None:
    done = _run("run", "no_such_experiment")
    assert done.returncode == 2 and "no_such_experiment" in done.stderr
