"""The numbers behind the Hahn & Rofin and implicit-bias verdicts, recomputed by hand (numpy,
scipy, brute force) on small made-up run summaries, and what a diverged run (a NaN or infinite
measure) does to them: named and left out or refused, never a number without a word."""

from __future__ import annotations

import itertools
import math
from typing import Any

import numpy as np
import pytest
from scipy import stats

from senslab.experiments.hahn_rofin._common import linear_fit
from senslab.experiments.hahn_rofin.norm_vs_blowup import (
    norm_blowup_verdict,
    permutation_p,
    rank_correlation,
)
from senslab.experiments.hahn_rofin.parity_dynamics import dynamics_verdict, nearness, peaks
from senslab.experiments.hahn_rofin.random_functions import judge_pairs
from senslab.experiments.hahn_rofin.sharpness_vs_length import slope_verdict
from senslab.experiments.implicit_bias._common import loss_race_verdict
from senslab.experiments.implicit_bias.fixed_v import fixed_v_verdict, growth_fits, norm_growth
from senslab.experiments.implicit_bias.joint import joint_verdict
from senslab.verdicts import NOT_COMPARABLE

NAN = math.nan


# ------------------------------------------------------------ hr_sharpness_vs_length
def _ols(x: np.ndarray, y: np.ndarray) -> tuple[float, float]:
    """Slope and its ordinary standard error, from numpy's unscaled covariance."""
    coef, cov = np.polyfit(x, y, 1, cov="unscaled")
    resid = y - np.polyval(coef, x)
    return float(coef[0]), math.sqrt(cov[0, 0] * float(resid @ resid) / (len(x) - 2))


def test_slope_verdict_parts_are_the_least_squares_fits_by_hand() -> None:
    rng = np.random.default_rng(3)
    runs, xy = [], {}
    for f, b in (("parity", 0.8), ("majority", 0.02), ("first", -0.01), ("mean", 0.0)):
        ns = np.repeat([4, 6, 8], 3)
        ys = 1.0 + b * ns + rng.normal(0, 0.05, ns.size)
        xy[f] = (ns.astype(float), ys)
        runs += [{"function": f, "n": int(n), "seed": i % 3, "converged": True,
                  "final": {"sharpness/loss": float(y)}}
                 for i, (n, y) in enumerate(zip(ns, ys, strict=True))]
    # a run that did not converge must not enter any fit
    runs.append({"function": "parity", "n": 8, "seed": 9, "converged": False,
                 "final": {"sharpness/loss": 1e6}})
    v = slope_verdict(runs, claimed=("parity", "majority", "first", "mean"))
    fits = {f: _ols(*xy[f]) for f in xy}
    par = v["effects"]["parity slope"]
    assert par["effect"] == pytest.approx(fits["parity"][0])
    assert par["se"] == pytest.approx(fits["parity"][1]) and par["df"] == 7
    assert v["evidence"]["not_converged"] == {"parity": 1}
    for f in ("majority", "first", "mean"):
        part = v["effects"][f"{f} flat"]
        a, b = (0.25 * fits["parity"][1]) ** 2, fits[f][1] ** 2
        assert part["effect"] == pytest.approx(0.25 * abs(fits["parity"][0]) - abs(fits[f][0]))
        assert part["se"] == pytest.approx(math.sqrt(a + b))
        assert part["df"] == pytest.approx((a + b) ** 2 / (a * a / 7 + b * b / 7))
    slope, se, icpt = linear_fit(list(xy["mean"][0]), list(xy["mean"][1]))
    assert icpt == pytest.approx(np.polyfit(*xy["mean"], 1)[1])


# ------------------------------------------------------------ hr_norm_vs_blowup
def _sweep_run(i: int, sens: float, norm: float, log_blow: float,
               converged: bool = True) -> dict[str, Any]:
    return {"name": f"{i:02d}", "converged": converged,
            "final": {"bool_sens": sens, "param_norm": norm, "blowup/log10": log_blow},
            "config": {"weight_decay": 0.01 * (i + 1)}}


def _sweep() -> list[dict[str, Any]]:
    return [_sweep_run(0, 1.0, 10, 0.1), _sweep_run(1, 1.0, 11, 0.2), _sweep_run(2, 2.0, 12, 0.3),
            _sweep_run(3, 2.0, 13, 0.1), _sweep_run(4, 3.0, 14, 0.5),
            _sweep_run(5, 3.0, 40, 0.9, converged=False)]


