"""Resume is exact: a run stopped after any checkpoint and trained again gives, bit for bit, the
metrics.jsonl rows, final weights and summary.json of a run that was never stopped — with a
learning-rate schedule, Adam's state, the noise regularizer's generator, dropout (the global
RNG), step-wise tracking, mid-epoch checkpoints and a training subset — and a Ctrl-C that one
sitting swallowed does not stop every later one.

The stop is a crash just before a checkpoint is written: the run directory of a finished run
with its summary and every later checkpoint removed, so metrics.jsonl still holds the rows
logged after the checkpoint resumed from (a resume must redo them, not keep them twice)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import threading
import warnings
import weakref
from pathlib import Path
from typing import Any

import pytest
import torch

from senslab.train import track
from senslab.train.config import RunConfig, apply_overrides
from senslab.train.loop import TrainingInterrupted, fit
from senslab.train.rundir import RunDir, checkpoint_step

BASE = ["data.name=digits", "device=cpu", "train.batch_size=128", "train.epochs=3",
        "train.keep_checkpoints=0", "optim.lr=0.05", "track.num_examples=32",
        "track.eval_examples=64", "seed=3"]
MLP = ["model.name=mlp", "model.overrides.widths=[16]", "model.overrides.image_size=8",
       "model.overrides.sens_patch=2"]
# dropout 0.1 (the model's default) draws from the global RNG at every training step
VIT = ["model.name=vit_small", "model.overrides.patch_size=4", "model.overrides.depth=1",
       "model.overrides.dim=8", "model.overrides.heads=1", "model.overrides.dim_head=8",
       "model.overrides.mlp_dim=8"]


def config(extra: list[str]) -> RunConfig:
    model = [] if any(e.startswith("model.name=") for e in extra) else MLP
    return apply_overrides(RunConfig(name="exact"), BASE + model + extra)


def train(cfg: RunConfig, path: Path) -> dict[str, Any]:
    with warnings.catch_warnings():  # the few-flips note of a 32-example measurement
        warnings.simplefilter("ignore", RuntimeWarning)
        return fit(cfg, path, progress=False)


def outcome(path: Path) -> tuple[list[dict[str, Any]], dict[str, Any], dict[str, torch.Tensor]]:
    """The rows (without their wall-clock times), the summary (likewise) and the final weights."""
    rd = RunDir(path)
    rows = [{k: v for k, v in r.items() if k != "time"} for r in rd.metrics()]
    summary = {k: v for k, v in rd.read_json("summary.json").items() if k != "seconds"}
    summary["final"] = {k: v for k, v in summary["final"].items() if k != "time"}
    return rows, summary, RunDir.load_checkpoint(rd.checkpoints()[-1])["model"]


def assert_same(a: Path, b: Path) -> None:
    rows_a, summary_a, weights_a = outcome(a)
    rows_b, summary_b, weights_b = outcome(b)
    assert [r["step"] for r in rows_b] == [r["step"] for r in rows_a]  # none twice, none lost
    assert rows_b == rows_a
    assert summary_b == summary_a
    assert weights_b.keys() == weights_a.keys()
    assert all(torch.equal(weights_a[k], weights_b[k]) for k in weights_a)


def crash_after(ref: Path, run: Path, step: int) -> None:
    """``run``: ``ref`` as a crash just after its checkpoint at ``step`` would have left it."""
    shutil.copytree(ref, run)
    (run / "summary.json").unlink()
    later = [p for p in RunDir(run).checkpoints() if checkpoint_step(p) > step]
    assert later, "nothing after the checkpoint to redo"
    for p in later:
        p.unlink()
    assert RunDir(run).metrics()[-1]["step"] > step  # rows the resume must redo


@pytest.mark.parametrize("extra", [
    ["optim.schedule=step", "optim.step_epochs=1", "optim.gamma=0.3"],
    ["optim.schedule=cosine", "optim.momentum=0.9"],
    ["optim.name=adamw", "optim.lr=0.01", "optim.weight_decay=0.1"],
    ["train.regularizer=noise", "train.reg_sigma=0.5", "data.train_subset=700"],
    ["track.unit=step", "track.every=5", "train.checkpoint_every=4"],
    VIT,
], ids=["step-lr", "cosine-momentum", "adamw", "noise-subset", "step-tracking", "dropout"])
def test_a_run_resumed_after_a_crash_equals_the_uninterrupted_run(
        tmp_path: Path, extra: list[str]) -> None:
    ref = tmp_path / "ref"
    train(config(extra), ref)
    steps = [checkpoint_step(p) for p in RunDir(ref).checkpoints()]
    for at in (steps[0], steps[len(steps) // 2]):  # the first epoch's end; mid-run
        run = tmp_path / f"from-{at}"
        crash_after(ref, run, at)
        train(config(extra), run)
        assert_same(ref, run)


def test_a_damaged_newest_checkpoint_is_skipped_and_the_resume_still_exact(
        tmp_path: Path) -> None:
    ref, run = tmp_path / "ref", tmp_path / "run"
    train(config([]), ref)
    shutil.copytree(ref, run)
    (run / "summary.json").unlink()
    newest = RunDir(run).checkpoints()[-1]
    newest.write_bytes(newest.read_bytes()[: newest.stat().st_size // 2])  # cut mid-write
    with pytest.warns(UserWarning, match="does not match its checksum"):
        train(config([]), run)
    assert_same(ref, run)


def ctrl_c_in_a_finalizer() -> None:
    """A SIGINT that lands while a weakref finalizer runs (the tracked sensitivity's memory
    bookkeeping has them): Python would swallow its KeyboardInterrupt, so the run records it."""
    os.kill(os.getpid(), signal.SIGINT)
    for _ in range(10_000):  # the handler runs here, inside the finalizer
        pass


def resume_to_the_end(run: Path) -> None:
    """Train ``run`` again, with no Ctrl-C; a TrainingInterrupted (a KeyboardInterrupt, which
    would end the whole pytest session) is this test's failure."""
    try:
        train(config([]), run)
    except TrainingInterrupted as err:
        pytest.fail(f"the resume stopped without a Ctrl-C: {err}")


