"""The statistics behind the verdicts of few runs (audit stats51): a slope through two runs, the
false-decision rate of the slope part, the rank correlation of a handful of runs, a correlation's
trend over a scale ladder, and seeds that tie without a measurement error."""

from __future__ import annotations

import itertools
import math
from typing import Any

import numpy as np
import pytest

from senslab.experiments.hahn_rofin.norm_vs_blowup import (
    correlation_verdict,
    norm_blowup_verdict,
    permutation_p,
    rank_correlation,
)
from senslab.experiments.hahn_rofin.parity_dynamics import dynamics_verdict
from senslab.experiments.hahn_rofin.sharpness_vs_length import slope_effect, slope_verdict
from senslab.experiments.ladder import ladder_sentence, trend
from senslab.verdicts import (
    CONTRADICTED,
    INCONCLUSIVE,
    SUPPORTED,
    Effect,
    describe,
    judge,
    over_seeds,
)

# --- 1. hr_sharpness_vs_length: least squares, m − 2 degrees of freedom ---------------------


def _len_run(f: str, n: int, sharp: float) -> dict[str, Any]:
    return {"function": f, "n": n, "converged": True, "final": {"sharpness/loss": sharp}}


@pytest.mark.parametrize("second", [0.51, 0.49])
def test_a_slope_through_two_runs_is_not_decided(second: float) -> None:
    """One converged run at n = 4 and one at n = 6: a line through two points has no standard
    error (the bootstrap gave s.e. ≈ 1e-17 and 'supported' or 'contradicted' for certain)."""
    v = slope_verdict([_len_run("parity", 4, 0.50), _len_run("parity", 6, second)])
    part = v["effects"]["parity slope"]
    assert v["verdict"] == INCONCLUSIVE and part["verdict"] == INCONCLUSIVE
    assert part["se"] is None and part["p"] is None and part["detectable"] is None
    assert part["interval"] == [None, None]
    assert "no uncertainty estimate (a line through two runs fits them exactly" in v["reason"]


def test_the_flat_part_of_a_two_run_function_is_not_decided() -> None:
    parity = [_len_run("parity", n, 0.1 * n + 0.01 * s) for n in (4, 6, 8) for s in range(3)]
    first = [_len_run("first", 4, 0.20), _len_run("first", 6, 0.21)]
    v = slope_verdict(parity + first)
    flat = v["effects"]["first flat"]
    assert flat["verdict"] == INCONCLUSIVE and flat["se"] is None
    assert "slope of first's sharpness on n has two runs only" in v["reason"]
    assert v["effects"]["parity slope"]["verdict"] == SUPPORTED


def test_the_slope_part_is_ordinary_least_squares_on_m_minus_2_df() -> None:
    rng = np.random.default_rng(7)
    pts = [(n, float(rng.normal())) for n in (4, 4, 4, 6, 6, 8)]
    e = slope_effect(pts)
    xs, ys = np.array([x for x, _ in pts], float), np.array([y for _, y in pts])
    b, a = np.polyfit(xs, ys, 1)
    rss = float(np.sum((ys - a - b * xs) ** 2))
    se = math.sqrt(rss / 4 / float(np.sum((xs - xs.mean()) ** 2)))
    assert (e.value, e.se, e.df, e.seeds) == pytest.approx((b, se, 4, 6))
    v = slope_verdict([_len_run("parity", n, y) for n, y in pts])
    assert v["effects"]["parity slope"]["df"] == 4
    assert v["effects"]["parity slope"]["se"] == pytest.approx(se)


