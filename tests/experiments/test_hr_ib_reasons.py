"""The words of the hahn_rofin and implicit_bias verdicts: a value that is not finite is named by
run, measure and step; runs left out are named; advice fits the case (a frozen run cannot be
helped by training longer). The verdict rules themselves are unchanged: the words and the
evidence gain the names, the verdict words and the parts stay as they were."""

from __future__ import annotations

import math
from typing import Any

import pytest

from senslab.experiments.hahn_rofin.norm_vs_blowup import norm_blowup_verdict
from senslab.experiments.hahn_rofin.parity_dynamics import dynamics_verdict, peaks
from senslab.experiments.hahn_rofin.random_functions import completion_verdict
from senslab.experiments.hahn_rofin.sharpness_vs_length import slope_verdict
from senslab.experiments.implicit_bias._common import loss_race_verdict
from senslab.experiments.implicit_bias.fixed_v import fixed_v_verdict, norm_growth
from senslab.experiments.implicit_bias.joint import joint_verdict
from senslab.verdicts import INCONCLUSIVE, NOT_COMPARABLE, SUPPORTED

NAN = math.nan
FUNCTIONS = ("parity", "majority", "first", "mean")


# ------------------------------------------------------------ hr_sharpness_vs_length
def _length_runs(nan_at: tuple[str, int, int] | None = None,
                 unconverged: tuple[str, int, int] | None = None) -> list[dict[str, Any]]:
    """Two seeds at n = 4, 6, 8 per function, PARITY's sharpness rising 0.1 per n, the others
    flat (with a little curvature so that no fit is exact)."""
    runs = []
    for f in FUNCTIONS:
        for n in (4, 6, 8):
            for seed in range(2):
                v = (0.1 if f == "parity" else 0.0) * n + 0.01 * seed + 0.001 * n * n
                if (f, n, seed) == nan_at:
                    v = NAN
                runs.append({"name": f"{f}-n{n}-s{seed}", "function": f, "n": n, "seed": seed,
                             "converged": (f, n, seed) != unconverged,
                             "final": {"sharpness/loss": v, "step": 1500}})
    return runs


def test_a_nan_sharpness_is_named_with_its_run_measure_step_and_parts() -> None:
    """The parts read "cannot be judged (the value is not finite)" and nothing said which run
    was NaN: the researcher had to open every run directory."""
    v = slope_verdict(_length_runs(nan_at=("parity", 6, 1)), claimed=FUNCTIONS)
    assert v["verdict"] == INCONCLUSIVE  # the rule: a NaN slope cannot be judged
    assert all(p["effect"] is None for p in v["effects"].values())  # as before: all NaN
    assert "parity-n6-s1 (sharpness/loss = nan at its final evaluation, step 1500)" in v["reason"]
    # PARITY's fit enters every part: all four are named as the ones it leaves unjudged
    assert "parts parity slope, first flat, majority flat, mean flat cannot be judged" in \
        v["reason"]
    assert v["evidence"]["not_finite"] == {
        "parity": ["parity-n6-s1 (sharpness/loss = nan at its final evaluation, step 1500)"]}


def test_a_nan_sharpness_of_a_flat_function_names_only_its_part() -> None:
    v = slope_verdict(_length_runs(nan_at=("mean", 8, 0)), claimed=FUNCTIONS)
    assert v["effects"]["mean flat"]["effect"] is None
    # 0.1 + 0.001 · (the least-squares slope of n² on n = 4, 6, 8: 2 · 6 = 12)
    assert v["effects"]["parity slope"]["effect"] == pytest.approx(0.112)
    assert "so mean's fit and the part mean flat cannot be judged: mean-n8-s0" in v["reason"]


def test_a_run_left_out_as_not_converged_is_named() -> None:
    """The parts said "(…, 5 runs)" where 6 were asked for, without saying which one was
    dropped or why."""
    full = slope_verdict(_length_runs(), claimed=FUNCTIONS)
    v = slope_verdict(_length_runs(unconverged=("first", 8, 0)), claimed=FUNCTIONS)
    assert v["verdict"] == full["verdict"] == SUPPORTED
    assert v["effects"]["first flat"]["seeds"] == 6 + 5
    assert "not converged (1 of 24 runs): first-n8-s0" in v["reason"]
    assert v["evidence"]["not_converged_runs"] == ["first-n8-s0"]
    assert "not converged" not in full["reason"] and "not_finite" not in full["evidence"]


# ------------------------------------------------------------ hr_random_functions
def _pair(k: int, seed: int, lsh: float, rsh: float, acc: float = 1.0,
          las: float = 2.0) -> list[dict[str, Any]]:
    common = {"train_size": k, "seed": seed, "random_completion_sens": 4.0 + 0.1 * seed}
    return [{"name": f"learned-k{k}-s{seed}", **common,
             "final": {"train/acc": acc, "bool_sens": las, "sharpness/loss": lsh,
                       "sharpness/loss_se": 0.01, "step": 2000}},
            {"name": f"random-k{k}-s{seed}", **common,
             "final": {"train/acc": 1.0, "bool_sens": 4.0, "sharpness/loss": rsh,
                       "sharpness/loss_se": 0.01, "step": 1900}}]


