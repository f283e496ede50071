"""Audit 77, area ``fit``: settings a run records but never trains with are refused or said
(optimizer settings the optimizer does not read; a learning-rate schedule that never changes the
rate, or that ``train.max_steps`` cuts short), and an unknown ``--set`` key names the key meant."""

from __future__ import annotations

import warnings
from pathlib import Path

import pytest
import torch

from senslab.train.config import RunConfig, apply_overrides, validate
from senslab.train.loop import fit
from senslab.train.rundir import RunDir

TINY = ["data.name=digits", "device=cpu", "train.batch_size=128", "train.epochs=1",
        "model.name=mlp", "model.overrides.widths=[8]", "model.overrides.image_size=8",
        "model.overrides.sens_patch=2", "track.num_examples=16", "track.eval_examples=64",
        "track.sigma=0", "seed=3"]


def train(path: Path, extra: list[str]) -> tuple[list[str], dict[str, torch.Tensor]]:
    """The UserWarnings of a tiny run and its final weights."""
    cfg = apply_overrides(RunConfig(name="t"), TINY + extra)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        fit(cfg, path, progress=False)
    said = [str(w.message) for w in caught if issubclass(w.category, UserWarning)]
    rd = RunDir(path)
    return said, RunDir.load_checkpoint(rd.checkpoints()[-1])["model"]


# -- optimizer settings no optimizer reads -----------------------------------------------------
@pytest.mark.parametrize(("items", "match"), [
    (["optim.name=adam", "optim.momentum=0.9"], r"optim.momentum=0.9: optim.name=adam has no SGD"),
    (["optim.name=adamw", "optim.momentum=0.9"], r"optim.momentum=0.9: optim.name=adamw"),
    (["optim.eta_max=0.5"], r"optim.eta_max=0.5: optim.name=sgd has no step-size cap"),
    (["optim.name=adam", "optim.eta_max=0.5"], r"optim.eta_max=0.5: optim.name=adam"),
    (["optim.name=sps", "optim.lr=0.01"], r"optim.lr=0.01: optim.name=sps sets its own"),
    (["optim.gamma=0.1"], r"optim.gamma=0.1: optim.schedule=constant has no steps"),
    (["optim.schedule=cosine", "optim.step_epochs=2"],
     r"optim.step_epochs=2: optim.schedule=cosine has no steps"),
])
def test_an_optimizer_setting_the_run_never_reads_is_refused(items: list[str], match: str
                                                             ) -> None:
    """Adam with optim.momentum=0.9, SGD with optim.eta_max, SPS with optim.lr, a cosine
    schedule with optim.gamma each trained bit for bit as without the setting (the same final
    weights), while config.json and the reports carried it."""
    cfg = apply_overrides(RunConfig(), items)
    with pytest.raises(ValueError, match=match):
        validate(cfg)


@pytest.mark.parametrize("items", [
    ["optim.momentum=0.9"], ["optim.name=ngd", "optim.eta_max=0.5"],
    ["optim.name=sps", "optim.eta_max=0.5"], ["optim.name=adamw", "optim.weight_decay=0.1"],
    ["optim.schedule=step", "optim.step_epochs=2", "optim.gamma=0.1"],
])
def test_the_settings_an_optimizer_reads_pass(items: list[str]) -> None:
    validate(apply_overrides(RunConfig(), items))


# -- a schedule the run never follows ---------------------------------------------------------
def test_a_cosine_schedule_over_one_epoch_is_said_to_leave_the_rate_constant(
        tmp_path: Path) -> None:
    """Cosine steps once per epoch: over train.epochs=1 the whole run trained at optim.lr,
    giving exactly the weights of optim.schedule=constant, without a word."""
    said, cosine = train(tmp_path / "cosine", ["optim.schedule=cosine"])
    _, constant = train(tmp_path / "constant", [])
    assert all(torch.equal(cosine[k], constant[k]) for k in constant)  # what is said below
    assert any("optim.schedule=cosine" in s and "stays at optim.lr=0.1 throughout" in s
               and "train.epochs=2 or more" in s for s in said), said


def test_a_cosine_cut_short_by_max_steps_is_said_with_its_last_rate(tmp_path: Path) -> None:
    """A cosine over train.epochs=10 stopped by train.max_steps=30 (12 steps an epoch) ended at
    lr 0.0905 of 0.1: recorded as cosine, trained near constant."""
    said, _ = train(tmp_path / "run", ["optim.schedule=cosine", "train.epochs=10",
                                       "train.max_steps=30"])
    assert any("train.max_steps=30" in s and "its last epoch trains at 0.0905, not near 0" in s
               and "Set train.epochs=3" in s for s in said), said


def test_a_step_schedule_that_never_reaches_its_first_step_is_said(tmp_path: Path) -> None:
    said, _ = train(tmp_path / "run", ["optim.schedule=step", "train.epochs=2",
                                       "train.max_steps=14"])
    assert any("optim.step_epochs=8" in s and "stays at optim.lr=0.1" in s
               and "optim.step_epochs=1 or less" in s for s in said), said


def test_a_schedule_the_run_follows_is_not_said(tmp_path: Path) -> None:
    said, _ = train(tmp_path / "run", ["optim.schedule=cosine", "train.epochs=2"])
    assert not [s for s in said if "optim.schedule" in s], said


# -- unknown keys ------------------------------------------------------------------------------
@pytest.mark.parametrize(("typo", "meant"), [
    ("train.lr", "optim.lr"),  # was 'train.loss'
    ("lr", "optim.lr"),  # was no suggestion
    ("train.seed", "seed"),  # was 'train.loss'
    ("model.depth", "model.overrides.depth"),  # was 'model.name'
    ("data.max_len", "data.options.max_len"),  # was 'train.max_steps'
    ("optim.lrr", "optim.lr"), ("data.subset", "data.train_subset"),  # spelling still found
])
def test_an_unknown_key_names_the_key_meant(typo: str, meant: str) -> None:
    with pytest.raises(KeyError, match=rf"unknown config key '{typo}'\. Did you mean '{meant}'\?"):
        apply_overrides(RunConfig(), [f"{typo}=1"])
