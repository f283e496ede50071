"""The training-stack callbacks across runs and outside training.

- Hugging Face: ``trainer.train()`` twice on one Trainer without resuming (what
  ``hyperparameter_search`` does per trial) kept one ``results`` list whose steps started over
  ([2, 4, 2, 4]), and the second run's checkpoint-2 held steps [2, 4, 2]. Now a new run sets the
  earlier run's results aside, with a warning; an evaluation at step 0 before ``train()`` stays.
- Lightning: the same callback in a second Trainer's fit did the same ([1, 2, 1, 2]).
  ``validate()``/``test()`` measured nothing without a word, and ``test(ckpt_path=...)`` loaded
  the checkpoint's results over the fit's (a 3-epoch fit's [1, 2, 3] became [1]).
- Lightning: a module whose ``forward`` returns features and whose head is applied elsewhere was
  measured on the features (0.3625 where the classifier's value is 0.0625): now warned of before
  training, and ``output=module.head`` measures the classifier.

Real tiny Trainer runs on the CPU (random-init BERT from a config, no downloads), no mocks."""

from __future__ import annotations

import json
import logging
import warnings
from pathlib import Path

import pytest
import torch
from torch import nn

pytest.importorskip("transformers")
pytest.importorskip("accelerate")  # the Trainer needs it
pytest.importorskip("lightning")

import lightning  # noqa: E402
from lightning.pytorch.callbacks import ModelCheckpoint  # noqa: E402
from lightning_toys import Module, data  # noqa: E402
from transformers import Trainer  # noqa: E402

from senslab.integrations.hf import SensitivityCallback  # noqa: E402
from senslab.integrations.lightning import SensitivityCallback as LightningCallback  # noqa: E402
from senslab.measure import token_sensitivity  # noqa: E402
from senslab.tokens import Embedding, Patches  # noqa: E402

from .test_hf import TOKENS, Texts, arguments, tiny_bert  # noqa: E402

logging.getLogger("lightning.pytorch").setLevel(logging.ERROR)
_NOISE = ".*(flips|tokenizer|padding|num_workers|does not have many workers).*"


def _mine(caught: list[warnings.WarningMessage], text: str) -> list[str]:
    return [str(w.message) for w in caught if text in str(w.message)]


def test_hf_a_second_train_sets_the_first_runs_results_aside(tmp_path: Path):
    train, val = Texts(32, 1), Texts(8, 2)
    args = arguments(tmp_path, max_steps=4, save_strategy="steps", save_steps=2,
                     report_to="none")
    trainer = Trainer(model=tiny_bert(), args=args, train_dataset=train, eval_dataset=val)
    callback = SensitivityCallback(val.batch(8), Embedding(TOKENS), sigma=4.0,
                                   repeats=4).attach(trainer)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trainer.evaluate()  # step 0, before training: the first run's starting point
        trainer.train()
    assert [s for s, _ in callback.results] == [0, 2, 4]
    assert not _mine(caught, "earlier run") and callback.set_aside == []
    first = list(callback.results)
    assert any(r.estimate > 0 for _, r in first)  # not trivially equal zeros

    with pytest.warns(UserWarning, match=r"new run starts at step 0.*earlier run \(steps "
                                         r"\[0, 2, 4\]\).*callback\.set_aside.*"
                                         r"resume_from_checkpoint"):
        trainer.train()
    assert [s for s, _ in callback.results] == [2, 4]  # before: [0, 2, 4, 2, 4]
    assert len(callback.set_aside) == 1  # one series set aside
    assert [r for _, r in callback.set_aside[0]] == [r for _, r in first]  # the very objects
    # the second run's checkpoint holds its own series only (before: steps [0, 2, 4, 2])
    state = json.loads((tmp_path / "checkpoint-2" / "trainer_state.json").read_text())
    assert [s for s, _ in state["stateful_callbacks"][callback.state_key]["results"]] == [2]


def _trainer(root: Path, callback: LightningCallback, epochs: int, **extra) -> lightning.Trainer:
    extra.setdefault("enable_checkpointing", False)
    return lightning.Trainer(
        max_epochs=epochs, accelerator="cpu", devices=1, callbacks=[callback, *extra.pop(
            "more", [])], logger=False, enable_progress_bar=False, enable_model_summary=False,
        default_root_dir=root, **extra)


class _Tested(Module):
    def test_step(self, batch: tuple[torch.Tensor, torch.Tensor], _: int) -> None:
        x, y = batch
        self.log("test_loss", nn.functional.cross_entropy(self(x), y))

    validation_step = test_step