def test_random_functions_names_a_nan_sharpness_and_an_unfitted_pair() -> None:
    runs = [*_pair(32, 0, 0.1, 0.5), *_pair(32, 1, NAN, 0.55), *_pair(32, 2, 0.12, 0.6),
            *_pair(64, 0, 0.1, 0.5, acc=0.5), *_pair(64, 1, 0.11, 0.52, las=2.2)]
    v = completion_verdict(runs)
    assert v["effects"]["sharpness"]["effect"] is None  # seed 1's mean is NaN, as before
    assert v["effects"]["as"]["effect"] is not None
    assert ("learned-k32-s1 (sharpness/loss = nan at its final evaluation, step 2000; part "
            "sharpness)") in v["reason"]
    assert "Left out, not fitted: k=64 seed 0 (learned-k64-s0 did not fit)" in v["reason"]
    assert "over 3 seeds (4 fitted (k, seed) pairs" in v["reason"]
    assert v["evidence"]["left_out"] == ["k=64 seed 0 (learned-k64-s0 did not fit)"]


def test_random_functions_names_an_infinite_measurement_error() -> None:
    runs = [*_pair(32, 0, 0.1, 0.5), *_pair(32, 1, 0.11, 0.55), *_pair(32, 2, 0.12, 0.6)]
    runs[3]["final"]["sharpness/loss_se"] = math.inf  # random-k32-s1
    v = completion_verdict(runs)
    part = v["effects"]["sharpness"]
    assert part["verdict"] == INCONCLUSIVE and part["se"] is None  # an infinite s.e.
    assert "random-k32-s1 (sharpness/loss_se = inf at its final evaluation, step 1900" in \
        v["reason"]


# ------------------------------------------------------------ ib_joint and the loss races
def _joint(label: str, seed: int, loss: float, align: float) -> dict[str, Any]:
    return {"label": label, "seed": seed, "name": f"{label}-s{seed}", "steps": 3000,
            "final": {"step": 3000, "train/loss": loss, "attn/alignment": align,
                      "attn/v_alignment": align, "attn/sparsity": align}}


def _joint_runs() -> list[dict[str, Any]]:
    values = {"sgd": (0.5, 0.5), "sngd": (0.1, 0.9), "sps": (0.1, 0.85), "adam": (0.05, 0.92)}
    return [_joint(o, k, loss + (0.001 * k if o in ("sngd", "sps") else 0),
                   align + (0.001 * k if o in ("sngd", "sps") else 0))
            for k in range(3) for o, (loss, align) in values.items()]


def test_joint_names_the_run_metric_and_step_that_is_not_finite() -> None:
    runs = _joint_runs()
    assert joint_verdict(runs)["verdict"] == SUPPORTED
    runs[5]["final"]["attn/v_alignment"] = NAN  # sngd, seed 1
    runs[11]["final"]["train/loss"] = math.inf  # adam, seed 2
    v = joint_verdict(runs)
    assert v["verdict"] == NOT_COMPARABLE
    assert "sngd-s1 (attn/v_alignment = nan at its final evaluation, step 3000)" in v["reason"]
    assert "adam-s2 (train/loss = inf at its final evaluation, step 3000)" in v["reason"]
    assert len(v["evidence"]["not_finite"]) == 2


def test_loss_race_names_the_run_whose_loss_is_not_finite() -> None:
    losses = {"sgd": [1.0, 1.1, 0.9], "sngd": [0.3, 0.5, 0.2], "sps": [0.4, 0.45, 0.35],
              "adam": [0.2, 0.25, 0.1]}
    runs = [{"label": o, "seed": k, "name": f"{o}-s{k}", "steps": 200,
             "final": {"train/loss": x}} for o, xs in losses.items() for k, x in enumerate(xs)]
    runs[4]["final"]["train/loss"] = NAN  # sngd, seed 1
    v = loss_race_verdict(runs)
    assert v["verdict"] == NOT_COMPARABLE
    assert "sngd-s1 (train/loss = nan at step 200)" in v["reason"]


# ------------------------------------------------------------ ib_fixed_v: a frozen run
def test_norm_growth_records_where_the_run_froze() -> None:
    recs = [{"step": s, "attn/W_norm": float(min(s, 500))} for s in (100, 200, 300, 500, 600)]
    fit = norm_growth(recs, 100)
    assert fit["froze_at"] == 600 and fit["fit_points"] == 4  # 600 repeats 500's ‖W‖
    moving = norm_growth([{"step": s, "attn/W_norm": float(s)} for s in (100, 200, 300)], 100)
    assert "froze_at" not in moving


