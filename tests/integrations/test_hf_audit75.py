"""Audit of session 75, the Hugging Face callback: weights changed through ``.data`` at the same
global step (an EMA's ``copy_to``, pruning by hand: no version counter moves) were taken for the
weights measured, and ``evaluate()`` logged the old weights' sensitivity without a word; a
``compute_metrics`` key ending in ``_runtime`` was taken for the evaluation's prefix, and the
value logged as ``eval_forward_sensitivity`` (``metric_for_best_model="eval_sensitivity"``
then failed in the Trainer)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

pytest.importorskip("transformers")
pytest.importorskip("tensorboard")
pytest.importorskip("accelerate")  # the Trainer needs it

from integrations.test_hf import TOKENS, Texts, arguments, tiny_bert  # noqa: E402
from transformers import Trainer  # noqa: E402

from senslab.integrations.hf import SensitivityCallback  # noqa: E402
from senslab.measure import token_sensitivity  # noqa: E402
from senslab.tokens import Embedding  # noqa: E402

OPTS = {"sigma": 2.0, "repeats": 2, "generator": 3}


@pytest.mark.filterwarnings("ignore:the standard error rests on")
def test_weights_written_through_data_are_measured_again(tmp_path: Path):
    subset = Texts(8, 2).batch(6)
    inputs = {k: v for k, v in subset.items() if k != "labels"}
    model = tiny_bert()
    trainer = Trainer(model=model, args=arguments(tmp_path, report_to="none"),
                      eval_dataset=Texts(8, 3))
    callback = SensitivityCallback(subset, Embedding(TOKENS), **OPTS).attach(trainer)
    first = trainer.evaluate()["eval_sensitivity"]
    torch.manual_seed(7)  # test-only: other weights
    for p in model.parameters():
        p.data.copy_(torch.randn_like(p) * 0.5)  # no version counter moves
    second = trainer.evaluate()["eval_sensitivity"]
    model.eval()
    ref = token_sensitivity(model, inputs, Embedding(TOKENS), **OPTS).estimate
    assert len(callback.results) == 2
    assert second == ref != first


@pytest.mark.filterwarnings("ignore:the standard error rests on")
def test_a_metric_ending_in_runtime_is_not_taken_for_the_prefix(tmp_path: Path):
    subset = Texts(8, 2).batch(6)
    trainer = Trainer(model=tiny_bert(), args=arguments(tmp_path, report_to="none"),
                      eval_dataset=Texts(8, 3),
                      compute_metrics=lambda p: {"accuracy": 0.5, "forward_runtime": 0.01})
    SensitivityCallback(subset, Embedding(TOKENS), **OPTS).attach(trainer)
    metrics = trainer.evaluate()
    assert "eval_forward_runtime" in metrics  # the key that was taken for the prefix
    assert "eval_sensitivity" in metrics and "eval_forward_sensitivity" not in metrics
    named = trainer.evaluate(metric_key_prefix="test")
    assert "test_sensitivity" in named


def test_a_trainer_that_never_evaluates_is_warned_of(tmp_path: Path):
    subset = Texts(8, 2).batch(6)
    from transformers import TrainingArguments

    args = TrainingArguments(output_dir=str(tmp_path), max_steps=1, per_device_train_batch_size=8,
                             report_to="none", use_cpu=True, disable_tqdm=True, seed=0)
    trainer = Trainer(model=tiny_bert(), args=args, train_dataset=Texts(8, 3))
    callback = SensitivityCallback(subset, Embedding(TOKENS), **OPTS).attach(trainer)
    with pytest.warns(UserWarning, match=r"this Trainer never evaluates during training "
                                         r"\(eval_strategy='no'"):
        trainer.train()
    assert not callback.results
