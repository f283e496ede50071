"""The verdict rules (senslab.verdicts): three-way decisions, Student's t over seeds, Holm's
correction, the detectable effect and the bootstrap, checked on closed forms and by simulation."""

from __future__ import annotations

import math
import random

import pytest
from scipy import stats

from senslab.verdicts import (
    CONTRADICTED,
    INCONCLUSIVE,
    NOT_COMPARABLE,
    SUPPORTED,
    Effect,
    bootstrap,
    describe,
    judge,
    measured,
    not_comparable,
    over_seeds,
    paired_by_seed,
    verdict,
)


def test_over_seeds_closed_form():
    e = over_seeds([1.0, 2.0, 3.0], [0.1, 0.1, 0.1], "x")
    assert e.value == 2.0 and e.df == 2 and e.seeds == 3
    assert e.se == pytest.approx(1 / math.sqrt(3))
    lo, hi = e.interval()
    assert hi - 2 == pytest.approx(4.302653 / math.sqrt(3), rel=1e-5)  # t_{0.975, 2}
    assert lo < 0 < hi
    assert e.se_measure == pytest.approx(math.sqrt(3 * 0.01) / 3)
    assert e.se_seed == pytest.approx(math.sqrt(1 / 3 - 0.01 / 3))
    # the effect found with 80% power by the two-sided t test: the noncentral t's power there
    # is 0.80 (the normal shortcut with t quantiles, (4.3027 + 1.0607)·s, gave 0.77)
    det = e.detectable()
    crit = 4.302653
    power = stats.nct.sf(crit, 2, det / e.se) + stats.nct.cdf(-crit, 2, det / e.se)
    assert power == pytest.approx(0.8, abs=1e-6)
    assert det > (4.302653 + 1.060660) / math.sqrt(3)
    normal = measured(0.0, 0.5)
    assert normal.detectable() == pytest.approx((1.959964 + 0.841621) * 0.5, rel=1e-6)


def test_seeds_that_agree_closer_than_their_measurement_error_are_not_exact():
    """Two seeds with the same difference (one flip each in 256 copies) and a measurement error
    of 0.01 each: the spread is 0, but the mean is not exact — its s.e. is the measurement
    error's, and the verdict is the one a single seed gets (inconclusive), not supported."""
    e = over_seeds([1 / 256, 1 / 256], [0.01, 0.01], "mlp − vit")
    assert e.se == pytest.approx(0.01 / math.sqrt(2)) and e.se == e.se_measure
    assert e.se_seed == 0.0 and "floored at the measurement error" in e.method
    assert verdict({"a": e})["verdict"] == INCONCLUSIVE
    assert verdict({"a": over_seeds([1 / 256], [0.01])})["verdict"] == INCONCLUSIVE
    wide = over_seeds([0.1, 0.3], [0.01, 0.01])  # a real spread: the sample s.e., not floored
    assert wide.se == pytest.approx(0.1) and "floored" not in wide.method
    # tied seeds and no measurement error known: no standard error at all, not an exact mean
    assert math.isnan(over_seeds([0.2, 0.2]).se)
    assert verdict({"a": over_seeds([0.2, 0.2, 0.2])})["verdict"] == INCONCLUSIVE


def test_one_seed_is_measurement_only():
    e = over_seeds([0.5], [0.1])
    assert e.df == math.inf and e.se == 0.1 and e.seeds == 1
    assert e.interval()[0] == pytest.approx(0.5 - 1.959964 * 0.1, rel=1e-6)
    assert math.isnan(over_seeds([0.5]).se)
    j = judge({"a": over_seeds([0.5])})  # no uncertainty: cannot be decided
    assert j["verdict"] == INCONCLUSIVE
    assert "no uncertainty" in describe("a", j["parts"]["a"])
    assert "measurement noise only" in describe("a", judge({"a": measured(1, 0.1)})["parts"]["a"])
    with pytest.raises(ValueError, match="no values"):
        over_seeds([])
    with pytest.raises(ValueError, match="standard errors"):
        over_seeds([1, 2], [0.1])


