"""Verdict rules that leaned toward the claim (audit 53, S1, S4, S6): a censored contender in
ib_fixed_v, a subset of hr_sharpness_vs_length's functions, and the one-seed wording of an
exact quantity."""

from __future__ import annotations

import math
from typing import Any

import pytest

from senslab.experiments import get_experiment
from senslab.experiments.hahn_rofin.random_functions import judge_pairs
from senslab.experiments.hahn_rofin.sharpness_vs_length import slope_verdict
from senslab.experiments.implicit_bias.fixed_v import fixed_v_verdict
from senslab.verdicts import (
    CONTRADICTED,
    INCONCLUSIVE,
    NOT_COMPARABLE,
    SUPPORTED,
    describe,
    judge,
    measured,
    over_seeds,
)


# ------------------------------------------------------------ S1: ib_fixed_v censoring
def _fv(label: str, seed: int, reach: float, r2: tuple[float, float]) -> dict[str, Any]:
    """A run of ``steps`` = 20,000 that reaches 0.99 alignment and mass at ``reach`` (inf:
    never); ``r2`` = (R² lin, R² log)."""
    return {"label": label, "seed": seed, "name": f"{label}-s{seed}", "steps": 20000,
            "final": {"attn/alignment": 0.9, "attn/sparsity": 0.9, "attn/W_norm": 10.0},
            "fit": {"r2_lin": r2[0], "r2_log": r2[1], "slope_lin": 1.0, "slope_log": 1.0},
            "reach": {"alignment": reach, "sparsity": reach}}


def _race(ngd_never: tuple[int, ...] = (), gd_reach: float = math.inf,
          seeds: int = 10) -> list[dict[str, Any]]:
    """GD logarithmic, NGD and Polyak linear; NGD there after ~1,000 steps except in the seeds
    ``ngd_never`` (never there); Polyak after ~30."""
    out = []
    for k in range(seeds):
        j = 0.001 * k
        out += [_fv("gd", k, gd_reach, (0.8 + j, 0.95)),
                _fv("ngd", k, math.inf if k in ngd_never else 1000.0 + 10 * k, (0.99, 0.7 + j)),
                _fv("polyak", k, 30.0 + k, (0.99, 0.8 + j))]
    return out


def test_a_censored_contender_makes_its_part_inconclusive_and_says_why() -> None:
    """NGD never reached 0.99 in seed 9 (GD never either): its difference read 0 there and the
    nine others ≈ +19,000, so "ngd aligns faster" was supported, although NGD's true step in
    seed 9 is unknown (possibly never). It has no standard error now, and the reason names the
    seed."""
    v = fixed_v_verdict(_race(ngd_never=(9,)))
    for name in ("ngd aligns faster", "ngd sparsifies faster"):
        part = v["effects"][name]
        assert part["verdict"] == INCONCLUSIVE and part["se"] is None, name
        assert part["detectable"] is None
    assert v["verdict"] == INCONCLUSIVE
    assert "ngd never reached 0.99 alignment in seed 9 within its 20000 steps" in v["reason"]
    assert "upper bound" in v["reason"] and "train longer" in v["reason"]
    assert v["evidence"]["censored"]["ngd"] == {"alignment": [9], "sparsity": [9]}
    # the other parts are judged as before (Polyak reached everywhere)
    assert v["effects"]["polyak aligns faster"]["verdict"] == SUPPORTED


def test_a_censored_contender_where_gd_got_there_is_not_judged_either() -> None:
    """GD at step 5,000 in every seed, NGD never in seed 0: the value there, 5,000 − 20,000, is
    an upper bound. Here the mean of the upper bounds is already below 0 (−2,343): the truth is
    lower still, so the part keeps its standard error and is judged as it stands — never
    supported; here inconclusive — and its method names the censoring."""
    v = fixed_v_verdict(_race(ngd_never=(0,), gd_reach=5000.0, seeds=3))
    part = v["effects"]["ngd aligns faster"]
    assert part["effect"] < 0 and part["se"] is not None and part["verdict"] == INCONCLUSIVE
    assert "ngd never reached 0.99 alignment in seed 0" in part["method"]
    assert "lower still" in part["method"]


