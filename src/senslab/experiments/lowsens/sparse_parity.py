"""Boolean sensitivity as a progress measure when a transformer learns a sparse parity.

Paper: "Transformers Learn Low Sensitivity Functions" (ICLR 2025), A.6 (Fig. 26).
Claim: while train and test accuracy sit near 50% (the plateau), the model's average Boolean
sensitivity rises; as accuracy goes to 100% it converges to k, the sensitivity of the k-sparse
parity y = Π_{i∈S} x_i (every one of its k relevant bits flips it, no other bit does).

Command: ``senslab run sparse_parity``.

Setup: dataset ``sparse_parity`` (x uniform on {±1}ⁿ, a fixed training set, a held-out test set),
model ``parity_transformer`` (two pre-LN layers, 4 heads, mean pooling, 2-class head),
cross-entropy, Adam, minibatches (trainer ``sparse_parity``,
:mod:`senslab.train.loops.sparse_parity`). Six settings of (train size, batch, width, lr, seed)
as in the paper (their values were lost from our copy; ours are in :data:`SETTINGS`); every run
is labelled by its setting without the seed (:func:`setting_label`). Tracked every
``eval_every`` epochs: train/test loss and accuracy and ``bool_sens`` = the sampled average
sensitivity E_x Σᵢ 1[ŷ(x) ≠ ŷ(x^⊕i)] of the predicted class
(``boolean_sensitivity(model, n, method="sample", output="sign")``, the same ``bool_samples``
strings at every evaluation), its standard error ``bool_sens_se`` and the part of it on the
relevant bits, ``bool_sens/relevant`` = Σ_{i∈S} Inf_i.

Verdict: on the runs that learn after a plateau, two parts over runs (settings × seed
replicates), Holm: the rise on the plateau and the convergence to k (:func:`parity_verdict`).

* **Rises on the plateau**: the mean sensitivity over the *later half* of the plateau (the last
  ⌈(m − 1)/2⌉ of its m − 1 evaluations after the start; the plateau is every evaluation before
  test acc first reaches 0.6) minus the sensitivity at the start. The evaluations are chosen by
  their position, never by their value, so on a flat plateau the difference has expectation 0
  whatever the evaluation-to-evaluation noise; the mean over runs is judged with Student's t over
  runs, whose spread contains that noise. Its measurement s.e. per run is
  √(se_start² + mean(se_later)²) (the mean of the later s.e.'s, not their root-mean-square / √L:
  every evaluation reuses the same sampled strings, so their errors are correlated). *Before
  2026-11-30 this part was the plateau maximum − the start; the plateau included the start, so
  it was ≥ 0 by construction and biased upward by the maximum of noisy evaluations: a flat,
  noisy plateau was "supported". That was a bug in the rule, corrected here.*
* **Converges to k**: 0.15·k − |final − k|, Student's t over runs, with each run's measurement
  s.e. the sampled s.e. of the final sensitivity combined with the resolution of m sampled
  strings, √(se² + (n/m)²) (one string in m off by the whole range n): strings that all flip
  exactly k bits give a sample s.e. of 0, which does not make the value exact (corrected
  2026-11-30, with the s.e. floor of :func:`~senslab.verdicts.over_seeds`).

The curve these parts need (``plateau`` in the run's summary) is added by
:meth:`SparseParity.after_run` from ``metrics.jsonl`` (and cached in ``summary.json``); a summary
without it is "not comparable" (run the experiment again on its directory: finished runs are
reused and only the curve is added).

Scales: cpu — n = 10, k = 3, width ≤ 64, 25 epochs, 200 sampled strings (see ``SCALES``);
paper — n = 20, k = 3, the same six settings for 200 epochs with 2,000 strings.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

from ...train.config import ranged
from ...train.loops._common import config_from
from ...train.loops.sparse_parity import PLATEAU_ACC, SparseParityRun, SparseParityTraining
from ...train.rundir import RunDir, nan_for_null
from ...verdicts import not_comparable, over_seeds, verdict
from ..base import Experiment, Run, Settings, register_experiment


class ParitySetting(NamedTuple):
    """One curve of the paper's Fig. 26: (train size, batch size, width, learning rate, seed)."""

    train_size: int
    batch_size: int
    width: int
    lr: float
    seed: int