def test_t_interval_covers_at_its_level_and_normal_would_not():
    """n = 3 seeds: the t interval covers the true mean in ~95% of replicates; the 1.96 interval
    that ignores the few degrees of freedom covers far less (~83%)."""
    rng = random.Random(1)
    cover_t = cover_z = 0
    reps = 3000
    for _ in range(reps):
        e = over_seeds([rng.gauss(0.3, 1.0) for _ in range(3)])
        lo, hi = e.interval()
        cover_t += lo <= 0.3 <= hi
        cover_z += abs(e.value - 0.3) <= 1.959964 * e.se
    assert 0.935 <= cover_t / reps <= 0.965
    assert cover_z / reps < 0.88


def test_detectable_effect_has_its_power():
    """A true effect equal to the stated detectable size is found ~80% of the time."""
    rng = random.Random(2)
    se = 1.0
    d = measured(0.0, se).detectable()
    assert d == pytest.approx((1.959964 + 0.841621) * se, rel=1e-5)
    hits = sum(judge({"a": measured(rng.gauss(d, se), se)})["verdict"] == SUPPORTED
               for _ in range(4000))
    assert 0.77 <= hits / 4000 <= 0.83


def test_three_words():
    assert judge({"a": measured(3, 1)})["verdict"] == SUPPORTED
    assert judge({"a": measured(-3, 1)})["verdict"] == CONTRADICTED
    assert judge({"a": measured(1, 1)})["verdict"] == INCONCLUSIVE
    # any contradicted part contradicts the claim, even next to a supported one
    j = judge({"a": measured(10, 1), "b": measured(-10, 1)})
    assert j["verdict"] == CONTRADICTED
    assert j["parts"]["a"]["verdict"] == SUPPORTED
    # supported only if every part is
    assert judge({"a": measured(10, 1), "b": measured(0.5, 1)})["verdict"] == INCONCLUSIVE
    inc = judge({"a": measured(0.5, 1)})["parts"]["a"]
    assert inc["detectable"] > 0
    assert judge({"a": measured(9, 1)})["parts"]["a"]["detectable"] is None


def _with_p(p: float) -> Effect:
    """A normal-reference effect whose two-sided p-value is ``p``."""
    return measured(float(stats.norm.isf(p / 2)), 1.0)


def test_holm_step_down():
    # p = 0.01, 0.02, 0.04: Holm rejects all three (0.01 < .05/3, .02 < .05/2, .04 < .05);
    # Bonferroni (.05/3 each) would reject only the first
    j = judge({"a": _with_p(0.01), "b": _with_p(0.02), "c": _with_p(0.04)})
    assert j["verdict"] == SUPPORTED
    assert [round(j["parts"][k]["level"], 6) for k in "abc"] == [
        round(1 - 0.05 / 3, 6), round(1 - 0.05 / 2, 6), 0.95]
    # p = 0.01, 0.03, 0.04: stops at 0.03 > .05/2; the later 0.04 (< .05) is not significant
    j = judge({"a": _with_p(0.01), "b": _with_p(0.03), "c": _with_p(0.04)})
    assert [j["parts"][k]["verdict"] for k in "abc"] == [SUPPORTED, INCONCLUSIVE, INCONCLUSIVE]
    assert j["parts"]["c"]["level"] == pytest.approx(1 - 0.05 / 2)
    assert j["parts"]["c"]["interval"][0] < 0  # its interval contains zero, as its verdict says
    assert j["verdict"] == INCONCLUSIVE
    # one part: no correction
    assert judge({"a": _with_p(0.04)})["verdict"] == SUPPORTED


def test_paired_by_seed_uses_common_seeds():
    low = {0: (0.1, 0.01), 1: (0.2, 0.01), 2: (0.15, 0.01)}
    high = {0: (0.3, 0.01), 1: (0.35, 0.01), 2: (0.4, 0.01), 3: (9.0, 0.01)}
    e = paired_by_seed(low, high, "h − l")
    assert e.seeds == 3 and e.value == pytest.approx((0.2 + 0.15 + 0.25) / 3)
    with pytest.raises(ValueError, match="no seed"):
        paired_by_seed({0: (1, 0)}, {1: (1, 0)})


