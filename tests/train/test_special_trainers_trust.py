"""The special-purpose trainers (``boolean``, ``grokking``, ``sparse_parity``,
``sparse_frequent``, ``attention``) at tiny scale: a diverged step stops the run at once with an
error that says so; the grokking summary's ``sens_before_jump`` is measured before the jump;
same seed, same numbers; a run interrupted by a real SIGINT and resumed equals the
uninterrupted one bit for bit; logged metrics recomputed independently from the saved model.
"""

from __future__ import annotations

import dataclasses
import itertools
import os
import signal
from pathlib import Path
from typing import Any

import pytest
import torch
from one_thread import _one_thread_quiet  # noqa: F401  (autouse)

from senslab.data import create_dataset
from senslab.models import create_model
from senslab.train.loop import TrainingInterrupted
from senslab.train.loops._common import sgd_step
from senslab.train.loops.grokking import grokking_phases
from senslab.train.rundir import RunDir
from senslab.train.trainers import get_trainer, train_run


def _train(name: str, cfg: Any, path: Path) -> dict[str, Any]:
    return train_run(name, cfg, path, progress=False, log=lambda _: None)


def _records(path: Path) -> list[dict[str, Any]]:
    return [{k: v for k, v in r.items() if k != "time"} for r in RunDir(path).metrics()]


def _final_model(path: Path) -> dict[str, torch.Tensor]:
    return RunDir.load_checkpoint(RunDir(path).checkpoints()[-1])["model"]


def _untimed(node: Any) -> Any:
    if isinstance(node, dict):
        return {k: _untimed(v) for k, v in node.items() if k not in ("time", "seconds")}
    if isinstance(node, list):
        return [_untimed(v) for v in node]
    return node


# tiny configurations, a second or less each on one thread
TINY: dict[str, dict[str, Any]] = {
    "boolean": {"steps": 80},
    "grokking": {"epochs": 24, "eval_every": 6, "sens_examples": 16},
    "sparse_parity": {"epochs": 3, "bool_samples": 16},
    "sparse_frequent": {"epochs": 4},
    "attention": {"steps": 200},
}


def _tiny(name: str, **extra: Any) -> Any:
    return dataclasses.replace(get_trainer(name).example(), **{**TINY[name], **extra})


# -- a diverged step ------------------------------------------------------------------------------
def test_sgd_step_refuses_a_nan_loss_before_stepping() -> None:
    w = torch.nn.Parameter(torch.ones(3))
    opt = torch.optim.SGD([w], lr=0.5)
    with pytest.raises(FloatingPointError, match=r"training loss became nan; lower lr \(now 0.5\)"):
        sgd_step(opt, (w * float("nan")).sum())
    assert torch.equal(w.detach(), torch.ones(3))  # the weights are still the finite ones


@pytest.mark.parametrize(("name", "extra", "epoch"), [
    ("grokking", {"lr": 1e4, "epochs": 40, "eval_every": 10}, 3),
    ("sparse_parity", {"lr": 1e6, "epochs": 3, "eval_every": 3}, 1),
])
def test_a_diverged_epoch_trainer_stops_at_the_step_that_diverged(
        tmp_path: Path, name: str, extra: dict[str, Any], epoch: int) -> None:
    """The step's loss went NaN and the run trained on NaN weights until its next evaluation,
    where a measurement failed with "model output is NaN or infinite ... check the model's
    weights and the inputs" (grokking) or "f returned NaN or infinite outputs" (sparse parity):
    nothing said the training had diverged, at which epoch, or which setting to lower."""
    cfg = _tiny(name, **extra)
    with pytest.raises(FloatingPointError, match=(
            rf"training loss became nan; lower lr \(now {cfg.lr}\) or check the data "
            rf"\(in epoch {epoch}, which began after step \d+\)")):
        _train(name, cfg, tmp_path / "run")
    logged = _records(tmp_path / "run")
    assert [r["epoch"] for r in logged] == [0]  # only the untrained model's evaluation
    assert not (tmp_path / "run" / "summary.json").exists()