#: six settings (ours): two seeds of a base setting, then one change of train size, batch,
#: width and learning rate each
SETTINGS: tuple[ParitySetting, ...] = (
    ParitySetting(2000, 32, 32, 1e-3, 0),
    ParitySetting(2000, 32, 32, 1e-3, 1),
    ParitySetting(4000, 32, 32, 1e-3, 0),
    ParitySetting(2000, 64, 32, 1e-3, 0),
    ParitySetting(2000, 32, 64, 1e-3, 0),
    ParitySetting(2000, 32, 32, 3e-3, 0),
)


@dataclass
class ParitySettings(Settings, SparseParityTraining):
    """Shared settings (the fields of
    :class:`~senslab.train.loops.sparse_parity.SparseParityTraining`). ``only``: comma-separated
    run indices (e.g. ``"0,3"``); empty = all. ``train_size`` > 0 replaces every setting's
    training-set size (quick checks). Replicate k of ``seeds`` adds k to every setting's seed
    (its run name says the seed used). A run identical to one listed before it is listed once:
    setting 1 is setting 0 at seed 1, so replicate k of setting 0 is replicate k − 1 of setting
    1, and with ``train_size`` set setting 2 (its own training-set size) is setting 0; the
    verdict counts every run as an independent one, so a run trained twice under two names
    would have entered it twice, with a standard error too small."""

    only: str = ""
    train_size: int = ranged(0, ge=0)


SCALES = {
    # n = 10 keeps the plateau short enough for 2 shared CPU cores (at n = 20 the model still
    # predicted a constant class after 30 epochs)
    "cpu": ParitySettings(n_bits=10, epochs=25, bool_samples=200),
    "paper": ParitySettings(epochs=200, test_size=2000, bool_samples=2000),
}

#: verdict thresholds: learned = final test acc ≥ LEARNED_ACC; converged = the part
#: K_TOLERANCE · k − |bool_sens − k| > 0 (the plateau's end, test acc ≥ 0.6, is the trainer's
#: PLATEAU_ACC)
LEARNED_ACC = 0.95
K_TOLERANCE = 0.15


def run_name(i: int, s: ParitySetting) -> str:
    return f"r{i}-n{s.train_size}-b{s.batch_size}-w{s.width}-lr{s.lr:g}-s{s.seed}"


def setting_label(s: ParitySetting) -> str:
    """The label of every run of setting ``s`` whatever its seed (its run name without the
    index and the seed): settings 0 and 1, one setting at two seeds, and the seed replicates of
    each share it, so ``senslab report`` shows one row per setting over its seeds."""
    return f"n{s.train_size}-b{s.batch_size}-w{s.width}-lr{s.lr:g}"


def chosen(settings: ParitySettings) -> list[int]:
    if not settings.only:
        return list(range(len(SETTINGS)))
    try:
        idx = sorted({int(t) for t in settings.only.split(",") if t.strip()})
    except ValueError:
        raise ValueError(f"only= takes run indices like '0,3', got {settings.only!r}") from None
    if not idx or idx[0] < 0 or idx[-1] >= len(SETTINGS):
        raise ValueError(f"only= indices must be in 0..{len(SETTINGS) - 1}, got {settings.only!r}")
    return idx


