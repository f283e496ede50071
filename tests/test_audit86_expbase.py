"""Audit 86 of the experiment framework's ladder runner: a rung that would be refused is refused
before any rung trains, not once every rung below it has trained.

* A rung the experiment refuses in :meth:`Experiment.prepare` (its data has no max-margin target,
  its dataset is missing) passed ``run_ladder``'s up-front check (overrides only) and was refused
  after the rungs below it had trained.
* A rung whose directory holds runs of other extra overrides (trained before with ``--rungs b
  --set lr=…``) was refused as "a different configuration" after the rungs below it had trained.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from senslab.experiments import get_experiment, run_experiment
from senslab.experiments.base import Rung
from senslab.experiments.ladder import run_ladder

IB = ("data.num_samples=8", "data.seq_len=4", "data.dim=8")
HR = ("dim=8", "eval_every=3", "batch=32", "eval_size=32", "n_values=[3]",
      "functions=['parity']")


def test_a_rung_the_experiment_refuses_is_refused_before_any_rung_trains(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # rung b's data (32 sequences of dimension 7) has no max-margin target for seed 1: ib_joint
    # refuses it in prepare; before, rung a's eight runs trained first
    ladder = (Rung("a", "cpu", ("steps=3", *IB), size=1),
              Rung("b", "cpu", ("steps=3", "data.dim=7"), size=2))
    monkeypatch.setattr(type(get_experiment("ib_joint")), "ladder", ladder)
    lines: list[str] = []
    out = tmp_path / "lad"
    with pytest.raises(ValueError, match=r"sgd-s1 .*no max-margin target"):
        run_ladder("ib_joint", out, extra=["seeds=2", "batch_size=4"], log=lines.append)
    assert not out.exists()  # nothing trained, nothing written
    assert lines == ["rung b is refused (below); no rung was trained"]


def test_a_rung_whose_directory_holds_other_runs_is_refused_before_any_rung_trains(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    ladder = (Rung("a", "cpu", ("steps=3", *HR), size=1),
              Rung("b", "cpu", ("steps=6", *HR), size=2))
    monkeypatch.setattr(type(get_experiment("hr_sharpness_vs_length")), "ladder", ladder)
    out = tmp_path / "lad"
    # rung b trained alone before, with an extra lr (as `--rungs b --set lr=0.01` trains it)
    run_experiment("hr_sharpness_vs_length", out / "b",
                   overrides=[*ladder[1].overrides, "seeds=1", "lr=0.01"], log=lambda _: None)
    with pytest.raises(ValueError, match=r"b/parity-n3-s0 holds a run with a different "
                                         r"configuration \(differs in lr\)"):
        run_ladder("hr_sharpness_vs_length", out, extra=["seeds=1"], log=lambda _: None)
    assert not (out / "a").exists()  # before: rung a trained, then rung b was refused
    assert not (out / "ladder.json").exists()