def test_lightning_a_second_fit_sets_the_first_fits_results_aside(tmp_path: Path):
    loader, subset = data()
    callback = LightningCallback(subset, Patches(4), sigma=0.7, repeats=2)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=_NOISE)
        _trainer(tmp_path, callback, 2).fit(Module(), loader)
    first = list(callback.results)
    assert [e for e, _ in first] == [1, 2]
    with pytest.warns(UserWarning, match=r"new run starts at epoch 0.*earlier run \(epochs "
                                         r"\[1, 2\]\).*ckpt_path"):
        _trainer(tmp_path, callback, 2).fit(Module(), loader)
    assert [e for e, _ in callback.results] == [1, 2]  # before: [1, 2, 1, 2]
    assert callback.set_aside == [first]
    second = list(callback.results)
    with pytest.warns(UserWarning, match=r"new run starts at epoch 0"):
        _trainer(tmp_path, callback, 1).fit(Module(), loader)
    # each earlier fit is a series of its own (a flat list had read epochs 1, 2, 1, 2)
    assert callback.set_aside == [first, second]
    assert [e for e, _ in callback.results] == [1]


def test_lightning_test_warns_and_a_checkpoint_it_loads_leaves_the_results(tmp_path: Path):
    loader, subset = data()
    callback = LightningCallback(subset, Patches(4), sigma=0.7, repeats=2)
    saves = ModelCheckpoint(dirpath=tmp_path, save_top_k=-1, every_n_epochs=1,
                            filename="{epoch}")
    trainer = _trainer(tmp_path, callback, 3, enable_checkpointing=True, more=[saves])
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=_NOISE)
        trainer.fit(_Tested(), loader)
    fitted = list(callback.results)
    assert [e for e, _ in fitted] == [1, 2, 3]

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        # the first epoch's checkpoint, whose callback state holds epoch 1 only
        trainer.test(_Tested(), loader, ckpt_path=str(tmp_path / "epoch=0.ckpt"))
        trainer.validate(_Tested(), loader)
    said = _mine(caught, "in fit() only")
    assert len(said) == 1 and "trainer.test() logs no sensitivity" in said[0]  # said once
    assert "callback.measure(module)" in said[0]
    assert not _mine(caught, "replace")
    assert callback.results == fitted and callback.set_aside == []  # before: [1] and [1, 2, 3]

    # the way the warning names measures the module as it is
    module = _Tested()
    ref = token_sensitivity(module, subset, Patches(4), sigma=0.7, repeats=2, generator=0)
    assert callback.measure(module).estimate == ref.estimate


class _Features(lightning.LightningModule):
    """``forward`` returns features; the head is applied in the steps."""

    def __init__(self, num_classes: int = 3) -> None:
        super().__init__()
        self.save_hyperparameters()
        torch.manual_seed(0)  # test-only: init
        self.body = nn.Sequential(nn.Flatten(), nn.Linear(64, 16), nn.Tanh())
        self.head = nn.Sequential(nn.Dropout(0.0), nn.Linear(16, num_classes))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.body(x)

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], _: int) -> torch.Tensor:
        x, y = batch
        return nn.functional.cross_entropy(self.head(self(x)), y)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.5)


@pytest.mark.filterwarnings("ignore:the standard error rests on few flips")
def test_lightning_a_head_left_out_of_forward_is_warned_of(tmp_path: Path):
    loader, subset = data()
    module = _Features()
    callback = LightningCallback(subset, Patches(4), sigma=0.7, repeats=2)
    with pytest.warns(UserWarning, match=r"reads its output, \(8, 16\), as 16 class scores; "
                                         r"but module\.head\.1 \(Linear 16 -> 3\).*did not run "
                                         r"in forward and the module's hparams declare "
                                         r"num_classes=3.*output=module\.head "):
        _trainer(tmp_path, callback, 1).fit(module, loader)
    classifier = nn.Sequential(module.body, module.head)
    measured = callback.results[0][1].estimate
    right = token_sensitivity(classifier, subset, Patches(4), sigma=0.7, repeats=2).estimate
    assert measured != right  # the features were measured: 0.3625 against 0.0625

    # pointed at the classifier: its value, and no word
    module = _Features()
    callback = LightningCallback(subset, Patches(4), sigma=0.7, repeats=2, output=module.head)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        _trainer(tmp_path, callback, 1).fit(module, loader)
    assert not _mine(caught, "class scores")
    classifier = nn.Sequential(module.body, module.head)
    ref = token_sensitivity(classifier, subset, Patches(4), sigma=0.7, repeats=2)
    assert callback.results[0][1].estimate == ref.estimate

    # a module whose forward returns its class scores: no word
    callback = LightningCallback(subset, Patches(4), sigma=0.7, repeats=2)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        _trainer(tmp_path, callback, 1).fit(Module(), loader)
    assert not _mine(caught, "class scores")
