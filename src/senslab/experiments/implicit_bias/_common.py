"""Shared pieces of the implicit-bias experiments
(docs/definitions.md#self-attention-optimization): data in float64, the max-margin
targets, a logarithmic evaluation schedule, the attention metrics, and curve fits.

Everything runs in float64: once the softmax saturates, the off-optimal attention weights are
~e^{-‖W‖·margin}, and in float32 their gradients are pure rounding noise long before NGD or the
Polyak step stop making progress.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from scipy.optimize import nnls
from torch import Tensor

from ...data import create_dataset
from ...optim import alignment, attention_sparsity, max_margin_attention
from ...train.config import RunConfig, apply_overrides
from ...train.rundir import RunDir
from .._manual import finished_summary, single_thread, start_run


@dataclass
class AttentionTask:
    """One ``maxmargin_attention`` training set in float64 with its max-margin targets.

    ``X`` (N, T, d) tokens, ``y`` (N,) ±1 labels, ``v_star`` the data's unit decoder, ``opt`` the
    optimal positions, ``gamma`` the token scores γ_it = y_i v*ᵀ x_it, ``W_mm`` the max-margin
    attention matrix and ``v_mm`` the max-margin decoder on the optimal tokens.
    """

    X: Tensor
    y: Tensor
    v_star: Tensor
    opt: Tensor
    gamma: Tensor
    W_mm: Tensor
    v_mm: Tensor

    @property
    def opt_scores(self) -> Tensor:
        """γ_{i,opt_i}, shape (N,)."""
        return self.gamma[torch.arange(len(self.X)), self.opt]


def load_task(**options: Any) -> AttentionTask:
    """The ``maxmargin_attention`` train split (``options`` go to the loader), in float64."""
    ds = create_dataset("maxmargin_attention", "train", **options)
    X = ds.inputs.double()
    y = ds.meta["y_pm"].double()
    opt = ds.meta["opt"].long()
    v_star = ds.meta["v"].double()
    gamma = y[:, None] * (X @ v_star)
    z = y[:, None] * X[torch.arange(len(X)), opt]  # y_i x_{i,opt}: the SVM features of v
    return AttentionTask(X, y, v_star, opt, gamma, max_margin_attention(X, opt),
                         max_margin_direction(z))


def max_margin_direction(Z: Tensor) -> Tensor:
    """v_mm = argmin ‖v‖ s.t. z_iᵀ v ≥ 1 for every row z_i of Z (a bias-free hard-margin SVM).

    With joint training, attention concentrates on the optimal tokens, so Φ → vᵀx_{i,opt} and
    the decoder follows the max-margin separator of the points y_i x_{i,opt}. Solved exactly as a
    least-distance program (Lawson & Hanson, ch. 23): u = NNLS(E, e) with E = [Zᵀ; 1ᵀ],
    e = (0, …, 0, 1); the residual r = E u − e gives v = −r[:d] / r[d] (r[d] < 0 iff feasible).
    """
    Zn = Z.detach().cpu().double().numpy()
    E = np.vstack([Zn.T, np.ones((1, len(Zn)))])
    e = np.zeros(len(E))
    e[-1] = 1.0
    u, _ = nnls(E, e, maxiter=50 * E.shape[1])
    r = E @ u - e
    if r[-1] > -1e-12:
        raise ValueError("no decoder v separates the optimal tokens (z_iᵀ v ≥ 1 is infeasible); "
                         "use fewer samples or more dimensions")
    return torch.from_numpy(-r[:-1] / r[-1])


def log_schedule(steps: int, per_decade: int = 20) -> list[int]:
    """Evaluation steps 0, 1, 2, … spaced evenly on a log axis (``per_decade`` per factor 10),
    always including ``steps``: log-scale plots get evenly spread points at little cost."""
    points = {0, steps}
    k = 0
    while (s := round(10 ** (k / per_decade))) < steps:
        points.add(s)
        k += 1
    return sorted(points)


def attention_metrics(model: torch.nn.Module, task: AttentionTask) -> dict[str, float]:
    """‖W‖_F, alignment cos(W, W_mm), mean softmax weight on the optimal token, and (when v is
    learned) ‖v‖ and cos(v, v_mm)."""
    with torch.no_grad():
        weights = model.attention_weights(task.X)
        out = {
            "attn/W_norm": float(model.W.norm()),
            "attn/alignment": alignment(model.W, task.W_mm),
            "attn/sparsity": attention_sparsity(weights, task.opt),
        }
        if isinstance(model.v, torch.nn.Parameter):
            out["attn/v_norm"] = float(model.v.norm())
            out["attn/v_alignment"] = alignment(model.v, task.v_mm)
    return out


def logistic_metrics(model: torch.nn.Module, task: AttentionTask) -> dict[str, float]:
    """Mean logistic loss log(1 + e^{−y Φ(X)}) and accuracy over the whole training set."""
    with torch.no_grad():
        margin = task.y * model(task.X)
        return {"train/loss": float(torch.nn.functional.softplus(-margin).mean()),
                "train/acc": float((margin > 0).double().mean())}


def first_step_reaching(records: list[dict[str, Any]], key: str, level: float) -> float:
    """The first logged step at which ``key`` ≥ ``level`` (inf if never: it never got there)."""
    return next((float(r["step"]) for r in records if r.get(key, -math.inf) >= level), math.inf)


def growth_fits(steps: list[float], norms: list[float]) -> dict[str, float]:
    """Least-squares fits ‖W‖ ≈ a + b·t and ‖W‖ ≈ a + b·log t; slopes and R² of each.

    R²_lin > R²_log says the norm grows linearly in t, the reverse that it grows like log t.
    """
    t = np.asarray(steps, dtype=float)
    w = np.asarray(norms, dtype=float)
    out: dict[str, float] = {"fit_points": float(len(t))}
    for name, x in (("lin", t), ("log", np.log(t))):
        A = np.stack([np.ones_like(x), x], axis=1)
        coef, *_ = np.linalg.lstsq(A, w, rcond=None)
        resid = w - A @ coef
        total = float(((w - w.mean()) ** 2).sum())
        out[f"slope_{name}"] = float(coef[1])
        out[f"r2_{name}"] = 1.0 - float((resid**2).sum()) / total if total > 0 else 0.0
    return out


def optimizer_runs(common: list[str], optimizers: dict[str, list[str]]) -> list[RunConfig]:
    """One :func:`~senslab.train.loop.fit` run per optimiser, named and labelled after it:
    the ``common`` overrides, then the optimiser's own (``optimizers``: label → overrides)."""
    return [apply_overrides(RunConfig(name=label, label=label), common + settings)
            for label, settings in optimizers.items()]