def test_norm_blowup_rho_and_p_are_spearmans_and_the_exact_permutation_p() -> None:
    runs = _sweep()
    v = norm_blowup_verdict(runs)
    done = [r for r in runs if r["converged"]]
    xs = [r["final"]["bool_sens"] for r in done]
    cs = [math.log10(r["final"]["param_norm"]) + r["final"]["blowup/log10"] for r in done]
    rho = stats.spearmanr(xs, cs)[0]
    part = v["effects"]["rho"]
    assert part["effect"] == pytest.approx(rho) and part["seeds"] == 5
    # brute force over all 5! orderings of c: the share with |ρ| at least the observed one
    hits = sum(abs(stats.spearmanr(xs, [cs[i] for i in order])[0]) >= abs(rho) - 1e-12
               for order in itertools.permutations(range(5)))
    assert part["p"] == pytest.approx(hits / 120)
    assert permutation_p(xs, cs)[0] == pytest.approx(hits / 120)


def test_rank_correlation_with_ties_is_scipys() -> None:
    rng = np.random.default_rng(0)
    xs = list(rng.integers(0, 3, 12).astype(float))
    ys = list(np.round(rng.normal(size=12), 1))
    assert rank_correlation(xs, ys) == pytest.approx(stats.spearmanr(xs, ys)[0])


def test_norm_blowup_leaves_out_a_converged_run_without_a_finite_c_and_names_it() -> None:
    """A NaN log10 blow-up was ranked as the largest c (numpy sorts NaN last): ρ = +0.837 for
    these runs, where the five runs with numbers give ρ = +0.738; a norm of 0 failed with
    "math domain error"."""
    runs = [*_sweep(), _sweep_run(6, 3.0, 9, NAN), _sweep_run(7, 1.0, 0.0, 0.2)]
    v = norm_blowup_verdict(runs)
    usable = [r for r in _sweep() if r["converged"]]
    xs = [r["final"]["bool_sens"] for r in usable]
    cs = [math.log10(r["final"]["param_norm"]) + r["final"]["blowup/log10"] for r in usable]
    assert v["effects"]["rho"]["effect"] == pytest.approx(stats.spearmanr(xs, cs)[0])
    assert v["effects"]["rho"]["seeds"] == 5
    assert "06" in v["reason"] and "07" in v["reason"] and "left out" in v["reason"]
    assert [p["name"] for p in v["evidence"]["points"]] == ["00", "01", "02", "03", "04"]
    assert v["evidence"]["converged"] == 7 and len(v["evidence"]["not_finite"]) == 2
    # too few usable runs: not comparable, and the reason still names the left-out ones
    v = norm_blowup_verdict([*_sweep()[:4], _sweep_run(6, 3.0, 9, NAN)])
    assert v["verdict"] == NOT_COMPARABLE and "06" in v["reason"]


# ------------------------------------------------------------ hr_parity_dynamics
def _records(values: list[float], blow: list[float] | None = None) -> list[dict[str, Any]]:
    blow = values if blow is None else blow
    return [{"step": 10 * (i + 1), "sharpness/loss": v, "blowup/log10": b}
            for i, (v, b) in enumerate(zip(values, blow, strict=True))]


def test_peaks_ignore_a_nan_evaluation_and_name_it() -> None:
    """max() compares nothing above a NaN: a NaN first evaluation was taken for the peak
    (step 10, offset −40, "near")."""
    p = peaks(_records([NAN, 1.0, 3.0, 5.0, 2.0, 1.0]), t0=40, window=0.25, eval_every=10)
    assert p["sharpness"]["peak_step"] == 40 and p["sharpness"]["peak"] == 5.0
    assert p["sharpness"]["nan_steps"] == [10]
    assert p["tolerance"] == 20  # max(0.25·40, 2·10)
    assert nearness(p["sharpness"], p["tolerance"]) == pytest.approx(1.0)
    assert peaks(_records([NAN, NAN]), t0=10, window=0.25, eval_every=10)[
        "blowup"]["peak_step"] is None


def test_dynamics_verdict_leaves_out_a_run_with_a_nan_measure() -> None:
    # peaks at 50, 60, 40 for t0 = 50 (tolerance 20): nearness 1, 0.5, 0.5 by hand
    good = [{"name": f"s{i}", "peaks": peaks(_records(vals), t0=50, window=0.25, eval_every=10)}
            for i, vals in enumerate([[1, 2, 3, 4, 9, 4, 3, 2],
                                      [1, 2, 3, 4, 5, 9, 3, 2],
                                      [1, 2, 3, 9, 5, 4, 3, 2]])]
    # a run that diverged after its first evaluation: its blow-up read a peak at step 10
    bad = {"name": "s3", "peaks": peaks(_records([8, NAN, NAN, NAN, NAN, NAN, NAN, NAN]),
                                        t0=50, window=0.25, eval_every=10)}
    v = dynamics_verdict([*good, bad])
    assert v["effects"]["sharpness"]["effect"] == pytest.approx(np.mean([1.0, 0.5, 0.5]))
    assert v["effects"]["blowup"]["seeds"] == 3
    assert "s3" in v["reason"] and "NaN" in v["reason"]
    v = dynamics_verdict([good[0], bad])
    assert v["verdict"] == NOT_COMPARABLE and "s3" in v["reason"]


