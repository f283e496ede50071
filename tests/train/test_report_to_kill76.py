"""A W&B run survives a killed sitting (audit of session 76): ``wandb.json`` marked a step sent as
soon as W&B was handed its row, and W&B buffers rows (in its own process too), so a run killed
at step 40 lost steps 0–40 from W&B for good: the resumed sitting skipped them as sent. The
marker now moves when a sitting's W&B run has finished, and a killed sitting's records are sent
again."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from senslab.train.config import RunConfig, apply_overrides
from senslab.train.loop import fit

from .test_report_to import _wandb_history

ARGS = ["model.name=mlp", "data.name=digits", "model.overrides.widths=[16]",
        "train.batch_size=32", "train.epochs=6", "optim.lr=0.05", "track.num_examples=16",
        "track.eval_examples=64", "track.unit=step", "track.every=10",
        "train.checkpoint_every=25", "device=cpu", "track.report_to=wandb"]
CHILD = """
import sys, torch
torch.set_num_threads(1)
from senslab.train.config import RunConfig, apply_overrides
from senslab.train.loop import fit
fit(apply_overrides(RunConfig(name="w"), sys.argv[2:]), sys.argv[1], progress=False)
"""


def _steps(run: Path) -> list[int]:
    path = run / "metrics.jsonl"
    if not path.exists():
        return []
    return [json.loads(line)["step"] for line in path.read_text().splitlines()
            if line.endswith("}")]


@pytest.mark.heavy
def test_steps_handed_to_wandb_before_a_kill_reach_it_after_the_resume(tmp_path, monkeypatch):
    pytest.importorskip("wandb")
    env = {"WANDB_MODE": "offline", "WANDB_SILENT": "true",
           "WANDB_CONFIG_DIR": str(tmp_path / "wc"), "WANDB_CACHE_DIR": str(tmp_path / "wk"),
           "WANDB_DATA_DIR": str(tmp_path / "wd")}
    for var, value in env.items():
        monkeypatch.setenv(var, value)
    run = tmp_path / "run"
    # its own W&B service: one this process started for an earlier test (WANDB_SERVICE, which
    # children inherit) would outlive the kill and hold the run
    child_env = {k: v for k, v in os.environ.items() if k != "WANDB_SERVICE"}
    proc = subprocess.Popen([sys.executable, "-c", CHILD, str(run), *ARGS],
                            env={**child_env, "OMP_NUM_THREADS": "1"})
    deadline = time.time() + 120
    while time.time() < deadline and (not _steps(run) or _steps(run)[-1] < 40):
        time.sleep(0.01)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    assert proc.returncode == -signal.SIGKILL
    assert not (run / "summary.json").exists(), "the child finished before it was killed"
    handed = _steps(run)
    assert handed[-1] >= 40
    # nothing of the killed sitting counts as held by W&B
    assert json.loads((run / "wandb.json").read_text())["step"] == -1

    fit(apply_overrides(RunConfig(name="w"), ARGS), run, progress=False)
    steps = _steps(run)
    assert set(handed) <= set(steps)
    assert sorted({s for s, _ in _wandb_history(run)}) == steps
    assert json.loads((run / "wandb.json").read_text())["step"] == steps[-1]



def test_a_run_wandb_holds_is_refused_naming_why(tmp_path, monkeypatch):
    """W&B's "run ID … is in use" — a killed sitting's run held by a service a parent process
    started (WANDB_SERVICE, inherited; seen under pytest-xdist, not reproducible on demand, so
    W&B's refusal is raised here by its own exception type) — is said as such, not as W&B's
    settings to fix."""
    wandb = pytest.importorskip("wandb")
    from wandb.sdk.mailbox.mailbox_handle import ServerResponseError

    from senslab.train.report_to import Wandb
    from senslab.train.rundir import RunDir

    def held(**kwargs):
        raise ServerResponseError(f"run ID {kwargs['id']} is in use")

    monkeypatch.setattr(wandb, "init", held)
    monkeypatch.setenv("WANDB_SERVICE", "3-1-unix-/tmp/socket")
    rd = RunDir(tmp_path / "run")
    rd.path.mkdir(parents=True)
    (rd.path / "wandb.json").write_text(json.dumps({"id": "abc", "step": -1}))
    with pytest.raises(RuntimeError, match=r"W&B still holds the run abc .*WANDB_SERVICE"):
        Wandb(rd, {}, "w", [{"step": 0, "train/loss": 1.0}])
