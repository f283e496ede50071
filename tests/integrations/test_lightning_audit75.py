"""Audit of session 75, the Lightning callback: a ModelCheckpoint or EarlyStopping monitoring
"sensitivity" that judges after validation (``check_val_every_n_epoch=2``), at epochs the
callback does not measure, or (EarlyStopping) before it, read the previous measurement as this
epoch's (epoch 2's checkpoint scored with epoch 1's value), or found none: refused before
training, with the fix, and the fixed set-up scores each checkpoint with its own epoch's value.
With ``eval_mode=False`` a module with dropout or train-mode BatchNorm was refused only at the
first measurement, after the epochs before it: now before training."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
import torch
from torch import nn

pytest.importorskip("lightning")

import lightning  # noqa: E402
from lightning.pytorch.callbacks import EarlyStopping, ModelCheckpoint  # noqa: E402
from torch.utils.data import DataLoader, TensorDataset  # noqa: E402

from senslab.integrations.lightning import SensitivityCallback  # noqa: E402
from senslab.tokens import Patches  # noqa: E402

logging.getLogger("lightning.pytorch").setLevel(logging.ERROR)
pytestmark = pytest.mark.filterwarnings("ignore::UserWarning", "ignore::RuntimeWarning")


class Module(lightning.LightningModule):
    def __init__(self, middle: nn.Module | None = None) -> None:
        super().__init__()
        torch.manual_seed(0)  # test-only: init
        self.net = nn.Sequential(nn.Flatten(), nn.Linear(64, 16), middle or nn.Tanh(),
                                 nn.Linear(16, 3))
        self.epochs_trained = 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], _: int) -> torch.Tensor:
        x, y = batch
        return nn.functional.cross_entropy(self(x), y)

    def on_train_epoch_end(self) -> None:
        self.epochs_trained += 1

    def validation_step(self, batch: tuple[torch.Tensor, torch.Tensor], _: int) -> None:
        x, y = batch
        self.log("val_loss", nn.functional.cross_entropy(self(x), y))

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=1.0)


def loaders() -> tuple[DataLoader, DataLoader, torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    x = torch.randn(32, 1, 8, 8, generator=g)
    y = torch.randint(0, 3, (32,), generator=g)
    data = TensorDataset(x, y)
    return DataLoader(data, batch_size=8), DataLoader(data, batch_size=16), x[:12]


def fit(tmp_path: Path, callbacks: list, module: Module | None = None, epochs: int = 4,
        **options) -> Module:
    train, val, _ = loaders()
    module = module or Module()
    trainer = lightning.Trainer(
        max_epochs=epochs, accelerator="cpu", devices=1, callbacks=callbacks, logger=False,
        enable_checkpointing=any(isinstance(c, ModelCheckpoint) for c in callbacks),
        enable_progress_bar=False, enable_model_summary=False, default_root_dir=tmp_path,
        **options)
    trainer.fit(module, train, val)
    return module


def sensitivity(every: int = 1, **options) -> SensitivityCallback:
    return SensitivityCallback(loaders()[2], Patches(4), sigma=1.0, every_n_epochs=every,
                               **options)


def checkpoint(tmp_path: Path, **options) -> ModelCheckpoint:
    return ModelCheckpoint(dirpath=tmp_path / "ck", monitor="sensitivity", mode="min",
                           save_top_k=-1, filename="{epoch}", **options)


@pytest.mark.parametrize("case", ["after validation", "other epochs", "within an epoch"])
def test_a_checkpoint_that_would_read_an_earlier_measurement_is_refused(tmp_path, case):
    callback, options, saver = sensitivity(), {}, checkpoint(tmp_path)
    fix = "save_on_train_epoch_end=True"
    if case == "after validation":
        options = {"check_val_every_n_epoch": 2}
    elif case == "other epochs":
        callback, fix = sensitivity(every=2), "every_n_epochs=2"
    else:
        saver, fix = checkpoint(tmp_path, every_n_train_steps=2), "every_n_epochs=1"
    module = Module()
    with pytest.raises(ValueError, match=f"ModelCheckpoint\\(monitor='sensitivity'\\).*{fix}"):
        fit(tmp_path, [callback, saver], module, **options)
    assert module.epochs_trained == 0 and not callback.results


def test_the_fixed_checkpoint_scores_each_epoch_by_its_own_measurement(tmp_path):
    callback = sensitivity()
    saver = checkpoint(tmp_path, save_on_train_epoch_end=True)
    fit(tmp_path, [callback, saver], check_val_every_n_epoch=2)
    scores = {int(Path(k).stem.split("=")[1]) + 1: float(v)
              for k, v in saver.best_k_models.items()}
    measured = {epoch: r.estimate for epoch, r in callback.results}
    assert scores.keys() == measured.keys()
    for epoch, score in scores.items():  # logged in float32
        assert score == pytest.approx(measured[epoch], rel=1e-6)
    assert len(set(scores.values())) > 1  # the epochs differ: an earlier value would show


@pytest.mark.parametrize("case", ["after validation", "other epochs", "listed first"])
def test_early_stopping_that_would_read_an_earlier_measurement_is_refused(tmp_path, case):
    callback, options = sensitivity(), {}
    stop = EarlyStopping(monitor="sensitivity", mode="min", patience=100)
    order = [callback, stop]
    fix = "check_on_train_epoch_end=True"
    if case == "after validation":
        options = {"check_val_every_n_epoch": 2}
    elif case == "other epochs":
        callback, fix = sensitivity(every=2), "every_n_epochs=1"
        order = [callback, stop]
    else:
        stop = EarlyStopping(monitor="sensitivity", mode="min", patience=100,
                             check_on_train_epoch_end=True)
        order, fix = [stop, callback], "list the SensitivityCallback first"
    with pytest.raises(ValueError, match=f"EarlyStopping\\(monitor='sensitivity'\\).*{fix}"):
        fit(tmp_path, order, **options)


def test_early_stopping_after_the_callback_at_every_epoch_runs(tmp_path):
    callback = sensitivity()
    stop = EarlyStopping(monitor="sensitivity", mode="min", patience=100)
    fit(tmp_path, [callback, stop], epochs=3)
    assert [epoch for epoch, _ in callback.results] == [1, 2, 3]
    assert float(stop.best_score) == min(r.estimate for _, r in callback.results)


@pytest.mark.parametrize("middle, refusal", [
    (nn.Dropout(0.3), "output changed between two evaluations"),
    (nn.BatchNorm1d(16), "eval_mode=False with BatchNorm layers"),
])
def test_eval_mode_false_is_refused_before_training(tmp_path, middle, refusal):
    module = Module(middle)
    with pytest.raises((RuntimeError, ValueError), match=refusal):
        fit(tmp_path, [sensitivity(every=3, eval_mode=False)], module, epochs=3)
    assert module.epochs_trained == 0
    assert module.training  # the module's modes as they were


def test_eval_mode_false_on_a_deterministic_module_measures(tmp_path):
    callback = sensitivity(eval_mode=False)
    fit(tmp_path, [callback], epochs=2)
    assert [epoch for epoch, _ in callback.results] == [1, 2]


def test_a_fit_shorter_than_every_n_epochs_is_warned_of(tmp_path):
    callback = sensitivity(every=5)
    with pytest.warns(UserWarning, match=r"this fit ends after 2 epoch\(s\) \(max_epochs=2\): "
                                         r"nothing will be measured"):
        fit(tmp_path, [callback], epochs=2)
    assert not callback.results
