"""Joint training of (W, v) with stochastic optimisers on Φ(X) = vᵀXᵀsoftmax(XWx₁)
(docs/definitions.md#ib_joint).

Claim (Vasudeva, Deora & Thrampoulidis): when the decoder v is trained together with W, the
stochastic normalised / Polyak variants (SNGD, SPS_max) drive W towards the max-margin direction
W_mm, v towards the max-margin separator v_mm of the optimal tokens, and the attention towards the
optimal token faster than SGD, and come close to Adam.

Command: ``senslab run ib_joint``. The runs: the ``"attention"`` trainer
(:mod:`senslab.train.loops.attention`) with a joint head, one run per optimiser and seed.

Setting: ``maxmargin_attention`` defaults (N = 32, T = 8, d = 32), float64, W₀ ~ N(0, 0.01²),
v₀ a random unit vector, logistic loss on minibatches of ``batch_size`` (seeded reshuffle every
epoch), the same ``steps`` for every optimiser: SGD (lr ``sgd_lr``), SNGD (``sngd_lr``, cap
``eta_max``), SPS_max (c = 0.5, f* = 0 — the loss can reach 0 here because ‖v‖ can grow — cap
``eta_max``) and Adam (``adam_lr``). W_mm solves the attention max-margin problem for the data's
optimal tokens; v_mm = argmin ‖v‖ s.t. y_i vᵀx_{i,opt} ≥ 1 (the tokens attention ends up on).
Metrics on the full training set at log-spaced steps: loss, accuracy, ‖W‖, cos(W, W_mm), mean
softmax mass on the optimal token, ‖v‖, cos(v, v_mm).

Verdict: "holds" when SNGD and SPS each end (mean over seeds) with lower loss and higher W
alignment, v alignment and optimal-token mass than SGD, and with W alignment and token mass within
``CLOSE`` of Adam's (or above).

CPU scale: 2 seeds × 4 optimisers, 3,000 steps of batch 8 (the paper's synthetic sizes and
learning rates are not given; ours are in ``JointSettings``; "paper" scale: 5 seeds, 20,000
steps).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, ClassVar

from ...train.config import ranged
from ..base import Experiment, Run, Settings, register_experiment
from ._common import attention_runs

OPTIMIZERS = ("sgd", "sngd", "sps", "adam")
CLOSE = 0.1  # "close to Adam": W alignment and token mass at most this far below Adam's
HIGHER = ("attn/alignment", "attn/v_alignment", "attn/sparsity")  # better when larger


@dataclass
class JointSettings(Settings):
    """Settings of ``ib_joint`` (override with ``--set steps=...``, ``--set data.dim=...``;
    ``data``: fields of :class:`~senslab.train.loops.attention.AttentionData`)."""

    steps: int = ranged(3000, ge=1)
    seeds: int = ranged(2, ge=1)
    batch_size: int = ranged(8, ge=1)
    sgd_lr: float = ranged(0.1, gt=0)
    sngd_lr: float = ranged(0.1, gt=0)
    adam_lr: float = ranged(0.01, gt=0)
    eta_max: float = ranged(10.0, gt=0)
    per_decade: int = ranged(20, ge=1)
    data: dict[str, Any] = field(default_factory=dict)


SCALES = {"cpu": JointSettings(), "paper": JointSettings(steps=20000, seeds=5)}


@register_experiment("ib_joint")
class IBJoint(Experiment):
    paper = ("Vasudeva, Deora & Thrampoulidis, Implicit Bias and Fast Convergence Rates for "
             "Self-attention (TMLR 2025), joint (W, v) training")
    claim = ("Training W and v jointly on minibatches, SNGD and SPS align W with W_mm and v with "
             "v_mm, and sparsify attention, faster than SGD, close to Adam.")
    cpu_scale_note = (
        "2 seeds × 4 optimisers, 3,000 steps of batch 8 (the paper does not give its synthetic "
        "sizes or learning rates)"
    )
    report_options: ClassVar[dict[str, Any]] = {
        "x": "step", "logx": True, "logy": ["train/loss", "attn/W_norm", "attn/v_norm"],
    }

    scales = SCALES
    seed_aware = True  # the verdict judges every run, seed replicates included
    one_thread_at = ("cpu", "paper")  # a model of a few kilobytes at every scale

    def runs(self, s: JointSettings) -> list[Run]:
        return attention_runs(s, {"sgd": {"optimizer": "sgd", "lr": s.sgd_lr},
                                  "sngd": {"optimizer": "ngd", "lr": s.sngd_lr,
                                           "eta_max": s.eta_max},
                                  "sps": {"optimizer": "sps", "sps_c": 0.5,
                                          "eta_max": s.eta_max},
                                  "adam": {"optimizer": "adam", "lr": s.adam_lr}},
                              head="joint", batch_size=s.batch_size)

    def verdict(self, summaries: list[dict[str, Any]]) -> dict[str, Any]:
        return joint_verdict(summaries)


def joint_verdict(summaries: list[dict[str, Any]]) -> dict[str, Any]:
    """SNGD and SPS vs SGD (better on every final metric) and vs Adam (within ``CLOSE``)."""
    keys = ("train/loss", *HIGHER)
    by: dict[str, list[dict[str, Any]]] = {}
    for s in summaries:
        by.setdefault(s["label"], []).append(s["final"])
    if set(by) != set(OPTIMIZERS):
        return {"verdict": "not comparable", "evidence": {},
                "reason": f"need runs of {', '.join(OPTIMIZERS)}; got {', '.join(sorted(by))}"}
    mean = {o: {k: sum(f[k] for f in fs) / len(fs) for k in keys} for o, fs in by.items()}
    if any(not math.isfinite(v) for m in mean.values() for v in m.values()):
        return {"verdict": "not comparable", "evidence": mean,
                "reason": "a final metric is not finite"}
    checks: dict[str, bool] = {}
    for o in ("sngd", "sps"):
        m, sgd, adam = mean[o], mean["sgd"], mean["adam"]
        checks[f"{o} loss < sgd"] = m["train/loss"] < sgd["train/loss"]
        for k in HIGHER:
            checks[f"{o} {k} > sgd"] = m[k] > sgd[k]
        for k in ("attn/alignment", "attn/sparsity"):
            checks[f"{o} {k} within {CLOSE} of adam"] = m[k] >= adam[k] - CLOSE
    failed = [k for k, ok in checks.items() if not ok]
    detail = "; ".join(
        f"{o}: loss {m['train/loss']:.3g}, cos(W,W_mm) {m['attn/alignment']:.3f}, "
        f"cos(v,v_mm) {m['attn/v_alignment']:.3f}, opt mass {m['attn/sparsity']:.3f}"
        for o, m in mean.items())
    head = f"failed: {', '.join(failed)}. " if failed else "all checks pass. "
    return {"verdict": "does not hold" if failed else "holds", "reason": head + detail,
            "evidence": {**mean, "checks": checks}}