# ------------------------------------------------------------ hr_random_functions
def test_judge_pairs_averages_each_seed_over_its_k_first() -> None:
    rows, by_seed = [], {}
    rng = np.random.default_rng(5)
    for seed, ks in ((0, (32, 64, 128)), (1, (32, 64)), (2, (128,))):  # seed 1, 2: some k unfit
        for k in ks:
            r = {"k": k, "seed": seed, "learned_as": float(rng.uniform(1, 2)),
                 "random_as": float(rng.uniform(3.5, 4.5)),
                 "learned_sharpness": float(rng.uniform(0.1, 0.2)),
                 "random_sharpness": float(rng.uniform(0.2, 0.4)),
                 "learned_sharpness_se": 0.01, "random_sharpness_se": 0.02}
            rows.append(r)
            by_seed.setdefault(seed, []).append(r)
    v = judge_pairs(rows)
    as_diff = [np.mean([r["random_as"] - r["learned_as"] for r in rs]) for rs in by_seed.values()]
    sh_diff = [np.mean([r["random_sharpness"] - r["learned_sharpness"] for r in rs])
               for rs in by_seed.values()]
    se_m = [math.sqrt(len(rs) * (0.01**2 + 0.02**2)) / len(rs) for rs in by_seed.values()]
    assert v["effects"]["as"]["effect"] == pytest.approx(np.mean(as_diff))
    assert v["effects"]["as"]["se"] == pytest.approx(np.std(as_diff, ddof=1) / math.sqrt(3))
    assert v["effects"]["as"]["df"] == 2
    assert v["effects"]["sharpness"]["effect"] == pytest.approx(np.mean(sh_diff))
    assert v["effects"]["sharpness"]["se_measure"] == pytest.approx(
        math.sqrt(sum(s * s for s in se_m)) / 3)


# ------------------------------------------------------------ ib_fixed_v
def test_growth_fits_are_numpys_least_squares() -> None:
    rng = np.random.default_rng(2)
    t = np.geomspace(100, 5000, 12)
    w = 1 + 0.3 * np.log(t) + 0.001 * t + rng.normal(0, 0.01, t.size)
    g = growth_fits(list(t), list(w))
    for name, x in (("lin", t), ("log", np.log(t))):
        coef = np.polyfit(x, w, 1)
        resid = w - np.polyval(coef, x)
        assert g[f"slope_{name}"] == pytest.approx(coef[0])
        assert g[f"r2_{name}"] == pytest.approx(1 - resid @ resid / np.sum((w - w.mean()) ** 2))


@pytest.mark.parametrize("bad", [NAN, math.inf])
def test_a_diverged_norm_is_no_growth_fit(bad: float) -> None:
    """A NaN or infinite ‖W‖ made both R² exactly 0 (``total > 0`` is False for NaN), so the
    run's r2_lin − r2_log entered the mean over seeds as a measured 0."""
    recs = [{"step": s, "attn/W_norm": w}
            for s, w in ((1, 0.1), (100, 1.0), (200, 2.0), (300, 3.0), (400, bad), (500, bad))]
    fit = norm_growth(recs, 100)
    assert "r2_lin" not in fit and fit["diverged_at"] == 400
    with pytest.raises(ValueError, match="finite"):
        growth_fits([100.0, 200.0, 300.0], [1.0, bad, 3.0])


def _fv(label: str, seed: int, fit: dict[str, float], reach: float) -> dict[str, Any]:
    return {"label": label, "seed": seed, "name": f"{label}-s{seed}", "steps": 20000,
            "final": {"attn/alignment": 0.9, "attn/sparsity": 0.9, "attn/W_norm": 10.0},
            "fit": fit, "reach": {"alignment": reach, "sparsity": reach}}


