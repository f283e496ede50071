"""Audit 80, area ``loops``: a model whose output columns cannot score the data's labels is
refused before training (a one-column model on digits trained BCE against labels up to 9 to a
negative train/loss and a 10-class train/acc); under torchrun a batch smaller than the world
(a short last batch) no longer stops the run as diverged; and every rank evaluates the model
that rank 0 checkpoints (BatchNorm's running statistics)."""

from __future__ import annotations

import warnings
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torchrun import assert_ddp_equals_one_process, torchrun_fit

from senslab.train.config import RunConfig, apply_overrides
from senslab.train.loop import build_model, evaluate, fit, load_data, rank_rows
from senslab.train.rundir import RunDir

TINY = ["data.name=digits", "device=cpu", "train.batch_size=128", "train.epochs=1",
        "model.name=mlp", "model.overrides.widths=[8]", "model.overrides.image_size=8",
        "model.overrides.sens_patch=2", "track.sigma=0", "seed=3", "optim.lr=0.001"]


def run(path: Path, extra: list[str]) -> dict:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return fit(apply_overrides(RunConfig(name="t"), TINY + extra), path, progress=False)


# -- output columns against the labels -----------------------------------------------------------
@pytest.mark.parametrize("loss", ["auto", "bce", "mse"])
def test_a_one_column_model_on_ten_classes_is_refused(tmp_path: Path, loss: str) -> None:
    """Trained before: train/loss -1.86 (BCE against labels up to 9) or 16.2 (MSE), train/acc
    0.10, in metrics.jsonl and summary.json without a word."""
    with pytest.raises(ValueError, match=r"mlp returns one output column .* digits has 10 "
                                         r"classes .*model.overrides.num_classes=10"):
        run(tmp_path / "r", ["model.overrides.num_classes=1", f"train.loss={loss}"])
    assert not RunDir(tmp_path / "r").checkpoints()


def test_fewer_columns_than_classes_is_refused_naming_the_count(tmp_path: Path) -> None:
    """Was torch's IndexError ("Target 9 is out of bounds") at the first evaluation, a
    device-side assert on CUDA."""
    with pytest.raises(ValueError, match=r"mlp returns 5 output columns .* labels up to 9 "
                                         r"\(10 classes\): set model.overrides.num_classes=10"):
        run(tmp_path / "r", ["model.overrides.num_classes=5"])


def test_cross_entropy_on_one_column_is_refused(tmp_path: Path) -> None:
    cfg = apply_overrides(RunConfig(name="t"), [
        "model.name=attention_model", "data.name=maxmargin_attention", "device=cpu",
        "train.epochs=1", "track.sigma=0", "train.loss=ce"])
    with pytest.raises(ValueError, match=r"train.loss=ce reads a score per class, but "
                                         r"attention_model returns one output column"):
        fit(cfg, tmp_path / "r", progress=False)


@pytest.mark.parametrize("loss", ["auto", "bce", "mse"])
def test_a_one_column_model_on_binary_labels_still_trains(tmp_path: Path, loss: str) -> None:
    cfg = apply_overrides(RunConfig(name="t"), [
        "model.name=attention_model", "data.name=maxmargin_attention", "device=cpu",
        "train.epochs=2", "train.batch_size=8", "track.sigma=0", "track.num_examples=32",
        f"train.loss={loss}"])
    summary = fit(cfg, tmp_path / "r", progress=False)
    assert summary["steps"] == 8 and 0.0 <= summary["final"]["train/acc"] <= 1.0


def test_a_model_with_a_column_per_class_still_trains(tmp_path: Path) -> None:
    summary = run(tmp_path / "r", ["model.overrides.num_classes=10"])
    assert summary["steps"] == 12 and summary["final"]["train/loss"] > 0


# -- the rows of each rank ---------------------------------------------------------------------
@pytest.mark.parametrize(("size", "world"), [(3, 2), (3, 4), (1, 2), (15, 2), (2, 5)])
def test_rank_rows_cover_the_batch_and_give_its_mean_gradient(size: int, world: int) -> None:
    """Ranks left without a row (a batch smaller than the world) took a mean loss over no rows,
    NaN, which stopped the run as diverged ("lower optim.lr"); they now take a row of weight 0,
    and DDP's equal-weight average of the ranks' gradients is the batch-mean gradient."""
    g = torch.Generator().manual_seed(0)
    model = nn.Linear(4, 3)
    x, y = torch.randn(20, 4, generator=g), torch.randint(0, 3, (20,), generator=g)
    whole = torch.randperm(20, generator=g)[:size]
    F.cross_entropy(model(x[whole]), y[whole]).backward()
    want = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    rows = [rank_rows(whole, r, world) for r in range(world)]
    weighted = sorted(i for idx, share in rows if share > 0 for i in idx.tolist())
    assert weighted == sorted(whole.tolist())  # disjoint and covering
    assert all(len(idx) >= 1 for idx, _ in rows)  # every rank has a forward to take part
    assert sum(share for _, share in rows) == pytest.approx(world)
    total = [torch.zeros_like(p) for p in model.parameters()]
    for idx, share in rows:
        model.zero_grad()
        loss = F.cross_entropy(model(x[idx]), y[idx]) * share
        assert torch.isfinite(loss)
        loss.backward()
        total = [t + p.grad / world for t, p in zip(total, model.parameters(), strict=True)]
    assert all(torch.allclose(a, b, atol=1e-6) for a, b in zip(total, want, strict=True))


# -- under torchrun --------------------------------------------------------------------------------
@pytest.mark.heavy
def test_a_last_batch_smaller_than_the_world_trains_as_one_process(tmp_path: Path) -> None:
    """1,001 examples in batches of 100 on 2 ranks: the last batch of 1 left rank 1 with none,
    and the run stopped with "training loss became nan; lower optim.lr"."""
    args = ["model.name=mlp", "data.name=digits", "model.overrides.widths=[16]",
            "model.overrides.image_size=8", "model.overrides.sens_patch=2", "device=cpu",
            "train.epochs=2", "data.train_subset=1001", "train.batch_size=100",
            "track.sigma=0"]
    assert_ddp_equals_one_process(tmp_path, args)
    assert RunDir(tmp_path / "ddp").read_json("summary.json")["steps"] == 22


@pytest.mark.heavy
def test_the_ranks_evaluate_the_model_rank_0_checkpoints(tmp_path: Path) -> None:
    """ResNet-18 (BatchNorm) on 2 ranks: each rank's running statistics were its own rows'
    after the last step, so the sharded evaluation mixed models (train/loss 7.843 logged for a
    checkpoint whose train/loss is 7.625)."""
    args = ["model.name=resnet18", "data.name=digits", "device=cpu", "train.epochs=1",
            "train.max_steps=6", "train.batch_size=64", "train.eval_batch_size=100",
            "track.sigma=0"]
    torchrun_fit(tmp_path, tmp_path / "ddp", args)
    rd = RunDir(tmp_path / "ddp")
    cfg = RunConfig.from_dict(rd.read_json("config.json"))
    train, test = load_data(cfg)
    model = build_model(cfg, train)
    model.load_state_dict(RunDir.load_checkpoint(rd.checkpoints()[-1])["model"])
    last, cpu = rd.metrics()[-1], torch.device("cpu")
    assert last["step"] == 6
    for split, data in (("train", train), ("test", test)):
        loss, acc = evaluate(model, data, "auto", cpu, 100)
        assert last[f"{split}/loss"] == pytest.approx(loss, rel=1e-5)
        assert last[f"{split}/acc"] == pytest.approx(acc, abs=1e-9)
