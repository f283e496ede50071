"""Low sensitivity and flat minima (main paper §7.2, Table 2;
docs/definitions.md#sharpness).

Paper: "Transformers Learn Low Sensitivity Functions" (ICLR 2025), §7.2.
Claim: ViT-small trained with the sensitivity regularizer (``train.regularizer=patch_mse``)
sits in a flatter minimum than vanilla ViT-small, on both measures:

* ShOp = E_{x,Δ} ‖f_{θ+Δ}(x) − f_θ(x)‖₁ (change of the output logits),
* ShPred = E_{x,Δ} 1[ŷ_{θ+Δ}(x) ≠ ŷ_θ(x)] (predicted-class flips),

with Δ ~ N(0, σ_w² I) on every parameter, σ_w = 0.05 and 5 weight draws (paper code), measured
in eval mode (the paper code left dropout on — a defect) on the fixed training subset that
sensitivity is tracked on (:func:`senslab.measure.sharpness.output_sharpness`).

Command: ``senslab run sharpness --out runs/sharpness``. The three runs (vanilla, noise
augmentation, regularizer) are exactly the ViT-small runs of ``robustness``: when
``runs/robustness/<run>`` (a sibling of the output directory) holds a finished run with the same
configuration it is copied instead of retrained. The same seed draws the same Δ for every model
(common random numbers), so the verdict compares draw by draw: the regularized model's ShOp and
ShPred must be below vanilla's by more than 2 s.e. of the paired per-draw differences, at train
accuracies within 0.03. Noise augmentation is reported too but is not part of the verdict
(Table 2 compares the regularizer only).

Scales: as ``robustness`` (paper: CIFAR-10, full ViT-small; cpu: Fashion-MNIST subset, small
ViT-small, 300 tracking images).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import nn

from ...data import ArrayDataset
from ...measure.sharpness import output_sharpness
from ...train.config import RunConfig
from ..base import Run, register_experiment
from ._posthoc import FinalMeasureExperiment, reuse_finished, tracking_subset
from ._vision import CPU_FASHION, PAPER, RegularizedSettings, combine, vit_runs

SIGMA_W = 0.05
REPEATS = 5
#: a supplementary measurement with more (independent) weight draws, reported, not in the verdict
SUPPLEMENT_REPEATS = 30
MAX_ACC_GAP = 0.03
#: the experiment whose finished runs (siblings of this experiment's directory) are copied
REUSE_FROM = "robustness"


@register_experiment("sharpness")
class Sharpness(FinalMeasureExperiment):
    paper = f"{PAPER}, §7.2 Table 2"
    claim = ("ViT-small trained with the sensitivity regularizer has lower ShOp and lower ShPred "
             "(a flatter minimum) than vanilla ViT-small.")
    cpu_scale_note = ("Fashion-MNIST subset and small ViT-small as in robustness (trained runs "
                      "shared with it); σ_w = 0.05, 5 draws, eval mode, 300 training images")
    requires = "as robustness (paper scale: CIFAR-10 in data.root)"
    scales = {"cpu": RegularizedSettings(**CPU_FASHION), "paper": RegularizedSettings()}

    def runs(self, s: RegularizedSettings) -> list[Run]:
        return vit_runs(s)

    def before_run(self, run: Run, path: Path, log: Callable[[str], None]) -> None:
        if reuse_finished(path.parent.parent / REUSE_FROM / run.name, path, run.config):
            log(f"    {run.name}: reusing the finished run of {REUSE_FROM}")

    def final_settings(self, s: RegularizedSettings) -> dict[str, Any]:
        return {"sigma_w": SIGMA_W, "repeats": REPEATS, "supplement": SUPPLEMENT_REPEATS}

    def measure_final(self, cfg: RunConfig, model: nn.Module, train: ArrayDataset,
                      test: ArrayDataset, s: RegularizedSettings) -> dict[str, Any]:
        x = tracking_subset(cfg, model, train, test).inputs
        out = _values(output_sharpness(model, x, sigma_w=SIGMA_W, repeats=REPEATS,
                                       generator=cfg.seed))
        out["supplement"] = _values(output_sharpness(
            model, x, sigma_w=SIGMA_W, repeats=SUPPLEMENT_REPEATS, generator=cfg.seed + 1))
        return out

    def verdict(self, summaries: list[dict[str, Any]]) -> dict[str, Any]:
        by = {s["label"]: s for s in summaries}
        base = by["vit_small"]
        parts = {}
        for reg in [k for k in by if k.startswith("vit_small-")]:
            parts[reg] = flatter(by[reg], base)
        primary = "vit_small-patch_mse"
        out = combine({primary: parts[primary]})
        others = [f"{k}: {p['reason']}" for k, p in parts.items() if k != primary]
        if others:
            out["reason"] += " | not in the verdict: " + " | ".join(others)
        if all("supplement" in s["final_measure"] for s in by.values()):
            sup = {k: flatter(_supplement(by[k]), _supplement(base)) for k in parts}
            out["reason"] += (f" | supplementary, {SUPPLEMENT_REPEATS} other weight draws (not "
                              "in the verdict): " + " | ".join(f"{k}: {p['reason']}"
                                                               for k, p in sup.items()))
            out["supplement"] = {k: p["evidence"] for k, p in sup.items()}
        out["evidence"] = {k: p["evidence"] for k, p in parts.items()}
        out["evidence"]["vit_small"] = {k: base["final_measure"][k] for k in ("shop", "shpred")}
        return out


def _values(r: Any) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, res in (("shop", r.shop), ("shpred", r.shpred)):
        if res is not None:
            out[key] = res.estimate
            out[f"{key}_se"] = res.stderr
            out[f"{key}_per_draw"] = res.per_draw.tolist()
    return out


def _supplement(summary: dict[str, Any]) -> dict[str, Any]:
    return {**summary, "final_measure": summary["final_measure"]["supplement"]}


def flatter(reg: dict[str, Any], base: dict[str, Any]) -> dict[str, Any]:
    """Is ``reg`` flatter than ``base`` on ShOp and ShPred (paired per-draw differences)?"""
    acc = (reg["final"].get("train/acc", math.nan), base["final"].get("train/acc", math.nan))
    m, m0 = reg["final_measure"], base["final_measure"]
    evidence: dict[str, Any] = {"train_acc": acc}
    ok, detail = True, []
    for key in ("shop", "shpred"):
        d = torch.tensor(m[f"{key}_per_draw"]) - torch.tensor(m0[f"{key}_per_draw"])
        diff, se = float(d.mean()), float(d.std() / math.sqrt(len(d)))
        evidence[key] = {"reg": m[key], "vanilla": m0[key], "diff": diff, "diff_se": se}
        ok &= diff < -2 * se
        detail.append(f"{key} {m[key]:.4g} vs {m0[key]:.4g} (diff {diff:+.4g} ± {2 * se:.2g})")
    gap = abs(acc[0] - acc[1])
    if not gap <= MAX_ACC_GAP:
        return {"verdict": "not comparable", "evidence": evidence,
                "reason": f"train accuracies differ by {gap:.3f} (> {MAX_ACC_GAP})"}
    return {"verdict": "holds" if ok else "does not hold", "reason": "; ".join(detail),
            "evidence": evidence}
