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
configuration it is copied instead of retrained. Each run has 3 seeds (both scales). Within a
seed the same Δ is drawn for every model (common random numbers), so the two models are compared
draw by draw. The verdict has two parts, vanilla − regularized ShOp and ShPred: over seeds, each
seed's value the mean per-draw difference with its standard error over draws as the measurement
error, judged together (Holm); not comparable when the seed-mean train accuracies differ by more
than 0.03. Noise augmentation and the supplementary draws are judged the same way as claims of
their own, reported but not part of the verdict (Table 2 compares the regularizer only).

Scales: as ``robustness`` (paper: CIFAR-10, full ViT-small; cpu: Fashion-MNIST subset, small
ViT-small, 300 tracking images).

Scale ladder (``senslab run sharpness --scale ladder``; docs/definitions.md#scale-ladders):
``robustness``'s ladder itself — the same rung names and overrides (``cpu``; ``longer``: at most
40 epochs; ``plateau``: stop at 90% train accuracy, at most 60 epochs; ``paper`` on a GPU),
``size`` the epoch budget — so that every rung trains exactly the ViT-small runs of the same
rung of ``robustness``. A rung directory ``L/sharpness/<rung>`` therefore copies the finished
runs of ``L/robustness/<rung>`` (the default ``L`` is ``runs/ladder``) instead of retraining
them, as ``runs/sharpness`` copies those of ``runs/robustness``; run ``robustness``'s ladder
first and this one costs only its measurements.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import nn

from ..._seeds import noise_seed
from ...data import ArrayDataset
from ...measure.sharpness import output_sharpness
from ...train.config import RunConfig
from ...verdicts import Effect, not_comparable, over_seeds, verdict
from .._verdicts import GAP_ROUNDING, by_label, mean, precondition
from ..base import Run, register_experiment
from ._posthoc import FINAL_FILE, FinalMeasureExperiment, reuse_finished, tracking_subset
from ._vision import CPU_FASHION, PAPER, REGULARIZED_LADDER, RegularizedSettings, vit_runs

SIGMA_W = 0.05
REPEATS = 5
#: a supplementary measurement with more (independent) weight draws, reported, not in the verdict
SUPPLEMENT_REPEATS = 30
MAX_ACC_GAP = 0.03
#: the experiment whose finished runs (siblings of this experiment's directory) are copied
REUSE_FROM = "robustness"
#: the regularized run whose flatness is the claim (Table 2 compares the regularizer only)
PRIMARY = "vit_small-patch_mse"


@register_experiment("sharpness")
class Sharpness(FinalMeasureExperiment):
    seed_aware = True  # the verdict judges every run, seed replicates included
    paper = f"{PAPER}, §7.2 Table 2"
    claim = ("ViT-small trained with the sensitivity regularizer has lower ShOp and lower ShPred "
             "(a flatter minimum) than vanilla ViT-small.")
    cpu_scale_note = ("Fashion-MNIST subset and small ViT-small as in robustness (trained runs "
                      "shared with it); σ_w = 0.05, 5 draws, eval mode, 300 training images")
    requires = "as robustness (paper scale: CIFAR-10 in data.root)"
    scales = {"cpu": RegularizedSettings(**CPU_FASHION), "paper": RegularizedSettings()}
    #: robustness's rungs, so that the rung directories of the two ladders pair up
    ladder = REGULARIZED_LADDER

    def runs(self, s: RegularizedSettings) -> list[Run]:
        return vit_runs(s)

    def before_run(self, run: Run, path: Path, log: Callable[[str], None]) -> None:
        """Copy ``run`` from :data:`REUSE_FROM` when it finished there with the same
        configuration: from ``OUT/../robustness/<run>`` (an experiment directory beside this
        one), or, for a ladder rung ``L/sharpness/<rung>``, from ``L/robustness/<rung>/<run>``."""
        for src in reuse_candidates(path):
            if reuse_finished(src, path, run.config):
                log(f"    {run.name}: reusing the finished run of {REUSE_FROM} ({src.parent})")
                return

    def final_settings(self, s: RegularizedSettings) -> dict[str, Any]:
        return {"sigma_w": SIGMA_W, "repeats": REPEATS, "supplement": SUPPLEMENT_REPEATS}

    def measure_final(self, cfg: RunConfig, model: nn.Module, train: ArrayDataset,
                      test: ArrayDataset, s: RegularizedSettings) -> dict[str, Any]:
        x = tracking_subset(cfg, model, train, test).inputs
        out = _values(output_sharpness(model, x, sigma_w=SIGMA_W, repeats=REPEATS,
                                       generator=noise_seed(cfg.seed)))
        out["supplement"] = _values(output_sharpness(
            model, x, sigma_w=SIGMA_W, repeats=SUPPLEMENT_REPEATS,
            generator=noise_seed(cfg.seed + 1)))
        return out

    def verdict(self, summaries: list[dict[str, Any]]) -> dict[str, Any]:
        """The regularized model's two parts (:func:`flatter_parts`: vanilla − regularized ShOp
        and ShPred over seeds), judged together (Holm). Noise augmentation and the supplementary
        weight draws are judged as claims of their own, in the evidence (``side``), and do not
        decide the verdict. Not comparable when a model has no runs or other seeds, or the
        regularized model's seed-mean train accuracy is more than :data:`MAX_ACC_GAP` from
        vanilla's."""
        groups = by_label(summaries)
        evidence: dict[str, Any] = {}
        why = (precondition(groups, list(groups), None, keys=())
               if "vit_small" in groups and PRIMARY in groups
               else f"need vit_small and {PRIMARY}; got {', '.join(groups)}")
        if why is not None:
            return not_comparable(why, evidence)
        base = groups["vit_small"]
        regs = [k for k in groups if k.startswith("vit_small-")]
        for reg in regs:
            evidence[reg] = flatness_evidence(groups[reg], base)
        evidence["vit_small"] = {k: mean(s["final_measure"][k] for s in base.values())
                                 for k in ("shop", "shpred")}
        side: dict[str, Any] = {k: _judged(flatter(groups[k], base)) for k in regs
                                if k != PRIMARY}
        supplement = {}
        if all("supplement" in s["final_measure"] for s in summaries):
            sup_base = _supplement(base)
            supplement = {k: _judged(flatter(_supplement(groups[k]), sup_base)) for k in regs}
            side["supplement"] = supplement
        evidence["side"] = side
        out = flatter(groups[PRIMARY], base, evidence)
        others = [f"{k}: {p['verdict']} ({p['reason']})" for k, p in side.items()
                  if k != "supplement"]
        if others:
            out["reason"] += " | not in the verdict: " + " | ".join(others)
        if supplement:
            out["reason"] += (f" | supplementary, {SUPPLEMENT_REPEATS} other weight draws (not "
                              "in the verdict): " + " | ".join(
                                  f"{k}: {p['verdict']} ({p['reason']})"
                                  for k, p in supplement.items()))
            out["supplement"] = {k: flatness_evidence(_supplement(groups[k]), sup_base)
                                 for k in regs}
        return out


