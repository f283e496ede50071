"""Fixed decoder v: GD vs normalised GD vs the Polyak step on Φ(X) = vᵀXᵀsoftmax(XWx₁)
(docs/definitions.md#ib_fixed_v).

Claim (Vasudeva, Deora & Thrampoulidis): with v fixed, full-batch GD's ‖W_t‖ grows only
logarithmically, so W_t/‖W_t‖ approaches the max-margin direction W_mm slowly; NGD and the Polyak
step grow ‖W_t‖ linearly, align with W_mm at a polynomial rate and concentrate the softmax on the
optimal token (exponentially) faster.

Command: ``senslab run ib_fixed_v`` (report.html draws every metric against the step on log–log
axes, ``report_options``). The runs: the ``"attention"`` trainer
(:mod:`senslab.train.loops.attention`) with a fixed head, one run per optimiser and seed.

Setting: ``maxmargin_attention`` with its defaults (N = 32 sequences, T = 8 tokens, d = 32, unit
v, γ_opt = 1), v fixed to the data's v, W₀ = 0, float64, full batch, ``steps`` steps of each
optimiser, metrics at ~20 log-spaced steps per decade. GD lr 1, NGD lr 0.1 (NGD's ‖W_t‖ ≤ η·t,
and with η = 1 the softmax underflows to exactly one-hot after ~2,000 steps), Polyak with its
exact L* (below).

The loss floor (why not L* = 0): with v fixed, y_iΦ(X_i) = Σ_t a_it γ_it < γ_{i,opt}, so the
logistic loss is bounded below by L* = mean_i log(1 + e^{−γ_{i,opt}}) (= log(1 + e^{−1}) ≈ 0.313
here), approached but never reached. The Polyak step with L* = 0 would take ever larger steps
and diverge. We therefore train on the *excess* loss

    L(W) − L* = mean_i log1p(σ(−γ_{i,opt}) · expm1(δ_i)),   δ_i = Σ_{t≠opt} a_it (γ_{i,opt} − γ_it),

which is L − L* exactly (log(1+e^{−(γ−δ)}) − log(1+e^{−γ}) rearranged) and so has the same
gradient as L, but is computed without cancellation: δ_i is a sum of the tiny off-optimal weights
instead of a difference of two numbers ≈ γ_opt (``excess_loss`` in the trainer). Every optimiser
sees this objective; Polyak uses f* = 0 on it, i.e. the true L*. (``train/loss`` logs the plain
logistic loss, ``train/excess`` the excess.)

Verdict (:mod:`senslab.verdicts`): seven parts, Holm-corrected, each a mean over seeds with
Student's t (seed k's runs share its data): (1) from the fits on the logged steps ≥ 100 before
the run freezes (the softmax saturates to one-hot in float64 and the gradient becomes exactly 0),
GD's ``r2_log − r2_lin`` (positive = ‖W‖ grows like log t) and NGD's and Polyak's ``r2_lin −
r2_log`` (positive = linear growth); (2) for NGD and Polyak, ``steps_gd − steps_o`` to alignment
0.99 and to optimal-token mass 0.99 (positive = o gets there first). A run that never gets there
is censored at its last step. GD censored alone leaves a lower bound (GD's lag is understated,
against the claim), and the note says so. A censored contender would leave an *upper* bound
(biased toward the claim; with both censored the difference reads 0 whatever the truth), so that
part has no standard error: it is inconclusive, and says which seeds never got there (train
longer; but a seed whose run froze below the level never moves again, and the part says that
no run length gets it there) — unless that upper bound is already below 0: the truth is lower
still, and the part is judged as it stands (never supported). (Correction of 2026-11-30: a
censored contender first counted its last step too, which could support "o gets there faster"
from runs where o never got there.) "not comparable" when an optimiser has no runs or a run
froze (lower fit_from) or ended (train longer) before three logged steps of the fit window, or
a run's ‖W_t‖ became NaN or infinite (it diverged: until 2026-12-04 both of its R² read 0, a
difference of exactly 0 in the mean over seeds). Settings whose runs would log fewer than three
steps ≥ ``fit_from`` are refused before anything trains (:func:`check_fit_window`), and so is data
without a max-margin W_mm (``_common.check_tasks``).

CPU scale: 3 seeds (data and initialisation), 20,000 steps per optimiser (the paper's exact
synthetic sizes are not given; "paper" scale: 5 seeds, 100,000 steps).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from ...train.config import ranged
from ...train.loops.attention import log_schedule
from ...train.rundir import RunDir, nan_for_null
from ...verdicts import NO_SE, Effect, not_comparable, over_seeds, verdict
from ..base import Experiment, Run, Settings, register_experiment
from ._common import attention_runs, check_run_overrides, check_tasks, duplicate_runs

OPTIMIZERS = ("gd", "ngd", "polyak")
LEVEL = 0.99  # alignment / optimal-token mass a run must reach to count as converged


@dataclass
class FixedVSettings(Settings):
    """Settings of ``ib_fixed_v`` (override with ``--set steps=...``, ``--set data.dim=...``;
    ``data``: fields of :class:`~senslab.train.loops.attention.AttentionData`)."""

    steps: int = ranged(20000, ge=1)
    seeds: int = ranged(3, ge=1)
    gd_lr: float = ranged(1.0, gt=0)
    ngd_lr: float = ranged(0.1, gt=0)
    per_decade: int = ranged(20, ge=1)
    #: fit ‖W_t‖ from this step on: the claim is about growth after the first, transient phase
    #: (≥ 1: the log t fit has no point at step 0)
    fit_from: int = ranged(100, ge=1)
    data: dict[str, Any] = field(default_factory=dict)


SCALES = {"cpu": FixedVSettings(), "paper": FixedVSettings(steps=100_000, seeds=5)}


def first_step_reaching(records: list[dict[str, Any]], key: str, level: float) -> float:
    """The first logged step at which ``key`` ≥ ``level`` (inf if never: it never got there)."""
    return next((float(r["step"]) for r in records if r.get(key, -math.inf) >= level), math.inf)


def growth_fits(steps: list[float], norms: list[float]) -> dict[str, float]:
    """Least-squares fits ‖W‖ ≈ a + b·t and ‖W‖ ≈ a + b·log t; slopes and R² of each.

    R²_lin > R²_log says the norm grows linearly in t, the reverse that it grows like log t.
    Every step must be ≥ 1 (log t is not defined at 0), and every norm finite.
    """
    t = np.asarray(steps, dtype=float)
    if not (t >= 1).all():
        raise ValueError(f"growth_fits needs steps ≥ 1 (the log t fit), got {min(steps)}; "
                         "fit from step 1 or later (fit_from ≥ 1)")
    w = np.asarray(norms, dtype=float)
    if not np.isfinite(w).all():
        # a NaN or inf norm made both R² exactly 0 (the NaN total failed ``total > 0``), so a
        # diverged run read as "no difference between linear and log growth"
        raise ValueError(f"growth_fits needs finite norms, got {norms}: a run whose ‖W‖ is not "
                         "finite diverged and its growth cannot be fitted; fit the steps before "
                         "it diverged, or lower its step size")
    out: dict[str, float] = {"fit_points": float(len(t))}
    for name, x in (("lin", t), ("log", np.log(t))):
        A = np.stack([np.ones_like(x), x], axis=1)
        coef, *_ = np.linalg.lstsq(A, w, rcond=None)
        resid = w - A @ coef
        total = float(((w - w.mean()) ** 2).sum())
        out[f"slope_{name}"] = float(coef[1])
        out[f"r2_{name}"] = 1.0 - float((resid**2).sum()) / total if total > 0 else 0.0
    return out


def check_fit_window(steps: int, per_decade: int, fit_from: int) -> None:
    """Refuse settings whose runs log fewer than 3 steps ≥ ``fit_from`` (the ‖W‖ fits need 3):
    every run would train to the end, and the verdict could only be "not comparable" (until
    2026-12-06 ``steps=50``, below the default ``fit_from=100``, trained every run first)."""
    logged = log_schedule(steps, per_decade)
    window = [t for t in logged if t >= fit_from]
    if len(window) >= 3:
        return
    # the least steps that log 3 points from fit_from on: two scheduled steps ≥ fit_from, then
    # one more step (the last step is always logged); [fit_from, 100·fit_from) holds two
    scheduled = [t for t in log_schedule(100 * fit_from, per_decade)[:-1] if t >= fit_from]
    fits_from = [t for t in logged if t >= 1][-3:]
    lower = (f" or fit_from ≤ {fits_from[0]}" if len(fits_from) == 3 else "")
    raise ValueError(
        f"steps={steps} with fit_from={fit_from} (per_decade={per_decade}): the ‖W‖ growth fits "
        f"use the logged steps ≥ fit_from, and these runs log {len(window)} of them "
        f"({', '.join(map(str, window)) or 'none'}) where the fits need 3, so every run would "
        f"train and the verdict could only be 'not comparable'; use steps ≥ "
        f"{scheduled[1] + 1}{lower}")


def norm_growth(records: list[dict[str, Any]], fit_from: int) -> dict[str, float]:
    """Fits of ‖W_t‖ against t and log t over the logged steps t ≥ ``fit_from`` (≥ 1) while W
    moves.

    The window ends at the first logged step where ‖W‖ has stopped changing (the softmax has
    saturated to one-hot in float64, so the gradient is exactly 0 and the run is frozen):
    ``froze_at`` is that step (absent if the run never froze). A frozen run never moves again,
    so no longer run adds a point to its window, nor gets it to a level it has not reached.
    A run whose ‖W‖ is not finite at a logged step (it diverged) has no fits: ``diverged_at``
    names that step, and :func:`fixed_v_verdict` refuses the run.
    """
    points: list[tuple[float, float]] = []
    prev = None
    frozen: dict[str, float] = {}
    for r in records:
        w = r["attn/W_norm"]
        if not math.isfinite(w):
            return {"fit_points": float(len(points)), "diverged_at": float(r["step"])}
        if prev is not None and w == prev:
            frozen["froze_at"] = float(r["step"])
            break
        prev = w
        if r["step"] >= fit_from:
            points.append((float(r["step"]), w))
    if len(points) < 3:
        return {"fit_points": float(len(points)), **frozen}
    steps, norms = zip(*points, strict=True)
    return {**growth_fits(list(steps), list(norms)), **frozen}


@register_experiment("ib_fixed_v")
class IBFixedV(Experiment):
    paper = ("Vasudeva, Deora & Thrampoulidis, Implicit Bias and Fast Convergence Rates for "
             "Self-attention (TMLR 2025), fixed-v synthetic experiments")
    claim = ("With v fixed, GD's ‖W_t‖ grows logarithmically while NGD's and Polyak's grow "
             "linearly; NGD and Polyak align with W_mm and sparsify the attention faster.")
    cpu_scale_note = (
        "3 seeds, 20,000 steps per optimiser (paper scale: 5 seeds, 100,000; the paper does not "
        "give its synthetic sizes)"
    )
    #: how `senslab run` / `senslab report` draw this experiment
    report_options: ClassVar[dict[str, Any]] = {
        "x": "step", "logx": True,
        "logy": ["train/loss", "train/excess", "attn/W_norm"],
    }

    scales = SCALES
    seed_aware = True  # the verdict judges every run, seed replicates included
    one_thread_at = ("cpu", "paper")  # a model of a few kilobytes at every scale
    replicated_by = ("data.seed",)
    replicated_why = "every run starts from W₀ = 0 and takes full-batch steps"

    def runs(self, s: FixedVSettings) -> list[Run]:
        return attention_runs(s, {"gd": {"optimizer": "sgd", "lr": s.gd_lr},
                                  "ngd": {"optimizer": "ngd", "lr": s.ngd_lr},
                                  "polyak": {"optimizer": "polyak"}},
                              head="fixed", init_scale=0.0)

    def resolve(self, scale: str, overrides: list[str] | tuple[str, ...] = ()
                ) -> tuple[FixedVSettings, list[Run]]:
        """As :meth:`Experiment.resolve`, refusing ``--set head=…`` and ``--set batch_size=…``
        (the claim is about full-batch steps with v fixed) and a step-size field no run reads
        (``sps_c``: no SPS run here)."""
        settings, runs = super().resolve(scale, overrides)
        check_run_overrides(self.name, runs, self.runs(settings), {
            "head": ("fixed", "tests a claim about a fixed decoder v"),
            "batch_size": (None, "tests a claim about full-batch GD, NGD and Polyak steps")})
        return settings, runs

    def before_training(self, settings: FixedVSettings) -> None:
        """Before anything is written: 3 logged steps in the fit window
        (:func:`check_fit_window`), and every seed's data has its max-margin W_mm
        (:func:`~._common.check_tasks`)."""
        check_fit_window(settings.steps, settings.per_decade, settings.fit_from)
        check_tasks(self.name, self.runs(settings))

    def after_run(self, run: Run, path: Path, summary: dict[str, Any], settings: FixedVSettings,
                  log: Callable[[str], None]) -> dict[str, Any]:
        """The ‖W‖ growth fits and the steps to ``LEVEL``, from the run's metric log."""
        # a NaN the loop logged is null in metrics.jsonl: read back as the NaN it was
        records = nan_for_null(RunDir(path).metrics())
        return {**summary, "fit": norm_growth(records, settings.fit_from),
                "reach": {k: first_step_reaching(records, f"attn/{k}", LEVEL)
                          for k in ("alignment", "sparsity")}}

    def verdict(self, summaries: list[dict[str, Any]]) -> dict[str, Any]:
        return fixed_v_verdict(summaries)