def run_custom(path: Path, config: dict[str, Any], body: Callable[[RunDir], dict[str, Any]],
               log: Callable[[str], None]) -> dict[str, Any]:
    """Run ``body`` in run directory ``path`` unless it already holds ``summary.json``.

    ``body(rundir)`` logs its metric records and returns the summary's extra fields (``final``
    …); this writes config.json, env.json (:func:`~senslab.experiments._manual.start_run`), and
    summary.json with the label, name and seconds. A run without a summary (interrupted) starts
    over: these runs take seconds to minutes. The run directory is locked while ``body`` runs.
    """
    done = finished_summary(path)
    if done is not None:
        log(f"{path.name}: finished earlier, reusing its summary")
        return done
    with RunDir(path).writing():
        rd = start_run(path, config)
        start = time.perf_counter()
        with single_thread():
            summary = {"label": config["label"], "name": path.name, **body(rd)}
        summary["seconds"] = round(time.perf_counter() - start, 2)
        rd.write_json("summary.json", summary)
    log(f"{path.name}: done in {summary['seconds']:.1f} s")
    return summary


#: the four runs of a loss race (:func:`loss_race_verdict`), by label
RACE = ("sgd", "sngd", "sps", "adam")


def loss_race_verdict(summaries: list[dict[str, Any]],
                      chance_loss: float = math.log(10)) -> dict[str, Any]:
    """SNGD and SPS: final train loss below SGD's and closer to Adam's than to SGD's, all after
    the same number of steps. "not comparable" when SGD and a contender both still sit on the
    initial plateau (loss ≥ 95% of the chance loss ln 10): the race has not started."""
    final = {s["label"]: s for s in summaries}
    if set(final) != set(RACE):
        return {"verdict": "not comparable", "evidence": {},
                "reason": f"need runs {', '.join(RACE)}; got {', '.join(sorted(final))}"}
    steps = {k: s.get("steps") for k, s in final.items()}
    loss = {k: s["final"].get("train/loss") for k, s in final.items()}
    evidence = {k: {"train_loss": loss[k], "train_acc": final[k]["final"].get("train/acc"),
                    "steps": steps[k]} for k in final}
    detail = ", ".join(f"{k} {v:.4f}" for k, v in loss.items() if isinstance(v, (int, float)))
    if len(set(steps.values())) != 1:
        return {"verdict": "not comparable", "evidence": evidence,
                "reason": f"runs stopped after different numbers of steps: {steps}"}
    if not all(isinstance(v, (int, float)) and math.isfinite(v) for v in loss.values()):
        return {"verdict": "not comparable", "evidence": evidence,
                "reason": "a run has no finite final train/loss"}
    plateau = 0.95 * chance_loss
    stuck = [o for o in ("sngd", "sps") if min(loss[o], loss["sgd"]) >= plateau]
    if stuck:
        return {"verdict": "not comparable", "evidence": evidence,
                "reason": f"after {steps['sgd']} steps SGD and {', '.join(stuck)} are still at "
                          f"the initial plateau (loss ≥ {plateau:.3f}); train longer. Train "
                          f"loss: {detail}"}
    sgd, adam = loss["sgd"], loss["adam"]
    checks = {}
    for o in ("sngd", "sps"):
        checks[f"{o} < sgd"] = loss[o] < sgd
        checks[f"{o} closer to adam"] = abs(loss[o] - adam) < abs(loss[o] - sgd)
    failed = [k for k, ok in checks.items() if not ok]
    head = f"failed: {', '.join(failed)}" if failed else "SNGD and SPS beat SGD, close to Adam"
    return {"verdict": "does not hold" if failed else "holds",
            "reason": f"{head}; train loss after {steps['sgd']} steps: {detail}",
            "evidence": {**evidence, "checks": checks}}


def plot_loglog(out: Path, names: list[str], options: dict[str, Any]) -> None:
    """Every metric against the step on log axes, as ``out/loglog.png``."""
    from ...report import load_runs
    from ...report.plots import plot_curves

    plot_curves(load_runs([out / n for n in names]), out / "loglog.png", **options)