def reuse_candidates(path: Path) -> tuple[Path, Path]:
    """Where the run to be trained into ``path`` (``OUT/<run>``) may already have finished in
    :data:`REUSE_FROM`: ``OUT/../robustness/<run>``, and, when ``OUT`` is a ladder rung
    ``L/sharpness/<rung>``, ``L/robustness/<rung>/<run>``."""
    out = path.parent
    return (out.parent / REUSE_FROM / path.name,
            out.parent.parent / REUSE_FROM / out.name / path.name)


def _values(r: Any) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, res in (("shop", r.shop), ("shpred", r.shpred)):
        if res is not None:
            out[key] = res.estimate
            out[f"{key}_se"] = res.stderr
            out[f"{key}_per_draw"] = res.per_draw.tolist()
    return out


def _judged(v: dict[str, Any]) -> dict[str, Any]:
    """A side claim's verdict without its evidence (the verdict's evidence holds it)."""
    return {k: v[k] for k in ("verdict", "reason", "effects", "correction") if k in v}


def _supplement(runs: dict[int, dict[str, Any]]) -> dict[int, dict[str, Any]]:
    return {seed: {**s, "final_measure": s["final_measure"]["supplement"]}
            for seed, s in runs.items()}


def _per_seed(reg: dict[int, dict[str, Any]], base: dict[int, dict[str, Any]], key: str
              ) -> dict[int, tuple[float, float]]:
    """Per seed: the mean of the per-draw differences ``reg − base`` of ``key`` (the same
    weight draws for both: common random numbers) and its standard error over draws."""
    out = {}
    for seed in sorted(reg):
        r, b = (runs[seed]["final_measure"].get(f"{key}_per_draw") for runs in (reg, base))
        if not (isinstance(r, list) and isinstance(b, list) and len(r) == len(b)):
            # not paired draw by draw: refused, with the runs named, by flatter (_draws_problem)
            out[seed] = (math.nan, math.nan)
            continue
        d = (torch.tensor(r, dtype=torch.float64) - torch.tensor(b, dtype=torch.float64))
        out[seed] = (float(d.mean()), float(d.std() / math.sqrt(len(d))) if len(d) > 1
                     else math.nan)
    return out


def train_accs(reg: dict[int, dict[str, Any]], base: dict[int, dict[str, Any]]
               ) -> tuple[float, float]:
    """Seed-mean final train accuracies of ``reg`` and ``base``."""
    def acc(runs: dict[int, dict[str, Any]]) -> float:
        return mean(s["final"].get("train/acc", math.nan) for s in runs.values())

    return acc(reg), acc(base)


