"""Audit 80 of the Hahn & Rofin experiments: verdict reasons that said something else than what
kept the runs out, and lists that trained nothing (or the wrong thing) refused before any
directory is written."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from senslab.experiments import get_experiment, run_experiment
from senslab.experiments.hahn_rofin.parity_dynamics import dynamics_verdict
from senslab.experiments.hahn_rofin.random_functions import completion_verdict
from senslab.experiments.hahn_rofin.sharpness_vs_length import slope_verdict
from senslab.verdicts import NOT_COMPARABLE


def _dynamics(name: str, t0: int | None, converged: bool) -> dict[str, Any]:
    """A paper-scale summary (converged_loss set) whose measures peak at t0."""
    peaks: dict[str, Any] = {"t0": t0}
    if t0 is not None:
        at = {"peak_step": t0, "offset": 0, "at_end": False}
        peaks.update(tolerance=50, sharpness=dict(at), blowup=dict(at))
    return {"name": name, "converged": converged, "config": {"converged_loss": 1e-3},
            "peaks": peaks}


def test_dynamics_not_comparable_names_the_runs_left_out_as_not_converged() -> None:
    """All three runs reached loss < 0.01 (t0 100, 120, 110), two did not converge: the reason
    said "only 1 of 3 runs reached loss < 0.01" and named neither."""
    v = dynamics_verdict([_dynamics("parity-n25-s0", 100, True),
                          _dynamics("parity-n25-s1", 120, False),
                          _dynamics("parity-n25-s2", 110, False)])
    assert v["verdict"] == NOT_COMPARABLE
    assert "reached loss < 0.01" not in v["reason"].split(";")[0].split("(")[0]
    assert v["reason"].startswith("1 of 3 runs can be judged")
    assert "not converged (final held-out loss not below the scale's converged_loss): " \
           "parity-n25-s1, parity-n25-s2" in v["reason"]


def test_dynamics_one_seed_says_two_are_needed_and_names_a_run_without_t0() -> None:
    one = dynamics_verdict([_dynamics("parity-n8-s0", 100, True)])
    assert one["verdict"] == NOT_COMPARABLE
    assert "needs at least 2 (seeds ≥ 2)" in one["reason"]
    two = dynamics_verdict([_dynamics("parity-n8-s0", 100, True),
                            _dynamics("parity-n8-s1", None, False)])
    assert "never reached loss < 0.01 (no t0): parity-n8-s1" in two["reason"]


def _run(f: str, n: int, converged: bool, seed: int = 0) -> dict[str, Any]:
    return {"name": f"{f}-n{n}-s{seed}", "function": f, "n": n, "converged": converged,
            "final": {"sharpness/loss": 0.1 * n, "step": 1500}}


def test_slope_verdict_at_a_single_n_does_not_blame_convergence() -> None:
    """Every run converged, at one n: the reason said "fewer than two n values converged"."""
    v = slope_verdict([_run("parity", 4, True), _run("parity", 4, True, seed=1)])
    assert v["verdict"] == NOT_COMPARABLE
    assert "converged" not in v["reason"]
    assert "runs at n = 4 only" in v["reason"] and "give n_values two or more" in v["reason"]


def test_slope_verdict_names_the_unconverged_runs_and_the_whole_rule() -> None:
    """The rule is the trainer's converged (the loss bound of a scale that sets one too), not
    "acc > 0.99" alone; the runs kept out are named."""
    v = slope_verdict([_run("parity", 4, True), _run("parity", 6, False),
                       _run("parity", 8, False)])
    assert v["verdict"] == NOT_COMPARABLE
    assert "(acc > 0.99)" not in v["reason"]
    assert "converged_loss" in v["reason"]
    assert "not converged: parity-n6-s0, parity-n8-s0" in v["reason"]


def test_random_functions_not_comparable_names_the_pairs_that_did_not_fit() -> None:
    def s(kind: str, acc: float) -> dict[str, Any]:
        return {"name": f"{kind}-k32-s0", "train_size": 32, "seed": 0, "converged": acc > 0.99,
                "random_completion_sens": 4.0,
                "final": {"train/acc": acc, "bool_sens": 3.0, "sharpness/loss": 0.1,
                          "step": 2000}}

    v = completion_verdict([s("learned", 1.0), s("random", 0.8)])
    assert v["verdict"] == NOT_COMPARABLE
    assert "k=32 seed 0 (random-k32-s0 did not fit)" in v["reason"]


@pytest.mark.parametrize(("name", "sets", "empty"), [
    ("hr_sharpness_vs_length", ["functions=[]"], "functions is empty"),
    ("hr_sharpness_vs_length", ["n_values=[]"], "n_values is empty"),
    ("hr_random_functions", ["train_sizes=[]"], "train_sizes is empty"),
])
def test_an_empty_list_is_refused_before_anything_is_written(
        tmp_path: Path, name: str, sets: list[str], empty: str) -> None:
    """They trained nothing and recorded "no parity runs to compare with" / "no (k, seed) pair
    where both models fit their training labels"."""
    with pytest.raises(ValueError, match=empty):
        run_experiment(name, tmp_path / "x", overrides=sets, log=lambda _: None)
    assert not (tmp_path / "x").exists()


@pytest.mark.parametrize("function", ["random", "parityx"])
def test_norm_vs_blowup_names_its_functions(function: str) -> None:
    """``functions=[random]`` was refused by the trainer with "give train_size (subset
    training)", a setting this experiment refuses."""
    with pytest.raises(ValueError, match=rf"unknown functions \['{function}'\].*parity, "
                                         "majority, first, mean"):
        get_experiment("hr_norm_vs_blowup").check("cpu", [f"functions={function}"])


@pytest.mark.parametrize("name", ["hr_sharpness_vs_length", "hr_norm_vs_blowup"])
def test_the_fix_an_empty_list_names_resolves(name: str) -> None:
    """The refusal of ``functions=[]`` told to set ``functions=[parity,majority]``, which parses
    as the two names '[parity' and 'majority]' (refused again); the advice given now works."""
    exp = get_experiment(name)
    with pytest.raises(ValueError, match="is empty") as err:
        exp.check("cpu", ["functions=[]"])
    fix = str(err.value).split("e.g. ", 1)[1].replace("--set ", "").split()
    settings = exp.settings("cpu", fix)
    assert settings.functions == ("parity", "majority") and settings.n_values == (4, 6, 8)