def test_a_contender_censored_in_every_seed_names_the_censoring_not_a_tie() -> None:
    """GD and NGD never there in any seed: every difference reads 0 (a tie); the part names the
    censoring as the reason it has no standard error, once."""
    v = fixed_v_verdict(_race(ngd_never=(0, 1, 2), seeds=3))
    part = v["effects"]["ngd aligns faster"]
    assert part["verdict"] == INCONCLUSIVE and part["effect"] == 0
    text = describe("ngd aligns faster", part)
    assert ("no uncertainty estimate (ngd never reached 0.99 alignment in seeds 0, 1, 2 within "
            "its 20000 steps") in text
    assert "tied" not in text and text.count("no standard error") == 0


def test_gd_censored_alone_stays_a_lower_bound() -> None:
    """GD never there, the contenders always: judged as before (a lower bound of GD's lag, the
    conservative side), and the note says so."""
    v = fixed_v_verdict(_race(seeds=3))
    assert v["verdict"] == SUPPORTED
    part = v["effects"]["ngd aligns faster"]
    assert part["effect"] == pytest.approx(20000 - 1010) and part["se"] is not None
    assert "gd never reached 0.99 alignment in seeds 0, 1, 2: its last step counts, so where a " \
        "contender got there steps_gd − steps_o is a lower bound" in v["reason"]
    assert "upper bound" not in v["reason"] and v["evidence"]["censored"] == {
        "gd": {"alignment": [0, 1, 2], "sparsity": [0, 1, 2]}}
    # every run there: no censoring words at all
    reached = fixed_v_verdict(_race(seeds=3, gd_reach=19000.0))
    assert "never reached" not in reached["reason"] and "censored" not in reached["evidence"]


# ------------------------------------------------------------ S6: a subset of the functions
def _len(f: str, n: int, sharp: float) -> dict[str, Any]:
    return {"function": f, "n": n, "converged": True, "final": {"sharpness/loss": sharp}}


PARITY = [_len("parity", n, 0.1 * n + 0.01 * s) for n in (4, 6, 8) for s in range(3)]


def _flat(f: str) -> list[dict[str, Any]]:
    return [_len(f, n, 0.2 + 0.001 * s) for n in (4, 6, 8) for s in range(3)]


def test_a_subset_of_the_functions_is_a_partial_verdict() -> None:
    """``--set functions=parity,``: PARITY's slope alone was "supported" and recorded as the
    whole claim ("parity's sharpness grows with n, the others' is flat")."""
    exp = get_experiment("hr_sharpness_vs_length")
    v = exp.verdict(PARITY)
    assert v["verdict"] == NOT_COMPARABLE
    assert v["partial"] == {"judged": ["parity slope"],
                            "omitted": ["majority flat", "first flat", "mean flat"],
                            "missing_functions": ["majority", "first", "mean"]}
    assert "partial verdict: no runs of majority, first, mean (add them to functions)" \
        in v["reason"]
    # the judged part is at its level in the full family of four (Holm's first: α/4)
    judged = v["evidence"]["judged_parts"]["parity slope"]
    assert judged["verdict"] == SUPPORTED and judged["level"] == pytest.approx(1 - 0.05 / 4)
    # two of four: still partial, naming the two left out
    v = exp.verdict(PARITY + _flat("first"))
    assert v["verdict"] == NOT_COMPARABLE and v["partial"]["omitted"] == ["majority flat",
                                                                         "mean flat"]


def test_a_subset_that_contradicts_is_contradicted() -> None:
    """A judged part that is contradicted fails the claim whatever the omitted parts say."""
    falling = [_len("parity", n, 1 - 0.1 * n + 0.01 * s) for n in (4, 6, 8) for s in range(2)]
    v = get_experiment("hr_sharpness_vs_length").verdict(falling)
    assert v["verdict"] == CONTRADICTED and v["partial"]["judged"] == ["parity slope"]
    assert v["correction"] == "Holm over 4 parts (3 omitted as not significant: no runs)"
    assert "'majority flat', 'first flat', 'mean flat' are not judged" in v["reason"]


