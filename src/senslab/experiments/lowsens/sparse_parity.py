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
as in the paper (their values were lost from our copy; ours are in :data:`SETTINGS`). Tracked every
``eval_every`` epochs: train/test loss and accuracy and ``bool_sens`` = the sampled average
sensitivity E_x Σᵢ 1[ŷ(x) ≠ ŷ(x^⊕i)] of the predicted class
(``boolean_sensitivity(model, n, method="sample", output="sign")``, the same ``bool_samples``
strings at every evaluation), its standard error ``bool_sens_se`` and the part of it on the
relevant bits, ``bool_sens/relevant`` = Σ_{i∈S} Inf_i.

Verdict: on the runs that learn after a plateau, two parts over runs (settings × seed
replicates), Holm: the plateau maximum − the start, and 0.15·k − |final − k|.

Scales: cpu — n = 10, k = 3, width ≤ 64, 25 epochs, 200 sampled strings (see ``SCALES``);
paper — n = 20, k = 3, the same six settings for 200 epochs with 2,000 strings.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, NamedTuple

from ...train.config import ranged
from ...train.loops._common import config_from
from ...train.loops.sparse_parity import SparseParityRun, SparseParityTraining
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
    (its run name says the seed used)."""

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
        for k in range(st.seeds):
            for i in chosen(st):
                s = SETTINGS[i]._replace(seed=SETTINGS[i].seed + k)
                if st.train_size > 0:
                    s = s._replace(train_size=st.train_size)
                cfg = config_from(SparseParityRun, st, name=run_name(i, s), **s._asdict())
                out.append(Run(cfg.name, cfg, trainer="sparse_parity"))
        return out

    def verdict(self, summaries: list[dict[str, Any]]) -> dict[str, Any]:
        return parity_verdict(summaries)


def parity_verdict(summaries: list[dict[str, Any]]) -> dict[str, Any]:
    """Judged on runs that learned the parity (final test acc ≥ 0.95) after a plateau of at
    least two evaluations. Two parts, each the mean over those runs (settings and seed
    replicates) with Student's t over runs, Holm over the two: the rise on the plateau,
    ``plateau max − start`` (its measurement s.e. from both sampled values), and the
    convergence to k, ``0.15·k − |final − k|``. "not comparable" if fewer than half the runs
    learned."""
    evidence = {s["name"]: s["progress"] for s in summaries}
    judged = [s for s in summaries if s["progress"]["test_acc_final"] >= LEARNED_ACC
              and s["progress"]["plateau_evals"] >= 2]
    if not summaries or 2 * len(judged) < len(summaries):
        return not_comparable(f"only {len(judged)} of {len(summaries)} runs learned the parity "
                              f"(test acc ≥ {LEARNED_ACC}) after a plateau; need at least half",
                              evidence)
    rise, rise_se, close, detail = [], [], [], []
    for s in judged:
        pr, k = s["progress"], s["k"]
        rise.append(pr["sens_plateau_max"] - pr["sens_start"])
        rise_se.append((pr["sens_start_se"] ** 2 + pr["sens_plateau_max_se"] ** 2) ** 0.5)
        close.append(K_TOLERANCE * k - abs(pr["sens_final"] - k))
        detail.append(f"{s['name']}: {pr['sens_start']:.2f} → {pr['sens_plateau_max']:.2f} "
                      f"(plateau, test acc {pr['plateau_max_test_acc']:.2f}) → "
                      f"{pr['sens_final']:.2f} (k = {k}, test acc {pr['test_acc_final']:.2f})")
    bad = [s["name"] for s, r, c in zip(judged, rise, close, strict=True)
           if not (math.isfinite(r) and math.isfinite(c))]
    if bad:
        return not_comparable(f"sensitivity not finite in {bad}", evidence)
    skipped = len(summaries) - len(judged)
    note = (f"{skipped} run(s) without a plateau-then-learning curve not judged. " if skipped
            else "")
    # one run per task setting (n, k), not seeds of one setting: the verdict's words say so
    parts = {"rises on the plateau": over_seeds(rise, rise_se, "plateau max − start",
                                                unit="setting"),
             "converges to k": over_seeds(close, what=f"{K_TOLERANCE:g}·k − |final − k|",
                                          unit="setting")}
    return verdict(parts, claim=f"sensitivity rises on the plateau and ends near k, mean over "
                                f"{len(judged)} runs",
                   evidence=evidence, note=note + "Runs: " + "; ".join(detail))