def test_a_diverged_boolean_run_stops_at_the_step_that_diverged(tmp_path: Path) -> None:
    """Before: 18 more steps on NaN weights, then at the step-20 evaluation "the loss of the
    clean model is NaN, so sharpness is undefined; check the model, loss_fn, inputs and
    targets" — a loss_fn the user never gave."""
    cfg = _tiny("boolean", lr=1e6, steps=60)
    with pytest.raises(FloatingPointError,
                       match=r"training loss became nan at step 2; lower lr \(now 1000000.0\)"):
        _train("boolean", cfg, tmp_path / "run")
    assert _records(tmp_path / "run") == [] and not RunDir(tmp_path / "run").checkpoints()


# -- the grokking phases --------------------------------------------------------------------------
def _history(train: list[float], test: list[float], sens: list[float]) -> list[dict[str, Any]]:
    return [{"epoch": 100 * i, "train/acc": a, "test/acc": b, "sens/train": s,
             "weight_norm": 1.0} for i, (a, b, s) in enumerate(zip(train, test, sens, strict=True))]


def test_sens_before_jump_is_none_when_the_jump_comes_with_memorisation() -> None:
    """Train acc reaches 0.99 and test acc 0.5 at the same evaluation (epoch 200): no evaluation
    lies between them, and ``sens_before_jump`` was 0.3, the value *at* the jump."""
    ph = grokking_phases(_history([0.1, 0.6, 1.0, 1.0], [0.0, 0.1, 0.6, 0.97],
                                  [0.1, 0.4, 0.3, 0.2]))
    assert (ph["memorisation_epoch"], ph["jump_epoch"], ph["generalisation_epoch"]) == (200, 200,
                                                                                        300)
    assert ph["sens_before_jump"] is None
    assert (ph["sens_peak"], ph["sens_at_generalisation"]) == (0.3, 0.2)


def test_sens_before_jump_is_the_evaluation_just_before_the_jump() -> None:
    ph = grokking_phases(_history([0.1, 1.0, 1.0, 1.0, 1.0], [0.0, 0.0, 0.2, 0.7, 0.99],
                                  [0.1, 0.5, 0.25, 0.15, 0.05]))
    assert ph["jump_epoch"] == 300 and ph["sens_before_jump"] == 0.25  # epoch 200's
    assert (ph["peak_epoch"], ph["sens_peak"]) == (100, 0.5)


# -- same seed, same numbers; an interrupted run resumed -----------------------------------------
@pytest.mark.parametrize("name", ["boolean", "sparse_parity"])
def test_same_seed_same_numbers_other_seed_other_numbers(tmp_path: Path, name: str) -> None:
    cfg = _tiny(name)
    _train(name, cfg, tmp_path / "a")
    _train(name, cfg, tmp_path / "b")
    _train(name, dataclasses.replace(cfg, seed=cfg.seed + 1), tmp_path / "c")
    a, b, c = (_final_model(tmp_path / k) for k in "abc")
    assert _records(tmp_path / "a") == _records(tmp_path / "b")
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert _records(tmp_path / "a") != _records(tmp_path / "c")
    assert any(not torch.equal(a[k], c[k]) for k in a)


