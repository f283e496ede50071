"""Sensitivity as a progress measure for grokking (modular addition).

Paper: "Transformers Learn Low Sensitivity Functions" (ICLR 2025), §7.3 and A.5.
Claim: after the model memorises the training set, its sensitivity to noise on the number
embeddings keeps changing while train and test accuracy are flat, and it falls well before the
test accuracy jumps: the sensitivity at the generalisation epoch is far below its peak after
memorisation (paper code: ≈ 8.5–9.5% around epoch 3,000, ≈ 1% before the jump at 10k–13k).

Command: ``senslab run grokking``.

Setup: dataset ``modular_addition`` ((a + b) mod p, tokens ``a b =``, a seeded 30% of all pairs
for training, the rest for testing), model ``modadd_transformer`` (one layer, no LayerNorm),
full-batch AdamW, trainer ``grokking`` (:mod:`senslab.train.loops.grokking`). Tracked every
``eval_every`` epochs: train and test loss/accuracy, ``weight_norm`` (L2 norm of all
parameters) and ``sens/train``, the probability that the predicted class changes when
N(0, 0.1²) noise is added to the number embeddings (``Embedding("embed")`` with
``mask = model.number_mask``; the ``=`` token is never perturbed), on training pairs, in eval
mode. Every measurement reuses the same noise seed (common random numbers), so changes between
epochs are the model's, not the noise's. Phases: memorisation = first evaluation with train
acc ≥ 0.99; generalisation = first with test acc ≥ 0.95.

Verdict: two parts over seeds (Student's t), Holm: 0.5 − (sensitivity at generalisation / peak)
and 0.8 − (sensitivity at the last evaluation before test accuracy reaches 50% / peak), where
the peak is the largest sensitivity from memorisation up to that last evaluation before the
jump (:func:`phases_before_jump`): the peak of the plateau on which test accuracy is still low.
A peak at the last evaluation before the jump gives the second ratio 1 (no fall before the
jump: that part points against the claim). One seed has no seed-to-seed spread to judge a ratio
with and is inconclusive. "not comparable" if a run never generalises, or its test accuracy
already reaches 50% at memorisation (no plateau).

*Corrected 2026-11-30 (a bug in the rule):* the peak was searched from memorisation up to
*generalisation*, after the jump, and nothing required it to come before the jump, so a curve
flat on the plateau that spiked between the jump and generalisation was "supported". What the
rule tests is §7.3's claim, "sensitivity values continue to decrease [...] while test accuracy
stays low" before it jumps. It does **not** test A.5's finer phase structure (a drop during
memorisation, a rise during circuit formation, then the clean-up fall): the peak may be the
memorisation epoch itself, so a monotone fall after memorisation passes (it does at the cpu
scale, where no dip-and-rise is seen).

Scales: paper — the paper code's run: p = 113, d = 128, 4 heads, MLP 512, the paper code's
model (no residual branches, positions initialised to zero, ``nn.MultiheadAttention``'s init, a
logit per vocabulary entry), AdamW lr 1e-3, weight decay 1.0, β = (0.9, 0.999), 17,000 epochs
whatever happens (``post_epochs`` = ``epochs``), seeds 42–44, sensitivity every epoch with both
numbers perturbed at once on every training pair (docs/fidelity.md lists what still differs).
cpu — a smaller problem so the run fits a CPU budget: see ``SCALES["cpu"]``: Nanda et al.'s
residual block with N(0, 1) positions, β = (0.9, 0.98), one number perturbed at a time on 1,000
training pairs, seeds 0–2, and, to fit the budget, p = 59, d = 64, MLP 256, lr 3e-3, weight decay
3.0 and a 50% training split (with p = 59, lr 3e-3 and wd 1.0 the test accuracy did not rise
within the CPU budget). The run stops ``post_epochs`` after it generalises.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ...train.loops._common import config_from
from ...train.loops.grokking import (
    GENERALISED,
    JUMP,
    MEMORISED,
    GrokkingRun,
    GrokkingTraining,
)
from ...train.rundir import RunDir, nan_for_null
from ...verdicts import not_comparable, over_seeds, verdict
from ..base import Experiment, Run, Settings, register_experiment

#: the verdict's thresholds, each a part positive when the ratio is below it: sensitivity at
#: generalisation ≤ 1/2 of the plateau's peak (memorisation to the jump), and already ≤ 80% of
#: it at the last evaluation before test accuracy reaches 50%
FALL_AT_GENERALISATION = 0.5
FALL_BEFORE_JUMP = 0.8


@dataclass
class GrokSettings(Settings, GrokkingTraining):
    """The fields of :class:`~senslab.train.loops.grokking.GrokkingTraining`; ``seed``: the
    first seed (replicate k of ``seeds`` uses seed + k, in run ``modadd-p<p>-s<seed + k>``)."""


SCALES = {
    # the paper code's run (language/sens_modular_addition.ipynb): its SimpleTransformer (no
    # residuals, zero-initialised positions, nn.MultiheadAttention's init, logits over the whole
    # vocabulary), AdamW with PyTorch's default β, 17,000 epochs for seeds 42, 43, 44, and the
    # sensitivity of both numbers perturbed at once on every training pair (round(0.3 · 113²))
    "paper": GrokSettings(p=113, train_fraction=0.3, dim=128, heads=4, mlp_dim=512,
                          residual=False, pos_init="zeros", attn_init="mha", eq_logit=True,
                          lr=1e-3, weight_decay=1.0, beta1=0.9, beta2=0.999, epochs=17000,
                          post_epochs=17000, eval_every=1, sigma=0.1, sens_mode="whole",
                          sens_examples=3831, seed=42, seeds=3),
    # smaller p and width, larger lr and weight decay, half the pairs for training: each change
    # shortens the memorisation plateau (grokking time falls roughly like 1/(lr·wd)); with the
    # paper's settings the plateau alone is ~10k epochs, hours on 2 CPU cores
    "cpu": GrokSettings(p=59, train_fraction=0.5, dim=64, heads=4, mlp_dim=256, residual=True,
                        pos_init="normal", attn_init="linear", eq_logit=False, lr=3e-3,
                        weight_decay=3.0, beta1=0.9, beta2=0.98, epochs=2500, post_epochs=150,
                        eval_every=5, sens_mode="token", sens_examples=1000, seed=0, seeds=3),
}


@register_experiment("grokking")
class Grokking(Experiment):
    paper = "Transformers Learn Low Sensitivity Functions (ICLR 2025), §7.3 / A.5"
    claim = ("During grokking on modular addition, sensitivity to noise on the number embeddings "
             "falls while test accuracy is still flat: at the generalisation epoch it is well "
             "below its peak on the plateau between memorisation and the jump.")
    cpu_scale_note = (
        "p = 59 instead of 113, d = 64, MLP 256, lr 3e-3, weight decay 3.0 and a 50% training "
        "split (paper: 30%, wd 1.0: the memorisation plateau alone would take hours on 2 CPU "
        "cores); Nanda et al.'s residual block and β2 = 0.98 instead of the paper code's "
        "residual-free model and β2 = 0.999; one number perturbed at a time on 1,000 pairs "
        "(paper code: both at once, every pair); same optimiser (AdamW, full batch)"
    )

    scales = SCALES
    seed_aware = True  # the verdict judges every run, seed replicates included

    def runs(self, s: GrokSettings) -> list[Run]:
        out = []
        for k in range(s.seeds):
            cfg = config_from(GrokkingRun, s, name=f"modadd-p{s.p}-s{s.seed + k}",
                              seed=s.seed + k)
            out.append(Run(cfg.name, cfg, trainer="grokking"))
        return out

    def after_run(self, run: Run, path: Path, summary: dict[str, Any], settings: Any,
                  log: Callable[[str], None]) -> dict[str, Any]:
        """Add :func:`phases_before_jump` (from ``metrics.jsonl``) to the run's ``summary.json``
        as ``claim_phases``. Computed again from the curve at every call and written only when it
        differs from the stored one: ``claim_phases`` stored by an older rule (before 2026-12-04
        it had no ``sens_not_finite_epochs``, and a NaN sensitivity on the plateau was skipped
        without a word) was returned as is, and the verdict judged it."""
        rd = RunDir(path)
        # a NaN the loop logged is null in metrics.jsonl: read back as the NaN it was
        ph = phases_before_jump(nan_for_null(rd.metrics()))
        if _json_equal(summary.get("claim_phases"), ph):
            return summary
        rd.write_json("summary.json", {**rd.read_json("summary.json"), "claim_phases": ph})
        return {**summary, "claim_phases": ph}

    def verdict(self, summaries: list[dict[str, Any]]) -> dict[str, Any]:
        return grokking_verdict(summaries)


def phases_before_jump(history: list[dict[str, Any]]) -> dict[str, Any]:
    """The numbers the verdict compares, from the logged evaluations: memorisation (first train
    acc ≥ 0.99), the jump (first test acc ≥ 0.5 from memorisation on), generalisation (first
    test acc ≥ 0.95 from memorisation on), the last evaluation before the jump (``before``), and
    the peak: the largest sensitivity from memorisation up to ``before`` (the first of equal
    values; only finite values are ranked). ``plateau`` is False when test acc is already ≥ 0.5
    at memorisation; epochs and sensitivities are None where a phase never happened.
    ``sens_not_finite_epochs`` (where there is a plateau): the epochs from memorisation up to
    ``before``, and the generalisation epoch, whose sensitivity is not a finite number, which
    the verdict refuses to judge (a NaN first value used to become the peak, a later one to be
    skipped without a word)."""
    def first(pred: Any, start: int = 0) -> int | None:
        return next((i for i in range(start, len(history)) if pred(history[i])), None)

    mem = first(lambda r: r["train/acc"] >= MEMORISED)
    gen = None if mem is None else first(lambda r: r["test/acc"] >= GENERALISED, mem)
    jump = None if mem is None else first(lambda r: r["test/acc"] >= JUMP, mem)
    out: dict[str, Any] = dict.fromkeys(
        ("memorisation_epoch", "generalisation_epoch", "jump_epoch", "before_jump_epoch",
         "sens_before_jump", "peak_epoch", "sens_peak", "sens_at_generalisation"))
    out["plateau"] = None
    if mem is None:
        return out
    out["memorisation_epoch"] = history[mem]["epoch"]
    if gen is not None:
        out.update(generalisation_epoch=history[gen]["epoch"],
                   sens_at_generalisation=history[gen]["sens/train"])
    if jump is None:
        return out
    out.update(jump_epoch=history[jump]["epoch"], plateau=jump > mem)
    if jump == mem:
        return out
    before = jump - 1
    # the peak of the finite values: Python's max keeps a NaN first element (nothing compares
    # greater) and skips later ones, so a failed measurement became the peak or vanished; the
    # evaluations the rule reads with no finite sensitivity are listed for the verdict instead
    window = [*range(mem, before + 1), *([gen] if gen is not None else [])]
    out["sens_not_finite_epochs"] = [history[i]["epoch"] for i in window
                                     if not _finite(history[i]["sens/train"])]
    finite = [i for i in range(mem, before + 1) if _finite(history[i]["sens/train"])]
    peak = max(finite, key=lambda i: (history[i]["sens/train"], -i)) if finite else None
    out.update(before_jump_epoch=history[before]["epoch"],
               sens_before_jump=history[before]["sens/train"],
               peak_epoch=None if peak is None else history[peak]["epoch"],
               sens_peak=None if peak is None else history[peak]["sens/train"])
    return out


def _json_equal(a: Any, b: Any) -> bool:
    """Whether ``a`` and ``b`` are the same as JSON text (a NaN, never ``==`` to itself, equals a
    NaN)."""
    return json.dumps(a, sort_keys=True) == json.dumps(b, sort_keys=True)


def _finite(x: Any) -> bool:
    """Whether ``x`` is a finite number (not None, NaN or ±inf)."""
    return isinstance(x, int | float) and not isinstance(x, bool) and math.isfinite(x)


def claim_phases(summary: dict[str, Any]) -> dict[str, Any] | None:
    """The run's :func:`phases_before_jump`: stored by :meth:`Grokking.after_run`, or, for a
    summary from before 2026-11-30, read from the trainer's ``phases`` where that is exact (their
    peak, the largest value from memorisation to generalisation, lies before the jump, so it is
    also the largest up to the last evaluation before it); None where it is not."""
    if "claim_phases" in summary:
        return summary["claim_phases"]
    ph = summary["phases"]
    if ph.get("peak_epoch") is None or ph.get("jump_epoch") is None \
            or not ph["peak_epoch"] < ph["jump_epoch"]:
        return None
    return {"memorisation_epoch": ph["memorisation_epoch"],
            "generalisation_epoch": ph["generalisation_epoch"], "jump_epoch": ph["jump_epoch"],
            "before_jump_epoch": None, "sens_before_jump": ph["sens_before_jump"],
            "peak_epoch": ph["peak_epoch"], "sens_peak": ph["sens_peak"],
            "sens_at_generalisation": ph["sens_at_generalisation"], "plateau": True}


def grokking_verdict(summaries: list[dict[str, Any]]) -> dict[str, Any]:
    """Two parts, each over seeds (Student's t; one seed: no uncertainty, inconclusive), Holm
    over the two: ``0.5 − sensitivity at generalisation / peak`` and ``0.8 − sensitivity just
    before test acc reaches 50% / peak``, the peak being the largest sensitivity from
    memorisation up to the last evaluation before the jump (:func:`claim_phases`). "not
    comparable" if a run never generalised within its epoch budget, had no plateau (test acc ≥
    0.5 at memorisation), its sensitivity is not a finite number at an evaluation the rule reads
    (from memorisation to the jump, and at generalisation: the run and epochs are named), its
    peak is not positive, or its summary lacks the curve's phases (a summary from before
    2026-11-30 whose stored peak lies after the jump)."""
    evidence = {s["name"]: s.get("claim_phases", s["phases"]) for s in summaries}
    missing = [f"{s['name']} (stopped at epoch {s['epochs']}, final test acc "
               f"{s['final']['test/acc']:.3f})" for s in summaries
               if s["phases"]["generalisation_epoch"] is None]
    if not summaries or missing:
        return not_comparable("no grokking within the epoch budget: " + ", ".join(missing)
                              if missing else "no runs", evidence)
    phases = {s["name"]: claim_phases(s) for s in summaries}
    old = [n for n, ph in phases.items() if ph is None]
    if old:
        return not_comparable(f"the summaries of {old} (from before 2026-11-30) put the "
                              "sensitivity peak after the jump: the peak before it needs their "
                              "curves; run the experiment again on its directory (finished runs "
                              "are reused) to add them", evidence)
    no_plateau = [n for n, ph in phases.items() if not ph["plateau"]]
    if no_plateau:
        return not_comparable(f"test accuracy already ≥ {JUMP} at memorisation in {no_plateau}: "
                              "no plateau to fall on", evidence)
    # before the peak's sign: a NaN peak read "no sensitivity after memorisation (peak 0)", and a
    # NaN just before the jump or at generalisation made a part "not finite" without naming it
    broken = []
    for n, ph in phases.items():
        what = [k for k in ("sens_peak", "sens_before_jump", "sens_at_generalisation")
                if not _finite(ph[k])]
        epochs = ph.get("sens_not_finite_epochs") or []
        said = ([f"{', '.join(what)} not finite"] if what else []) + (
            [f"sens/train not finite at epoch(s) {epochs}"] if epochs else [])
        if said:
            broken.append(f"{n} ({'; '.join(said)})")
    if broken:
        return not_comparable("sensitivity not a finite number where the rule reads it (from "
                              "memorisation to the jump, and at generalisation) in "
                              + "; ".join(broken) + ": a failed measurement or a diverged run "
                              "cannot be ranked as a peak or a fall; check the run's "
                              "metrics.jsonl and rerun it", evidence)
    flat = [n for n, ph in phases.items() if not ph["sens_peak"] > 0]
    if flat:
        return not_comparable(f"no sensitivity after memorisation (peak 0) in {flat}", evidence)
    gen, before, detail = [], [], []
    for s in summaries:
        ph = phases[s["name"]]
        peak = ph["sens_peak"]
        r_gen = ph["sens_at_generalisation"] / peak
        r_before = ph["sens_before_jump"] / peak
        gen.append(FALL_AT_GENERALISATION - r_gen)
        before.append(FALL_BEFORE_JUMP - r_before)
        detail.append(
            f"{s['name']}: memorised at epoch {ph['memorisation_epoch']}, sensitivity peak "
            f"before the jump {peak:.4f} at epoch {ph['peak_epoch']}, "
            f"{ph['sens_before_jump']:.4f} just before the jump (epoch {ph['jump_epoch']}), "
            f"{ph['sens_at_generalisation']:.4f} at generalisation (epoch "
            f"{ph['generalisation_epoch']}), ratios {r_before:.2f} / {r_gen:.2f}")
    parts = {
        "low at generalisation": over_seeds(
            gen, what=f"{FALL_AT_GENERALISATION:g} − sensitivity at generalisation / peak"),
        "fallen before the jump": over_seeds(
            before, what=f"{FALL_BEFORE_JUMP:g} − sensitivity before the jump / peak"),
    }
    return verdict(parts, claim="sensitivity falls before test accuracy jumps",
                   evidence=evidence, note="; ".join(detail))
