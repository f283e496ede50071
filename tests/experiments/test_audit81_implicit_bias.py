"""Audit 81 of the implicit-bias experiments: what ib_fixed_v and ib_joint refuse before anything
is written.

* ``ib_fixed_v --set steps=50`` (below the default ``fit_from=100``) trained all nine runs and
  only then said "not comparable: too few points to fit ‖W‖"; now refused before training, with
  the steps and the fit_from that would work.
* ``--set data.dim=7`` (32 sequences): seed 1's data has no max-margin W_mm, which the
  ``attention`` trainer found out in its run directory after seed 0's runs had trained, leaving
  experiment.json and a half-written ``gd-s1`` behind; now every seed's data is built first.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from senslab.experiments import get_experiment, run_experiment
from senslab.train.loops.attention import log_schedule

TINY = ["data.num_samples=8", "data.seq_len=4", "data.dim=8"]
FIT = {"ib_fixed_v": ["fit_from=1"], "ib_joint": []}  # 5 steps log 3 points from step 1 on


def test_fixed_v_with_too_few_steps_to_fit_is_refused_before_training(tmp_path: Path) -> None:
    out = tmp_path / "fv"
    with pytest.raises(ValueError, match=r"steps=50 with fit_from=100 .* log 0 of them \(none\) "
                                         r"where the fits need 3.*use steps ≥ 113 or "
                                         r"fit_from ≤ 40"):
        run_experiment("ib_fixed_v", out, overrides=["steps=50", "seeds=1", *TINY],
                       log=lambda _: None)
    assert not out.exists()  # nothing trained, nothing written
    # the two suggestions each give the fits their 3 logged steps, and are the least such
    assert sum(t >= 100 for t in log_schedule(113, 20)) == 3
    assert sum(t >= 100 for t in log_schedule(112, 20)) == 2
    assert [t for t in log_schedule(50, 20) if t >= 40] == [40, 45, 50]
    exp = get_experiment("ib_fixed_v")
    for sets in (["steps=113"], ["steps=50", "fit_from=40"]):
        exp.prepare("cpu", [*sets, "seeds=1", *TINY])  # accepted
    # the settings still resolve (a record of such a run can still be checked and reported)
    settings, _ = exp.resolve("cpu", ["steps=50"])
    assert settings.steps == 50


@pytest.mark.parametrize(("name", "first"), [("ib_fixed_v", "gd-s1"), ("ib_joint", "sgd-s1")])
def test_data_without_a_max_margin_target_is_refused_before_training(
        tmp_path: Path, name: str, first: str) -> None:
    # data.dim=7 with the default 32 sequences: seeds 0 and 2 have a W_mm, seed 1 has none
    out = tmp_path / name
    with pytest.raises(ValueError, match=rf"{name}: the training set of {first} \(data.seed=1, "
                                         r"data.num_samples=32, data.dim=7.*no max-margin "
                                         r"target.*Nothing is trained; use a data.dim of at "
                                         r"least data.num_samples"):
        run_experiment(name, out, overrides=["steps=5", "data.dim=7", *FIT[name]],
                       log=lambda _: None)
    assert not out.exists()  # before: experiment.json, seed 0's runs and a half-written seed 1