def flatter_parts(reg: dict[int, dict[str, Any]], base: dict[int, dict[str, Any]]
                  ) -> dict[str, Effect]:
    """"shop" and "shpred": vanilla − ``reg`` (both ``{seed: summary}``) over seeds, each seed's
    value the mean of the paired per-draw differences with their standard error as the
    measurement error (positive: ``reg`` is flatter, the claimed direction)."""
    label = next(iter(reg.values()))["label"]
    out = {}
    for key in ("shop", "shpred"):
        d = _per_seed(reg, base, key)
        out[key] = over_seeds([-v for v, _ in d.values()], [se for _, se in d.values()],
                              f"{key} vit_small − {label}")
    return out


def flatness_evidence(reg: dict[int, dict[str, Any]], base: dict[int, dict[str, Any]]
                      ) -> dict[str, Any]:
    """Train accuracies (seed means: ``reg``, vanilla) and, per measure, the seed means of both
    models, the mean paired difference ``reg − vanilla``, its standard error over seeds, and
    every seed's difference."""
    evidence: dict[str, Any] = {"train_acc": list(train_accs(reg, base))}
    for key in ("shop", "shpred"):
        d = _per_seed(reg, base, key)
        diff = over_seeds([v for v, _ in d.values()], [se for _, se in d.values()])
        evidence[key] = {"reg": mean(s["final_measure"][key] for s in reg.values()),
                         "vanilla": mean(s["final_measure"][key] for s in base.values()),
                         "diff": diff.value, "diff_se": diff.se,
                         "per_seed": {str(seed): {"diff": v, "diff_se": se}
                                      for seed, (v, se) in d.items()}}
    return evidence


def _draws_problem(reg: dict[int, dict[str, Any]], base: dict[int, dict[str, Any]]
                   ) -> str | None:
    """Why ``reg`` and ``base`` cannot be compared draw by draw, or None: a run whose per-draw
    ShOp or ShPred is not a non-empty list of finite numbers, or the two runs of a seed with
    different numbers of weight draws. Without this, a NaN draw made the part "not finite"
    without naming the run, and a run of one draw was broadcast against the other's every
    draw (torch subtraction), its difference counted as that many paired draws."""
    bad = []
    for key in ("shop", "shpred"):
        for seed in sorted(reg):
            draws = {}
            for runs in (reg, base):
                s = runs[seed]
                v = s["final_measure"].get(f"{key}_per_draw")
                name = s.get("name", f"{s['label']}/seed {seed}")
                if not (isinstance(v, list) and v and all(_finite(x) for x in v)):
                    bad.append(f"{name}: {key}_per_draw is not a non-empty list of finite "
                               "numbers")
                else:
                    draws[name] = len(v)
            if len(draws) == 2 and len(set(draws.values())) == 2:
                bad.append(f"seed {seed}: {key} over " + " vs ".join(
                    f"{n} draws ({name})" for name, n in draws.items()))
    if not bad:
        return None
    return ("per-draw sharpness cannot be paired: " + "; ".join(bad) + "; delete these runs' "
            f"{FINAL_FILE} to measure them again (a diverged model has no sharpness)")


def _finite(x: Any) -> bool:
    """Whether ``x`` is a finite number (not None, NaN or ±inf)."""
    return isinstance(x, int | float) and not isinstance(x, bool) and math.isfinite(x)


def flatter(reg: dict[int, dict[str, Any]], base: dict[int, dict[str, Any]],
            evidence: dict[str, Any] | None = None) -> dict[str, Any]:
    """"``reg`` is flatter than ``base`` on ShOp and ShPred" (both ``{seed: summary}``): the two
    parts of :func:`flatter_parts` judged together (Holm); not comparable when a run's per-draw
    values are not finite or not paired draw by draw (:func:`_draws_problem`, naming the runs)
    or the seed-mean train accuracies differ by more than :data:`MAX_ACC_GAP`. ``evidence``: the
    verdict's (default: :func:`flatness_evidence`)."""
    why = _draws_problem(reg, base)
    if evidence is None:
        evidence = flatness_evidence(reg, base)
    if why is not None:
        return not_comparable(why, evidence)
    acc = train_accs(reg, base)
    gap = abs(acc[0] - acc[1])
    # a gap at the limit up to the rounding of seed means (0.85 − 0.82 is 0.030000000000000027)
    # is within it, as in every other accuracy precondition (:data:`~.._verdicts.GAP_ROUNDING`)
    if not (gap <= MAX_ACC_GAP or math.isclose(gap, MAX_ACC_GAP, rel_tol=GAP_ROUNDING)):
        return not_comparable(f"seed-mean train accuracies differ by {gap:.3f} (> {MAX_ACC_GAP})",
                              evidence)
    label = next(iter(reg.values()))["label"]
    n = len(reg)
    note = "; ".join(f"{key} {sum(s['final_measure'][key] for s in reg.values()) / n:.4g} vs "
                     f"{sum(s['final_measure'][key] for s in base.values()) / len(base):.4g}"
                     for key in ("shop", "shpred"))
    return verdict(flatter_parts(reg, base), claim=f"{label} flatter than vit_small",
                   evidence=evidence, note=f"{note} (means over {n} seed{'s' if n != 1 else ''})")