@pytest.mark.parametrize("name", list(TINY))
def test_a_run_stopped_by_sigint_resumes_bit_for_bit(
        tmp_path: Path, name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """A real SIGINT right after the second checkpoint (timed by wrapping the save); the same
    training again resumes from it and ends with the uninterrupted run's records, summary and
    checkpoint (model, optimiser, every generator, counters)."""
    cfg = _tiny(name)
    ref = _train(name, cfg, tmp_path / "ref")
    save = RunDir.save_checkpoint
    saved = []

    def save_then_interrupt(self: RunDir, *args: Any, **kwargs: Any) -> None:
        save(self, *args, **kwargs)
        saved.append(1)
        if len(saved) == 2:
            os.kill(os.getpid(), signal.SIGINT)

    monkeypatch.setattr(RunDir, "save_checkpoint", save_then_interrupt)
    with pytest.raises(TrainingInterrupted):
        _train(name, cfg, tmp_path / "run")
    monkeypatch.setattr(RunDir, "save_checkpoint", save)
    assert not (tmp_path / "run" / "summary.json").exists()
    resumed = _train(name, cfg, tmp_path / "run")
    assert _untimed(resumed) == _untimed(ref)
    assert _records(tmp_path / "run") == _records(tmp_path / "ref")
    a = RunDir.load_checkpoint(RunDir(tmp_path / "ref").checkpoints()[-1])
    b = RunDir.load_checkpoint(RunDir(tmp_path / "run").checkpoints()[-1])
    assert a.keys() == b.keys()

    def same(x: Any, y: Any) -> bool:
        if isinstance(x, torch.Tensor):
            return torch.equal(x, y)
        if isinstance(x, dict):
            return x.keys() == y.keys() and all(same(x[k], y[k]) for k in x if k != "time")
        if isinstance(x, (list, tuple)):
            return len(x) == len(y) and all(map(same, x, y))
        return bool(x == y)

    differ = [k for k in a if k != "elapsed" and not same(a[k], b[k])]
    assert not differ, f"{name}: {differ} differ after the resume"


# -- the metrics are what their names say ---------------------------------------------------------
def test_sparse_parity_metrics_recomputed_from_the_saved_model(tmp_path: Path) -> None:
    """``test/acc`` on the test split and ``bool_sens`` = E_x Σᵢ 1[ŷ(x) ≠ ŷ(x^⊕i)] (here the
    exact average over the whole cube, which the sampled value must sit near)."""
    cfg = _tiny("sparse_parity", n_bits=8, epochs=4, bool_samples=256)
    _train("sparse_parity", cfg, tmp_path / "run")
    last = _records(tmp_path / "run")[-1]
    model = create_model("parity_transformer", n_bits=cfg.n_bits, dim=cfg.width, heads=cfg.heads,
                         layers=cfg.layers, mlp_dim=4 * cfg.width, seed=cfg.seed)
    model.load_state_dict(_final_model(tmp_path / "run"))
    model.eval()
    opts = {"n_bits": cfg.n_bits, "k": cfg.k, "train_size": cfg.train_size,
            "test_size": cfg.test_size, "seed": cfg.seed}
    test = create_dataset("sparse_parity", "test", **opts)
    cube = torch.tensor(list(itertools.product([1.0, -1.0], repeat=cfg.n_bits)))
    with torch.no_grad():
        acc = (model(test.inputs).argmax(1) == test.targets).float().mean().item()
        pred = model(cube).argmax(1)
        flips = torch.zeros(len(cube))
        for i in range(cfg.n_bits):
            other = cube.clone()
            other[:, i] *= -1
            flips += (model(other).argmax(1) != pred).float()
    assert last["test/acc"] == acc
    exact = flips.mean().item()
    assert abs(last["bool_sens"] - exact) <= 4 * last["bool_sens_se"] + 1e-9, (last, exact)


def test_sparse_frequent_accuracies_are_on_their_own_splits(tmp_path: Path) -> None:
    cfg = _tiny("sparse_frequent")
    _train("sparse_frequent", cfg, tmp_path / "run")
    last = _records(tmp_path / "run")[-1]
    vocab = create_dataset("sparse_frequent", "train", num_samples=2, case=cfg.case,
                           setting=cfg.setting, seed=cfg.seed).inputs.shape[-1]
    model = create_model("sparse_attention", dim=vocab, init_scale=cfg.init_scale, seed=cfg.seed)
    model.load_state_dict(_final_model(tmp_path / "run"))
    got = {}
    for split, size in (("train", cfg.train_size), ("test", cfg.test_size),
                        ("ood", cfg.test_size)):
        data = create_dataset("sparse_frequent", split, num_samples=size, case=cfg.case,
                              setting=cfg.setting, seed=cfg.seed)
        with torch.no_grad():
            got[split] = ((model(data.inputs) > 0).long() == data.targets).float().mean().item()
        assert last[f"{split}/acc"] == got[split]
    assert got["test"] != got["ood"]  # the OOD split is another set of sequences
