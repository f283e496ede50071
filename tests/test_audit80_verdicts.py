"""The verdict rules checked by simulation at the seed counts the experiments use (audit
verdicts80): the smallest detectable effect of a mean over seeds whose s.e. is floored at its
measurement error (the noncentral t overstated its power: 0.75, not 0.80), the bootstrap's
plug-in spread (a mean over 3–11 runs at a true 0 decided in 6–7% of simulations at the 5%
level), a fully trained model's sensitivity written as 0.0000 in a verdict's words, and the
false-decision rate of "supported"/"contradicted" at a true 0 with Holm's correction and a
measurement error. Simulations are seeded; expected numbers come from scipy or by hand."""

from __future__ import annotations

import math
import random
from typing import Any

import pytest
from scipy import stats

from senslab.experiments._verdicts import lowest_sensitivity_verdict
from senslab.verdicts import (
    INCONCLUSIVE,
    SUPPORTED,
    Effect,
    bootstrap,
    judge,
    over_seeds,
)


@pytest.mark.parametrize("n", [3, 5])
def test_a_floored_parts_detectable_effect_is_found_with_its_power(n: int) -> None:
    """n seeds whose spread is all measurement noise (s.e. 1 each): the part's s.e. is floored
    at 1/√n, and its "could detect ≥ d" is the effect the part finds 80% of the time. The
    noncentral t's d (3.26 on 3 seeds, 1.68 on 5) was found in 75% and 74% of simulations:
    the floored test never divides by the small spreads that give the t test its power."""
    part = judge({"x": over_seeds([0.0] * n, [1.0] * n)})["parts"]["x"]
    assert part["verdict"] == INCONCLUSIVE and "floored" in part["method"]
    d = part["detectable"]
    nct = Effect(0.0, 1 / math.sqrt(n), n - 1).detectable()  # the same s.e. without a floor
    assert d > nct * 1.04
    rng = random.Random(80 + n)
    sims = 3000
    found = 0
    for _ in range(sims):
        lo, _ = over_seeds([d + rng.gauss(0.0, 1.0) for _ in range(n)], [1.0] * n).interval()
        found += lo > 0
    assert 0.78 <= found / sims <= 0.82, found / sims
    # a floor far below the spread is the noncentral t's, as before
    assert Effect(0.0, 1.0, n - 1, n, 1e-6).detectable() == pytest.approx(
        Effect(0.0, 1.0, n - 1).detectable(), rel=1e-6)


def test_a_bootstraps_standard_error_of_a_mean_is_students() -> None:
    """Three runs 1.1, 2, 2.9: Student's t gives s.e. 0.52 and p = 0.061 (inconclusive). The
    bootstrap's plug-in spread, 0.52·√(2/3) = 0.42, on the same t with 2 df read 'supported'."""
    runs = [1.1, 2.0, 2.9]
    ref = stats.ttest_1samp(runs, 0.0)
    assert 0.05 < ref.pvalue < 0.07
    e = bootstrap(runs, lambda u: sum(u) / len(u), "mean")
    assert e.se == pytest.approx(stats.sem(runs), rel=0.03)
    assert judge({"m": e})["verdict"] == INCONCLUSIVE
    six = bootstrap([1.0, 2.0, 3.0, 4.0, 5.0, 6.0], lambda u: sum(u) / len(u), "mean")
    assert six.se == pytest.approx(math.sqrt(3.5 / 6), rel=0.03)  # s = 1.87, over √6


def _run(label: str, seed: int, sens: float, se: float) -> dict[str, Any]:
    return {"label": label, "seed": seed, "name": f"{label}-s{seed}",
            "final": {"sens/train": sens, "sens/train_se": se, "train/acc": 0.99}}


def test_a_small_sensitivity_is_written_with_its_digits() -> None:
    """A ViT at 3.1e-05 and an MLP at 8.2e-05: the words read 'vit 0.0000 ± 0.0000, mlp
    0.0001 ± 0.0000' next to a part of +5.1e-05."""
    runs = [_run("vit", k, 3.0e-5 + 1e-6 * k, 4e-6) for k in range(3)]
    runs += [_run("mlp", k, 8.0e-5 + 2e-6 * k, 6e-6) for k in range(3)]
    v = lowest_sensitivity_verdict(runs, "vit")
    assert v["verdict"] == SUPPORTED
    # vit: mean 3.1e-05, s.e. floored at √(3·(4e-6)²)/3 = 2.3e-06
    assert "vit 3.1e-05 ± 2.3e-06 (train acc 0.990)" in v["reason"], v["reason"]
    assert "mlp 8.2e-05 ± 3.5e-06" in v["reason"] and "0.0000" not in v["reason"]
    big = [_run("vit", k, 0.0193 + 0.001 * k, 4e-4) for k in range(3)]
    big += [_run("mlp", k, 0.03 + 0.001 * k, 4e-4) for k in range(3)]
    assert "vit 0.0203 ± 0.00058" in lowest_sensitivity_verdict(big, "vit")["reason"]


@pytest.mark.heavy
def test_false_decisions_at_a_true_zero_stay_at_the_level() -> None:
    """A true effect of 0 at 2, 3 and 5 seeds, a seed-to-seed s.d. of 1, without a measurement
    error and with one of 0.5 in each value: three parts (Holm) decide any part in at most
    about 5% of simulations, one part alone likewise (the normal's 1.96 in place of Student's
    t would decide 12–30% of single parts); a bootstrap mean over 3, 5 and 11 runs likewise
    (6.7%, 6.0%, 7.1% before its √(n/(n − 1)))."""
    rng = random.Random(8080)
    for n in (2, 3, 5):
        for me in (0.0, 0.5):
            sims, holm, one = 400, 0, 0
            for _ in range(sims):
                parts = {f"p{j}": over_seeds(
                    [rng.gauss(0, 1) + rng.gauss(0, me) for _ in range(n)],
                    [me] * n if me else None) for j in range(3)}
                j = judge(parts)
                holm += any(p["verdict"] != INCONCLUSIVE for p in j["parts"].values())
                lo, hi = parts["p0"].interval()
                one += lo > 0 or hi < 0
            assert holm / sims <= 0.075 and one / sims <= 0.075, (n, me, holm / sims, one / sims)
    for n in (3, 5, 11):
        sims, decided = 600, 0
        for i in range(sims):
            lo, hi = bootstrap([rng.gauss(0, 1) for _ in range(n)], lambda u: sum(u) / len(u),
                               resamples=400, seed=i).interval()
            decided += lo > 0 or hi < 0
        assert decided / sims <= 0.065, (n, decided / sims)
