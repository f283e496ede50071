"""Audit 85 of senslab.verdicts: the test level and power are checked, seeds whose sum
overflows keep their finite mean, and a bootstrap without a standard error says why."""

from __future__ import annotations

import math
import statistics

import pytest

from senslab.verdicts import (
    NO_SE,
    SUPPORTED,
    Effect,
    bootstrap,
    judge,
    measured,
    over_seeds,
    verdict,
)


@pytest.mark.parametrize("alpha, power", [(0.0, 0.8), (1.0, 0.8), (5.0, 0.8), (-0.05, 0.8),
                                          (math.nan, 0.8), (0.05, 1.0), (0.05, 80.0),
                                          (0.05, 0.0)])
def test_a_level_or_power_outside_zero_one_is_refused(alpha: float, power: float) -> None:
    # before: alpha = 0 or power = 1 (or 80) looped for ever, alpha = 5 failed in scipy ("the
    # function value at x=0.0 is NaN"), alpha = 1 read "supported" at a zero-width interval
    parts = {"a": over_seeds([0.1, -0.2, 0.15], [0.01] * 3), "b": measured(0.1, 0.2)}
    name = "alpha" if not 0 < alpha < 1 else "power"
    with pytest.raises(ValueError, match=f"{name} = .* strictly between 0 and 1"):
        judge(parts, alpha=alpha, power=power)
    with pytest.raises(ValueError, match=f"{name} = "):
        Effect(0.1, 0.2, 2, 3, 0.05).detectable(alpha, power)


def test_verdict_refuses_a_percentage_for_alpha() -> None:
    with pytest.raises(ValueError, match="alpha = 5 "):
        verdict({"a": over_seeds([0.1, 0.2, 0.15])}, alpha=5)


def test_seeds_whose_sum_overflows_keep_their_finite_mean() -> None:
    # before: the sum overflowed, the mean read inf and the part "cannot be judged (the value
    # is not finite)" although every seed was finite and the interval lay far above zero
    vals, ses = [1.0e308, 1.1e308, 0.9e308], [1e306] * 3
    e = over_seeds(vals, ses, "x")
    assert math.isfinite(e.value)
    assert e.value == pytest.approx(statistics.fmean(v / 1e300 for v in vals) * 1e300)
    sd = statistics.stdev(v / 1e300 for v in vals) * 1e300
    assert e.se == pytest.approx(sd / math.sqrt(3))
    assert verdict({"x": e})["verdict"] == SUPPORTED


def test_seeds_whose_deviations_overflow_keep_their_spread() -> None:
    vals = [1.7e308, -1.7e308, 1.7e308]
    e = over_seeds(vals)
    scaled = [v / 1e300 for v in vals]
    assert e.value == pytest.approx(statistics.fmean(scaled) * 1e300)
    assert e.se == pytest.approx(statistics.stdev(scaled) / math.sqrt(3) * 1e300)


def test_a_bootstrap_without_a_standard_error_says_why() -> None:
    # before: "inconclusive, no uncertainty estimate" with no reason, although every other part
    # without a standard error gives one after NO_SE
    def mean_of_distinct(u: list[float]) -> float:  # undefined unless all 3 runs are drawn
        return sum(u) / len(u) if len(set(u)) == 3 else math.nan

    e = bootstrap([1.0, 2.0, 3.5], mean_of_distinct, "m", resamples=200)
    assert math.isnan(e.se)
    assert NO_SE in e.method and "of the 200 resamples, more than half" in e.method
    reason = verdict({"m": e})["reason"]
    assert "no uncertainty estimate (the statistic was undefined on" in reason
    one = bootstrap([1.0], lambda u: sum(u) / len(u), "m")
    assert NO_SE in one.method
    assert "a bootstrap needs at least 2" in verdict({"m": one})["reason"]
