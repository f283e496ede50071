"""Lightning SensitivityCallback: a real CPU ``Trainer(max_epochs=1)`` run logs the subset's
sensitivity to ``callback_metrics`` and the CSV logger's metrics.csv, equal to
``token_sensitivity`` on the same subset and seed (no mocks)."""

from __future__ import annotations

import csv
import logging
from pathlib import Path

import pytest
import torch

pytest.importorskip("lightning")

import lightning  # noqa: E402
from lightning.pytorch.loggers import CSVLogger  # noqa: E402
from lightning_toys import Module, data  # noqa: E402
from torch.utils.data import DataLoader  # noqa: E402

from senslab.integrations.lightning import SensitivityCallback  # noqa: E402
from senslab.measure import token_sensitivity  # noqa: E402
from senslab.tokens import Patches  # noqa: E402

logging.getLogger("lightning.pytorch").setLevel(logging.ERROR)


def quiet_trainer(tmp_path: Path, callback: SensitivityCallback, epochs: int = 1):
    return lightning.Trainer(
        max_epochs=epochs, accelerator="cpu", devices=1, callbacks=[callback],
        logger=CSVLogger(tmp_path), enable_checkpointing=False, enable_progress_bar=False,
        enable_model_summary=False, default_root_dir=tmp_path)


def read_csv(trainer: lightning.Trainer) -> list[dict[str, str]]:
    path = Path(trainer.logger.log_dir) / "metrics.csv"
    with path.open() as f:
        return list(csv.DictReader(f))


def test_callback_logs_token_sensitivity_of_the_subset(tmp_path: Path):
    loader, subset = data()
    module = Module()
    callback = SensitivityCallback(subset, Patches(4), sigma=0.7, repeats=2, generator=5)
    trainer = quiet_trainer(tmp_path, callback)
    trainer.fit(module, loader)
    ref = token_sensitivity(module, subset, Patches(4), sigma=0.7, repeats=2, generator=5)
    assert 0 < ref.estimate < 1  # not a degenerate value
    logged = trainer.callback_metrics["sensitivity"]
    assert logged.item() == torch.tensor(ref.estimate, dtype=logged.dtype).item()
    assert trainer.callback_metrics["sensitivity_stderr"].item() == pytest.approx(ref.stderr,
                                                                                  rel=1e-6)
    rows = [r for r in read_csv(trainer) if r.get("sensitivity")]
    assert len(rows) == 1 and rows[0]["epoch"] == "0"
    assert float(rows[0]["sensitivity"]) == pytest.approx(ref.estimate, rel=1e-6)
    assert float(rows[0]["sensitivity_stderr"]) == pytest.approx(ref.stderr, rel=1e-6)
    (epoch, full), = callback.results
    assert epoch == 1 and full.estimate == ref.estimate and full.num_examples == 10


def test_every_n_epochs_and_same_noise_each_time(tmp_path: Path):
    loader, subset = data()
    module = Module()
    callback = SensitivityCallback(subset, Patches(4), sigma=0.7, every_n_epochs=2,
                                   batch_size=4)
    quiet_trainer(tmp_path, callback, epochs=2).fit(module, loader)
    assert [e for e, _ in callback.results] == [2]
    # the same weights measured again: the same numbers (the seed restarts every measurement)
    assert callback.measure(module).estimate == callback.results[0][1].estimate
    with pytest.raises(TypeError, match="did you mean sigma"):
        SensitivityCallback(subset, Patches(4), sigmaa=0.7)
    with pytest.raises(ValueError, match="every_n_epochs"):
        SensitivityCallback(subset, Patches(4), sigma=0.7, every_n_epochs=0)


def test_a_true_bf16_module_gets_its_subset_in_bf16(tmp_path: Path):
    """precision="bf16-true" casts the module to bf16; the callback's subset is converted as
    Lightning converts a batch, and the logged value is the bf16 module's on bf16 images
    (before: the float32 subset stopped fit with a dtype clash after the first epoch)."""
    loader, subset = data()
    module = Module()
    callback = SensitivityCallback(subset, Patches(4), sigma=0.7, repeats=2, generator=5)
    trainer = lightning.Trainer(
        max_epochs=1, accelerator="cpu", devices=1, callbacks=[callback], precision="bf16-true",
        logger=False, enable_checkpointing=False, enable_progress_bar=False,
        enable_model_summary=False, default_root_dir=tmp_path)
    trainer.fit(module, loader)
    assert next(module.parameters()).dtype == torch.bfloat16
    ref = token_sensitivity(module, subset.bfloat16(), Patches(4), sigma=0.7, repeats=2,
                            generator=5)
    (_, logged), = callback.results
    assert logged.estimate == ref.estimate and logged.num_examples == 10


def test_docs_snippet_runs(snippet, tmp_path: Path):
    loader, subset = data()
    module = Module()
    scope = {"subset": subset, "module": module, "loader": loader,
             "logger": CSVLogger(tmp_path)}
    exec(snippet("torchmetrics and Lightning", 1), scope)
    ref = token_sensitivity(module, subset, Patches(4), sigma=0.5, generator=0)
    assert scope["callback"].results[-1][1].estimate == ref.estimate


class Tracked(Module):
    """The metric inside a LightningModule: updated in validation_step, logged as an object (so
    Lightning computes, syncs and resets it every epoch)."""

    def __init__(self) -> None:
        super().__init__()
        from senslab.integrations.torchmetrics import TokenSensitivityMetric

        self.sens = TokenSensitivityMetric(Patches(4), sigma=0.7, generator=2)

    def validation_step(self, batch: tuple[torch.Tensor, torch.Tensor], _: int) -> None:
        self.sens.update(self, batch[0])
        self.log("val_sensitivity", self.sens, on_epoch=True, batch_size=len(batch[0]))