def test_every_function_gives_the_verdict_as_before() -> None:
    """All four functions: the experiment's verdict is the plain rule's, word for word."""
    runs = PARITY + _flat("majority") + _flat("first") + _flat("mean")
    v = get_experiment("hr_sharpness_vs_length").verdict(runs)
    assert v == slope_verdict(runs) and "partial" not in v and v["verdict"] == SUPPORTED


# ------------------------------------------------------------ S4: one seed, exact quantity
def test_one_seed_of_an_exact_quantity_does_not_claim_measurement_noise() -> None:
    """hr_random_functions with one seed: as is exact, so its part has no uncertainty at all;
    it read "no uncertainty estimate (measurement noise only)"."""
    rows = [{"k": 32, "seed": 0, "learned_as": 2.5, "random_as": 3.92,
             "learned_sharpness": 0.1, "random_sharpness": 0.3,
             "learned_sharpness_se": 0.01, "random_sharpness_se": 0.02}]
    v = judge_pairs(rows)
    as_text = describe("as", v["effects"]["as"])
    assert "measurement noise only" not in as_text
    assert ("no uncertainty estimate (one seed, without a measurement error: seed-to-seed "
            "variation needs at least 2 seeds)") in as_text
    # the sharpness part has a measurement error: that one is measurement noise only
    assert describe("s", v["effects"]["sharpness"]).endswith("(measurement noise only)")
    assert describe("a", judge({"a": measured(1, 0.1)})["parts"]["a"]).endswith(
        "(measurement noise only)")
    # an exact zero measurement error is no measurement noise either
    text = describe("z", judge({"z": over_seeds([0.3], [0.0])})["parts"]["z"])
    assert "measurement noise only" not in text and "without a measurement error" in text


def test_a_censored_contender_that_is_slower_still_contradicts() -> None:
    """GD there at step ~100 in every seed, NGD never in 20,000: steps_gd − steps_ngd, an upper
    bound, is already far below 0, so the claim fails whatever NGD's true step: contradicted,
    as before the censoring rule (which had made it inconclusive)."""
    runs = _race(ngd_never=(0, 1, 2), gd_reach=100.0, seeds=3)
    for r in runs:  # GD's seeds a step apart, so the differences have a spread
        if r["label"] == "gd":
            r["reach"] = {k: 100.0 + r["seed"] for k in r["reach"]}
    v = fixed_v_verdict(runs)
    part = v["effects"]["ngd aligns faster"]
    assert part["effect"] < 0 and part["se"] is not None
    assert part["verdict"] == CONTRADICTED and v["verdict"] == CONTRADICTED


def test_a_censored_contender_beside_a_censored_gd_stays_inconclusive() -> None:
    """GD cut off in seed 0 (its difference, +10, a lower bound there) and NGD in seeds 1–4
    (about −5,000 each, upper bounds): the mean is below 0, but the seed-0 difference is
    unbounded above, so nothing bounds the truth: no standard error, inconclusive."""
    from senslab.experiments.implicit_bias.fixed_v import _censored
    diffs = [10.0, -5000.0, -4900.0, -4800.0, -4700.0]
    part = over_seeds(diffs, what="steps_gd − steps_ngd to 0.99 alignment")
    runs = {k: {"steps": 20000} for k in range(5)}
    assert _censored(part, "ngd", "alignment", [1, 2, 3, 4], runs).se == part.se
    out = _censored(part, "ngd", "alignment", [1, 2, 3, 4], runs, gd_never=True)
    assert math.isnan(out.se) and "upper bound" in out.method
    runs = _race(ngd_never=(1, 2, 3, 4), seeds=5)
    for r in runs:  # GD cut off in seed 0 only, there at 14,100–14,400 elsewhere
        if r["label"] == "gd" and r["seed"]:
            r["reach"] = {k: 14000.0 + 100 * r["seed"] for k in r["reach"]}
    whole = fixed_v_verdict(runs)["effects"]["ngd aligns faster"]
    assert whole["effect"] < 0 and whole["se"] is None and whole["verdict"] == INCONCLUSIVE
