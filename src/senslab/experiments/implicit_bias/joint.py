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

Verdict (:mod:`senslab.verdicts`): twelve parts, Holm-corrected, each the mean over seeds of a
per-seed difference (seed k's four runs share its data, initialisation and batch order) with
Student's t. For o ∈ {SNGD, SPS}, against SGD: ``loss_sgd − loss_o`` and ``o − sgd`` of the final
W alignment, v alignment and optimal-token mass (positive = o ahead of SGD); against Adam:
``o − (adam − CLOSE)`` of the final W alignment and token mass (positive = o within ``CLOSE`` of
Adam, or above). The means in the note are over the same paired seeds; a seed some optimiser
lacks is left out and named. "not comparable" when an optimiser has no runs, no seed has all
four, a seed has two runs of one optimiser, or a final metric is missing or not finite (the
reason names the run, the metric and the step of its final evaluation).

CPU scale: 3 seeds × 4 optimisers, 3,000 steps of batch 8 (the paper's synthetic sizes and
learning rates are not given; ours are in ``JointSettings``; "paper" scale: 5 seeds, 20,000
steps).

Scale ladder (``senslab run ib_joint --scale ladder``; docs/definitions.md#scale-ladders), 3
seeds per optimiser on every CPU rung, the same verdict rule on every rung; ``size`` is the number
of training steps (the model and data are the same at both scales):

1. ``cpu``: the CPU scale (3,000 steps). Its SNGD and SPS trail Adam's optimal-token mass by more
   than ``CLOSE``.
2. ``longer``: 10,000 steps.
3. ``paper-steps``: 20,000 steps, the paper scale's run for every seed it trains here: it differs
   from the paper scale only in training seeds 0–2 of each optimiser rather than 0–4 (every rung
   keeps the CPU scale's 3 seeds).
4. ``paper``: the paper scale itself (``--scale paper``: 20,000 steps, 5 seeds; a few minutes on a
   CPU, listed as the GPU rung like every experiment's paper scale).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, ClassVar

from ...train.config import ranged
from ...verdicts import not_comparable, over_seeds, verdict
from .._verdicts import final_value
from ..base import Experiment, Run, Rung, Settings, register_experiment
from ._common import attention_runs, check_run_overrides, check_tasks, duplicate_runs

OPTIMIZERS = ("sgd", "sngd", "sps", "adam")
CLOSE = 0.1  # "close to Adam": W alignment and token mass at most this far below Adam's
HIGHER = ("attn/alignment", "attn/v_alignment", "attn/sparsity")  # better when larger


@dataclass
class JointSettings(Settings):
    """Settings of ``ib_joint`` (override with ``--set steps=...``, ``--set data.dim=...``;
    ``data``: fields of :class:`~senslab.train.loops.attention.AttentionData`)."""

    steps: int = ranged(3000, ge=1)
    seeds: int = ranged(3, ge=1)
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
        "3 seeds × 4 optimisers, 3,000 steps of batch 8 (the paper does not give its synthetic "
        "sizes or learning rates)"
    )
    report_options: ClassVar[dict[str, Any]] = {
        "x": "step", "logx": True, "logy": ["train/loss", "attn/W_norm", "attn/v_norm"],
    }

    scales = SCALES
    seed_aware = True  # the verdict judges every run, seed replicates included
    one_thread_at = ("cpu", "paper")  # a model of a few kilobytes at every scale
    ladder = (
        Rung("cpu", "cpu", size=3000, note="3,000 steps of batch 8"),
        Rung("longer", "cpu", ("steps=10000",), size=10_000, note="10,000 steps"),
        Rung("paper-steps", "cpu", ("steps=20000",), size=20_000,
             note="20,000 steps: the paper scale's runs of seeds 0-2", paper_arch=True,
             differs=(("runs", "seeds 0-2 of each optimiser, not 0-4: every rung keeps the CPU "
                               "scale's 3 seeds"),)),
        Rung("paper", "paper", size=20_000, cpu=False,
             note="the paper scale: 20,000 steps, 5 seeds"),
    )

    def runs(self, s: JointSettings) -> list[Run]:
        return attention_runs(s, {"sgd": {"optimizer": "sgd", "lr": s.sgd_lr},
                                  "sngd": {"optimizer": "ngd", "lr": s.sngd_lr,
                                           "eta_max": s.eta_max},
                                  "sps": {"optimizer": "sps", "sps_c": 0.5,
                                          "eta_max": s.eta_max},
                                  "adam": {"optimizer": "adam", "lr": s.adam_lr}},
                              head="joint", batch_size=s.batch_size)

    def resolve(self, scale: str, overrides: list[str] | tuple[str, ...] = ()
                ) -> tuple[JointSettings, list[Run]]:
        """As :meth:`Experiment.resolve`, refusing ``--set head=fixed`` (the claim and the
        verdict are about v trained with W), a step-size field no run reads, and minibatches as
        large as the training set (full-batch steps)."""
        settings, runs = super().resolve(scale, overrides)
        check_run_overrides(self.name, runs, self.runs(settings), {
            "head": ("joint", "tests a claim about W and v trained jointly")})
        n = runs[0].config.data.num_samples if runs else 0
        if runs and settings.batch_size >= n:
            raise ValueError(f"batch_size={settings.batch_size} with {n} training sequences: "
                             "every step would take the whole set, so SGD, SNGD and SPS would "
                             f"run full-batch, not on minibatches as the claim says; use a "
                             f"batch_size below {n} (or more data.num_samples)")
        return settings, runs

    def before_training(self, settings: JointSettings) -> None:
        """Every seed's data has its max-margin W_mm and v_mm (:func:`~._common.check_tasks`)."""
        check_tasks(self.name, self.runs(settings))

    def verdict(self, summaries: list[dict[str, Any]]) -> dict[str, Any]:
        return joint_verdict(summaries)


def joint_verdict(summaries: list[dict[str, Any]]) -> dict[str, Any]:
    """SNGD and SPS vs SGD (ahead on every final metric) and vs Adam (within ``CLOSE``), per
    seed (the module docstring)."""
    keys = ("train/loss", *HIGHER)
    by: dict[str, dict[int, dict[str, float]]] = {}
    names: dict[tuple[str, int], str] = {}  # (optimiser, seed) → run name, for the words
    for s in summaries:
        # a final metric that was not finite is null in summary.json: read back as NaN (refused
        # below, naming the run), not summed into a TypeError
        by.setdefault(s["label"], {})[s.get("seed", 0)] = {
            k: math.nan if v is None else v for k, v in s["final"].items()}
        names[s["label"], s.get("seed", 0)] = s.get("name", f"{s['label']}-s{s.get('seed', 0)}")
    if set(by) != set(OPTIMIZERS):
        return not_comparable(f"need runs of {', '.join(OPTIMIZERS)}; got {', '.join(sorted(by))}")
    if (twice := duplicate_runs(summaries)) is not None:  # `by` kept the last, silently
        return not_comparable(twice)
    lacking = sorted(f"{o} (seed {k}): {', '.join(m for m in keys if m not in f)}"
                     for o, fs in by.items() for k, f in fs.items()
                     if any(m not in f for m in keys))
    if lacking:  # e.g. a run whose v was not trained logs no attn/v_alignment
        return not_comparable(f"final metrics missing: {'; '.join(lacking)} (every run must "
                              "train W and v jointly)")
    seeds = sorted(set.intersection(*(set(fs) for fs in by.values())))
    # the means over the paired seeds, the ones the parts are computed on
    mean = {o: {k: sum(fs[s][k] for s in seeds) / len(seeds) if seeds else math.nan
                for k in keys} for o, fs in by.items()}
    if not seeds:
        return not_comparable("no seed has runs of every optimiser")
    if any(not math.isfinite(v) for m in mean.values() for v in m.values()):
        # "a final metric is not finite" left the researcher to search the run directories
        bad = [final_value({"final": by[o][k]}, m, names[o, k])
               for o in by for k in seeds for m in keys if not math.isfinite(by[o][k][m])]
        if not bad:  # every value finite, their sum is not (values near the float maximum)
            bad = [f"the mean over seeds of {o}'s {m} ({[by[o][k][m] for k in seeds]}) overflows"
                   for o, mo in mean.items() for m, v in mo.items() if not math.isfinite(v)]
        return not_comparable(f"a final metric is not finite: {'; '.join(bad)}",
                              {**mean, "not_finite": bad})
    unpaired = {o: sorted(set(fs) - set(seeds)) for o, fs in by.items() if set(fs) - set(seeds)}
    checks: dict[str, bool] = {}  # the former rule, on the means over seeds
    parts = {}
    for o in ("sngd", "sps"):
        m, sgd, adam = mean[o], mean["sgd"], mean["adam"]
        checks[f"{o} loss < sgd"] = m["train/loss"] < sgd["train/loss"]
        parts[f"{o} loss < sgd"] = over_seeds(
            [by["sgd"][k]["train/loss"] - by[o][k]["train/loss"] for k in seeds],
            what=f"loss_sgd − loss_{o}")
        for k in HIGHER:
            checks[f"{o} {k} > sgd"] = m[k] > sgd[k]
            parts[f"{o} {k} > sgd"] = over_seeds(
                [by[o][s][k] - by["sgd"][s][k] for s in seeds], what=f"{o} − sgd {k}")
        for k in ("attn/alignment", "attn/sparsity"):
            checks[f"{o} {k} within {CLOSE} of adam"] = m[k] >= adam[k] - CLOSE
            parts[f"{o} {k} within {CLOSE} of adam"] = over_seeds(
                [by[o][s][k] - (by["adam"][s][k] - CLOSE) for s in seeds],
                what=f"{o} − (adam − {CLOSE}) {k}")
    detail = "; ".join(
        f"{o}: loss {m['train/loss']:.3g}, cos(W,W_mm) {m['attn/alignment']:.3f}, "
        f"cos(v,v_mm) {m['attn/v_alignment']:.3f}, opt mass {m['attn/sparsity']:.3f}"
        for o, m in mean.items())
    note = f"Means over {len(seeds)} seeds: {detail}"
    evidence: dict[str, Any] = {**mean, "checks": checks}
    if unpaired:  # left out of the parts and the means: said, not dropped silently
        note += ". Left out, for want of a run of every optimiser: " + "; ".join(
            f"{o} seed{'s' if len(k) > 1 else ''} {', '.join(map(str, k))}"
            for o, k in unpaired.items())
        evidence["unpaired_seeds"] = unpaired
    return verdict(parts, evidence=evidence,
                   claim="SNGD and SPS end ahead of SGD and close to Adam", note=note)