def _mean(values: list[float | None]) -> float:
    """The mean; NaN if a value is null (a final metric that was not finite is null in
    summary.json: before 2026-12-07 it stopped the verdict with a TypeError)."""
    return math.nan if any(v is None for v in values) else sum(values) / len(values)


def fixed_v_verdict(summaries: list[dict[str, Any]]) -> dict[str, Any]:
    """Verdict from the norm-growth fits and the steps to alignment / sparsity ``LEVEL``, per
    seed (the module docstring)."""
    by: dict[str, list[dict[str, Any]]] = {}
    for s in summaries:
        by.setdefault(s["label"], []).append(s)
    if set(by) != set(OPTIMIZERS):
        return not_comparable(f"need runs of {', '.join(OPTIMIZERS)}; got {', '.join(sorted(by))}")
    if (twice := duplicate_runs(summaries)) is not None:  # the paired parts kept the last
        return not_comparable(twice)
    diverged = sorted(f"{s['name']} (step {s['fit']['diverged_at']:g})" for s in summaries
                      if "diverged_at" in s["fit"])
    if diverged:
        return not_comparable(f"‖W‖ became NaN or infinite in {', '.join(diverged)}: the run "
                              "diverged, so its growth cannot be fitted nor its steps to "
                              f"{LEVEL} compared (lower that optimiser's step size)")
    unfitted = [s for s in summaries if "r2_lin" not in s["fit"]]
    if unfitted:
        # "run longer" cannot help a run that froze: its window ends where it froze, whatever
        # the number of steps; only a run that ran out of steps gains points from more of them
        froze = sorted(f"{s['name']} (‖W‖ unchanged at step {s['fit']['froze_at']:g})"
                       for s in unfitted if "froze_at" in s["fit"])
        short = sorted(s["name"] for s in unfitted if "froze_at" not in s["fit"])
        why = []
        if froze:
            why.append(f"froze before 3 logged steps in the fit window: {', '.join(froze)}; "
                       "the softmax saturated to one-hot in float64, so the gradient is exactly "
                       "0 and a frozen run never moves again: training longer adds no point, "
                       "lower fit_from")
        if short:
            why.append(f"ended before 3 logged steps in the fit window: {', '.join(short)}; "
                       "run longer (more steps) or lower fit_from")
        return not_comparable("too few points to fit ‖W‖: " + "; ".join(why))
    evidence: dict[str, Any] = {}
    for o, runs in by.items():
        evidence[o] = {
            **{k: _mean([r["fit"][k] for r in runs])
               for k in ("r2_lin", "r2_log", "slope_lin", "slope_log")},
            "steps_to_alignment": max(r["reach"]["alignment"] for r in runs),
            "steps_to_sparsity": max(r["reach"]["sparsity"] for r in runs),
            "final_alignment": _mean([r["final"]["attn/alignment"] for r in runs]),
            "final_sparsity": _mean([r["final"]["attn/sparsity"] for r in runs]),
            "final_W_norm": _mean([r["final"]["attn/W_norm"] for r in runs]),
        }
    gd = evidence["gd"]
    checks = {"GD ‖W‖ logarithmic": gd["r2_log"] > gd["r2_lin"]}  # on the means, as before
    for o in ("ngd", "polyak"):
        e = evidence[o]
        checks[f"{o} ‖W‖ linear"] = e["r2_lin"] > e["r2_log"]
        checks[f"{o} aligns faster"] = e["steps_to_alignment"] < gd["steps_to_alignment"]
        checks[f"{o} sparsifies faster"] = e["steps_to_sparsity"] < gd["steps_to_sparsity"]
    seed = {o: {r.get("seed", 0): r for r in runs} for o, runs in by.items()}
    common = sorted(set(seed["gd"]) & set(seed["ngd"]) & set(seed["polyak"]))
    if not common:
        return not_comparable("no seed has runs of every optimiser", evidence)
    parts = {"GD ‖W‖ logarithmic": over_seeds(
        [r["fit"]["r2_log"] - r["fit"]["r2_lin"] for r in by["gd"]], what="gd r2_log − r2_lin")}
    for o in ("ngd", "polyak"):
        parts[f"{o} ‖W‖ linear"] = over_seeds(
            [r["fit"]["r2_lin"] - r["fit"]["r2_log"] for r in by[o]], what=f"{o} r2_lin − r2_log")
    censored: dict[str, dict[str, list[int]]] = {}  # {optimiser: {key: seeds that never got there}}
    for o in OPTIMIZERS:
        for key in ("alignment", "sparsity"):
            never = [k for k in common if not math.isfinite(seed[o][k]["reach"][key])]
            if never:
                censored.setdefault(o, {})[key] = never
    for o in ("ngd", "polyak"):
        for key, words in (("alignment", "aligns"), ("sparsity", "sparsifies")):
            part = over_seeds(
                [_reached(seed["gd"][k], key) - _reached(seed[o][k], key) for k in common],
                what=f"steps_gd − steps_{o} to {LEVEL} {key}")
            never = censored.get(o, {}).get(key)
            gd_never = bool(censored.get("gd", {}).get(key))
            parts[f"{o} {words} faster"] = (_censored(part, o, key, never, seed[o], gd_never)
                                            if never else part)
    detail = "; ".join(
        f"{o}: R² lin {e['r2_lin']:.3f} / log {e['r2_log']:.3f}, steps to {LEVEL} alignment "
        f"{e['steps_to_alignment']:g}, to {LEVEL} mass {e['steps_to_sparsity']:g}"
        for o, e in evidence.items())
    note = f"Means over seeds (steps: the slowest seed; inf: never): {detail}"
    gd_never = censored.get("gd", {})
    if gd_never:
        note += ". " + "; ".join(
            f"gd never reached {LEVEL} {key} in {_seeds(never)}: its last step counts, so "
            "where a contender got there steps_gd − steps_o is a lower bound (GD's lag "
            "understated)"
            for key, never in gd_never.items())
    # a seed some optimiser lacks is left out of the paired parts: said, not dropped silently
    unpaired = {o: sorted(set(seed[o]) - set(common), key=str) for o in OPTIMIZERS
                if set(seed[o]) - set(common)}
    if unpaired:
        note += ". Left out of the paired parts (steps to alignment and sparsity), for want of a " \
                "run of every optimiser: " + "; ".join(f"{o} {_seeds(k)}" for o, k in
                                                        unpaired.items())
        evidence["unpaired_seeds"] = unpaired
    if censored:
        evidence["censored"] = censored
    return verdict(parts, evidence={**evidence, "checks": checks},
                   claim="GD's ‖W‖ grows like log t, NGD's and Polyak's linearly, and they align "
                         "and sparsify faster",
                   note=note)