def test_the_slope_part_holds_its_level_at_a_flat_truth() -> None:
    """A true slope of 0 with i.i.d. normal noise, in the small designs the audit listed
    (converged runs per n): the part is decided in about 5% of simulations (the bootstrap
    decided 23.8%, 14.7%, 12.7% and 10.8% of them)."""
    rng = np.random.default_rng(0)
    rates = {}
    for design in ({4: 3, 6: 1}, {4: 2, 6: 2}, {4: 1, 6: 1, 8: 1}, {4: 3, 6: 2}):
        decided, sims = 0, 600
        for _ in range(sims):
            pts = [(n, float(rng.normal())) for n, k in design.items() for _ in range(k)]
            lo, hi = slope_effect(pts).interval()
            decided += lo > 0 or hi < 0
        rates[str(design)] = decided / sims
    assert all(r <= 0.085 for r in rates.values()), rates
    assert sum(rates.values()) / len(rates) <= 0.065, rates


# --- 2. the ladder trend of a correlation is taken on Fisher's z ---------------------------


def _rho_part(rho: float, se_z: float, df: float, **extra: Any) -> dict[str, Any]:
    z = math.atanh(rho)
    lo, hi = Effect(z, se_z, df).interval()
    return {"effect": rho, "se": se_z, "df": df, "interval": [math.tanh(lo), math.tanh(hi)],
            "verdict": INCONCLUSIVE, **extra}


def test_a_correlations_trend_is_on_fisher_z() -> None:
    """The audit's rungs: ρ = 0.112 (12 runs, s.e. of z 0.443) to ρ = 0.890 (96 runs, 0.136).
    On ρ with the s.e. of z the trend read 'no clear change (+0.778 [−0.242, +1.8])'."""
    current = {"method": "bootstrap over 12 runs, on Fisher's z = atanh ρ (interval and "
                         "detectable transformed back with tanh)"}
    low = _rho_part(0.112, 0.443, 11, **current)
    high = _rho_part(0.890, 0.136, 95, scale="fisher_z", z=math.atanh(0.890))
    t = trend(low, high)
    dz = math.atanh(0.890) - math.atanh(0.112)
    assert t["scale"] == "fisher_z" and t["change"] == pytest.approx(dz)
    assert t["word"] == "grows" and t["interval"][0] > 0
    half = Effect(0, math.hypot(0.443, 0.136), 11).quantile(0.975) * math.hypot(0.443, 0.136)
    assert t["interval"] == pytest.approx([dz - half, dz + half])
    rows = [{"rung": "cpu", "status": "done", "verdict": INCONCLUSIVE},
            {"rung": "sweep", "status": "done", "verdict": SUPPORTED}]
    text = ladder_sentence(rows, {"rho": {"trend": {"from": "cpu", "to": "sweep", **t}}})
    assert "rho grows from cpu to sweep (+1.31 [" in text and "in atanh ρ)" in text
    # a rung judged on ρ (before the Fisher-z rule) and one on z share no scale
    old = _rho_part(0.112, 0.3, 11, method="bootstrap over 12 runs")
    mixed = trend(old, high)
    assert mixed["interval"] is None and mixed["word"] == "no clear change" and mixed["note"]
    # every other part: the difference of the effects, as before
    plain = trend({"effect": 0.1, "se": 0.02, "df": 2}, {"effect": 0.3, "se": 0.02, "df": 4})
    assert plain["change"] == pytest.approx(0.2) and "scale" not in plain
    assert plain["word"] == "grows"


# --- 3. hr_norm_vs_blowup: a permutation p-value for a handful of runs ---------------------


def _sweep(sens: float, c: float, name: str) -> dict[str, Any]:
    return {"name": name, "converged": True,
            "final": {"bool_sens": sens, "param_norm": 10.0, "blowup/log10": c - 1.0}}


def _exact_p(xs: list[float], ys: list[float]) -> float:
    r = abs(rank_correlation(xs, ys))
    perms = [abs(rank_correlation(xs, list(p))) for p in itertools.permutations(ys)]
    return sum(q >= r - 1e-12 for q in perms) / len(perms)


