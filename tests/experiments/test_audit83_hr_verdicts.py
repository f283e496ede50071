"""Audit 83: the verdicts of the Hahn & Rofin experiments on synthetic summaries with known
effects, checked against hand computations; null values (a resumed experiment) and duplicated
runs."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest
from scipy import stats

from senslab.experiments.hahn_rofin.random_functions import completion_verdict
from senslab.experiments.hahn_rofin.sharpness_vs_length import slope_verdict
from senslab.verdicts import CONTRADICTED, INCONCLUSIVE, SUPPORTED


def _len(f: str, n: int, seed: int, sharp: float | None, converged: bool = True
         ) -> dict[str, Any]:
    return {"name": f"{f}-n{n}-s{seed}", "function": f, "n": n, "seed": seed,
            "converged": converged, "final": {"sharpness/loss": sharp, "step": 1500}}


def _sweep(f: str, slope: float, noise: list[float]) -> list[dict[str, Any]]:
    return [_len(f, n, s, 0.3 + slope * n + noise[3 * i + s])
            for i, n in enumerate((4, 6, 8)) for s in range(3)]


NOISE = [0.011, -0.007, 0.002, -0.004, 0.009, -0.012, 0.006, -0.001, 0.003]


def _ols(f_runs: list[dict[str, Any]]) -> tuple[float, float]:
    x = np.array([s["n"] for s in f_runs], float)
    y = np.array([s["final"]["sharpness/loss"] for s in f_runs], float)
    b, a = np.polyfit(x, y, 1)
    rss = float(((y - a - b * x) ** 2).sum())
    return float(b), math.sqrt(rss / (len(x) - 2) / float(((x - x.mean()) ** 2).sum()))


def test_slope_verdict_numbers_match_a_hand_fit() -> None:
    parity, first = _sweep("parity", 0.1, NOISE), _sweep("first", 0.0, NOISE[::-1])
    v = slope_verdict(parity + first)
    assert v["verdict"] == SUPPORTED
    bp, sp = _ols(parity)
    bf, sf = _ols(first)
    part = v["effects"]["parity slope"]
    assert (part["effect"], part["se"], part["df"]) == pytest.approx((bp, sp, 7))
    flat = v["effects"]["first flat"]
    a, b = (0.25 * sp) ** 2, sf ** 2
    df = (a + b) ** 2 / (a * a / 7 + b * b / 7)
    assert flat["effect"] == pytest.approx(0.25 * abs(bp) - abs(bf))
    assert (flat["se"], flat["df"]) == pytest.approx((math.sqrt(a + b), df))
    # Holm over two parts: the smaller p at 97.5%, the other at 95%
    assert sorted(p["level"] for p in v["effects"].values()) == pytest.approx([0.95, 0.975])
    half = stats.t.ppf(1 - (1 - part["level"]) / 2, 7) * sp
    assert part["interval"] == pytest.approx([bp - half, bp + half])
    # the opposite: PARITY's sharpness falls with n
    assert slope_verdict(_sweep("parity", -0.1, NOISE) + first)["verdict"] == CONTRADICTED


def test_slope_verdict_reads_a_null_sharpness_as_nan() -> None:
    """A resumed experiment reads null where a fresh one had NaN: the same verdict, not a
    TypeError (before: "float() argument must be ... not 'NoneType'")."""
    parity, first = _sweep("parity", 0.1, NOISE), _sweep("first", 0.0, NOISE)
    nulled = [dict(s, final={**s["final"], "sharpness/loss": None}) if i == 4 else s
              for i, s in enumerate(parity)]
    nan = [dict(s, final={**s["final"], "sharpness/loss": math.nan}) if i == 4 else s
           for i, s in enumerate(parity)]
    v, fresh = slope_verdict(nulled + first), slope_verdict(nan + first)
    assert v["verdict"] == fresh["verdict"] == INCONCLUSIVE
    assert v["effects"]["parity slope"]["effect"] is None
    assert "parity-n6-s1" in v["reason"] and "cannot be judged" in v["reason"]


def test_slope_verdict_refuses_a_run_counted_twice() -> None:
    """One run twice entered the fit as two independent runs (10 runs, 8 df: a narrower
    interval on the same data); now refused, naming the run."""
    parity, first = _sweep("parity", 0.1, NOISE), _sweep("first", 0.0, NOISE)
    with pytest.raises(ValueError, match=r"two runs of parity at n = 4 have seed 0"):
        slope_verdict(parity + parity[:1] + first)


def _pair(k: int, seed: int, las: float, ras: float, lsh: float, rsh: float,
          se: float = 0.01) -> list[dict[str, Any]]:
    common = {"train_size": k, "seed": seed, "random_completion_sens": ras}
    return [{"name": f"{kind}-k{k}-s{seed}", **common,
             "final": {"train/acc": 1.0, "bool_sens": b, "sharpness/loss": sh,
                       "sharpness/loss_se": se}}
            for kind, b, sh in (("learned", las, lsh), ("random", ras, rsh))]


def test_completion_verdict_numbers_match_a_hand_computation() -> None:
    runs = (_pair(32, 0, 2.0, 4.0, 0.1, 0.5) + _pair(64, 0, 2.4, 4.1, 0.2, 0.5)
            + _pair(32, 1, 2.1, 3.9, 0.1, 0.4) + _pair(32, 2, 1.9, 4.0, 0.2, 0.45))
    v = completion_verdict(runs)
    seed_as = [(2.0 + 1.7) / 2, 1.8, 2.1]
    mean = sum(seed_as) / 3
    se = float(np.std(seed_as, ddof=1)) / math.sqrt(3)
    part = v["effects"]["as"]
    assert (part["effect"], part["se"], part["df"]) == pytest.approx((mean, se, 2))
    half = stats.t.ppf(1 - (1 - part["level"]) / 2, 2) * se
    assert part["interval"] == pytest.approx([mean - half, mean + half])
    assert v["verdict"] == SUPPORTED


def test_completion_verdict_refuses_a_duplicated_run() -> None:
    """A second learned run of one (k, seed) replaced the first without a word (its as 5.0
    instead of 2.0 judged, the other run gone from the evidence); now refused."""
    runs = (_pair(32, 0, 2.0, 4.0, 0.1, 0.5) + _pair(32, 1, 2.1, 3.9, 0.1, 0.4)
            + _pair(32, 2, 1.9, 4.0, 0.2, 0.45))
    again = _pair(32, 0, 5.0, 4.0, 0.9, 0.5)[:1]
    with pytest.raises(ValueError, match=r"two learned runs for k=32 seed 0"):
        completion_verdict(runs + again)
