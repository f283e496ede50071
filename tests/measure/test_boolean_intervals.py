"""Numbers of ``boolean_sensitivity`` that can be trusted as printed: the sampled 95% interval
uses Student's t (not ±1.96) and stays in the range s(f, x) can take, a standard error resting
on no change (``0 ± 0``) or on a handful is flagged, and every warning points at the caller's
line, not at senslab's ``one_at_a_time`` wrapper."""

from __future__ import annotations

import warnings

import pytest
import torch
from torch import nn

from senslab.measure.boolean import boolean_sensitivity, majority, truth_table

# 0.975 quantiles of Student's t, from the printed tables (2 and 4 degrees of freedom)
T_2DF, T_4DF = 4.3027, 2.7764

_A = torch.randn(10, 10, generator=torch.Generator().manual_seed(5)).triu(1)
A = _A + _A.T  # symmetric, zero diagonal


def quad(x: torch.Tensor) -> torch.Tensor:
    """A real-valued f = Σ_{i<j} a_ij·x_i·x_j on 10 bits. Flipping bit i changes it by
    2·x_i·Σ_{j≠i} a_ij·x_j, so (change / 2)² = (Σ_j a_ij·x_j)², whose mean over uniform x is
    Σ_j a_ij²: the "real" sensitivity is Σ_{i≠j} a_ij² in closed form, and s(f, x) takes
    many values (a sum of squares), so a t interval is what small samples need."""
    return 0.5 * ((x @ A.to(x)) * x).sum(1)


QUAD_AS = float(A.double().pow(2).sum())


def all_and(x: torch.Tensor) -> torch.Tensor:
    """AND of all bits: a flip changes it only at the all-(+1) string and its n neighbours,
    so as(f) = n · 2 / 2ⁿ (2·12/4096 = 0.00586 on 12 bits)."""
    return (x > 0).all(1)


# ----------------------------------------------------------------------------- the interval


@pytest.mark.parametrize(("num_samples", "t"), [(3, T_2DF), (5, T_4DF)])
def test_sampled_interval_uses_student_t(num_samples: int, t: float) -> None:
    r = boolean_sensitivity(quad, 10, method="sample", num_samples=num_samples,
                            generator=11, output="real")
    assert r.stderr > 0 and r.ci95[0] > 0  # not cut at 0, so the half-width is t·stderr
    half = (r.ci95[1] - r.ci95[0]) / 2
    assert half == pytest.approx(t * r.stderr, rel=1e-4)
    assert (r.ci95[0] + r.ci95[1]) / 2 == pytest.approx(r.average)


def test_exact_check_of_closed_form() -> None:
    r = boolean_sensitivity(quad, 10, method="exact", output="real")
    assert r.average == pytest.approx(QUAD_AS, rel=1e-6)
    assert r.ci95 == (r.average, r.average) and r.stderr == 0.0


def test_small_sample_interval_covers_near_95_percent() -> None:
    """With ±1.96·stderr from 3 points the "95%" interval covered as(f) in about 79% of seeds;
    Student's t with 2 degrees of freedom covers about 94% (over 2000 seeds)."""
    hits = 0
    seeds = range(300)  # 0.76 of them with ±1.96·stderr, 0.92 with t
    for seed in seeds:
        r = boolean_sensitivity(quad, 10, method="sample", num_samples=3, generator=seed,
                                output="real")
        hits += r.ci95[0] <= QUAD_AS <= r.ci95[1]
    assert hits / len(seeds) >= 0.88


def test_sign_interval_stays_in_zero_to_n() -> None:
    """s(f, x) lies in [0, n] for class changes: from 2 points of MAJORITY on 3 bits, one with
    s = 0 and one with s = 2 (1 ± 1), ±1.96·stderr gave (−0.96, 2.96) and Student's t with 1
    degree of freedom (12.7) would give (−11.7, 13.7); no value outside [0, 3] is possible."""
    seen = 0
    for seed in range(20):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)  # few changes: said, not tested here
            r = boolean_sensitivity(majority, 3, method="sample", num_samples=2, generator=seed)
        lo, hi = r.ci95
        assert 0.0 <= lo <= r.average <= hi <= 3.0
        seen += r.stderr > 0
    assert seen > 0  # some seeds drew one point of each kind: the cut mattered there


# ----------------------------------------------------------------------------- few changes


def test_no_change_is_flagged_with_rule_of_three() -> None:
    truth = boolean_sensitivity(all_and, 12, method="exact").average
    assert truth == pytest.approx(2 * 12 / 4096)
    with pytest.warns(RuntimeWarning, match="rests on no change") as rec:
        r = boolean_sensitivity(all_and, 12, method="sample", num_samples=200, generator=0)
    # the silent result this warning is about: 0 ± 0, an interval that excludes the truth
    assert r.average == 0.0 and r.stderr == 0.0 and r.ci95 == (0.0, 0.0) and r.ci95[1] < truth
    message = str(rec[0].message)
    assert "3/200 = 0.015" in message and "method='exact'" in message
    assert rec[0].filename == __file__


def test_few_changes_are_flagged() -> None:
    with pytest.warns(RuntimeWarning, match="rests on few changes: only 1 of the 1,000"):
        boolean_sensitivity(all_and, 12, method="sample", num_samples=1000, generator=0)


def test_enough_changes_or_every_point_say_nothing() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        boolean_sensitivity(majority, 7, method="sample", num_samples=500, generator=1)
        # every point changes: the spread is the points' own, which t is for
        boolean_sensitivity(quad, 10, method="sample", num_samples=3, generator=1,
                            output="real")
        boolean_sensitivity(all_and, 12, method="exact")  # exact: no standard error at all


# ----------------------------------------------------------------------------- warning lines


def _only_here(rec: list[warnings.WarningMessage], match: str) -> None:
    hits = [w for w in rec if match in str(w.message)]
    assert hits, f"no warning matching {match!r}: {[str(w.message)[:60] for w in rec]}"
    for w in hits:
        assert w.filename == __file__, f"{match!r} points at {w.filename}:{w.lineno}"


def test_training_mode_warning_points_at_caller() -> None:
    torch.manual_seed(0)
    model = nn.Linear(4, 1)  # a new module is in training mode
    with warnings.catch_warnings(record=True) as rec:
        warnings.simplefilter("always")
        boolean_sensitivity(model, 4, output="sign")
        boolean_sensitivity(model, 4, output="sign", method="sample", num_samples=50)
        truth_table(model, 4, output="sign")
    _only_here(rec, "training mode")
    assert sum("training mode" in str(w.message) for w in rec) == 3


def test_real_column_warning_points_at_caller() -> None:
    torch.manual_seed(0)
    model = nn.Linear(4, 1).eval()
    with warnings.catch_warnings(record=True) as rec:
        warnings.simplefilter("always")
        boolean_sensitivity(model, 4)
    _only_here(rec, "not as a classifier's logit")


def test_sampled_zero_one_warning_points_at_caller() -> None:
    with warnings.catch_warnings(record=True) as rec:
        warnings.simplefilter("always")
        boolean_sensitivity(lambda x: (x.sum(1) > 0).float(), 9, method="sample",
                            num_samples=100, generator=0)
    _only_here(rec, "took the sampled values, all in {0, 1}")


def test_low_precision_table_warning_points_at_caller() -> None:
    torch.manual_seed(0)
    model = nn.Linear(10, 1).bfloat16().eval()
    with warnings.catch_warnings(record=True) as rec:
        warnings.simplefilter("always")
        truth_table(model, 10, output="real")
    _only_here(rec, "bfloat16 outputs")
