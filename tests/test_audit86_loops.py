"""Audit 86 of the custom training loops (``grokking``, ``boolean``): a diverged step that lands
on an evaluation says that the training diverged (naming where and the learning rate) instead of
failing inside a measurement; the ``boolean`` trainer's ``epoch`` counts passes over the
training set when ``subset_batch`` draws the steps' strings."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest
import torch

from senslab.train.rundir import RunDir
from senslab.train.trainers import get_trainer, train_run


def _train(name: str, path: Path, **kw: Any) -> dict[str, Any]:
    torch.set_num_threads(1)
    cfg = dataclasses.replace(get_trainer(name).example(), **kw)
    return train_run(name, cfg, path, progress=False, log=lambda _: None)


def _epochs(path: Path) -> list[tuple[int, float]]:
    return [(r["step"], r["epoch"]) for r in RunDir(path).metrics()]


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
def test_grokking_divergence_at_an_evaluation_says_the_training_diverged(tmp_path: Path) -> None:
    """lr = 1e4: epoch 2's step took a finite loss (2.9e29) to NaN outputs, and with an
    evaluation every epoch the run failed inside the sensitivity: "model output is NaN or
    infinite on 16 clean examples ... check the model's weights and the inputs", never saying
    that the training diverged or which setting to lower."""
    with pytest.raises(FloatingPointError, match=(
            r"outputs became NaN or infinite \(train/loss=nan, test/loss=nan\) at the "
            r"evaluation after epoch 2: the training diverged; lower lr \(now 10000.0\)")):
        _train("grokking", tmp_path / "run", lr=1e4, epochs=10, eval_every=1, sens_examples=16)
    assert [e for _, e in _epochs(tmp_path / "run")] == [0, 1]  # the finite evaluations kept
    assert not (tmp_path / "run" / "summary.json").exists()


def test_boolean_divergence_at_an_evaluation_says_the_training_diverged(tmp_path: Path) -> None:
    """lr = 1e6, an evaluation every step: step 1 made the outputs NaN from a finite loss, and
    the evaluation failed in the sharpness with "the loss of the clean model is NaN ... check
    the model, loss_fn, inputs and targets" (a ValueError, about a loss_fn never given)."""
    with pytest.raises(FloatingPointError, match=(
            r"outputs on the evaluation strings became NaN or infinite: the training diverged "
            r"\(at the evaluation after step 1\); lower lr \(now 1000000.0\)")):
        _train("boolean", tmp_path / "run", lr=1e6, steps=10, eval_every=1)
    assert not (tmp_path / "run" / "summary.json").exists()


def test_boolean_subset_batch_epoch_counts_passes_over_the_training_set(tmp_path: Path) -> None:
    """``subset_batch`` = 48 strings a step drawn from k = 12: four passes a step, logged as
    one (``epoch`` = step), so the curves of different k and of the random completion (all 2ⁿ
    strings) shared an epoch axis that meant different amounts of training."""
    _train("boolean", tmp_path / "k12", function="majority", train_size=12, subset_batch=48,
           steps=20, eval_every=10)
    assert _epochs(tmp_path / "k12") == [(10, 40.0), (20, 80.0)]
    _train("boolean", tmp_path / "random", function="random", train_size=12,
           completion="random", subset_batch=8, steps=20, eval_every=10)
    assert _epochs(tmp_path / "random") == [(10, 2.5), (20, 5.0)]  # 8 of the 32 strings a step


def test_boolean_epoch_is_the_step_without_subset_batch(tmp_path: Path) -> None:
    """Full-batch subset training (a step is a pass) and fresh sampling keep epoch = step."""
    _train("boolean", tmp_path / "full", function="majority", train_size=12, steps=20,
           eval_every=10)
    _train("boolean", tmp_path / "fresh", steps=20, eval_every=10)
    assert _epochs(tmp_path / "full") == _epochs(tmp_path / "fresh") == [(10, 10.0), (20, 20.0)]