def _seeds(seeds: list[int]) -> str:
    return f"seed{'s' if len(seeds) != 1 else ''} {', '.join(map(str, seeds))}"


def _censored(part: Effect, o: str, key: str, never: list[int],
              runs: dict[int, dict[str, Any]], gd_never: bool = False) -> Effect:
    """``part`` (``steps_gd − steps_o``) without a standard error, because contender ``o``
    never reached ``LEVEL`` of ``key`` in the seeds ``never``: its last step stands in for a
    later, unknown one, so the difference is only an upper bound, biased toward the claim; the
    method says why (inconclusive). Where that upper bound is already below 0 (against the
    claim) the part keeps its standard error: the true difference is lower still — provided
    GD reached the level in every seed (``gd_never`` False); a seed where GD was cut off too is
    a lower bound there, and the difference is then bounded on neither side."""
    last = sorted({int(runs[k]["steps"]) for k in never})
    if part.value < 0 and not gd_never:  # an upper bound already against the claim: the truth
        # is lower still (unless GD was cut off in some seed too: a lower bound there),
        # so the part is judged as it stands (it can be contradicted or undecided, never
        # supported)
        return dataclasses.replace(part, method=(
            f"{part.method}; {o} never reached {LEVEL} {key} in {_seeds(never)} within its "
            f"{' or '.join(map(str, last))} steps: the true difference is lower still"))
    method = part.method.split(NO_SE, 1)[0].rstrip("; ")  # censoring is the reason (ties too)
    # "train longer" is no advice for a seed that froze below the level: it never moves again
    frozen = [k for k in never if "froze_at" in runs[k].get("fit", {})]
    cut = [k for k in never if k not in frozen]
    why = []
    if cut:
        last = sorted({int(runs[k]["steps"]) for k in cut})
        why.append(f"{o} never reached {LEVEL} {key} in {_seeds(cut)} within its "
                   f"{' or '.join(map(str, last))} steps, so steps_gd − steps_{o} is only an "
                   "upper bound there: train longer")
    if frozen:
        at = ", ".join(f"{runs[k]['fit']['froze_at']:g}" for k in frozen)
        why.append(f"{o} froze below {LEVEL} {key} in {_seeds(frozen)} (‖W‖ stopped changing "
                   f"by step {at}: the softmax saturated to one-hot in float64, so the gradient "
                   "is exactly 0 and W never moves again): training longer cannot get it there, "
                   f"and its last step stands in for a step that never comes, so steps_gd − "
                   f"steps_{o} is an upper bound there that no longer run can tighten: {o} does "
                   f"not reach {LEVEL} {key} on this data in float64 (final_{key} in the "
                   "evidence: where it stopped)")
    return Effect(part.value, math.nan, part.df, part.seeds, part.se_measure, None, part.what,
                  f"{method}; {NO_SE}{'; '.join(why)}", part.unit)


def _reached(run: dict[str, Any], key: str) -> float:
    """The run's first step at ``LEVEL`` of ``key``; its last step (``steps``: the schedule
    ends there) if it never got there (censored: a lower bound of the true step)."""
    step = run["reach"][key]
    return step if math.isfinite(step) else float(run["steps"])
