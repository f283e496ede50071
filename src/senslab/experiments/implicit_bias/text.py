"""Text classifier: SGD vs SNGD vs SPS_max vs Adam (Vasudeva, Deora & Thrampoulidis, Figs. 1, 4;
docs/definitions.md#ib_text).

Claim: on a transformer text classifier the stochastic normalised (SNGD) and Polyak (SPS_max)
steps reach a low training loss faster than SGD, close to Adam. We compare the training loss
after the same number of steps, and the first logged step at which each optimiser's training
loss falls below a threshold.

Command: ``senslab run ib_text --out runs/ib_text``.

The paper fine-tunes a pre-trained BERT on MNLI and on Civil Comments; senslab has neither those
datasets nor pre-trained weights, so both scales train our RoBERTa-style encoder (``roberta``,
``models/text.py``) from scratch on the offline Rotten Tomatoes sentiment snippets
(``rotten_tomatoes``, byte-level BPE trained on the training split, label 1 = fresh), with the
paper's text-experiment optimiser settings: batch 32; SGD lr 1e-3, SNGD lr 0.01 with η_max 0.1,
SPS_max (c = 0.5, f* = 0) with η_max 0.1, Adam lr 2e-5 (docs/definitions.md#ib_text). Those
learning rates were tuned for fine-tuning; we keep them so the comparison stays the paper's.

"paper" scale: the paper-size encoder of docs/definitions.md#text-models (4 layers, width 256, 8
heads), the full training split (11,528 snippets), 10 epochs (3,610 steps; the paper does not give
an epoch count), 3 seeds.

CPU scale: a 2-layer, width-64, 4-head encoder (dropout 0.1 as in BERT), max_len 64 and a 4,000
token BPE, a seeded 2,000-snippet training subset so the model can fit its training set, and 630
steps (10 epochs), 3 seeds; training loss and accuracy are evaluated every 45 steps on 500 fixed
training snippets (and 500 validation snippets). Sensitivity tracking is off (not part of this
claim). Seed k sets the initialisation, data order and training subset of all four runs of that
seed.

Verdict: :func:`text_race_verdict` — the ViT rule (``_common.loss_race_verdict``) with chance
loss ln 2: per seed and contender o ∈ {SNGD, SPS}, ``loss_sgd − loss_o`` and ``|o − sgd| − |o −
adam|`` (positive = the claimed direction), each the mean over seeds with Student's t, Holm over
the four parts. Where, in some seed, SGD and SNGD/SPS both still sit on the initial plateau
(loss ≥ 0.95 ln 2), that contender's "below SGD" part is withheld, and its "closer to Adam" part
is judged only if Adam has left the plateau in every seed (at the levels of the Holm family of
four); a contradicted judged part makes the claim contradicted, otherwise the verdict is "not
comparable" (train longer). Correction of 2026-11-30: the guard first withheld every part, so a
contradiction of "close to Adam" read as "not comparable" (e.g. the ``longer`` rung: sgd 0.684,
sngd 0.684, sps 0.684, adam 0.049). The evidence adds each run's first step with training loss
≤ ``THRESHOLD``.

The paper's claim is about fine-tuning a pre-trained BERT: testing it needs longer runs ("paper"
scale, a GPU) and, to match the paper, pre-trained weights and MNLI / Civil Comments loaders that
senslab does not have.

Scale ladder (``senslab run ib_text --scale ladder``; docs/definitions.md#scale-ladders), 3 seeds
on every rung, the same verdict rule on every rung; ``size`` is the number of training steps per
run:

1. ``cpu``: the CPU scale (10 epochs of the 2,000-snippet subset: 630 steps). Its verdict is "not
   comparable": every optimiser, Adam included, is still on the initial plateau.
2. ``longer``: the same encoder and subset trained 50 epochs (3,150 steps, near the paper scale's
   3,610; evaluations still every 45 steps): does the race start?
3. ``paper`` (GPU): the paper scale itself (``--scale paper``: the 4-layer width-256 encoder on the
   full split, 10 epochs = 3,610 steps). That encoder costs several times the CPU one per step: no
   CPU rung trains it.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ...train.rundir import RunDir
from ..base import Experiment, Run, Rung, Settings, fit_runs, register_experiment
from ._common import loss_race_verdict

#: (optimizer settings of the paper's text runs, docs/definitions.md#ib_text) of each run, by label
OPTIMIZERS: dict[str, list[str]] = {
    "sgd": ["optim.name=sgd", "optim.lr=0.001"],
    "sngd": ["optim.name=sngd", "optim.lr=0.01", "optim.eta_max=0.1"],
    "sps": ["optim.name=sps", "optim.eta_max=0.1"],
    "adam": ["optim.name=adam", "optim.lr=2e-05"],
}

#: "low training loss": half the chance loss ln 2 (a classifier ~2× more confident than chance)
THRESHOLD = 0.5 * math.log(2)


@dataclass
class TextSettings(Settings):
    """``small``: the CPU-scale encoder and data (2 layers, width 64, 4 heads, max_len 64, a
    4,000-token BPE, a 2,000-snippet training subset, evaluations every 45 steps on 500
    snippets); else the paper-size encoder on the full split, evaluated every 190 steps on
    5,000 snippets. Run settings go to the runs: ``--set train.epochs=3``."""

    small: bool = False


@register_experiment("ib_text")
class IBText(Experiment):
    paper = ("Vasudeva, Deora & Thrampoulidis, Implicit Bias and Fast Convergence Rates for "
             "Self-attention (TMLR 2025), text classification (Figs. 1, 4)")
    claim = ("Training a transformer text classifier, SNGD and SPS reach low training loss "
             "faster than SGD, close to Adam.")
    cpu_scale_note = ("The paper fine-tunes pre-trained BERT on MNLI / Civil Comments (neither "
                      "available here); both scales train a RoBERTa-style encoder from scratch on "
                      "Rotten Tomatoes with the paper's optimisers, learning rates and batch 32. "
                      "CPU: 2 layers, width 64, 4 heads, a 2,000-snippet training subset, 630 "
                      "steps, 3 seeds (paper scale: 4 layers, width 256, full split, 10 epochs).")
    scales = {"cpu": TextSettings(small=True, seeds=3), "paper": TextSettings(seeds=3)}
    seed_aware = True  # the verdict judges every run, seed replicates included
    # one intra-op thread: a small encoder's ops are too short for two threads to pay off on a
    # shared 2-core machine
    one_thread_at = ("cpu",)
    ladder = (
        Rung("cpu", "cpu", size=630, note="10 epochs of a 2,000-snippet subset (630 steps)"),
        Rung("longer", "cpu", ("train.epochs=50",), size=3150,
             note="the same subset trained 50 epochs (3,150 steps)"),
        Rung("paper", "paper", size=3610, cpu=False,
             note="the paper scale: 4 layers, width 256, full split, 10 epochs (3,610 steps)"),
    )

    def runs(self, s: TextSettings) -> list[Run]:
        common = [
            "data.name=rotten_tomatoes", "data.test_split=validation", "model.name=roberta",
            "train.batch_size=32", f"train.epochs={10}",
            "track.sigma=0",  # no sensitivity tracking: this claim is about optimisation speed
            "track.unit=step", f"track.every={45 if s.small else 190}",
        ]
        if s.small:
            common += ["data.options.max_len=64", "data.options.vocab_size=4000",
                       "data.train_subset=2000", "model.overrides.dim=64",
                       "model.overrides.layers=2", "model.overrides.heads=4",
                       "track.eval_examples=500"]
        else:
            common += ["track.eval_examples=5000"]
        return fit_runs(OPTIMIZERS, common, s.seeds)

    def after_run(self, run: Run, path: Path, summary: dict[str, Any], settings: TextSettings,
                  log: Callable[[str], None]) -> dict[str, Any]:
        """The loss curve (steps to the threshold), which ``fit`` keeps in metrics.jsonl rather
        than in the summary."""
        return {**summary, "curve": loss_curve(path)}

    def verdict(self, summaries: list[dict[str, Any]]) -> dict[str, Any]:
        return text_race_verdict(summaries)


def loss_curve(run_dir: Path) -> list[list[float]]:
    """``[[step, train loss], ...]`` of every evaluation logged in ``run_dir/metrics.jsonl``,
    read as every other reader reads the log (:meth:`~senslab.train.rundir.RunDir.metrics`):
    a blank line is skipped, and a log with a step twice or out of order is refused, naming the
    file (until 2026-12-07 a blank line stopped the verdict with a bare ``JSONDecodeError``, and a
    repeated step entered the curve twice without a word)."""
    return [[record["step"], record["train/loss"]] for record in RunDir(run_dir).metrics()
            if "train/loss" in record]


def steps_to(curve: list[list[float]], level: float) -> float:
    """The first logged step with training loss ≤ ``level`` (inf: it never got there). A loss
    logged as null (metrics.jsonl writes a NaN or inf loss as null) is not at the level: before
    2026-12-07 it stopped the verdict with a TypeError (``None <= 0.347``)."""
    return next((float(step) for step, loss in curve
                 if loss is not None and loss <= level), math.inf)


def text_race_verdict(summaries: list[dict[str, Any]],
                      threshold: float = THRESHOLD) -> dict[str, Any]:
    """:func:`loss_race_verdict` with chance loss ln 2 (binary labels), plus each run's first
    logged step with training loss ≤ ``threshold`` in the evidence and the reason (per label:
    the latest over its seeds, None if a seed never got there)."""
    result = loss_race_verdict(summaries, chance_loss=math.log(2))
    reach: dict[str, dict[int, float]] = {}
    for s in summaries:
        if "curve" in s:
            reach.setdefault(s["label"], {})[s.get("seed", 0)] = steps_to(s["curve"], threshold)
    if reach:
        for label, per in reach.items():
            entry = result["evidence"].setdefault(label, {})
            latest = max(per.values())
            entry["steps_to_threshold"] = latest if math.isfinite(latest) else None
            for seed, step in per.items():
                if str(seed) in entry.get("seeds", {}):
                    entry["seeds"][str(seed)]["steps_to_threshold"] = (
                        step if math.isfinite(step) else None)
        result["evidence"]["threshold"] = threshold
        detail = ", ".join(
            f"{k} " + "/".join("never" if math.isinf(v) else str(int(v))
                               for _, v in sorted(per.items()))
            for k, per in reach.items())
        result["reason"] += f"; first step with train loss ≤ {threshold:.3f}: {detail}"
        if any(len(per) > 1 for per in reach.values()):
            result["reason"] += " (per seed)"
    return result
