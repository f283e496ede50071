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
Holm-corrected together. PARITY's part is the least-squares slope of final sharpness on n over
its m runs, with the ordinary least-squares standard error and Student's t on m − 2 degrees of
freedom (positive = sharpness grows with n). Each other function f's part is
``ratio·|PARITY's slope| − |f's slope|`` (``ratio`` = ¼; positive = f's slope is flatter than a
quarter of PARITY's), with standard error √(ratio²·s.e.²_PARITY + s.e.²_f) and Welch–
Satterthwaite degrees of freedom from the two fits' m − 2. A fit through two runs has no
standard error (the line passes through both): its parts are inconclusive, and say so. "not
comparable" when fewer than two n values of a function converged. The reason names the runs
left out as not converged, and a converged run whose final sharpness is not finite (NaN: its
function's fit and every part using it "cannot be judged"), with the step of its evaluation.

A ``--set functions=...`` that leaves out some of PARITY, MAJORITY, FIRST, MEAN judges only part
of the claim: the verdict is *partial* (``"partial"`` in verdict.json names the parts judged and
the parts omitted, and the reason says so). The judged parts keep the levels of the full Holm
family of four (an omitted part counts as not significant), so leaving functions out never
loosens a test; a contradicted judged part makes the claim contradicted (it fails whatever the
omitted parts would say), otherwise the verdict is "not comparable" (add the missing functions),
with the judged parts in the reason. (Correction of 2026-11-30: ``functions=parity,`` was
judged on PARITY's slope alone and recorded as the whole claim, "parity's sharpness grows with
n, the others' is flat".) (Until 2026-11-30 the
standard errors were bootstrapped over the runs: two runs gave the same slope in every resample,
s.e. ≈ 1e-17, so any difference between them was "supported" or "contradicted" for certain, and
with a lone run at some n its noise never entered the s.e.: 11–24% false decisions at a true
slope of 0 with 4–5 converged runs.)
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ...train.config import ranged
from ...verdicts import CONTRADICTED, NO_SE, Effect, describe, judge, not_comparable, verdict
from .._verdicts import final_value, listed
from ..base import Run, register_experiment
from ._common import (
    FRESH,
    FRESH_UNUSED,
    BooleanExperiment,
    Setup,
    boolean_run,
    linear_fit,
    refuse_empty,
)

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
class SharpnessVsLength(BooleanExperiment):
    paper = "Hahn & Rofin, Why are Sensitive Functions Hard for Transformers? (2024), Fig. 2"
    claim = ("The sharpness of trained transformers grows with the input length n for PARITY "
             "(clearly positive slope), but not for MAJORITY, FIRST or MEAN (slope ≈ 0).")
    cpu_scale_note = (
        "d = 32 instead of 128, n ∈ {4, 6, 8} instead of 4…30, 3 seeds instead of 10, 1,500 steps "
        "of 256 fresh strings, AdamW lr 1e-3"
    )

    scales = SCALES
    seed_aware = True  # the verdict judges every run, seed replicates included
    fixed = {**FRESH, "function": "set it through functions", "n": "set it through n_values"}
    unused = FRESH_UNUSED

    def runs(self, s: LengthSettings) -> list[Run]:
        unknown = [f for f in s.functions if f not in FUNCTIONS]
        if unknown:
            raise ValueError(f"unknown functions {unknown}; use some of {', '.join(FUNCTIONS)}")
        # an empty list trained nothing and was recorded as "no parity runs to compare with"
        refuse_empty(s, ("functions", "n_values"), "the runs are every function at every n")
        return [boolean_run(f"{f}-n{n}-s{seed}", s, label=f, function=f, n=n, seed=seed)
                for f in s.functions for n in s.n_values for seed in range(s.seeds)]

    def verdict(self, summaries: list[dict[str, Any]]) -> dict[str, Any]:
        return slope_verdict(summaries, claimed=FUNCTIONS)


def slope_verdict(summaries: list[dict[str, Any]], sensitive: str = "parity",
                  ratio: float = 0.25, claimed: Sequence[str] | None = None) -> dict[str, Any]:
    """Fit final sharpness on n per function (converged runs only) and judge the slopes: the
    ``sensitive`` function's slope > 0 and, per other function f, ``ratio·|its slope| −
    |f's slope|`` > 0, each on its least-squares standard error (Holm over the parts).

    ``claimed``: the functions the claim compares (the experiment passes :data:`FUNCTIONS`);
    where some of them have no runs, the verdict is partial (the module docstring). None: the
    claim is about the functions that have runs."""
    points: dict[str, list[tuple[int, float]]] = {}
    dropped: dict[str, int] = {}
    unconverged: list[str] = []
    bad: dict[str, list[str]] = {}  # function → its converged runs without a finite sharpness
    seen: dict[tuple[Any, Any, Any], str] = {}
    for s in summaries:
        f = s["function"]
        if "seed" in s:  # one run counted twice in a fit is a replicate that is not one
            key = (f, s["n"], s["seed"])
            if key in seen:
                raise ValueError(f"two runs of {f} at n = {s['n']} have seed {s['seed']} "
                                 f"({seen[key]} and {_name(s)}): each would enter the fit as "
                                 "an independent run; judge one run directory per (function, "
                                 "n, seed) (remove or rename the other)")
            seen[key] = _name(s)
        if s["converged"]:
            # null: a value not finite when summary.json was written (a resumed experiment
            # reads it back so), NaN as a fresh run's: "cannot be judged", not a TypeError
            sharp = s["final"]["sharpness/loss"]
            points.setdefault(f, []).append((s["n"], math.nan if sharp is None else sharp))
            if not _finite(sharp):
                bad.setdefault(f, []).append(final_value(s, "sharpness/loss", _name(s)))
        else:
            dropped[f] = dropped.get(f, 0) + 1
            unconverged.append(_name(s))
    evidence: dict[str, Any] = {"not_converged": dropped}
    fits: dict[str, Effect] = {}
    for f in sorted({s["function"] for s in summaries}):
        pts = points.get(f, [])
        if len({n for n, _ in pts}) < 2:
            # "fewer than two n values converged (acc > 0.99)" was said of runs at a single n
            # too, and of runs left out by the loss bound of a scale that sets converged_loss
            ran = sorted({s["n"] for s in summaries if s["function"] == f})
            if len(ran) < 2:
                return not_comparable(f"{f}: runs at n = {ran[0]} only, and a slope on n needs "
                                      "at least two lengths: give n_values two or more",
                                      evidence)
            mine = [_name(s) for s in summaries if s["function"] == f and not s["converged"]]
            return not_comparable(
                f"{f}: fewer than two of its n values ({', '.join(map(str, ran))}) have a "
                "converged run (the trainer's converged: held-out accuracy > 0.99, and the loss "
                f"below converged_loss where the scale sets one); not converged: {listed(mine)}",
                evidence)
        fits[f] = slope_effect(pts, f"slope of {f}'s sharpness on n")
        _, _, intercept = linear_fit([float(n) for n, _ in pts], [v for _, v in pts])
        evidence[f] = {"slope": fits[f].value, "slope_se": fits[f].se, "intercept": intercept,
                       "runs": len(pts),
                       "mean_sharpness": {str(n): _mean([v for m, v in pts if m == n])
                                          for n in sorted({n for n, _ in pts})}}
    if sensitive not in fits:
        return not_comparable(f"no {sensitive} runs to compare with", evidence)
    parts = {f"{sensitive} slope": fits[sensitive]}
    for f in fits:
        if f != sensitive:
            parts[f"{f} flat"] = flatness_effect(fits[sensitive], fits[f], ratio,
                                                 f"{ratio:g}·|{sensitive} slope| − |{f} slope|")
    detail = "; ".join(f"{f} {v.value:+.4g} ± {v.se:.2g}" for f, v in fits.items())
    claim = f"{sensitive}'s sharpness grows with n, the others' is flat"
    note = f"Sharpness per unit n (least squares ± s.e.): {detail}"
    # a NaN sharpness makes its function's slope NaN and every part using it "cannot be judged
    # (the value is not finite)": the words name the runs, not only the evidence
    for f, runs in bad.items():
        uses = list(parts) if f == sensitive else [f"{f} flat"]
        note += (f". Not finite, so {f}'s fit and the part{'s' if len(uses) > 1 else ''} "
                 f"{', '.join(uses)} cannot be judged: {listed(runs)}")
    if bad:
        evidence["not_finite"] = bad
    if unconverged:  # the parts' run counts are below the runs asked for: say which and why
        note += (f". Left out of the fits, not converged ({len(unconverged)} of "
                 f"{len(summaries)} runs): {listed(unconverged)}")
        evidence["not_converged_runs"] = unconverged
    missing = [f for f in claimed or () if f not in fits and f != sensitive]
    if missing:
        return _partial(parts, [f"{f} flat" for f in missing], missing, claim, note, evidence)
    return verdict(parts, claim=claim, evidence=evidence, note=note)


def _partial(parts: dict[str, Effect], omitted: list[str], missing: list[str], claim: str,
             note: str, evidence: dict[str, Any]) -> dict[str, Any]:
    """The verdict of a claim some of whose parts have no runs (``omitted``, the parts of the
    functions ``missing``): the judged ``parts`` at their levels in the full Holm family (an
    omitted part is a not-significant one: NaN p-value, last); contradicted if a judged part
    is, else "not comparable"; ``"partial"`` names the judged and the omitted parts."""
    j = judge({**parts, **{name: Effect(math.nan, math.nan, what=name) for name in omitted}})
    judged = {name: j["parts"][name] for name in parts}
    body = "; ".join(describe(name, p) for name, p in judged.items())
    why = (f"partial verdict: no runs of {', '.join(missing)} (add "
           f"{'them' if len(missing) > 1 else 'it'} to functions), so the claim's parts "
           + ", ".join(repr(p) for p in omitted) + " are not judged")
    partial = {"judged": list(parts), "omitted": omitted, "missing_functions": missing}
    if any(p["verdict"] == CONTRADICTED for p in judged.values()):
        return {"verdict": CONTRADICTED, "reason": f"{claim}: {body}; {why}. {note}",
                "evidence": evidence, "effects": judged, "partial": partial,
                "correction": f"Holm over {len(parts) + len(omitted)} parts ({len(omitted)} "
                              "omitted as not significant: no runs)"}
    out = not_comparable(f"{claim} — {why}; judged without them (no contradiction): {body}. "
                         f"{note}",
                         {**evidence, "judged_parts": judged})
    return {**out, "partial": partial}


def slope_effect(points: Sequence[tuple[float, float]], what: str = "") -> Effect:
    """The least-squares slope of y on x over ``(x, y)`` runs (at least two distinct x), with
    its ordinary standard error and Student's t on m − 2 degrees of freedom; no standard error
    (inconclusive) through two runs."""
    xs, ys = [float(x) for x, _ in points], [float(y) for _, y in points]
    m = len(xs)
    b, se, _ = linear_fit(xs, ys)
    method = f"least squares over {m} runs (t on {m - 2} df)"
    if m <= 2:
        method = (f"least squares over {m} runs; {NO_SE}a line through two runs fits them "
                  "exactly, at least 3 are needed")
    return Effect(b, se, m - 2, m, None, None, what, method, "run")


def flatness_effect(sensitive: Effect, other: Effect, ratio: float, what: str = "") -> Effect:
    """``ratio·|sensitive slope| − |other slope|`` of two independent least-squares fits
    (:func:`slope_effect`): standard error √(ratio²·s.e.²ₛ + s.e.²ₒ), Welch–Satterthwaite degrees
    of freedom; none (NaN) when either fit has none."""
    a, b = (ratio * sensitive.se) ** 2, other.se ** 2
    se = math.sqrt(a + b)
    runs = sensitive.seeds + other.seeds
    if not math.isfinite(se):
        # a fit of three runs or more lacks one where a run's value is not a number (a NaN
        # sharpness): verdict.json's method said "has two runs only" of it too
        lacking = " and ".join(
            f"{e.what or 'a fit'} " + ("has two runs only, at least 3 are needed"
                                       if e.seeds <= 2 else
                                       f"has none (a value among its {e.seeds} runs is not a "
                                       "number)")
            for e in (sensitive, other) if not math.isfinite(e.se))
        return Effect(ratio * abs(sensitive.value) - abs(other.value), math.nan, 0, runs, None,
                      None, what, f"difference of two least-squares fits; {NO_SE}{lacking}",
                      "run")
    dfs = (sensitive.df, other.df)
    df = (a + b) ** 2 / (a * a / dfs[0] + b * b / dfs[1]) if a + b > 0 else min(dfs)
    return Effect(ratio * abs(sensitive.value) - abs(other.value), se, df, runs, None, None, what,
                  f"difference of two least-squares fits over {sensitive.seeds} and "
                  f"{other.seeds} runs (t, Welch–Satterthwaite df)", "run")


def _mean(values: list[float]) -> float:
    return sum(values) / len(values)


def _finite(value: Any) -> bool:
    try:
        return math.isfinite(float(value))
    except (TypeError, ValueError):  # None or text: no number at all
        return False


def _name(summary: dict[str, Any]) -> str:
    """The run's name (its summary's; for a summary without one, function, n and seed)."""
    if "name" in summary:
        return str(summary["name"])
    return f"{summary['function']} n={summary['n']}" + (
        f" seed {summary['seed']}" if "seed" in summary else "")
