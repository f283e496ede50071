"""Hugging Face SensitivityCallback: its ``results`` survive ``train(resume_from_checkpoint=...)``
(they go into the checkpoint's ``trainer_state.json``), and two values under one log key —
two callbacks with one name, or ``compute_metrics`` returning the callback's name — are refused
rather than one silently overwriting the other in ``evaluate()``'s metrics. Real tiny Trainer
runs (random-init BERT, CPU), no mocks."""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import pytest
import torch

pytest.importorskip("transformers")
pytest.importorskip("accelerate")  # the Trainer needs it

from transformers import Trainer  # noqa: E402

from senslab.integrations.hf import SensitivityCallback  # noqa: E402
from senslab.tokens import Embedding  # noqa: E402

from .test_hf import TOKENS, Texts, arguments, tiny_bert  # noqa: E402


def _same(a, b) -> bool:
    """Two SensitivityResults hold the same numbers (tensors bit for bit, dtypes included)."""
    for name, x in vars(a).items():
        y = vars(b)[name]
        if isinstance(x, torch.Tensor):
            if x.dtype != y.dtype or x.shape != y.shape or not torch.equal(
                    x.nan_to_num(-7.0), y.nan_to_num(-7.0)):
                return False
        elif x != y and not (x != x and y != y):  # NaN equals NaN here
            return False
    return True


def _trainer(out: Path, **extra) -> tuple[Trainer, SensitivityCallback]:
    train, val = Texts(32, 1), Texts(8, 2)
    args = arguments(out, max_steps=6, save_strategy="steps", save_steps=2, report_to="none",
                     **extra)
    trainer = Trainer(model=tiny_bert(), args=args, train_dataset=train, eval_dataset=val)
    callback = SensitivityCallback(val.batch(6), Embedding(TOKENS), sigma=2.0, repeats=2,
                                   generator=3).attach(trainer)
    return trainer, callback


def test_results_survive_a_resumed_training(tmp_path: Path):
    """A run measured at steps 2, 4, 6 and checkpointed at each. A new process resuming from
    checkpoint-4 had results [(6, …)] only: the measurements at steps 2 and 4 were lost (the
    log_history, restored by the Trainer, still had them). Now the checkpoint holds them, exactly
    (per-sample rates and all), and the resumed run continues them."""
    trainer, full = _trainer(tmp_path)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer.train()
    assert [step for step, _ in full.results] == [2, 4, 6]

    # a fresh Trainer and callback, as in a new process; the Trainer's own callback restoring
    # is on, and must not trip over the entry
    resumed, callback = _trainer(tmp_path, restore_callback_states_from_checkpoint=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        resumed.train(resume_from_checkpoint=str(tmp_path / "checkpoint-4"))
    assert [step for step, _ in callback.results] == [2, 4, 6]
    for (_, mine), (_, theirs) in zip(callback.results[:2], full.results[:2], strict=True):
        assert _same(mine, theirs)  # what was measured before the checkpoint, exactly
    assert any(r.estimate > 0 for _, r in full.results[:2])  # not trivially equal zeros
    assert isinstance(callback.results[0][1].ci95, tuple)
    assert resumed.callback_handler.callbacks[0] is callback  # not replaced by the Trainer
    assert callback.set_aside == []
    saved = json.loads((tmp_path / "checkpoint-4" / "trainer_state.json").read_text())
    assert any("sensitivity" in key for key in saved["stateful_callbacks"])  # plain JSON


def test_the_same_callback_resumed_says_what_it_sets_aside(tmp_path: Path):
    """Resuming the callback that ran on (same process) from an earlier checkpoint: the
    checkpoint's results replace its own, which are kept, with a warning."""
    trainer, callback = _trainer(tmp_path)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer.train()
    held = [r for _, r in callback.results]
    with pytest.warns(UserWarning, match=r"results \(steps \[2\]\) replace the 3 this callback "
                                         r"held.*callback.set_aside"):
        trainer.train(resume_from_checkpoint=str(tmp_path / "checkpoint-2"))
    assert len(callback.set_aside) == 1 and len(callback.set_aside[0]) == 3  # none dropped
    assert all(a is b for (_, a), b in zip(callback.set_aside[0], held, strict=True))  # the same
    assert [step for step, _ in callback.results] == [2, 4, 6]


def test_two_callbacks_under_one_name_are_refused(tmp_path: Path):
    """Before: two attached callbacks with the default name both logged eval_sensitivity; the
    dict evaluate() returned (read by metric_for_best_model and EarlyStoppingCallback) held
    only the last one's value, and log_history two unmarked values at one step."""
    val = Texts(8, 2)
    trainer = Trainer(model=tiny_bert(), args=arguments(tmp_path, report_to="none"),
                      train_dataset=val, eval_dataset=val)
    first = SensitivityCallback(val.batch(4), Embedding(TOKENS), sigma=2.0).attach(trainer)
    second = SensitivityCallback(val.batch(8), Embedding(TOKENS), sigma=0.5)
    with pytest.raises(ValueError, match="two SensitivityCallbacks of this Trainer log under "
                                         "'eval_sensitivity'.*name="):
        second.attach(trainer)
    assert second not in trainer.callback_handler.callbacks
    # a name whose stderr key is the other's: refused too
    with pytest.raises(ValueError, match="eval_sensitivity_stderr"):
        SensitivityCallback(val.batch(8), Embedding(TOKENS), sigma=0.5,
                            name="sensitivity_stderr").attach(trainer)
    # distinct names: both logged, each under its own key, each its own measurement
    other = SensitivityCallback(val.batch(8), Embedding(TOKENS), sigma=0.5,
                                name="sensitivity_all").attach(trainer)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        metrics = trainer.evaluate()
    assert metrics["eval_sensitivity"] == first.results[-1][1].estimate
    assert metrics["eval_sensitivity_all"] == other.results[-1][1].estimate
    assert first.results[-1][1].num_examples == 4 and other.results[-1][1].num_examples == 8


def test_a_key_already_in_the_metrics_is_refused(tmp_path: Path):
    """Callbacks given to Trainer(callbacks=[...]) without attach(), or compute_metrics
    returning "sensitivity": the evaluation's metrics already hold eval_sensitivity when the
    callback comes, which it overwrote without a word."""
    val = Texts(8, 2)
    a = SensitivityCallback(val.batch(4), Embedding(TOKENS), sigma=2.0)
    b = SensitivityCallback(val.batch(8), Embedding(TOKENS), sigma=0.5)
    trainer = Trainer(model=tiny_bert(), args=arguments(tmp_path / "a", report_to="none"),
                      train_dataset=val, eval_dataset=val, callbacks=[a, b])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with pytest.raises(ValueError, match="metrics already hold 'eval_sensitivity'"):
            trainer.evaluate()

    def accuracy_and_more(pred) -> dict[str, float]:
        return {"accuracy": 0.5, "sensitivity": 0.25}

    trainer = Trainer(model=tiny_bert(), args=arguments(tmp_path / "b", report_to="none"),
                      train_dataset=val, eval_dataset=val, compute_metrics=accuracy_and_more)
    SensitivityCallback(val.batch(4), Embedding(TOKENS), sigma=2.0).attach(trainer)
    with pytest.raises(ValueError, match="compute_metrics"):
        trainer.evaluate()
