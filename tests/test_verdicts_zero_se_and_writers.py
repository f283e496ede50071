"""Verdicts and records that were wrong without a word (audit verdicts69): a standard error of
exactly 0 decided as an exact value, a bootstrap whose resamples all agreed read as precise, one
seed's unknown measurement error that dropped the floor of all of them, degrees of freedom
Student's t cannot have, too few resamples, and two writers of REPRODUCTION.md at once.
Expected numbers are derived by hand or with scipy, not copied from the code."""

from __future__ import annotations

import math
import threading
from pathlib import Path

import pytest
from scipy import stats

from senslab.experiments.hahn_rofin.norm_vs_blowup import correlation_verdict, rank_correlation
from senslab.experiments.hahn_rofin.sharpness_vs_length import slope_effect
from senslab.reproduction import load_ladders, load_records, render, reproduction
from senslab.verdicts import (
    ALPHA,
    INCONCLUSIVE,
    NO_SE,
    SUPPORTED,
    Effect,
    bootstrap,
    describe,
    judge,
    measured,
    over_seeds,
    verdict,
)


def test_a_standard_error_of_exactly_zero_decides_nothing() -> None:
    """Three runs exactly on a line (sharpness 1, 2, 3 at n = 10, 20, 30) gave slope +0.1 with
    s.e. 0 and read 'slope = +0.1 [+0.1, +0.1] (95%, 3 runs) supported'; a measurement error
    of 0 did the same for one value."""
    e = slope_effect([(10, 1.0), (20, 2.0), (30, 3.0)], "slope")
    assert e.se == 0 and e.value == pytest.approx(0.1)  # the fit itself is right
    for part in (e, measured(0.5, 0.0), Effect(-2.0, 0.0, 4, 5)):
        j = judge({"x": part})["parts"]["x"]
        assert j["verdict"] == INCONCLUSIVE, part
        assert j["interval"] == [None, None] and j["p"] is None and j["detectable"] is None
        assert NO_SE in j["method"] and "exactly 0" in j["method"]
        text = describe("x", j)
        assert "no uncertainty estimate (a standard error of exactly 0" in text
        assert "supported" not in text and "contradicted" not in text


def test_a_zero_standard_error_does_not_take_the_first_holm_place() -> None:
    """With s.e. 0 a part had p = 0 and was tested first (at α/2), which let the other part be
    tested at the full α. Undecidable, it is ordered last: the other part, p = 0.03 on the
    normal, is tested at α/2 = 0.025 and is not significant."""
    z = stats.norm.isf(0.03 / 2)  # |effect| / s.e. with a two-sided p of exactly 0.03
    parts = {"exact": Effect(1.0, 0.0, 2, 3), "b": Effect(z, 1.0)}
    j = judge(parts)
    assert j["parts"]["b"]["p"] == pytest.approx(0.03)
    assert j["parts"]["b"]["level"] == pytest.approx(1 - ALPHA / 2)
    assert j["parts"]["b"]["verdict"] == INCONCLUSIVE
    assert j["parts"]["exact"]["verdict"] == INCONCLUSIVE and j["verdict"] == INCONCLUSIVE


def test_a_bootstrap_without_spread_is_not_precise() -> None:
    """Every resample of three runs in perfect rank order has ρ = 1 (clipped to 0.999): the
    bootstrap s.e. was the rounding of the mean, 1.6e-13, and the claim read 'rho = +1
    [+0.999, +1] (95%, 3 runs) supported' (two runs: the same)."""
    for m in (2, 3):
        pts = [(float(i), float(i) ** 1.5) for i in range(1, m + 1)]
        v = correlation_verdict(pts, lambda u: rank_correlation([p[0] for p in u],
                                                                [p[1] for p in u]),
                                "rho", {}, claim="")
        part = v["effects"]["rho"]
        assert v["verdict"] == INCONCLUSIVE and part["se"] is None, m
        assert f"every resample of the {m} runs gave the same value" in v["reason"]
    same = bootstrap([2.0, 2.0, 2.0], lambda u: sum(u) / len(u), "mean")
    assert same.se == 0 and judge({"x": same})["verdict"] == INCONCLUSIVE
    # a bootstrap with spread is decided as before: 1..6, mean 3.5, s.e. about 1.87/√6 = 0.70
    spread = bootstrap([1.0, 2.0, 3.0, 4.0, 5.0, 6.0], lambda u: sum(u) / len(u), "mean")
    assert spread.se == pytest.approx(math.sqrt(17.5 / 6 / 6), rel=0.1)
    assert judge({"x": spread})["verdict"] == SUPPORTED


