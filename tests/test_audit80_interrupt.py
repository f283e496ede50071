"""Interrupts, audited (session 80): what a Ctrl-C or a batch scheduler's SIGTERM leaves behind.

Guards of guarantees that held when audited but had no test of their own: a real SIGINT in the
middle of ``TokenSensitivity.update`` leaves the metric as it was before that update (nothing
half-added), and SIGTERM — what ``timeout``, Slurm and Kubernetes send, for which senslab
installs no handler — ends ``senslab train`` as SIGKILL does: the directory stays consistent,
its lock is free, and the same command resumes from the newest checkpoint to the numbers of a
run never interrupted.
"""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

import cliproc
import pytest
import torch
from torch import nn

from senslab.measure import TokenSensitivity
from senslab.tokens import Patches
from senslab.train.rundir import RunDir, checkpoint_step

ENV = {k: v for k, v in os.environ.items() if k != "SENSLAB_DEBUG"} | {"OMP_NUM_THREADS": "1"}


def _metric(model: nn.Module) -> TokenSensitivity:
    return TokenSensitivity(model, Patches(4), sigma=1.0, generator=0, repeats=16,
                            precision="float32", chunk_size=64)


def test_a_ctrl_c_mid_update_leaves_the_metric_as_it_was() -> None:
    """SIGINT delivered while the second batch's copies run (at the 1st, 2nd, … forward of that
    update): the update raises KeyboardInterrupt, and the metric computes the first batch's
    number alone; the batch added again afterwards is counted once (its noise is drawn anew: the
    random stream may have moved on, as ``update`` says)."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Flatten(), nn.Linear(3 * 8 * 8, 32), nn.ReLU(),
                          nn.Linear(32, 10)).eval()
    x1, x2 = (torch.randn(16, 3, 8, 8, generator=torch.Generator().manual_seed(s))
              for s in (1, 2))
    one = _metric(model)
    one.update(x1)
    first = one.compute()
    both = _metric(model)
    both.update(x1)
    both.update(x2)
    whole = both.compute()
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        for at in (1, 3):
            m = _metric(model)
            m.update(x1)
            calls = [0]

            def ctrl_c(module: nn.Module, args: object, at: int = at,
                       calls: list[int] = calls) -> None:
                calls[0] += 1
                if calls[0] == at:
                    os.kill(os.getpid(), signal.SIGINT)

            handle = model[1].register_forward_pre_hook(ctrl_c)
            try:
                with pytest.raises(KeyboardInterrupt):
                    m.update(x2)
            finally:
                handle.remove()
            got = m.compute()
            assert (got.estimate, got.num_examples, got.num_forward) == (
                first.estimate, first.num_examples, first.num_forward), at
            m.update(x2)
            again = m.compute()
            assert (again.num_examples, again.num_forward) == (
                whole.num_examples, whole.num_forward), at
    finally:
        signal.signal(signal.SIGINT, previous)


def _train(out: Path) -> list[str]:
    return ["train", "--model", "mlp", "--data", "digits", "--out", str(out), "--threads", "1",
            "--set", "train.epochs=12", "--set", "train.batch_size=20",
            "--set", "track.num_examples=32"]


def _records(run: Path) -> list[dict[str, object]]:
    return [{k: v for k, v in json.loads(line).items() if k != "time"}
            for line in (run / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.heavy  # three real processes, seconds each
def test_sigterm_mid_training_leaves_a_run_the_same_command_resumes_exactly(
        tmp_path: Path) -> None:
    ref = tmp_path / "ref"
    done = cliproc.run(_train(ref), cwd=tmp_path, env=ENV, timeout=300)
    assert done.returncode == 0, done.stderr

    run = tmp_path / "run"
    proc = cliproc.start(_train(run), cwd=tmp_path, env=ENV, stdout=cliproc.PIPE,
                         stderr=cliproc.PIPE)
    deadline = time.monotonic() + 120
    while not RunDir(run).checkpoints():
        assert proc.poll() is None, "the run ended before its first checkpoint"
        assert time.monotonic() < deadline, "no checkpoint within 120 s"
        time.sleep(0.005)
    proc.send_signal(signal.SIGTERM)
    proc.communicate(timeout=120)
    assert proc.returncode == -signal.SIGTERM  # ended by the signal, as SIGKILL ends it
    assert not (run / "summary.json").exists(), "the run finished before the SIGTERM"
    saved = RunDir(run).checkpoints()
    assert saved and not list(run.rglob(".*.tmp-*"))
    resumes = checkpoint_step(saved[-1])
    for p in saved:  # every checkpoint on disk verifies
        RunDir.load_checkpoint(p)

    again = cliproc.run(_train(run), cwd=tmp_path, env=ENV, timeout=300)
    assert again.returncode == 0, again.stderr  # the lock went with the terminated process
    assert f"resuming {run} from step {resumes} " in again.stderr
    assert _records(run) == _records(ref)
