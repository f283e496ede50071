"""Audit 85, the training loop (senslab.train.loop.fit): train.max_steps above the epochs' steps
is said; a BatchNorm layer that would be handed a batch of one example is refused before a step
is taken; NaN or ±inf inputs are named as the cause of a loss that is not finite, instead of the
learning rate."""

from __future__ import annotations

import math
import warnings
from pathlib import Path

import pytest
import torch
from torch import nn

from senslab.data import ArrayDataset
from senslab.data._registry import DATASETS, register_dataset
from senslab.models._registry import MODELS, register_model
from senslab.train.config import RunConfig, apply_overrides
from senslab.train.loop import fit
from senslab.train.rundir import RunDir

DIGITS = ["data.name=digits", "device=cpu", "train.batch_size=128", "optim.lr=0.05",
          "track.sigma=0", "track.eval_examples=64", "seed=3"]
MLP = ["model.name=mlp", "model.overrides.widths=[16]", "model.overrides.sens_patch=2"]


def config(*items: str) -> RunConfig:
    return apply_overrides(RunConfig(name="audit85"), list(items))


def quiet_fit(cfg: RunConfig, path: Path) -> dict:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return fit(cfg, path, progress=False)


# -- train.max_steps beyond train.epochs -------------------------------------------------------


def test_max_steps_beyond_the_epochs_is_said_with_the_epochs_that_reach_it(tmp_path: Path):
    """Before: train.max_steps=100 with train.epochs=1 (12 steps of 128 digits) trained 12 steps
    and recorded "stopped": "budget" without a word, while config.json said 100 steps (a
    Hugging Face max_steps overrides the epochs)."""
    with pytest.warns(UserWarning, match=r"train\.max_steps=100, but train\.epochs=1 of 12 "
                      r"steps each .* end the run at step 12.*Set train\.epochs=9 for 100 steps"):
        summary = fit(config(*DIGITS, *MLP, "train.epochs=1", "train.max_steps=100"),
                      tmp_path / "run", progress=False)
    n_batches = math.ceil(1438 / 128)
    assert summary["steps"] == n_batches == 12
    assert math.ceil(100 / n_batches) == 9


def test_max_steps_that_stops_the_run_is_not_said(tmp_path: Path):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        summary = fit(config(*DIGITS, *MLP, "train.epochs=2", "train.max_steps=5"),
                      tmp_path / "run", progress=False)
    assert summary["steps"] == 5
    assert not [w for w in caught if "max_steps" in str(w.message)]


# -- a batch of one for BatchNorm --------------------------------------------------------------


def test_a_batchnorm_layer_given_a_batch_of_one_is_refused_before_training(tmp_path: Path):
    """ResNet-18 on 8x8 digits: its last BatchNorm sees a 1x1 map. 129 examples in batches of
    128 leave one example for each epoch's last batch. Before: the first step trained, then
    torch's "Expected more than 1 value per channel when training" stopped step 2 (the
    epoch's steps lost, no checkpoint; a resume stopped there again)."""
    run = tmp_path / "run"
    cfg = config(*DIGITS, "model.name=resnet18", "data.train_subset=129", "train.epochs=1")
    with pytest.raises(ValueError, match=r"BatchNorm layer .* batch of one example.*the last "
                       r"batch of every epoch, as 129 training examples in batches of 128 "
                       r"leave 1 for it.*set train\.batch_size=127"):
        quiet_fit(cfg, run)
    assert not RunDir(run).checkpoints()
    assert not (run / "metrics.jsonl").exists() or not RunDir(run).metrics()  # nothing trained
    # the batch size it names trains the run through (its last batch holds 2 examples)
    fixed = config(*DIGITS, "model.name=resnet18", "data.train_subset=129", "train.epochs=1",
                   "train.batch_size=127")
    assert quiet_fit(fixed, tmp_path / "fixed")["steps"] == 2


def test_batch_size_one_is_refused_from_the_first_step(tmp_path: Path):
    cfg = config(*DIGITS, "model.name=resnet18", "data.train_subset=8", "train.batch_size=1",
                 "train.epochs=1")
    with pytest.raises(ValueError, match=r"train\.batch_size=1, from the first step.*"
                       r"set train\.batch_size=2"):
        quiet_fit(cfg, tmp_path / "run")


def test_batchnorm_that_sees_more_than_one_value_per_example_trains_a_batch_of_one(
        tmp_path: Path):
    """ConvMixer's BatchNorms see 2x2 maps: a batch of one normalises, and trains."""
    cfg = config(*DIGITS, "model.name=convmixer", "model.overrides.dim=8",
                 "model.overrides.depth=1", "data.train_subset=129", "train.epochs=1")
    assert quiet_fit(cfg, tmp_path / "run")["steps"] == 2