def test_metric_logged_from_a_lightning_module(tmp_path: Path):
    pytest.importorskip("torchmetrics")
    from senslab.measure import TokenSensitivity

    loader, _ = data()
    module = Tracked()
    trainer = lightning.Trainer(
        max_epochs=1, accelerator="cpu", devices=1, logger=CSVLogger(tmp_path),
        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
        num_sanity_val_steps=0)
    trainer.fit(module, loader, loader)
    ref = TokenSensitivity(module, Patches(4), sigma=0.7, generator=2)
    for x, _ in loader:
        ref.update(x)
    logged = trainer.callback_metrics["val_sensitivity"]
    assert logged.item() == pytest.approx(ref.compute().estimate, rel=1e-6)
    rows = [r for r in read_csv(trainer) if r.get("val_sensitivity")]
    assert float(rows[0]["val_sensitivity"]) == pytest.approx(ref.compute().estimate, rel=1e-6)


class StepLogged(Module):
    """The metric called as ``metric(model, x)`` in training_step, logged per step and epoch."""

    def __init__(self) -> None:
        super().__init__()
        from senslab.integrations.torchmetrics import TokenSensitivityMetric

        self.sens = TokenSensitivityMetric(Patches(4), sigma=0.7, generator=2)
        self.steps: list[float] = []

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], i: int) -> torch.Tensor:
        self.steps.append(self.sens(self, batch[0]).item())
        self.log("train_sens", self.sens, on_step=True, on_epoch=True, batch_size=len(batch[0]))
        return super().training_step(batch, i)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.0)  # fixed weights: one reference


def test_per_step_values_of_the_metrics_forward_reach_the_logger(tmp_path: Path):
    """``self.log(name, metric, on_step=True)`` logs what ``metric(model, x)`` returned for
    the batch (Lightning reads the metric's forward cache; it once logged no step at all)."""
    pytest.importorskip("torchmetrics")
    loader, _ = data()
    module = StepLogged()
    trainer = lightning.Trainer(
        max_epochs=1, accelerator="cpu", devices=1, logger=CSVLogger(tmp_path),
        log_every_n_steps=1, enable_checkpointing=False, enable_progress_bar=False,
        enable_model_summary=False)
    trainer.fit(module, loader)
    rows = read_csv(trainer)
    steps = [float(r["train_sens_step"]) for r in rows if r.get("train_sens_step")]
    assert len(module.steps) == 4 and steps == pytest.approx(module.steps, rel=1e-6)
    epoch = [float(r["train_sens_epoch"]) for r in rows if r.get("train_sens_epoch")]
    ref = sensitivity_over(module, loader)
    assert epoch == pytest.approx([ref], rel=1e-6)


def sensitivity_over(module: lightning.LightningModule, loader: DataLoader) -> float:
    from senslab.measure import TokenSensitivity

    ref = TokenSensitivity(module, Patches(4), sigma=0.7, generator=2)
    for x, _ in loader:
        ref.update(x)
    return ref.compute().estimate


def test_tokens_default_to_auto_of_the_wrapped_hf_model():
    """No tokens given, a LightningModule holding a Hugging Face model as ``self.model``: that
    model's auto_tokens, named from the module."""
    transformers = pytest.importorskip("transformers")
    from senslab.tokens import Embedding, default_tokens

    class Wrapped(lightning.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            torch.manual_seed(0)
            self.model = transformers.BertForSequenceClassification(transformers.BertConfig(
                vocab_size=40, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                intermediate_size=32, max_position_embeddings=16))

        def forward(self, **batch: torch.Tensor):
            return self.model(**batch)

    module = Wrapped().eval()
    g = torch.Generator().manual_seed(0)
    subset = {"input_ids": torch.randint(1, 40, (5, 8), generator=g),
              "attention_mask": torch.ones(5, 8, dtype=torch.long)}
    tokens = Embedding("model.bert.embeddings.LayerNorm")
    assert default_tokens(module) == tokens
    r = SensitivityCallback(subset, sigma=2.0, generator=5).measure(module)
    ref = token_sensitivity(module, subset, tokens, sigma=2.0, generator=5)
    assert r.estimate == ref.estimate and r.num_forward == ref.num_forward == 5 * 8 + 5


def test_a_left_padded_subset_is_refused_when_the_callback_is_made():
    """A left-padded attention mask would be refused at the first measurement, after an epoch
    of training: the callback refuses it when it is made, with the same fix; with
    trim_padding=False it is measured as it is."""
    ids = torch.randint(1, 9, (3, 6), generator=torch.Generator().manual_seed(0))
    mask = torch.tensor([[1] * 6, [0, 0, 1, 1, 1, 1], [1, 1, 1, 1, 0, 0]])
    with pytest.raises(ValueError, match="SensitivityCallback: the inputs are left-padded "
                                         r"\(example 1.*padding_side = 'right'"):
        SensitivityCallback({"input_ids": ids, "attention_mask": mask}, Patches(2), sigma=1.0)
    SensitivityCallback({"input_ids": ids, "attention_mask": mask}, Patches(2), sigma=1.0,
                        trim_padding=False)
    SensitivityCallback({"input_ids": ids, "attention_mask": mask.flip(1).flip(0)[1:]},
                        Patches(2), sigma=1.0)  # right padding
