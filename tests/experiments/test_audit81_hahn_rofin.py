"""Audit 81 (Hahn & Rofin): the sweep correlation's bootstrap with a rare sensitivity level, and
early stops that contradict the settings the verdict rests on."""

from __future__ import annotations

import math
import random
from typing import Any

import pytest

from senslab.experiments import get_experiment
from senslab.experiments.hahn_rofin.norm_vs_blowup import norm_blowup_verdict, permutation_p
from senslab.verdicts import INCONCLUSIVE, SUPPORTED


def _summary(i: int, sens: float, norm: float, blow: float) -> dict[str, Any]:
    return {"name": f"{i:02d}-run", "converged": True, "config": {"weight_decay": 0.1},
            "final": {"param_norm": norm, "blowup/log10": blow, "bool_sens": sens}}


def _sweep(m: int, rare: int, seed: int = 1) -> list[dict[str, Any]]:
    """m converged runs: m − rare of FIRST (as 1) at random norms, ``rare`` of PARITY (as 8)
    furthest from the origin."""
    rng = random.Random(seed)
    out = [_summary(i, 1.0, 10 + rng.random(), rng.random()) for i in range(m - rare)]
    return out + [_summary(m - rare + j, 8.0, 30.0 + j, 2.0) for j in range(rare)]


def _c(s: dict[str, Any]) -> float:
    return math.log10(s["final"]["param_norm"]) + s["final"]["blowup/log10"]


@pytest.mark.parametrize("m", [12, 16])
def test_one_run_of_a_rare_level_is_not_supported_by_a_conditional_bootstrap(m: int) -> None:
    """One PARITY run furthest out among 12 (16) read ρ = 0.48 'supported', p = 0.02 (0.01):
    the bootstrap left out the resamples without it (no ρ), so its s.e. was that of the
    resamples that held it. The permutation p is 2/m (it is at one of the two ends by chance)."""
    runs = _sweep(m, 1)
    v = norm_blowup_verdict(runs)
    part = v["effects"]["rho"]
    exact = 2 / m
    assert v["verdict"] == INCONCLUSIVE
    assert part["p"] == pytest.approx(exact, abs=0.015)
    assert part["p"] == pytest.approx(permutation_p([s["final"]["bool_sens"] for s in runs],
                                                    [_c(s) for s in runs])[0])
    assert "random orderings" in part["method"] and "not the bootstrap" in part["method"]
    lo, hi = part["interval"]
    assert lo < 0 < part["effect"] < hi


def test_common_levels_keep_the_bootstrap_and_a_real_order_is_supported() -> None:
    """No resample lacks a level (6 runs each): the bootstrap decides as before; 3 PARITY runs
    of 30 furthest out stay supported under the permutation test (p = 4e-4)."""
    rng = random.Random(2)
    runs = [_summary(i, 1.0 + 7.0 * (i % 2), 10 + 20 * (i % 2) + rng.random(), rng.random())
            for i in range(12)]
    part = norm_blowup_verdict(runs)["effects"]["rho"]
    assert part["method"].startswith("bootstrap over 12 runs")
    v = norm_blowup_verdict(_sweep(30, 3))
    assert v["verdict"] == SUPPORTED and v["effects"]["rho"]["p"] < 0.001
    assert "not the bootstrap" in v["effects"]["rho"]["method"]


def test_random_functions_refuse_an_early_stop_above_the_fit_bound() -> None:
    """stop_loss=0.01 with converged_loss=0.001: runs stopped at training loss 0.007 with
    accuracy 1.0 were left out as 'did not fit', every pair of them: 'not comparable'."""
    exp = get_experiment("hr_random_functions")
    with pytest.raises(ValueError, match=r"stop_loss=0.01 stops each run .* converged_loss="
                                         r"0.001 .* give stop_loss at most converged_loss"):
        exp.resolve("paper", ["seeds=1", "stop_loss=0.01"])
    with pytest.raises(ValueError, match="stop_loss"):
        exp.resolve("cpu", ["converged_loss=0.001"])  # the CPU scale's stop_loss is 0.01
    for scale, over in (("paper", ["seeds=1", "stop_loss=0.001"]),
                        ("paper", ["seeds=1"]), ("cpu", [])):
        settings, runs = exp.resolve(scale, over)
        assert all(r.config.stop_below == settings.stop_loss for r in runs)


def test_parity_dynamics_refuse_an_early_stop_that_ends_the_runs_at_t0() -> None:
    """--set stop_below=0.01 ended every run at about t0 (n = 4: t0 = 197 and 191, the last
    evaluations 225), and the blow-up's maximum there read 'last step, still rising'."""
    exp = get_experiment("hr_parity_dynamics")
    with pytest.raises(ValueError, match=r"--set stop_below=0.01: hr_parity_dynamics sets "
                                         r"stop_below itself .* shorten the runs with steps"):
        exp.resolve("cpu", ["stop_below=0.01"])
    _, runs = exp.resolve("cpu", ["steps=300"])
    assert {(r.config.steps, r.config.stop_below) for r in runs} == {(300, None)}