@register_experiment("sparse_parity")
class SparseParity(Experiment):
    paper = "Transformers Learn Low Sensitivity Functions (ICLR 2025), A.6"
    claim = ("Training a transformer on a k-sparse parity, its Boolean sensitivity rises during "
             "the plateau where accuracy is ≈ 50%, then converges to k as accuracy → 100%.")
    cpu_scale_note = (
        "n = 10, k = 3, width ≤ 64, 25 epochs, Boolean sensitivity from 200 sampled strings; six "
        "settings varying train size, batch, width, lr and seed as in the paper"
    )

    scales = SCALES
    seed_aware = True  # the verdict judges every run, seed replicates included

    def runs(self, st: ParitySettings) -> list[Run]:
        out = []
        listed: set[ParitySetting] = set()
        for k in range(st.seeds):
            for i in chosen(st):
                s = SETTINGS[i]._replace(seed=SETTINGS[i].seed + k)
                if st.train_size > 0:
                    s = s._replace(train_size=st.train_size)
                if s in listed:  # the same training as a run listed already (ParitySettings)
                    continue
                listed.add(s)
                cfg = config_from(SparseParityRun, st, name=run_name(i, s), **s._asdict())
                # the label in the summary only (the trainer's is the run's own name), not in
                # config.json: finished runs of earlier versions are reused, and relabelled
                out.append(Run(cfg.name, cfg, trainer="sparse_parity",
                               info={"label": setting_label(s)}))
        return out

    def after_run(self, run: Run, path: Path, summary: dict[str, Any], settings: Any,
                  log: Callable[[str], None]) -> dict[str, Any]:
        """Add the plateau curve the verdict reads (:func:`plateau_curve`) to the run's
        ``summary.json`` (once: a summary that has it is returned as is)."""
        if "plateau" in summary:
            return summary
        rd = RunDir(path)
        # a NaN the loop logged is null in metrics.jsonl: read back as the NaN it was
        curve = plateau_curve(nan_for_null(rd.metrics()), run.config.bool_samples)
        rd.write_json("summary.json", {**rd.read_json("summary.json"), "plateau": curve})
        return {**summary, "plateau": curve}

    def verdict(self, summaries: list[dict[str, Any]]) -> dict[str, Any]:
        return parity_verdict(summaries)


def plateau_curve(history: list[dict[str, Any]], bool_samples: int) -> dict[str, Any]:
    """The sensitivities the verdict reads: every evaluation of the plateau (before test acc
    first reaches :data:`~senslab.train.loops.sparse_parity.PLATEAU_ACC`, the trainer's
    definition), the final one, and the number of sampled strings behind each."""
    end = next((i for i, r in enumerate(history) if r["test/acc"] >= PLATEAU_ACC), len(history))
    plateau = history[:end]
    return {"epochs": [r["epoch"] for r in plateau],
            "sens": [r["bool_sens"] for r in plateau],
            "se": [r["bool_sens_se"] for r in plateau],
            "sens_final_se": history[-1]["bool_sens_se"] if history else None,
            "bool_samples": bool_samples}


def plateau_rise(curve: dict[str, Any]) -> tuple[float, float, str]:
    """(later plateau mean − start, its measurement s.e., the evaluations used in words): the
    later half of the plateau's evaluations after the start (see the module docstring)."""
    sens, se, epochs = curve["sens"], curve["se"], curve["epochs"]
    after = len(sens) - 1
    if after < 1:
        return math.nan, math.nan, "no evaluation after the start"
    first = len(sens) - (after + 1) // 2
    later, later_se = sens[first:], se[first:]
    rise = sum(later) / len(later) - sens[0]
    rise_se = math.sqrt(se[0] ** 2 + (sum(later_se) / len(later_se)) ** 2)
    return rise, rise_se, f"epochs {epochs[first]}–{epochs[-1]}"


def final_se(summary: dict[str, Any]) -> float:
    """The final sensitivity's measurement s.e., floored by the resolution of the sampled
    strings: √(se² + (n/m)²) (module docstring)."""
    curve = summary["plateau"]
    return math.hypot(curve["sens_final_se"], summary["n_bits"] / curve["bool_samples"])


def _finite(x: Any) -> bool:
    """Whether ``x`` is a finite number (not None, NaN or ±inf)."""
    return isinstance(x, int | float) and not isinstance(x, bool) and math.isfinite(x)


