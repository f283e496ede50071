"""Training under torchrun (DDP, gloo, two CPU processes — also on a GPU machine) matches one
process."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torchrun import assert_ddp_equals_one_process, torchrun_fit

from senslab.train.config import RunConfig, apply_overrides
from senslab.train.loop import fit, rank_device
from senslab.train.rundir import RunDir

ARGS = ["model.name=mlp", "data.name=digits", "model.overrides.widths=[32]",
        "model.overrides.sens_patch=2", "train.epochs=2", "train.batch_size=16", "optim.lr=0.1",
        "optim.momentum=0.9", "track.num_examples=64", "device=cpu", "train.max_steps=20"]


@pytest.mark.heavy
def test_uneven_shares_of_a_batch_weigh_as_in_one_process(tmp_path: Path):
    """A batch of 15 on 2 ranks (8 + 7 examples): DDP's equal-weight average of the ranks'
    mean losses once weighed the 7 more than the 8 (2e-3 off one process); each rank's loss is
    now scaled by its share, and the weights agree as for even batches."""
    args = [a for a in ARGS if not a.startswith("train.batch_size")] + ["train.batch_size=15"]
    assert_ddp_equals_one_process(tmp_path, args)


@pytest.mark.heavy
def test_each_rank_draws_its_own_regularizer_noise(tmp_path: Path):
    """With the sensitivity regularizer, every rank's noise stream is its own (one seed gave
    every rank's row i the same patch and noise), rank 0's is the single process's, and the
    checkpoint keeps every rank's so that a resume continues each."""
    args = [*ARGS, "train.regularizer=patch_mse", "train.max_steps=4"]
    torchrun_fit(tmp_path, tmp_path / "ddp", [a for a in args if a != "train.max_steps=20"])
    state = RunDir.load_checkpoint(RunDir(tmp_path / "ddp").checkpoints()[-1])
    regs = state["reg_rngs"]
    assert len(regs) == 2 and not torch.equal(regs[0], regs[1])
    assert torch.equal(regs[0], state["reg_rng"])


@pytest.mark.heavy
def test_two_process_ddp_training_matches_one_process(tmp_path: Path):
    # one thread on every side (torchrun's default for its workers). Two half-batch gradients
    # averaged differ from one full-batch gradient by float rounding, which momentum SGD
    # amplifies step by step (past 1e-5 within 2 epochs on some CPUs): 20 steps keep that far
    # below the tolerance, while a wrong reduction (a sum, one rank's gradient) is far above it
    torchrun_fit(tmp_path, tmp_path / "ddp", list(ARGS))

    torch.set_num_threads(1)  # restored after the test (conftest)
    fit(apply_overrides(RunConfig(name="ddp"), list(ARGS)), tmp_path / "single", progress=False)
    ddp, single = RunDir(tmp_path / "ddp"), RunDir(tmp_path / "single")
    # only rank 0 wrote: one line per evaluation, no duplicates
    assert [r["step"] for r in ddp.metrics()] == [r["step"] for r in single.metrics()]
    assert ddp.read_json("env.json")["world_size"] == 2
    a = RunDir.load_checkpoint(ddp.checkpoints()[-1])["model"]
    b = RunDir.load_checkpoint(single.checkpoints()[-1])["model"]
    # equal halves of every batch: the averaged gradient is the full-batch gradient
    assert all(torch.allclose(a[k], b[k], atol=1e-5) for k in a)
    last_ddp, last_single = ddp.metrics()[-1], single.metrics()[-1]
    assert abs(last_ddp["train/acc"] - last_single["train/acc"]) < 0.01
    assert abs(last_ddp["sens/train"] - last_single["sens/train"]) < 0.05


def test_more_ranks_than_gpus_is_a_clear_error(monkeypatch):
    monkeypatch.setenv("LOCAL_RANK", str(torch.cuda.device_count()))
    with pytest.raises(RuntimeError, match="--nproc_per_node=.*or set device=cpu"):
        rank_device(torch.device("cuda"), 2)
    assert rank_device(torch.device("cpu"), 2) == torch.device("cpu")  # gloo on CPUs: any rank


@pytest.mark.heavy
def test_sps_under_ddp_steps_on_the_batch_loss_as_one_process(tmp_path: Path):
    """SPS sets its step size from the loss: each rank's own half-batch loss gave each rank
    another step on the same averaged gradient, and the ranks' models drifted apart (rank 0's
    checkpoint then was one of two models). The ranks now read the whole batch's loss, so
    training matches one process."""
    args = [a for a in ARGS if not a.startswith(("optim.momentum", "optim.lr"))]
    args += ["optim.name=sps", "optim.eta_max=2", "train.max_steps=8"]
    args = [a for a in args if a != "train.max_steps=20"]
    assert_ddp_equals_one_process(tmp_path, args)
