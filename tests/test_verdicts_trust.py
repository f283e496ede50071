"""Inputs that gave a wrong verdict without a word (audit verdicts68): one seed with a
measurement error of 0, values so small or large that their spread under- or overflowed, a
Holm step that disagreed with the part's own interval at the critical value, seeds paired away
in silence, a negative standard error, and an accuracy gap equal to its bound up to rounding.
Numbers are checked against scipy."""

from __future__ import annotations

import math
from typing import Any

import pytest
from scipy import stats

from senslab.experiments._verdicts import lowest_sensitivity_verdict
from senslab.verdicts import (
    INCONCLUSIVE,
    NOT_COMPARABLE,
    SUPPORTED,
    UNPAIRED,
    Effect,
    describe,
    judge,
    measured,
    over_seeds,
    paired_by_seed,
    verdict,
)


def test_one_seed_with_a_measurement_error_of_zero_is_not_exact() -> None:
    """'+0.5 [+0.5, +0.5] (95%, 1 seed) supported (one seed, without a measurement error ...)':
    a measurement error of 0 made one seed exact."""
    for e in (over_seeds([0.5], [0.0]), paired_by_seed({0: (0.1, 0.0)}, {0: (0.6, 0.0)})):
        assert math.isnan(e.se) and e.seeds == 1
        part = judge({"x": e})["parts"]["x"]
        assert part["verdict"] == INCONCLUSIVE and part["interval"] == [None, None]
        assert part["detectable"] is None
        text = describe("x", part)
        assert "no uncertainty estimate" in text and "without a measurement error" in text
    # a non-zero measurement error is still the one seed's interval (normal reference)
    assert judge({"x": over_seeds([0.5], [0.1])})["verdict"] == SUPPORTED


@pytest.mark.parametrize("scale", [1e-200, 1e-160, 1.0, 1e160, 1e200])
def test_the_spread_of_tiny_or_huge_values_is_kept(scale: float) -> None:
    """Three seeds 1, 2, 3 (times ``scale``): t = 3.46 on 2 df, p = 0.074, inconclusive at every
    scale. At 1e-200 the squares underflowed to an s.e. of 0 ('supported, p = 0'); at 1e200 they
    overflowed (OverflowError)."""
    e = over_seeds([1 * scale, 2 * scale, 3 * scale], [0.1 * scale] * 3)
    ref = stats.ttest_1samp([1.0, 2.0, 3.0], 0.0)
    assert e.se == pytest.approx(scale / math.sqrt(3), rel=1e-12)
    assert e.se_measure == pytest.approx(0.1 * scale / math.sqrt(3), rel=1e-12)
    assert e.p_value() == pytest.approx(ref.pvalue, rel=1e-9)
    lo, hi = e.interval()
    assert lo / scale == pytest.approx(2 - stats.t.ppf(0.975, 2) / math.sqrt(3), rel=1e-9)
    assert hi / scale == pytest.approx(2 + stats.t.ppf(0.975, 2) / math.sqrt(3), rel=1e-9)
    assert judge({"x": e})["verdict"] == INCONCLUSIVE


def test_a_seed_that_is_not_finite_is_not_a_tie() -> None:
    """[inf, 1, 2] passed the tie test (inf − 1 ≤ 1e-12 · inf), so its method said the seeds
    tied; it cannot be judged because a value is not finite."""
    for values in ([math.inf, 1.0, 2.0], [1.0, math.nan, 1.0]):
        e = over_seeds(values, [0.1] * 3)
        assert "tied" not in e.method and "floored" not in e.method
        part = judge({"x": e})["parts"]["x"]
        assert part["verdict"] == INCONCLUSIVE
        assert "cannot be judged (the value is not finite)" in describe("x", part)


