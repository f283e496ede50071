"""Ctrl-C during a run of any trainer, not only ``fit``: the interruption says at which step and
that re-running resumes (from which checkpoint), and the re-run does resume from it.

A real SIGINT, sent to a process training the trainer's example once it has written a checkpoint
after step 0 (as ``test_sigkill_then_resume_is_bit_identical`` kills one); and, for the command a
user types, ``senslab run`` of a Hahn & Rofin experiment (the ``boolean`` trainer) interrupted
and run again."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import cliproc
import pytest
import torch

from senslab.train.rundir import RunDir, checkpoint_step
from senslab.train.trainers import get_trainer, list_trainers, train_run

ENV = {k: v for k, v in os.environ.items() if k != "SENSLAB_DEBUG"} | {"OMP_NUM_THREADS": "1"}

# the child trains the trainer's example and reports the KeyboardInterrupt that ends it
_CHILD = """
import json
import sys
import torch
from senslab.train.trainers import get_trainer, train_run
torch.set_num_threads(int(sys.argv[3]))
name = sys.argv[1]
try:
    train_run(name, get_trainer(name).example(), sys.argv[2], progress=False, log=lambda _: None)
except KeyboardInterrupt as err:
    print(json.dumps({"type": type(err).__name__, "step": getattr(err, "step", None),
                      "checkpoint": getattr(err, "checkpoint", None), "message": str(err)}))
    sys.exit(130)
"""


def _newest_step(path: Path) -> int:
    found = RunDir(path).checkpoints()
    return checkpoint_step(found[-1]) if found else -1


@pytest.mark.heavy  # real processes, seconds each
@pytest.mark.parametrize("name", [n for n in list_trainers() if n != "fit"])
def test_ctrl_c_says_where_and_the_rerun_resumes_there(
        tmp_path: Path, name: str, capfd: pytest.CaptureFixture[str]) -> None:
    """Every trainer but ``fit`` (whose own tests are in tests/badinput/test_rundir_faults.py)
    ended a Ctrl-C with a bare KeyboardInterrupt: ``senslab`` printed "interrupted" alone."""
    run = tmp_path / "run"
    proc = subprocess.Popen([sys.executable, "-c", _CHILD, name, str(run),
                             str(torch.get_num_threads())], stdout=subprocess.PIPE, text=True,
                            env=ENV)
    deadline = time.time() + 120
    while time.time() < deadline and _newest_step(run) <= 0 and proc.poll() is None:
        time.sleep(0.005)
    proc.send_signal(signal.SIGINT)
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 130, f"{name}'s example ended otherwise than interrupted: {out}"
    got = json.loads(out)
    resumes = _newest_step(run)
    assert resumes > 0 and not (run / "summary.json").exists()
    assert got["type"] == "TrainingInterrupted", got
    assert got["checkpoint"] == resumes and got["step"] >= resumes, got
    assert re.fullmatch(
        rf"interrupted (at step|in epoch \d+, after step) {got['step']}; re-run the same command "
        rf"to resume \(it resumes from the checkpoint at step {resumes}\)", got["message"]), got
    assert not (run / ".senslab.owner").exists()  # the lock is released
    # and the claim holds: the same training again resumes from that checkpoint
    capfd.readouterr()
    train_run(name, get_trainer(name).example(), run, progress=False, log=lambda _: None)
    assert f"resuming {run} from step {resumes} " in capfd.readouterr().err
    assert (run / "summary.json").exists()


@pytest.mark.heavy  # real processes, seconds each
def test_senslab_run_interrupted_says_where_and_the_same_command_resumes(tmp_path: Path) -> None:
    """``senslab run`` of an experiment whose runs the ``boolean`` trainer trains, Ctrl-C once
    it has written a checkpoint: one line naming the step and the checkpoint; the same command
    again resumes the run from that checkpoint and finishes it."""
    out = tmp_path / "exp"
    run = out / "parity-n3-s0"
    args = ["run", "hr_sharpness_vs_length", "--out", str(out), "--threads", "1"] + [
        f"--set={s}" for s in ("dim=8", "steps=600", "eval_every=20", "batch=32",
                               "eval_size=32", "sharp_draws=2", "n_values=[3]", "seeds=1",
                               "functions=['parity']")]
    proc = cliproc.start(args, cwd=tmp_path, env=ENV, stdout=cliproc.PIPE, stderr=cliproc.PIPE)
    deadline = time.monotonic() + 120
    while _newest_step(run) <= 0:
        assert proc.poll() is None, "the run ended before it could be interrupted"
        assert time.monotonic() < deadline, "the run wrote no checkpoint"
        time.sleep(0.005)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err
    resumes = _newest_step(run)
    said = re.search(r"senslab: error: interrupted at step (\d+); re-run the same command to "
                     rf"resume \(it resumes from the checkpoint at step {resumes}\)", err)
    assert said and int(said[1]) >= resumes > 0, err
    again = cliproc.run(args, cwd=tmp_path, env=ENV, timeout=300)
    assert again.returncode == 0, again.stderr
    assert f"resuming {run} from step {resumes} " in again.stderr
    assert json.loads((out / "verdict.json").read_text())["verdict"]
