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

Verdict: "holds" when PARITY's slope is positive by more than two standard errors and every other
function's |slope| is below a quarter of PARITY's; "not comparable" when fewer than two n values
of a function converged.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from ...train.config import ranged
from ..base import Experiment, Run, register_experiment
from ._common import Setup, boolean_run, linear_fit

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
    """Fit final sharpness on n per function (converged runs only) and compare the slopes."""
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
            return {"verdict": "not comparable", "evidence": evidence,
                    "reason": f"{f}: fewer than two n values converged (acc > 0.99)"}
        slope, se, intercept = linear_fit([float(n) for n, _ in pts], [v for _, v in pts])
        fits[f] = (slope, se)
        evidence[f] = {"slope": slope, "slope_se": se, "intercept": intercept,
                       "mean_sharpness": {str(n): _mean([v for m, v in pts if m == n])
                                          for n in sorted({n for n, _ in pts})}}
    if sensitive not in fits:
        return {"verdict": "not comparable", "evidence": evidence,
                "reason": f"no {sensitive} runs to compare with"}
    ps, pse = fits[sensitive]
    positive = ps > 0 and (math.isnan(pse) or ps > 2 * pse)
    flat = {f: abs(v[0]) < ratio * abs(ps) for f, v in fits.items() if f != sensitive}
    ok = positive and all(flat.values())
    detail = "; ".join(f"{f} {v[0]:+.4g} ± {v[1]:.2g}" for f, v in fits.items())
    if ok:
        why = f"{sensitive}'s slope is > 2 s.e. above 0 and the others are < {ratio:g}× it"
    elif not positive:
        why = f"{sensitive}'s slope is not clearly positive"
    else:
        why = (f"{', '.join(f for f, v in flat.items() if not v)} slope(s) not below "
               f"{ratio:g}× {sensitive}'s")
    return {"verdict": "holds" if ok else "does not hold",
            "reason": f"{why}: sharpness per unit n: {detail}", "evidence": evidence}


def _mean(values: list[float]) -> float:
    return sum(values) / len(values)