def _fv(label: str, seed: int, reach: float, r2: tuple[float, float],
        froze: float | None = None) -> dict[str, Any]:
    fit = {"r2_lin": r2[0], "r2_log": r2[1], "slope_lin": 1.0, "slope_log": 1.0}
    if froze is not None:
        fit["froze_at"] = froze
    return {"label": label, "seed": seed, "name": f"{label}-s{seed}", "steps": 20000,
            "final": {"attn/alignment": 0.9, "attn/sparsity": 0.9, "attn/W_norm": 10.0},
            "fit": fit, "reach": {"alignment": reach, "sparsity": reach}}


def _race(ngd_frozen: int | None = None, polyak_cut: int | None = None) -> list[dict[str, Any]]:
    """Four seeds: GD there after ~9,000 steps; NGD after ~1,000 except in seed ``ngd_frozen``
    (froze below 0.99 at step 5,012); Polyak after ~30 except in seed ``polyak_cut`` (ran out
    of its 20,000 steps)."""
    out = []
    for k in range(4):
        j = 0.001 * k
        out += [_fv("gd", k, 9000.0 + k, (0.8 + j, 0.95)),
                _fv("ngd", k, math.inf if k == ngd_frozen else 1000.0 + 10 * k, (0.99, 0.7 + j),
                    froze=5012.0 if k == ngd_frozen else None),
                _fv("polyak", k, math.inf if k == polyak_cut else 30.0 + k, (0.99, 0.8 + j))]
    return out


def test_a_contender_frozen_below_the_level_is_not_told_to_train_longer() -> None:
    """NGD froze below 0.99 alignment in seed 3 (gradient exactly 0): the part said "train
    longer", which cannot move a run whose W never changes again."""
    v = fixed_v_verdict(_race(ngd_frozen=3, polyak_cut=2))
    ngd = v["effects"]["ngd aligns faster"]
    assert ngd["verdict"] == INCONCLUSIVE and ngd["se"] is None  # the rule is unchanged
    assert "train longer" not in ngd["method"]
    assert "froze below 0.99 alignment in seed 3" in ngd["method"]
    assert "by step 5012" in ngd["method"] and "training longer cannot get it there" in \
        ngd["method"]
    # a contender that merely ran out of steps is still told to train longer
    polyak = v["effects"]["polyak aligns faster"]
    assert "never reached 0.99 alignment in seed 2 within its 20000 steps" in polyak["method"]
    assert polyak["method"].endswith("train longer") and "froze" not in polyak["method"]
    assert "froze below 0.99 alignment in seed 3" in v["reason"]


def test_a_run_that_froze_before_the_fit_window_filled_is_told_to_lower_fit_from() -> None:
    runs = _race()
    runs[-1]["fit"] = {"fit_points": 2.0, "froze_at": 200.0}  # polyak-s3 froze
    runs[-2]["fit"] = {"fit_points": 1.0}  # ngd-s3 ran out of steps
    v = fixed_v_verdict(runs)
    assert v["verdict"] == NOT_COMPARABLE
    froze, ended = v["reason"].split("; ended before")
    assert "polyak-s3 (‖W‖ unchanged at step 200)" in froze and "lower fit_from" in froze
    assert "run longer" not in froze and "training longer adds no point" in froze
    assert "ngd-s3" in ended and "run longer" in ended


# ------------------------------------------------------------ hr_parity_dynamics
def _dyn(seed: int, t0: int | None) -> dict[str, Any]:
    recs = [{"step": 10 * (i + 1), "sharpness/loss": v, "blowup/log10": v}
            for i, v in enumerate([1.0, 2.0, 5.0, 3.0, 2.0, 1.0 + 0.1 * seed])]
    return {"name": f"parity-n8-s{seed}", "converged": True, "config": {},
            "peaks": peaks(recs, t0, 0.25, 10)}


def test_parity_dynamics_names_the_runs_that_never_reached_t0() -> None:
    """Two of three runs reached loss < 0.01: the parts said "2 seeds" with no word that a
    third was asked for and left out."""
    v = dynamics_verdict([_dyn(0, 30), _dyn(1, 40), _dyn(2, None)])
    assert v["effects"]["sharpness"]["seeds"] == 2
    assert v["reason"].startswith("over 2 of 3 runs, sharpness and blow-up peak near t0")
    assert "left out, never reached loss < 0.01 (no t0): parity-n8-s2" in v["reason"]


# ------------------------------------------------------------ hr_norm_vs_blowup
def test_norm_vs_blowup_names_the_runs_left_out_as_not_converged() -> None:
    runs = [{"name": f"r{i}", "converged": i != 5,
             "final": {"bool_sens": 1.0 + i // 2, "param_norm": 10.0 + i,
                       "blowup/log10": 0.1 * i}} for i in range(7)]
    v = norm_blowup_verdict(runs)
    assert v["effects"]["rho"]["seeds"] == 6
    assert "over 6 converged runs (of 7)" in v["reason"]
    assert "left out, not converged: r5" in v["reason"]