def parity_verdict(summaries: list[dict[str, Any]]) -> dict[str, Any]:
    """Judged on runs that learned the parity (final test acc ≥ 0.95) after a plateau of at
    least two evaluations. Two parts, each the mean over those runs (settings and seed
    replicates) with Student's t over runs (floored at the measurement s.e.), Holm over the two:
    the rise on the plateau, ``later plateau mean − start`` (:func:`plateau_rise`), and the
    convergence to k, ``0.15·k − |final − k|`` (module docstring). "not comparable" if a run's
    final test accuracy is not a finite number, fewer than half the runs learned, a judged run's
    summary has no plateau curve (one from before 2026-11-30), or a judged run's sensitivity or
    its standard error is not a finite number at an evaluation of its plateau or at the end
    (the run, measure and epochs are named)."""
    evidence = {s["name"]: s["progress"] for s in summaries}
    # a NaN final test accuracy failed "≥ 0.95" and the run was counted, unnamed, among those
    # that did not learn: whether it learned is unknown, not "no"
    unknown = [s["name"] for s in summaries if not _finite(s["progress"]["test_acc_final"])]
    if unknown:
        return not_comparable(f"final test accuracy not a finite number in {unknown}: whether "
                              "they learned the parity is unknown; check their metrics.jsonl "
                              "and rerun them", evidence)
    judged = [s for s in summaries if s["progress"]["test_acc_final"] >= LEARNED_ACC
              and s["progress"]["plateau_evals"] >= 2]
    if not summaries or 2 * len(judged) < len(summaries):
        return not_comparable(f"only {len(judged)} of {len(summaries)} runs learned the parity "
                              f"(test acc ≥ {LEARNED_ACC}) after a plateau; need at least half",
                              evidence)
    old = [s["name"] for s in judged if "plateau" not in s]
    if old:
        return not_comparable(f"no plateau curve in the summaries of {old} (written before "
                              "2026-11-30): run the experiment again on its directory (finished "
                              "runs are reused) to add it", evidence)
    # every evaluation of the curve, also those the rise does not average (the first half of
    # the plateau after its start): a NaN there is a failed measurement, skipped without a word
    broken = []
    for s in judged:
        curve = s["plateau"]
        said = [f"{key} at epoch(s) {bad}" for key, values in (("bool_sens", curve["sens"]),
                                                               ("bool_sens_se", curve["se"]))
                if (bad := [e for e, v in zip(curve["epochs"], values, strict=True)
                            if not _finite(v)])]
        said += [key for key, v in (("final bool_sens", s["progress"]["sens_final"]),
                                    ("final bool_sens_se", curve["sens_final_se"]))
                 if not _finite(v)]
        if said:
            broken.append(f"{s['name']} ({'; '.join(said)})")
    if broken:
        return not_comparable("sensitivity or its standard error not a finite number in "
                              + ", ".join(broken) + ": a failed measurement cannot be averaged "
                              "or skipped; check the runs' metrics.jsonl and rerun them",
                              evidence)
    rise, rise_se, close, close_se, detail = [], [], [], [], []
    for s in judged:
        pr, k = s["progress"], s["k"]
        r, r_se, where = plateau_rise(s["plateau"])
        rise.append(r)
        rise_se.append(r_se)
        close.append(K_TOLERANCE * k - abs(pr["sens_final"] - k))
        close_se.append(final_se(s))
        evidence[s["name"]] = {**pr, "later_plateau_minus_start": r,
                               "later_plateau_minus_start_se": r_se, "later_plateau": where}
        detail.append(f"{s['name']}: {pr['sens_start']:.2f} → {r + pr['sens_start']:.2f} "
                      f"(later plateau, {where}; max {pr['sens_plateau_max']:.2f}) → "
                      f"{pr['sens_final']:.2f} (k = {k}, test acc {pr['test_acc_final']:.2f})")
    bad = [s["name"] for s, r, c, e in zip(judged, rise, close, rise_se, strict=True)
           if not (math.isfinite(r) and math.isfinite(c) and math.isfinite(e))]
    if bad:
        return not_comparable(f"sensitivity not finite in {bad}", evidence)
    skipped = [s["name"] for s in summaries if not any(s is j for j in judged)]
    note = (f"{len(skipped)} run(s) without a plateau-then-learning curve not judged "
            f"({', '.join(skipped)}). " if skipped else "")
    # one value per judged run, settings × seed replicates (settings 0 and 1 are one setting
    # at two seeds): "N runs", not "N settings" (said until 2026-12-07, of seed replicates too)
    parts = {"rises on the plateau": over_seeds(rise, rise_se, "later plateau mean − start",
                                                unit="run"),
             "converges to k": over_seeds(close, close_se,
                                          what=f"{K_TOLERANCE:g}·k − |final − k|",
                                          unit="run")}
    return verdict(parts, claim=f"sensitivity rises on the plateau and ends near k, mean over "
                                f"{len(judged)} runs",
                   evidence=evidence, note=note + "Runs: " + "; ".join(detail))