def test_a_ctrl_c_swallowed_before_a_checkpoint_does_not_stop_every_resume(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A Ctrl-C swallowed during the evaluation at an epoch's end was saved in that epoch's
    checkpoint (its position's ``interrupted``): every re-run restored it and stopped after one
    step ("interrupted at step 13 ... resumes from the checkpoint at step 12"), so the run
    could never be finished."""
    if threading.current_thread() is not threading.main_thread():
        pytest.skip("signal handlers are installed from the main thread only")
    ref, run = tmp_path / "ref", tmp_path / "run"
    train(config([]), ref)
    real, calls = track.Tracker.measure, []

    def measure(self: track.Tracker, loss_kind: str) -> dict[str, Any]:
        record = real(self, loss_kind)
        calls.append(1)
        if len(calls) == 2:  # as the evaluation at the end of epoch 1 ends, before its
            dying = type("Dying", (), {})()  # checkpoint (the measurement's own objects die)
            weakref.finalize(dying, ctrl_c_in_a_finalizer)
            del dying
        return record

    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        with monkeypatch.context() as m:
            m.setattr(track.Tracker, "measure", measure)
            with pytest.raises(TrainingInterrupted) as err:
                train(config([]), run)
    finally:
        signal.signal(signal.SIGINT, previous)
    first = checkpoint_step(RunDir(run).checkpoints()[-1])
    assert err.value.checkpoint == first == 12  # 1438 digits / 128 → 12 steps an epoch
    resume_to_the_end(run)
    assert_same(ref, run)


def test_a_checkpoint_that_recorded_a_ctrl_c_resumes(tmp_path: Path) -> None:
    """A checkpoint written before the fix holds ``interrupted: true`` in its position: the
    resume reads where the loop was from it, not the old sitting's Ctrl-C."""
    ref, run = tmp_path / "ref", tmp_path / "run"
    train(config([]), ref)
    crash_after(ref, run, 12)
    rd = RunDir(run)
    path = rd.checkpoints()[-1]
    state = RunDir.load_checkpoint(path)
    state["position"]["interrupted"] = True
    rd.truncate_metrics(12)  # as they were when it was saved
    rd.save_checkpoint(state, 12, keep=0)
    resume_to_the_end(run)
    assert_same(ref, run)


def test_a_resume_on_another_thread_count_says_its_numbers_may_differ(tmp_path: Path) -> None:
    """Same seed, same numbers holds on one setup: a sitting on another thread count rounds
    its reductions otherwise, and training amplifies it. The resume says so; on the same
    setup it says nothing (and stays exact)."""
    ref = tmp_path / "ref"
    train(config([]), ref)
    at = checkpoint_step(RunDir(ref).checkpoints()[0])
    for other in (False, True):
        run = tmp_path / f"other-{other}"
        crash_after(ref, run, at)
        if other:  # the earlier sitting, as recorded, ran on one more thread than this one
            env = json.loads((run / "env.json").read_text())
            env["threads"] = torch.get_num_threads() + 1
            (run / "env.json").write_text(json.dumps(env))
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            fit(config([]), run, progress=False)
        said = [str(w.message) for w in caught if "another setup" in str(w.message)]
        if other:
            assert len(said) == 1, said
            assert (f"at step {at} on another setup than the sitting before (threads "
                    f"{torch.get_num_threads() + 1} → {torch.get_num_threads()})") in said[0]
        else:
            assert said == []
            assert_same(ref, run)