@pytest.mark.parametrize("m", [5, 6])
def test_a_perfect_order_of_few_runs_has_its_exact_p_and_contains_rho(m: int) -> None:
    """5–6 runs in perfect rank order: the bootstrap of z gave a zero-width interval
    [+0.999, +0.999] that excluded the reported ρ = 1, with p = 4e-53 (exact: 2/m!)."""
    v = norm_blowup_verdict([_sweep(float(i), float(i) ** 1.5, f"r{i}") for i in range(1, m + 1)])
    part = v["effects"]["rho"]
    assert v["verdict"] == SUPPORTED and part["effect"] == pytest.approx(1.0)
    assert part["p"] == pytest.approx(2 / math.factorial(m), rel=1e-6)
    lo, hi = part["interval"]
    assert -1 <= lo < 0.99 and lo <= part["effect"] <= hi <= 1
    assert part["scale"] == "fisher_z" and "permutation" in part["method"]


@pytest.mark.parametrize(("levels", "exact"), [([1, 1, 2, 2, 2, 2], 0.133),
                                               ([1, 1, 1, 1, 1, 2, 2], 0.095)])
def test_two_tied_sensitivity_levels_are_judged_on_the_exact_p(levels: list[int],
                                                               exact: float) -> None:
    """Two sensitivity levels perfectly separated in c over 6–7 runs: the bootstrap said
    'supported' (p 0.037, 0.015) where the exact permutation p is 0.133 and 0.095."""
    v = norm_blowup_verdict([_sweep(float(a), float(i), f"r{i}") for i, a in enumerate(levels)])
    part = v["effects"]["rho"]
    assert v["verdict"] == INCONCLUSIVE and part["verdict"] == INCONCLUSIVE
    assert part["p"] == pytest.approx(exact, abs=5e-4)
    lo, hi = part["interval"]
    assert -1 <= lo <= part["effect"] <= hi <= 1 and 0 < part["detectable"] < 1


def test_permutation_p_is_exact_and_seeded() -> None:
    xs, ys = [1.0, 1.0, 2.0, 3.0, 3.0, 5.0], [0.3, 0.1, 0.5, 0.9, 0.7, 0.8]
    p, how = permutation_p(xs, ys)
    assert p == pytest.approx(_exact_p(xs, ys)) and how.startswith("exact")
    rng = np.random.default_rng(3)
    big = rng.normal(size=(2, 10)).tolist()
    assert permutation_p(*big) == permutation_p(*big)  # a fixed generator above 8 runs
    assert "random orderings" in permutation_p(*big)[1]


def test_a_degenerate_bootstrap_of_many_runs_falls_back_to_fieller() -> None:
    """12 runs in perfect order (above the permutation size): every resample has ρ = 1, so the
    bootstrap s.e. is 0; the interval must still contain ρ = 1 and have width."""
    pts = [(float(i), float(i) ** 1.5) for i in range(1, 13)]
    v = correlation_verdict(pts, lambda u: rank_correlation([p[0] for p in u],
                                                            [p[1] for p in u]),
                            "rho", {}, claim="")
    part = v["effects"]["rho"]
    assert part["se"] == pytest.approx(math.sqrt(1.06 / 9)) and "Fieller" in part["method"]
    lo, hi = part["interval"]
    assert lo < 0.999 and hi == pytest.approx(1.0) and v["verdict"] == SUPPORTED


# --- 4. seeds that tie without a measurement error ------------------------------------------


def test_tied_seeds_without_a_measurement_error_are_not_decided() -> None:
    """'+0.5 [+0.5, +0.5] (95%, 3 seeds) supported, p = 0' was the mean of three equal values."""
    for values in ([0.5, 0.5, 0.5], [0.0, 0.0, 0.0], [0.1 + 0.2] * 3, [-2.0, -2.0]):
        e = over_seeds(values, what="x")
        assert math.isnan(e.se), values
        part = judge({"x": e})["parts"]["x"]
        assert part["verdict"] == INCONCLUSIVE and part["detectable"] is None
        text = describe("x", part)
        assert f"no uncertainty estimate (the {len(values)} seeds tied, more seeds are needed)" \
            in text and "detect" not in text
    assert "(k, seed) pairs tied" in describe(
        "x", judge({"x": over_seeds([1.0, 1.0], unit="(k, seed) pair")})["parts"]["x"])
    # a known measurement error still floors the tie (records #6)
    floored = over_seeds([0.5, 0.5, 0.5], [0.1, 0.1, 0.1])
    assert floored.se == pytest.approx(math.sqrt(0.03) / 3) and "floored" in floored.method
    # close but not tied: the spread is the estimate, as before
    assert over_seeds([0.5, 0.5, 0.5 + 1e-6]).se > 0