# -- NaN or inf inputs ---------------------------------------------------------------------------


def _nan_data(split: str = "train", root: str | None = None, download: bool = False,
              where: str = "both", n: int = 200) -> ArrayDataset:
    g = torch.Generator().manual_seed(0 if split == "train" else 1)
    x = torch.randn(n, 1, 4, 4, generator=g)
    y = (x[:, 0, 0, 0] > 0).long()
    if where == "both" or where == split:
        x[3, 0, 1, 1] = float("nan")
        x[57, 0, 2, 0] = float("inf")
    return ArrayDataset(x, y, 2, name="audit85_nan")


@pytest.fixture
def nan_data(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(DATASETS, "_entries", dict(DATASETS._entries))  # undone after
    register_dataset("audit85_nan")(_nan_data)


NAN = ["data.name=audit85_nan", "device=cpu", "train.batch_size=32", "train.epochs=2",
       "track.sigma=0", "model.name=mlp", "model.overrides.widths=[8]",
       "model.overrides.sens_patch=2"]


def test_nan_inputs_at_the_first_evaluation_are_named_not_the_learning_rate(
        tmp_path: Path, nan_data: None):
    """Before: "evaluation loss became nan ...: the model's outputs are no longer finite ...;
    lower optim.lr (now 0.1) or check the data", before any step was taken."""
    with pytest.raises(FloatingPointError) as err:
        quiet_fit(config(*NAN), tmp_path / "run")
    said = str(err.value)
    assert "before any training step" in said
    assert "examples 3, 57 of the train split and examples 3, 57 of the test split" in said
    assert "optim.lr" not in said


def test_nan_inputs_met_by_a_training_step_are_named(tmp_path: Path, nan_data: None):
    """The evaluation subset leaves the NaN rows out, so the first training batch holding one
    finds them. Before: "training loss became nan; lower optim.lr (now 0.1) or check the
    data"; a lower rate stops at the same step."""
    cfg = config(*NAN, "data.options.where=train", "track.eval_examples=16")
    with pytest.raises(FloatingPointError, match=r"training loss became nan at step \d+: its "
                       r"batch holds NaN or ±inf inputs \(example(s)? (3|57|3, 57) of the train "
                       r"split of audit85_nan\)") as err:
        quiet_fit(cfg, tmp_path / "run")
    assert "optim.lr" not in str(err.value)


def test_a_finite_run_of_the_same_data_is_unchanged(tmp_path: Path, nan_data: None):
    assert quiet_fit(config(*NAN, "data.options.where=clean"), tmp_path / "run")["steps"] == 14


class _Overflowing(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(16, 2)
        with torch.no_grad():
            self.fc.weight.fill_(1e38)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(x.flatten(1))


def test_an_untrained_model_whose_outputs_overflow_is_named(
        tmp_path: Path, nan_data: None, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setattr(MODELS, "_entries", dict(MODELS._entries))
    register_model("audit85_overflow")(lambda **_: _Overflowing())
    cfg = config(*[i for i in NAN if not i.startswith("model.")], "model.name=audit85_overflow",
                 "data.options.where=clean")
    with pytest.raises(FloatingPointError, match=r"before any training step: audit85_nan's "
                       r"inputs are finite, so the untrained audit85_overflow's outputs "
                       r"overflow") as err:
        quiet_fit(cfg, tmp_path / "run")
    assert "optim.lr" not in str(err.value)


# -- a run that stops at step 0 ----------------------------------------------------------------


def test_a_run_stopped_at_step_0_saves_its_final_model(tmp_path: Path):
    """train.target_train_acc reached by the untrained model: the run finished at step 0.
    Before: it wrote no checkpoint, so `senslab measure --checkpoint` said "no usable
    checkpoint ... the run saved none yet ... re-running its `senslab train` command resumes
    it", and a re-run reused the finished run, still without one."""
    from senslab.train.loop import build_model, load_data

    run = tmp_path / "run"
    cfg = config(*DIGITS, *MLP, "train.target_train_acc=0.0")
    summary = quiet_fit(cfg, run)
    assert summary["steps"] == 0 and summary["stopped"] == "target_train_acc"
    rd = RunDir(run)
    found = rd.final_checkpoint()
    assert found is not None, "no checkpoint of the final model"
    path, state = found
    assert rd.load_latest() is not None
    initial = build_model(cfg, load_data(cfg)[0]).state_dict()  # the seed's untrained model
    assert state["model"].keys() == initial.keys()
    assert all(torch.equal(state["model"][k], initial[k]) for k in initial)
    assert quiet_fit(cfg, run) == summary  # reused, as before
