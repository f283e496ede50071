"""``tests/cliproc.py``, the fork server the CLI tests start commands from: a forked command
behaves as ``python -m senslab.cli`` does — exit status, stdout and stderr, working directory,
environment, signals."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import cliproc
import pytest

ENV = {k: v for k, v in os.environ.items() if k != "SENSLAB_DEBUG"} | {"OMP_NUM_THREADS": "1"}


def interpreter(args: list[str], cwd: Path, env: dict[str, str]
                ) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "senslab.cli", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=120)


@pytest.mark.heavy
def test_a_forked_command_answers_as_the_interpreter(tmp_path):
    args = ["list", "models", "--threads", "0"]  # a usage error: exit 2, one line on stderr
    real = subprocess.run([sys.executable, "-m", "senslab.cli", *args], cwd=tmp_path, env=ENV,
                          capture_output=True, text=True, timeout=120)
    forked = cliproc.run(args, cwd=tmp_path, env=ENV)
    assert real.returncode == 2 and forked.returncode == real.returncode
    assert (forked.stdout, forked.stderr) == (real.stdout, real.stderr)
    assert real.stderr.startswith("senslab: error: --threads")


def test_a_forked_command_runs_in_the_environment_given(tmp_path):
    # SENSLAB_DEBUG lets the error through with its traceback (as the interpreter's, in
    # tests/badinput/test_cli_failures.py::test_senslab_debug_shows_the_traceback)
    done = cliproc.run(["measure", "--set", "optim.lrr=1"], cwd=tmp_path,
                       env=ENV | {"SENSLAB_DEBUG": "1"})
    assert done.returncode != 0 and "Traceback" in done.stderr and "optim.lrr" in done.stderr
    assert "Traceback" not in cliproc.run(["measure", "--set", "optim.lrr=1"], cwd=tmp_path,
                                          env=ENV).stderr


def test_a_forked_command_writes_where_it_runs_and_prints_its_result(tmp_path):
    done = cliproc.run(["list", "datasets"], cwd=tmp_path, env=ENV)
    assert done.returncode == 0 and "digits" in done.stdout.split() and done.stderr == ""
    (tmp_path / "afile").write_text("")  # a relative --out is read in the command's cwd
    under = cliproc.run(["run", "demo", "--out", "afile/sub"], cwd=tmp_path, env=ENV)
    assert under.returncode == 2 and "afile is a file, not a directory" in under.stderr
    # output to files, the working directory's relative paths
    with open(tmp_path / "out", "w") as out, open(tmp_path / "err", "w") as err:
        proc = cliproc.start(["list", "models", "--threads", "0"], cwd=tmp_path, env=ENV,
                             stdout=out, stderr=err)
    assert proc.wait(60) == 2
    assert (tmp_path / "err").read_text().startswith("senslab: error: --threads")


@pytest.mark.heavy
def test_signals_reach_the_command_and_its_status_says_so(tmp_path):
    args = ["train", "--model", "mlp", "--data", "digits", "--set", "train.epochs=300",
            "--threads", "1", "--out", str(tmp_path / "run")]
    proc = cliproc.start(args, cwd=tmp_path, env=ENV, stdout=cliproc.PIPE, stderr=cliproc.PIPE)
    assert proc.poll() is None and proc.pid != os.getpid()
    deadline = time.monotonic() + 60
    while not (tmp_path / "run" / "metrics.jsonl").exists():
        assert proc.poll() is None and time.monotonic() < deadline
        time.sleep(0.05)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(60)
    assert proc.returncode == 130 and "interrupted at step" in err
    again = cliproc.start(args, cwd=tmp_path, env=ENV, stdout=cliproc.PIPE, stderr=cliproc.PIPE)
    time.sleep(0.5)
    again.kill()
    assert again.wait(60) == -signal.SIGKILL
    with pytest.raises(subprocess.TimeoutExpired):
        cliproc.run(args, cwd=tmp_path, env=ENV, timeout=0.5)