def test_bootstrap_slope():
    def slope(pts):
        xs = [x for x, _ in pts]
        mx = sum(xs) / len(xs)
        sxx = sum((x - mx) ** 2 for x in xs)
        if sxx == 0:
            return math.nan
        my = sum(y for _, y in pts) / len(pts)
        return sum((x - mx) * (y - my) for x, y in pts) / sxx

    exact = [(x, 2.0 * x) for x in (1, 2, 3, 4) for _ in range(3)]
    e = bootstrap(exact, slope, "slope")
    assert e.value == pytest.approx(2.0) and e.se == pytest.approx(0.0, abs=1e-12)
    rng = random.Random(3)
    noisy = [(x, 0.1 * x + rng.gauss(0, 1)) for x in (1, 2, 3, 4) for _ in range(3)]
    e1, e2 = bootstrap(noisy, slope, seed=5), bootstrap(noisy, slope, seed=5)
    assert e1 == e2 and e1.se > 0 and e1.df == len(noisy) - 1
    assert math.isnan(bootstrap([(1, 1.0)], slope).se)


def test_verdict_dict_and_not_comparable():
    v = verdict({"mlp": over_seeds([0.02, 0.03, 0.025], what="mlp − vit")}, claim="vit lowest",
                evidence={"k": 1}, note="σ = 0.1")
    assert v["verdict"] == SUPPORTED
    assert v["reason"].startswith("vit lowest: mlp − vit = +0.025 [")
    assert "(95%, 3 seeds) supported" in v["reason"] and v["reason"].endswith("σ = 0.1")
    assert v["effects"]["mlp"]["df"] == 2 and v["evidence"] == {"k": 1}
    nc = not_comparable("train accuracies differ")
    assert nc["verdict"] == NOT_COMPARABLE and nc["effects"] == {}


def test_a_verdict_is_plain_json():
    """No NaN or infinity reaches verdict.json: an unknown s.e. and the normal reference's
    infinite df are None, so the verdict reads back equal."""
    import json

    v = verdict({"a": over_seeds([0.5]), "b": measured(1.0, 0.1)})
    back = json.loads(json.dumps(v, allow_nan=False))
    assert back == v
    assert v["effects"]["a"]["se"] is None and v["effects"]["a"]["interval"] == [None, None]
    assert v["effects"]["b"]["df"] is None  # normal reference
    assert "a = +0.5 [?, ?]" in v["reason"]
    # a bootstrap part counts runs, not seeds
    part = judge({"s": bootstrap([1.0, 2.0, 3.0], lambda u: sum(u) / len(u))})["parts"]["s"]
    assert "(95%, 3 runs)" in describe("s", part)


def test_the_unit_of_replication_is_named_in_the_verdict() -> None:
    """A mean over runs that are not seeds of one setting says so: the synthetic task's runs are
    three task settings, hr_random_functions' are (k, seed) pairs."""
    e = over_seeds([0.2, 0.3, 0.25], what="x", unit="run")
    assert e.method == "mean over 3 runs (t)" and e.unit == "run"
    v = verdict({"p": e}, claim="c")
    assert "(95%, 3 runs) supported" in v["reason"] and v["effects"]["p"]["unit"] == "run"
    pairs = over_seeds([0.2, 0.3], unit="(k, seed) pair")
    assert "2 (k, seed) pairs)" in verdict({"p": pairs})["reason"]
    assert "3 seeds)" in verdict({"p": over_seeds([0.2, 0.3, 0.25])})["reason"]
    assert bootstrap([1.0, 2.0, 3.0], lambda u: sum(u) / len(u)).unit == "run"


def test_a_value_that_is_not_finite_gets_no_power_statement():
    """A NaN metric is inconclusive without a 'could detect' size (which would claim a power it
    never had), and its words say why."""
    for e in (measured(float("nan"), 0.01), over_seeds([float("nan")] * 3, [0.01] * 3)):
        part = judge({"p": e})["parts"]["p"]
        assert part["verdict"] == INCONCLUSIVE and part["detectable"] is None
        text = describe("p", part)
        assert "cannot be judged (the value is not finite)" in text and "detect" not in text
    ok = judge({"p": measured(0.001, 0.01)})["parts"]["p"]
    assert ok["detectable"] is not None and "could detect" in describe("p", ok)