def test_fixed_v_verdict_refuses_a_diverged_run_and_computes_the_rest_by_hand() -> None:
    fits = {"gd": [(0.80, 0.95), (0.82, 0.96), (0.81, 0.99)],
            "ngd": [(0.99, 0.70), (0.98, 0.72), (0.97, 0.75)],
            "polyak": [(0.99, 0.80), (0.99, 0.85), (0.98, 0.81)]}
    reach = {"gd": [9000, 11000, math.inf], "ngd": [3000, 3100, 3300], "polyak": [30, 40, 35]}
    runs = [_fv(o, k, {"r2_lin": a, "r2_log": b, "slope_lin": 1.0, "slope_log": 1.0},
                reach[o][k]) for o in fits for k, (a, b) in enumerate(fits[o])]
    v = fixed_v_verdict(runs)
    gd = [b - a for a, b in fits["gd"]]
    assert v["effects"]["GD ‖W‖ logarithmic"]["effect"] == pytest.approx(np.mean(gd))
    assert v["effects"]["GD ‖W‖ logarithmic"]["se"] == pytest.approx(
        np.std(gd, ddof=1) / math.sqrt(3))
    # GD never got there in seed 2: its last step (20,000) stands in
    steps_gd = [9000, 11000, 20000]
    assert v["effects"]["ngd aligns faster"]["effect"] == pytest.approx(
        np.mean([g - o for g, o in zip(steps_gd, reach["ngd"], strict=True)]))
    diverged = [*runs[:-1], _fv("polyak", 2, {"fit_points": 3.0, "diverged_at": 700.0}, math.inf)]
    v = fixed_v_verdict(diverged)
    assert v["verdict"] == NOT_COMPARABLE and "polyak-s2 (step 700)" in v["reason"]
    assert "froze" not in v["reason"]


# ------------------------------------------------------------ ib_joint and the loss races
def _joint(label: str, seed: int, loss: float, align: float) -> dict[str, Any]:
    return {"label": label, "seed": seed, "final": {
        "train/loss": loss, "attn/alignment": align, "attn/v_alignment": align,
        "attn/sparsity": align}}


def test_joint_parts_pair_by_seed_and_leave_out_an_unpaired_seed() -> None:
    table = {"sgd": [(0.5, 0.60), (0.6, 0.55), (0.4, 0.62)],
             "sngd": [(0.1, 0.90), (0.2, 0.88), (0.15, 0.91)],
             "sps": [(0.12, 0.85), (0.18, 0.86), (0.11, 0.90)],
             "adam": [(0.05, 0.93), (0.06, 0.95), (0.04, 0.92)]}
    runs = [_joint(o, k, *lv) for o, rows in table.items() for k, lv in enumerate(rows)]
    runs.append(_joint("sngd", 3, 9.0, 0.0))  # seed 3 has no other optimiser
    v = joint_verdict(runs)
    d = [table["sgd"][k][0] - table["sngd"][k][0] for k in range(3)]
    assert v["effects"]["sngd loss < sgd"]["effect"] == pytest.approx(np.mean(d))
    assert v["effects"]["sngd loss < sgd"]["se"] == pytest.approx(
        np.std(d, ddof=1) / math.sqrt(3))
    close = [table["sps"][k][1] - (table["adam"][k][1] - 0.1) for k in range(3)]
    assert v["effects"]["sps attn/sparsity within 0.1 of adam"]["effect"] == pytest.approx(
        np.mean(close))
    assert v["evidence"]["sngd"]["train/loss"] == pytest.approx(0.15)  # seeds 0-2 only
    assert v["evidence"]["unpaired_seeds"] == {"sngd": [3]} and "sngd seed 3" in v["reason"]


def test_loss_race_parts_by_hand() -> None:
    losses = {"sgd": [1.0, 1.1, 0.9], "sngd": [0.3, 0.5, 0.2], "sps": [0.4, 0.45, 0.35],
              "adam": [0.2, 0.25, 0.1]}
    runs = [{"label": o, "seed": k, "steps": 200, "final": {"train/loss": x}}
            for o, xs in losses.items() for k, x in enumerate(xs)]
    v = loss_race_verdict(runs)
    for o in ("sngd", "sps"):
        below = [s - x for s, x in zip(losses["sgd"], losses[o], strict=True)]
        closer = [abs(x - s) - abs(x - a)
                  for x, s, a in zip(losses[o], losses["sgd"], losses["adam"], strict=True)]
        assert v["effects"][f"{o} below sgd"]["effect"] == pytest.approx(np.mean(below))
        assert v["effects"][f"{o} closer to adam"]["effect"] == pytest.approx(np.mean(closer))
        assert v["effects"][f"{o} closer to adam"]["se"] == pytest.approx(
            np.std(closer, ddof=1) / math.sqrt(3))
    runs[5]["final"]["train/loss"] = math.inf  # a diverged sngd seed
    assert loss_race_verdict(runs)["verdict"] == NOT_COMPARABLE