def test_a_zero_standard_error_claims_no_power() -> None:
    """An inconclusive part with s.e. 0 said 'could detect ≥ 0'."""
    part = judge({"x": Effect(0.0, 0.0, 2)})["parts"]["x"]
    assert part["verdict"] == INCONCLUSIVE and part["detectable"] is None


def _dyn_run(seed: int, t0: int, sh_off: int, bu_off: int, every: int = 50) -> dict[str, Any]:
    tol = max(0.25 * t0, 2 * every)

    def peak(off: int) -> dict[str, Any]:
        return {"offset": off, "at_end": False, "peak_step": t0 + off}

    return {"name": f"parity-n8-s{seed}", "seed": seed, "converged": True, "config": {},
            "peaks": {"t0": t0, "tolerance": tol, "sharpness": peak(sh_off),
                      "blowup": peak(bu_off)}}


def test_parity_dynamics_with_tied_nearness_is_inconclusive() -> None:
    """Every peak one evaluation after t0 with tol = 2 evaluations: nearness 0.5 in each of
    three seeds, which read 'supported' with a zero-width interval."""
    v = dynamics_verdict([_dyn_run(0, 300, 50, 50), _dyn_run(1, 350, 50, 50),
                          _dyn_run(2, 250, 50, 50)])
    assert v["verdict"] == INCONCLUSIVE
    for part in v["effects"].values():
        assert part["verdict"] == INCONCLUSIVE and part["se"] is None
    assert "the 3 seeds tied, more seeds are needed" in v["reason"]
    assert v["verdict"] != CONTRADICTED


def test_every_ordering_as_strong_gives_no_interval_claim() -> None:
    """p = 1 (no ordering of the runs gives a smaller |ρ|): no interval, no power claim."""
    xs, ys = [1.0, 1.0, 1.0, 1.0, 2.0], [0.0, 1.0, 2.0, 3.0, 2.0]
    assert permutation_p(xs, ys)[0] == pytest.approx(1.0)
    v = correlation_verdict(list(zip(xs, ys, strict=True)), lambda u: rank_correlation(
        [p[0] for p in u], [p[1] for p in u]), "rho", {}, claim="", pairs=(xs, ys))
    part = v["effects"]["rho"]
    assert v["verdict"] == INCONCLUSIVE and part["interval"] == [None, None]
    assert part["detectable"] is None and "(exact over all 120 orderings; p = 1)" in part["method"]
    assert "every ordering of the runs gives a |ρ| at least as large" in v["reason"]


def test_a_flat_part_without_a_standard_error_from_a_nan_says_so() -> None:
    """A fit of three runs, one of them NaN: verdict.json's ``method`` said "has two runs
    only" (the reason named the NaN run); it now says the fit's s.e. is not a number."""
    parity = [_len_run("parity", n, 0.1 * n + 0.01 * s) for n in (4, 6, 8) for s in range(3)]
    first = [_len_run("first", 4, 0.20), _len_run("first", 6, math.nan),
             _len_run("first", 8, 0.22)]
    flat = slope_verdict(parity + first)["effects"]["first flat"]
    assert flat["verdict"] == INCONCLUSIVE and flat["se"] is None
    assert "two runs only" not in flat["method"]
    assert "has none (a value among its 3 runs is not a number)" in flat["method"]
