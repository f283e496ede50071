"""One example with the data estimand: the standard error is NaN, and compute says why.

The data standard error is the spread of the per-example rates; one example has none. Before,
``0.8125 ± nan (95% CI nan–nan, data)`` came with no word of the reason (only, at times, a
warning of few kept copies that spoke of the NaN interval as if it were one).
"""

from __future__ import annotations

import copy
import math
import warnings

import pytest
import torch

from senslab.measure import (
    CompareSensitivity,
    TokenSensitivity,
    compare_sensitivity,
    token_sensitivity,
)
from senslab.tokens import Patches

WHY = "needs at least two examples"


def _model(seed: int) -> torch.nn.Module:
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(3 * 8 * 8, 10)).eval()


def _x(n: int = 1, seed: int = 0) -> torch.Tensor:
    return torch.randn(n, 3, 8, 8, generator=torch.Generator().manual_seed(seed))


def _caught(fn):  # type: ignore[no-untyped-def]
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        out = fn()
    return out, [str(x.message) for x in w]


def test_data_on_one_example_says_why_and_names_the_subset_stderr() -> None:
    r, said = _caught(lambda: token_sensitivity(_model(0), _x(), Patches(4), sigma=3.0,
                                                repeats=4, generator=0))
    assert math.isnan(r.stderr) and all(math.isnan(v) for v in r.ci95)
    assert math.isfinite(r.stderr_subset) and r.stderr_subset > 0
    why = [m for m in said if WHY in m]
    assert len(why) == 1
    assert "estimand='subset'" in why[0] and f"± {r.stderr_subset:.2g}" in why[0]
    # one of the warnings of what a standard error rests on: a filter of those takes it too
    assert why[0].startswith("the standard error rests on one example")
    # the other warnings (few kept copies here) speak of the subset interval, never of the NaN
    others = [m for m in said if WHY not in m]
    assert others and all("nan" not in m for m in others)
    assert all("subset; the data one needs two examples" in m for m in others)
    # estimand="subset" on the same example: the same numbers, finite, and no word of two
    sub, said_sub = _caught(lambda: token_sensitivity(_model(0), _x(), Patches(4), sigma=3.0,
                                                      repeats=4, generator=0, estimand="subset"))
    assert not any(WHY in m for m in said_sub)
    assert sub.estimate == r.estimate and sub.stderr_subset == r.stderr_subset
    assert sub.stderr == sub.stderr_subset and math.isfinite(sub.stderr)
    lo, hi = sub.ci95
    assert lo == pytest.approx(max(sub.estimate - 1.96 * sub.stderr, 0.0))
    assert hi == pytest.approx(min(sub.estimate + 1.96 * sub.stderr, 1.0))
    assert f"(95% CI {lo:.4g}–{hi:.4g})" in why[0]


def test_streamed_warns_once_and_two_examples_are_finite() -> None:
    metric = TokenSensitivity(_model(0), Patches(4), sigma=3.0, repeats=4, generator=0)
    metric.update(_x(seed=0))
    r1, said1 = _caught(metric.compute)
    assert math.isnan(r1.stderr) and sum(WHY in m for m in said1) == 1
    metric.update(_x(seed=1))
    r2, said2 = _caught(metric.compute)
    assert r2.num_examples == 2 and math.isfinite(r2.stderr) and not any(WHY in m for m in said2)
    rates = r2.per_sample.double()
    assert r2.stderr == pytest.approx(float(rates.std() / math.sqrt(2)))
    metric.reset()  # said once per metric, as its other warnings
    metric.update(_x(seed=0))
    _, said3 = _caught(metric.compute)
    assert not any(WHY in m for m in said3)


def test_target_stderr_on_one_example_stops_and_says_what_it_bounds() -> None:
    r, said = _caught(lambda: token_sensitivity(_model(0), _x(), Patches(4), sigma=0.5,
                                                repeats=4, generator=0, target_stderr=0.05))
    assert r.num_forward <= 1 + 64 * 16  # the rounds' cap: no loop on a NaN
    assert math.isnan(r.stderr) and r.stderr_subset <= 0.05
    why = [m for m in said if WHY in m]
    assert len(why) == 1 and "the one target_stderr= stopped on" in why[0]


def test_one_unit_of_draws_does_not_offer_a_nan_subset() -> None:
    r, said = _caught(lambda: token_sensitivity(_model(0), _x(), Patches(4), sigma=3.0,
                                                repeats=1, generator=0, mode="whole"))
    assert math.isnan(r.stderr_subset)
    why = [m for m in said if WHY in m]
    assert len(why) == 1 and "a larger repeats=" in why[0] and "here ±" not in why[0]


def test_compare_on_one_example_says_why_for_the_difference() -> None:
    models = {"a": _model(0), "b": _model(1)}
    r, said = _caught(lambda: compare_sensitivity(models, _x(), Patches(4), sigma=3.0,
                                                  repeats=4, generator=0))
    d = r.difference("a", "b")
    assert math.isnan(d.stderr) and math.isfinite(d.stderr_subset)
    why = [m for m in said if WHY in m and "per-example differences" in m]
    assert len(why) == 1 and f"a − b ± {d.stderr_subset:.2g}" in why[0]
    # each model's own is said too, with its name
    assert sum(m.startswith("model 'a': ") and WHY in m for m in said) == 1
    sub, said_sub = _caught(lambda: compare_sensitivity(models, _x(), Patches(4), sigma=3.0,
                                                        repeats=4, generator=0,
                                                        estimand="subset"))
    ds = sub.difference("a", "b")
    assert ds.stderr == d.stderr_subset and not any(WHY in m for m in said_sub)


def test_compare_said_once_per_comparison() -> None:
    metric = CompareSensitivity({"a": _model(0), "b": _model(1)}, Patches(4), sigma=3.0,
                                repeats=4, generator=0)
    metric.update(_x())
    _, first = _caught(metric.compute)
    _, again = _caught(metric.compute)
    assert sum("per-example differences" in m for m in first) == 1
    assert not any("per-example differences" in m for m in again)


def test_no_disagreement_on_one_example_shows_the_subset_zero() -> None:
    a = _model(0)
    b = copy.deepcopy(a)  # another object, the same decisions: no copy differs
    r, said = _caught(lambda: compare_sensitivity({"a": a, "b": b}, _x(), Patches(4),
                                                  sigma=3.0, repeats=4, generator=0))
    none = [m for m in said if "rests on no copy on which the two models differ" in m]
    assert len(none) == 1 and "nan" not in none[0]
    assert "± 0.0000 (95% CI +0.0000–+0.0000, subset; the data one needs two examples)" in none[0]
