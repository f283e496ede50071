"""Hahn & Rofin (1): sharpness of the trained transformer against the input length n.

Claim (docs/definitions.md#hr_sharpness_vs_length): for PARITY, the sharpness of the solution found
grows with n (a clearly positive slope of a linear fit of sharpness on n over seeds), while for the
low-sensitivity functions MAJORITY, FIRST and MEAN the slope is ≈ 0.

Command: ``senslab run hr_sharpness_vs_length`` (add ``--scale paper`` on a GPU).

Settings. Paper (the authors' sweep and config): d = 128, n = 4, 5, …, 30, 10 seeds, 10,000 steps
of 1,024 fresh strings, AdamW lr 3e-4, wd 0.1, PyTorch's encoder initialisation, sharpness from 10
weight draws, converged = held-out accuracy > 0.99 and loss < 0.001. CPU scale: a narrower
model (d = 32, FF width 32, still 2 layers, 2 heads, post-LN), n ∈ {4, 6, 8}, 3 seeds, 1,500
steps of 256 fresh strings, AdamW lr 1e-3 (higher because of the 7× fewer steps), wd 0.1;
sharpness from 10 weight draws on 512 held-out strings; converged = held-out accuracy > 0.99.
PARITY is learnt to > 99% held-out accuracy at every CPU n, so the comparison is between
solutions, as in the paper. Only converged runs enter the fits.

Verdict (:mod:`senslab.verdicts`), on the converged runs: the claim has one part per function,
Holm-corrected together. PARITY's part is the least-squares slope of final sharpness on n, with
its bootstrap standard error over the runs (positive = sharpness grows with n). Each other
function f's part is ``ratio·|PARITY's slope| − |f's slope|`` (``ratio`` = ¼; positive = f's
slope is flatter than a quarter of PARITY's), bootstrapped over the runs of PARITY and f
together. "not comparable" when fewer than two n values of a function converged.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ...train.config import ranged
from ...verdicts import bootstrap, not_comparable, verdict
from ..base import Experiment, Run, register_experiment
from ._common import Setup, boolean_run, linear_fit, slope

FUNCTIONS = ("parity", "majority", "first", "mean")


@dataclass
class LengthSettings(Setup):
    functions: tuple[str, ...] = FUNCTIONS
    n_values: tuple[int, ...] = ranged(tuple(range(4, 31)), ge=1)
    seeds: int = ranged(10, ge=1)


SCALES = {
    "cpu": LengthSettings(dim=32, steps=1500, batch=256, lr=1e-3, eval_every=500,
                          eval_size=512, sharp_draws=10, n_values=(4, 6, 8), seeds=3),
    "paper": LengthSettings(n_values=tuple(range(4, 31)), sharp_draws=10, init="torch_encoder",
                            converged_loss=1e-3),
}


@register_experiment("hr_sharpness_vs_length")
class SharpnessVsLength(Experiment):
    paper = "Hahn & Rofin, Why are Sensitive Functions Hard for Transformers? (2024), Fig. 2"
    claim = ("The sharpness of trained transformers grows with the input length n for PARITY "
             "(clearly positive slope), but not for MAJORITY, FIRST or MEAN (slope ≈ 0).")
    cpu_scale_note = (
        "d = 32 instead of 128, n ∈ {4, 6, 8} instead of 4…30, 3 seeds instead of 10, 1,500 steps "
        "of 256 fresh strings, AdamW lr 1e-3"
    )

    scales = SCALES
    seed_aware = True  # the verdict judges every run, seed replicates included

    def runs(self, s: LengthSettings) -> list[Run]:
        unknown = [f for f in s.functions if f not in FUNCTIONS]
        if unknown:
            raise ValueError(f"unknown functions {unknown}; use some of {', '.join(FUNCTIONS)}")
        return [boolean_run(f"{f}-n{n}-s{seed}", s, label=f, function=f, n=n, seed=seed)
                for f in s.functions for n in s.n_values for seed in range(s.seeds)]

    def verdict(self, summaries: list[dict[str, Any]]) -> dict[str, Any]:
        return slope_verdict(summaries)


def slope_verdict(summaries: list[dict[str, Any]], sensitive: str = "parity",
                  ratio: float = 0.25) -> dict[str, Any]:
    """Fit final sharpness on n per function (converged runs only) and judge the slopes: the
    ``sensitive`` function's slope > 0 and, per other function f, ``ratio·|its slope| −
    |f's slope|`` > 0, each bootstrapped over runs (Holm over the parts)."""
    points: dict[str, list[tuple[int, float]]] = {}
    dropped: dict[str, int] = {}
    for s in summaries:
        if s["converged"]:
            points.setdefault(s["function"], []).append((s["n"], s["final"]["sharpness/loss"]))
        else:
            dropped[s["function"]] = dropped.get(s["function"], 0) + 1
    evidence: dict[str, Any] = {"not_converged": dropped}
    fits: dict[str, tuple[float, float]] = {}
    for f in sorted({s["function"] for s in summaries}):
        pts = points.get(f, [])
        if len({n for n, _ in pts}) < 2:
            return not_comparable(f"{f}: fewer than two n values converged (acc > 0.99)",
                                  evidence)
        fit_slope, se, intercept = linear_fit([float(n) for n, _ in pts], [v for _, v in pts])
        fits[f] = (fit_slope, se)
        evidence[f] = {"slope": fit_slope, "slope_se": se, "intercept": intercept,
                       "mean_sharpness": {str(n): _mean([v for m, v in pts if m == n])
                                          for n in sorted({n for n, _ in pts})}}
    if sensitive not in fits:
        return not_comparable(f"no {sensitive} runs to compare with", evidence)
    parts = {f"{sensitive} slope": bootstrap(points[sensitive], slope,
                                             f"slope of {sensitive}'s sharpness on n")}
    for f in fits:
        if f != sensitive:
            units = [(sensitive, p) for p in points[sensitive]] + [(f, p) for p in points[f]]
            parts[f"{f} flat"] = bootstrap(units, _flatness(sensitive, f, ratio),
                                           f"{ratio:g}·|{sensitive} slope| − |{f} slope|")
    detail = "; ".join(f"{f} {v[0]:+.4g} ± {v[1]:.2g}" for f, v in fits.items())
    return verdict(parts, claim=f"{sensitive}'s sharpness grows with n, the others' is flat",
                   evidence=evidence,
                   note=f"Sharpness per unit n (least squares ± s.e.): {detail}")


def _flatness(sensitive: str, other: str, ratio: float
              ) -> Callable[[list[tuple[str, tuple[int, float]]]], float]:
    """``ratio·|slope of sensitive| − |slope of other|`` of ``(function, (n, sharpness))`` runs."""
    def statistic(units: list[tuple[str, tuple[int, float]]]) -> float:
        of = {f: [p for g, p in units if g == f] for f in (sensitive, other)}
        return ratio * abs(slope(of[sensitive])) - abs(slope(of[other]))
    return statistic


def _mean(values: list[float]) -> float:
    return sum(values) / len(values)