def test_a_bootstrap_needs_two_resamples() -> None:
    """resamples=1 failed with ZeroDivisionError, resamples=0 too."""
    for k in (0, 1):
        with pytest.raises(ValueError, match="resamples; a standard deviation needs at least 2"):
            bootstrap([1.0, 2.0, 3.0], lambda u: sum(u) / len(u), "mean", resamples=k)


def test_one_unknown_measurement_error_keeps_the_others_floor() -> None:
    """Values 0.05, 0.0501, 0.0502 with measurement errors 0.1 each: the floor √3·0.1/3 = 0.058
    makes them inconclusive. With the third error unknown (NaN) the floor was NaN, the
    comparison with it false, and the s.e. the seeds' spread, 5.8e-5: 'supported'. The two
    known errors still bound it: √2·0.1/3 = 0.047."""
    vals = [0.05, 0.0501, 0.0502]
    known = over_seeds(vals, [0.1, 0.1, 0.1])
    assert known.se == pytest.approx(0.1 / math.sqrt(3))
    assert judge({"x": known})["verdict"] == INCONCLUSIVE
    part = over_seeds(vals, [0.1, 0.1, math.nan])
    assert part.se == pytest.approx(math.sqrt(2) * 0.1 / 3)
    assert math.isnan(part.se_measure) and "2 seeds that have one; 1 without" in part.method
    assert judge({"x": part})["verdict"] == INCONCLUSIVE
    # every error unknown: the spread, as without errors, and the method says so
    spread = over_seeds([1.0, 2.0, 3.0], [math.nan] * 3)
    assert spread.se == pytest.approx(1 / math.sqrt(3))
    assert "measurement error unknown for 3 of them" in spread.method
    # every error unknown and the seeds tied: no standard error at all
    assert math.isnan(over_seeds([0.5, 0.5], [math.nan, math.nan]).se)
    with pytest.raises(ValueError, match="negative measurement standard error"):
        over_seeds([0.5, 0.6, 0.7], [-0.1, 0.1, 0.1])


def test_student_t_needs_a_degree_of_freedom() -> None:
    """Effect(1.0, 0.1, df=0) was accepted, and judge() failed in scipy's root finder ('The
    function value at x=0.0 is NaN')."""
    for df in (0, -1, math.nan):
        with pytest.raises(ValueError, match=r"Student's t needs df > 0"):
            Effect(1.0, 0.1, df)
    # without a standard error, df 0 says nothing and stays allowed (a line through two runs)
    assert verdict({"x": Effect(1.0, math.nan, 0)})["verdict"] == INCONCLUSIVE


def test_two_writers_of_reproduction_md_at_once(tmp_path: Path) -> None:
    """Both wrote REPRODUCTION.md through one temporary file, REPRODUCTION.md.tmp: one renamed
    it away under the other, which failed with a bare FileNotFoundError (dozens of times in 100
    renders from 4 threads)."""
    records = tmp_path / "rec"
    records.mkdir()
    out = tmp_path / "REPRODUCTION.md"
    errors: list[BaseException] = []
    start = threading.Barrier(4)

    def write() -> None:
        start.wait()
        for _ in range(25):
            try:
                reproduction([], records=records, out=out, log=lambda _: None)
            except Exception as err:  # noqa: BLE001 - every failure is the finding
                errors.append(err)

    threads = [threading.Thread(target=write) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert out.read_text() == render(load_records(records), load_ladders(records))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["REPRODUCTION.md", "rec"]
