"""Fixed decoder v: GD vs normalised GD vs the Polyak step on Φ(X) = vᵀXᵀsoftmax(XWx₁)
(docs/definitions.md#ib_fixed_v).

Claim (Vasudeva, Deora & Thrampoulidis): with v fixed, full-batch GD's ‖W_t‖ grows only
logarithmically, so W_t/‖W_t‖ approaches the max-margin direction W_mm slowly; NGD and the Polyak
step grow ‖W_t‖ linearly, align with W_mm at a polynomial rate and concentrate the softmax on the
optimal token (exponentially) faster.

Command: ``senslab run ib_fixed_v`` (plots: ``loglog.png`` in the experiment directory, every
metric against the step on log–log axes).

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
instead of a difference of two numbers ≈ γ_opt. Every optimiser sees this objective; Polyak uses
f* = 0 on it, i.e. the true L*. (``train/loss`` logs the plain logistic loss, ``train/excess``
the excess.)

Verdict: "holds" when (1) on the logged steps ≥ 100 before the run freezes (the softmax
saturates to one-hot in float64 and the gradient becomes exactly 0), GD's ‖W‖ is fitted better by
a + b·log t than by a + b·t while NGD's and Polyak's are fitted better by a + b·t; and (2) NGD and
Polyak reach alignment 0.99 and optimal-token mass 0.99 in fewer steps than GD.

CPU scale: 3 seeds (data and initialisation), 20,000 steps per optimiser (the paper's exact
synthetic sizes are not given; "paper" scale: 5 seeds, 100,000 steps).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from ...models import create_model
from ...optim import NGD, Polyak
from ...train.config import ranged
from ...train.rundir import RunDir
from ..base import Experiment, register_experiment, write_experiment_json
from ._common import (
    AttentionTask,
    attention_metrics,
    first_step_reaching,
    growth_fits,
    load_task,
    log_schedule,
    logistic_metrics,
    plot_loglog,
    run_custom,
)

OPTIMIZERS = ("gd", "ngd", "polyak")
LEVEL = 0.99  # alignment / optimal-token mass a run must reach to count as converged


@dataclass
class FixedVSettings:
    """Settings of ``ib_fixed_v`` (override with ``--set steps=...``, ``--set data.dim=...``)."""

    steps: int = ranged(20000, ge=1)
    seeds: int = ranged(3, ge=1)
    gd_lr: float = ranged(1.0, gt=0)
    ngd_lr: float = ranged(0.1, gt=0)
    per_decade: int = ranged(20, ge=1)
    #: fit ‖W_t‖ from this step on: the claim is about growth after the first, transient phase
    fit_from: int = ranged(100, ge=0)
    data: dict[str, Any] = field(default_factory=dict)


SCALES = {"cpu": FixedVSettings(), "paper": FixedVSettings(steps=100_000, seeds=5)}


def excess_loss(model: torch.nn.Module, task: AttentionTask) -> torch.Tensor:
    """L(W) − L* computed without cancellation (module docstring)."""
    a = model.attention_weights(task.X)
    g_opt = task.opt_scores
    delta = (a * (g_opt[:, None] - task.gamma)).sum(dim=1)
    return torch.log1p(torch.sigmoid(-g_opt) * torch.expm1(delta)).mean()


def train_fixed_v(task: AttentionTask, optimizer: str, settings: FixedVSettings, seed: int,
                  rd: RunDir) -> dict[str, Any]:
    """Train W with ``optimizer`` for ``settings.steps`` full-batch steps, logging into ``rd``;
    returns the summary fields (final metrics and the ‖W‖ growth fits)."""
    model = create_model("attention_model", dim=task.X.shape[-1], train_v=False,
                         init_scale=0.0, seed=seed).double()
    with torch.no_grad():
        model.v.copy_(task.v_star)  # the data's decoder: its optimal tokens define W_mm
    params = [model.W]
    opt = {"gd": lambda: torch.optim.SGD(params, lr=settings.gd_lr),
           "ngd": lambda: NGD(params, lr=settings.ngd_lr),
           "polyak": lambda: Polyak(params, f_star=0.0)}[optimizer]()

    def closure() -> torch.Tensor:
        opt.zero_grad(set_to_none=True)
        loss = excess_loss(model, task)
        loss.backward()
        return loss

    records: list[dict[str, Any]] = []
    schedule = set(log_schedule(settings.steps, settings.per_decade))
    for step in range(settings.steps + 1):
        if step in schedule:
            with torch.no_grad():
                rec: dict[str, Any] = {"step": step, "epoch": float(step),
                                       "train/excess": float(excess_loss(model, task))}
            rec.update(logistic_metrics(model, task))
            rec.update(attention_metrics(model, task))
            rd.log(rec)
            records.append(rec)
        if step == settings.steps:
            break
        if optimizer == "polyak":
            opt.step(closure)
        else:
            closure()
            opt.step()
        if not torch.isfinite(model.W).all():
            raise FloatingPointError(f"{optimizer}: W became non-finite at step {step + 1}; "
                                     "lower the learning rate")
    return {"final": records[-1], "fit": norm_growth(records, settings.fit_from),
            "steps": settings.steps,
            "reach": {k: first_step_reaching(records, f"attn/{k}", LEVEL)
                      for k in ("alignment", "sparsity")}}


def norm_growth(records: list[dict[str, Any]], fit_from: int) -> dict[str, float]:
    """Fits of ‖W_t‖ against t and log t over the logged steps t ≥ ``fit_from`` while W moves.

    The window ends at the first logged step where ‖W‖ has stopped changing (the softmax has
    saturated to one-hot in float64, so the gradient is exactly 0 and the run is frozen).
    """
    points: list[tuple[float, float]] = []
    prev = None
    for r in records:
        w = r["attn/W_norm"]
        if prev is not None and w == prev:
            break
        prev = w
        if r["step"] >= fit_from:
            points.append((float(r["step"]), w))
    if len(points) < 3:
        return {"fit_points": float(len(points))}
    steps, norms = zip(*points, strict=True)
    return growth_fits(list(steps), list(norms))


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
    #: how ``loglog.png`` is drawn (and how `senslab report` should draw this experiment)
    report_options: dict[str, Any] = {  # noqa: RUF012
        "x": "step", "logx": True,
        "logy": ["train/loss", "train/excess", "attn/W_norm"],
    }

    scales = SCALES

    def execute(self, out: Path, scale: str, overrides: list[str], progress: bool | None,
                log: Callable[[str], None]) -> list[dict[str, Any]]:
        settings = self.settings(scale, overrides)
        runs = [(o, s) for s in range(settings.seeds) for o in OPTIMIZERS]
        names = [f"{o}-s{s}" for o, s in runs]
        write_experiment_json(out, self, scale, names)
        summaries = []
        for (optimizer, seed), name in zip(runs, names, strict=True):
            task = load_task(**{"seed": seed, **settings.data})
            config = {"label": optimizer, "seed": seed, "optimizer": optimizer, "scale": scale,
                      "dtype": "float64", **dataclasses.asdict(settings)}
            summaries.append(run_custom(
                out / name, config,
                lambda rd, t=task, o=optimizer, s=seed: train_fixed_v(t, o, settings, s, rd),
                log))
        plot_loglog(out, names, self.report_options)
        return summaries

    def verdict(self, summaries: list[dict[str, Any]]) -> dict[str, Any]:
        return fixed_v_verdict(summaries)


def _mean(values: list[float]) -> float:
    return sum(values) / len(values)


def fixed_v_verdict(summaries: list[dict[str, Any]]) -> dict[str, Any]:
    """Verdict from the norm-growth fits and the steps to alignment / sparsity ``LEVEL``."""
    by: dict[str, list[dict[str, Any]]] = {}
    for s in summaries:
        by.setdefault(s["label"], []).append(s)
    if set(by) != set(OPTIMIZERS):
        return {"verdict": "not comparable", "evidence": {},
                "reason": f"need runs of {', '.join(OPTIMIZERS)}; got {', '.join(sorted(by))}"}
    unfitted = sorted(s["name"] for s in summaries if "r2_lin" not in s["fit"])
    if unfitted:
        return {"verdict": "not comparable", "evidence": {},
                "reason": f"{', '.join(unfitted)} froze before 3 logged steps in the fit window: "
                          "too few points to fit ‖W‖ (run longer or lower fit_from)"}
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
    checks = {"GD ‖W‖ logarithmic": gd["r2_log"] > gd["r2_lin"]}
    for o in ("ngd", "polyak"):
        e = evidence[o]
        checks[f"{o} ‖W‖ linear"] = e["r2_lin"] > e["r2_log"]
        checks[f"{o} aligns faster"] = e["steps_to_alignment"] < gd["steps_to_alignment"]
        checks[f"{o} sparsifies faster"] = e["steps_to_sparsity"] < gd["steps_to_sparsity"]
    failed = [k for k, ok in checks.items() if not ok]
    detail = "; ".join(
        f"{o}: R² lin {e['r2_lin']:.3f} / log {e['r2_log']:.3f}, steps to {LEVEL} alignment "
        f"{e['steps_to_alignment']:g}, to {LEVEL} mass {e['steps_to_sparsity']:g}"
        for o, e in evidence.items())
    head = f"failed: {', '.join(failed)}. " if failed else "all checks pass. "
    return {"verdict": "does not hold" if failed else "holds", "reason": head + detail,
            "evidence": {**evidence, "checks": checks}}
