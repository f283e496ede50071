"""Audit 77 of the Lightning and Hugging Face callbacks: a value logged under the callback's key
by the module itself, a mask of other rows than the subset, and a seed the measurement refuses —
each said before (or right after) it costs training or logs a wrong number. Real CPU Trainers,
tiny models, one or two epochs."""

from __future__ import annotations

import logging
import warnings
from pathlib import Path

import pytest
import torch

pytest.importorskip("lightning")

import lightning  # noqa: E402
from lightning_toys import Module, data  # noqa: E402

from senslab.integrations.lightning import SensitivityCallback  # noqa: E402
from senslab.tokens import Patches  # noqa: E402

logging.getLogger("lightning.pytorch").setLevel(logging.ERROR)


def trainer(tmp_path: Path, callback: SensitivityCallback, epochs: int = 2) -> lightning.Trainer:
    return lightning.Trainer(
        max_epochs=epochs, accelerator="cpu", devices=1, callbacks=[callback], logger=False,
        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
        default_root_dir=tmp_path)


def test_a_key_the_module_logs_in_training_step_is_refused_not_overwritten(tmp_path: Path):
    """The module logged sensitivity=123 from training_step; the callback's value replaced it in
    callback_metrics and the logger (metrics.csv held 0.0625 only), without a word."""
    loader, subset = data()
    callback = SensitivityCallback(subset, Patches(4), sigma=0.7, repeats=2, generator=5)
    with pytest.raises(ValueError, match="also logged 'sensitivity' in training_step"):
        trainer(tmp_path, callback).fit(Module("training_step"), loader)
    assert len(callback.results) == 1  # the measurement is kept


def test_a_key_the_module_logs_in_its_own_epoch_end_is_not_logged_as_a_mean(tmp_path: Path):
    """The module logged sensitivity=7.0 in its on_train_epoch_end, after the callback's
    0.0625 over 10 examples: Lightning logged (and a checkpoint would monitor) their mean
    weighted by batch size, 0.6932, as the sensitivity, without a word."""
    loader, subset = data()
    callback = SensitivityCallback(subset, Patches(4), sigma=0.7, repeats=2, generator=5)
    with pytest.raises(ValueError, match=r"logged sensitivity=0\.0625 at epoch 1, but Lightning "
                                         r"holds sensitivity=0\.693182"):
        trainer(tmp_path, callback).fit(Module("on_train_epoch_end"), loader)
    assert [e for e, _ in callback.results] == [1]
    assert callback.results[0][1].estimate == 0.0625


def test_own_keys_alone_pass_the_checks_and_log_the_measurement(tmp_path: Path):
    loader, subset = data()
    callback = SensitivityCallback(subset, Patches(4), sigma=0.7, repeats=2, generator=5)
    t = trainer(tmp_path, callback)
    t.fit(Module(), loader)
    assert [e for e, _ in callback.results] == [1, 2]
    assert t.callback_metrics["sensitivity"].item() == pytest.approx(
        callback.results[-1][1].estimate, rel=1e-6)


@pytest.mark.parametrize("rows", [9, 12])
def test_a_mask_of_other_rows_is_refused_before_training(tmp_path: Path, rows: int):
    """The check before training read only the mask's first 8 rows: a mask of 9 (or 12) rows
    for a subset of 10 passed it, and the first measurement refused it after the epoch."""
    loader, subset = data()
    mask = torch.ones(rows, 4, dtype=torch.bool)
    callback = SensitivityCallback(subset, Patches(4), sigma=0.7, mask=mask)
    module = Module()
    before = [p.detach().clone() for p in module.parameters()]
    t = trainer(tmp_path, callback, epochs=1)
    with pytest.raises(ValueError, match=f"mask has shape \\({rows}, 4\\) but the subset has 10"):
        t.fit(module, loader)
    assert t.global_step == 0 and callback.results == []
    assert all(torch.equal(a, b) for a, b in zip(before, module.parameters(), strict=True))


@pytest.mark.parametrize("seed", [-1, 2**64])
def test_a_seed_out_of_range_is_refused_when_the_callback_is_made(seed: int):
    """Taken at construction, refused by the first measurement, after an epoch of training."""
    _, subset = data()
    with pytest.raises(ValueError, match="seed must be an int from 0 to 2\\*\\*64 - 1"):
        SensitivityCallback(subset, Patches(4), sigma=0.7, generator=seed)


def test_a_64_bit_seed_on_a_cpu_model_is_refused_before_training(tmp_path: Path):
    loader, subset = data()
    callback = SensitivityCallback(subset, Patches(4), sigma=0.7, generator=2**40)
    t = trainer(tmp_path, callback, epochs=1)
    with pytest.raises(ValueError, match="2\\*\\*32 or more"):
        t.fit(Module(), loader)
    assert t.global_step == 0 and callback.results == []


def test_hf_refuses_a_bad_seed_and_mask_before_training(tmp_path: Path):
    pytest.importorskip("transformers")
    pytest.importorskip("accelerate")
    from transformers import BertConfig, BertForSequenceClassification

    from senslab.integrations.hf import SensitivityCallback as HFCallback
    from senslab.tokens import Embedding

    torch.manual_seed(0)
    model = BertForSequenceClassification(BertConfig(
        vocab_size=40, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
        intermediate_size=32, max_position_embeddings=16, num_labels=2))
    g = torch.Generator().manual_seed(2)
    subset = {"input_ids": torch.randint(1, 40, (10, 8), generator=g),
              "attention_mask": torch.ones(10, 8, dtype=torch.long)}
    tokens = Embedding("bert.embeddings.LayerNorm")
    with pytest.raises(ValueError, match="seed must be an int from 0"):
        HFCallback(subset, tokens, sigma=2.0, generator=-1)
    bad_mask = HFCallback(subset, tokens, sigma=2.0, mask=torch.ones(9, 8, dtype=torch.bool))
    with pytest.raises(ValueError, match="mask has shape \\(9, 8\\) but the subset has 10"):
        bad_mask.on_train_begin(None, None, None, model=model)
    wide_seed = HFCallback(subset, tokens, sigma=2.0, generator=2**40)
    with pytest.raises(ValueError, match="2\\*\\*32 or more"), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        wide_seed.on_train_begin(None, None, None, model=model)