@pytest.mark.parametrize("df", [2, 3, 7])
def test_the_holm_step_agrees_with_the_parts_interval_at_the_critical_value(df: int) -> None:
    """Part b sits at the critical value of its Holm level 0.05/2 (t on ``df``); c has p = 0.04.
    c may be tested at 0.05 exactly when b was decided at 0.025 by its interval. The step used
    p < level, which rounding can put on the other side of the interval's decision: b
    inconclusive and c still stepped on to 0.05 (supported), or b supported and c held at 0.025.
    """
    q = float(stats.t.isf(0.025 / 2, df))
    c = measured(float(stats.norm.isf(0.04 / 2)), 1.0)
    for k in range(-6, 7):
        b = Effect(q * (1 + k * 1e-16), 1.0, df)
        j = judge({"a": measured(10.0, 1.0), "b": b, "c": c})["parts"]
        b_decided = j["b"]["verdict"] != INCONCLUSIVE
        assert b_decided == (j["b"]["interval"][0] > 0), k
        assert (j["c"]["level"] == pytest.approx(0.95)) == b_decided, k
        assert (j["c"]["verdict"] == SUPPORTED) == b_decided, k


def test_seeds_without_a_pair_are_named() -> None:
    """Seed 3 of ``high`` (and seed 7 of ``low``) had no partner: the part used seeds 0–2 and
    did not say that any seed was left out. Pairing is by seed id, not by position."""
    low = {2: (0.15, 0.01), 0: (0.1, 0.01), 1: (0.2, 0.01), 7: (5.0, 0.01)}
    high = {0: (0.3, 0.01), 1: (0.35, 0.01), 2: (0.4, 0.01), 3: (9.0, 0.01)}
    e = paired_by_seed(low, high, "h − l")
    assert e.seeds == 3 and e.value == pytest.approx((0.2 + 0.15 + 0.25) / 3)
    assert f"{UNPAIRED}7 (low only); 3 (high only)" in e.method
    v = verdict({"h − l": e})
    assert f"({UNPAIRED}7 (low only); 3 (high only))" in v["reason"]
    both = paired_by_seed({k: low[k] for k in (0, 1, 2)}, {k: high[k] for k in (0, 1, 2)})
    assert UNPAIRED not in both.method and both.value == e.value
    assert UNPAIRED not in verdict({"p": both})["reason"]
    # beside a reason for no standard error, each is stated once, apart
    tied = paired_by_seed({0: (0.1, 0.0), 1: (0.2, 0.0), 5: (1.0, 0.0)},
                          {0: (0.3, 0.0), 1: (0.4, 0.0)})
    assert ("no uncertainty estimate (the 2 seeds tied, more seeds are needed) "
            f"({UNPAIRED}5 (low only))") in verdict({"t": tied})["reason"]


def test_a_negative_standard_error_is_refused() -> None:
    """Effect(1, −0.1): its interval came out reversed ([1.2, 0.8]) and 'supported' with p = 1."""
    with pytest.raises(ValueError, match="standard error -0.1 < 0"):
        Effect(1.0, -0.1, what="x")
    with pytest.raises(ValueError, match="< 0"):
        measured(1.0, -0.1)
    assert math.isnan(Effect(1.0, math.nan).se)  # unknown is allowed


def _run(label: str, seed: int, acc: float, sens: float) -> dict[str, Any]:
    return {"label": label, "seed": seed, "name": f"{label}-s{seed}",
            "final": {"sens/train": sens, "sens/train_se": 0.001, "train/acc": acc}}


def test_an_accuracy_gap_equal_to_its_bound_is_within_it() -> None:
    """Seed-mean train accuracies 0.85 and 0.82 with max_acc_gap 0.03: 0.85 − 0.82 is
    0.030000000000000027 in floating point, and the runs read 'not comparable: seed-mean train
    accuracies differ by 0.030 (> 0.03)'. A gap past the bound by a real amount still is."""
    at = [_run("vit", k, 0.85, 0.010 + 0.001 * k) for k in range(3)]
    at += [_run("mlp", k, 0.82, 0.030 + 0.002 * k) for k in range(3)]
    assert 0.85 - 0.82 > 0.03  # the rounding this is about
    v = lowest_sensitivity_verdict(at, "vit", max_acc_gap=0.03)
    assert v["verdict"] == SUPPORTED, v["reason"]
    past = [dict(r, final={**r["final"], "train/acc": 0.8501}) if r["label"] == "vit" else r
            for r in at]
    v = lowest_sensitivity_verdict(past, "vit", max_acc_gap=0.03)
    assert v["verdict"] == NOT_COMPARABLE and "differ by 0.030 (> 0.03)" in v["reason"]
