"""Sparse vs frequent tokens: a one-layer self-attention model picks the low-sensitivity feature.

Paper: "Transformers Learn Low Sensitivity Functions" (ICLR 2025), §4.1 and A.1 (Figs. 3, 12).
Claim: when two features predict the label equally well, the model relies on the one that gives
the lower-sensitivity classifier. Case 1 (the *sparse* classifier sign(#S₊ − #S₋) is less
sensitive): the OOD accuracy (sparse tokens drawn from the other label's set) collapses, the
head v aligns with the sparse tokens and attention concentrates on them. Case 2 (the *frequent*
classifier is less sensitive): OOD accuracy stays high and v aligns with the frequent tokens.

Command: ``senslab run synthetic_sparse_frequent``.

Setup: dataset ``sparse_frequent`` (three settings of each case, the table
``SPARSE_FREQUENT_SETTINGS`` in :mod:`senslab.data.synthetic`; the paper's exact parameters were
lost from our copy, so ours are designed to make both cases clean), model ``sparse_attention``
(f(X) = mean_i Σ_j softmax_j(x_jᵀ W x_i) vᵀx_j, small random init), logistic loss, plain SGD
(trainer ``sparse_frequent``, :mod:`senslab.train.loops.sparse_frequent`; one run per setting
and seed replicate, every replicate labelled by its setting's run name, e.g. ``case1-s0``).
Tracked every ``eval_every`` epochs: train/test/OOD accuracy; ``align/<type>`` = cos(v, u) with
u_sparse = mean(e_S₊) − mean(e_S₋), u_frequent = mean(e_F₊) − mean(e_F₋) (label-signed, ours)
and u_irrelevant = mean(e_R); ``attn/<type>`` = softmax attention mass received by each token
type (averaged over queries and training sequences); ``sens/train`` = token-wise sensitivity
with the replacement token uniform over the vocabulary (main paper's choice for this task) on
``sens_examples`` training sequences. The summary also records the sensitivity of the ideal
sparse and frequent classifiers (``solution/sparse``, ``solution/frequent``).

Verdict: four parts over the runs of each case (settings × seed replicates), Holm — case 1:
0.5 − OOD acc and cos(v, u_sparse) − cos(v, u_frequent); case 2: OOD acc − 0.9 and the reverse
alignment difference; "not comparable" if a run does not train or a setting's designed feature is
not the less sensitive one. The OOD parts' s.e. is floored at the measurement s.e. of an accuracy
on the OOD set (:func:`~senslab.experiments._verdicts.accuracy_se`, √((p(1 − p) + 1/n)/n) on n
OOD sequences): *before 2026-11-30 it had no measurement s.e., and runs that tied (all at OOD
acc 1.000) gave an s.e. of 0 and a zero-width interval, a bug in the rule.* The alignment parts
(a cosine of the trained weights, no sampling) have no measurement s.e.

Scales (ours; the paper gives no sizes here): cpu — 1,000 train / 1,000 test / 1,000 OOD
sequences, SGD lr 0.5, batch 50, 50 epochs; paper — 5,000 / 2,000 / 2,000, 100 epochs, the same
optimiser.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ...data.synthetic import SPARSE_FREQUENT_SETTINGS
from ...train.loops._common import config_from
from ...train.loops.sparse_frequent import SparseFrequentRun, SparseFrequentTraining
from ...train.rundir import RunDir
from ...verdicts import not_comparable, over_seeds, verdict
from .._verdicts import accuracy_se
from ..base import Experiment, Run, Settings, register_experiment, seeded_name

#: the low-sensitivity feature each case is built to have
EXPECTED_FEATURE = {1: "sparse", 2: "frequent"}


@dataclass
class SyntheticSettings(Settings, SparseFrequentTraining):
    """Training and tracking settings (ours; the fields of
    :class:`~senslab.train.loops.sparse_frequent.SparseFrequentTraining`). ``seed``: the first
    seed (replicate k of ``seeds`` uses seed + k, named ``<run>-s<k>`` for k > 0). ``only``:
    comma-separated run names (e.g. ``"case1-s0,case2-s0"``) to run a subset; empty runs all
    six."""

    only: str = ""


SCALES = {
    "cpu": SyntheticSettings(),
    "paper": SyntheticSettings(epochs=100, train_size=5000, test_size=2000, eval_every=2,
                               sens_examples=1000),
}

#: OOD accuracy below chance means the prediction follows the swapped sparse tokens
OOD_COLLAPSED = 0.5
#: OOD accuracy at least this high means the sparse tokens are ignored
OOD_KEPT = 0.9
MIN_TRAIN_ACC = 0.95
#: the final numbers the verdict reads: a run with any of them not finite is not judged
FINITE = ("train/acc", "ood/acc", "align/sparse", "align/frequent", "solution/sparse",
          "solution/frequent")


def run_names(settings: SyntheticSettings) -> list[str]:
    names = [f"case{c}-s{s}" for c, s in SPARSE_FREQUENT_SETTINGS]
    if not settings.only:
        return names
    chosen = [n.strip() for n in settings.only.split(",") if n.strip()]
    unknown = sorted(set(chosen) - set(names))
    if unknown:
        raise ValueError(f"only= names unknown runs {unknown}; choose from {', '.join(names)}")
    return [n for n in names if n in chosen]


@register_experiment("synthetic_sparse_frequent")
class SyntheticSparseFrequent(Experiment):
    paper = "Transformers Learn Low Sensitivity Functions (ICLR 2025), §4.1 / A.1"
    claim = ("A one-layer self-attention model relies on whichever of two equally predictive "
             "features gives the lower-sensitivity classifier: sparse tokens in case 1 (OOD "
             "accuracy collapses), frequent tokens in case 2 (OOD accuracy stays high).")
    cpu_scale_note = (
        "1,000 train / 1,000 test / 1,000 OOD examples per run (the paper gives no sizes)"
    )

    scales = SCALES
    seed_aware = True  # the verdict judges every run, seed replicates included

    def runs(self, s: SyntheticSettings) -> list[Run]:
        keys = {f"case{c}-s{n}": (c, n) for c, n in SPARSE_FREQUENT_SETTINGS}
        out = []
        for k in range(s.seeds):
            for name in run_names(s):
                case, setting = keys[name]
                cfg = config_from(SparseFrequentRun, s, name=seeded_name(name, k), case=case,
                                  setting=setting, seed=s.seed + k)
                # the setting's name as the label of each of its seed replicates (the trainer's
                # summary labels a run by its own name): `senslab report` shows one row per
                # setting over its seeds. In the summary only, not in config.json, so finished
                # runs of earlier versions are reused (and relabelled) as they are
                out.append(Run(cfg.name, cfg, trainer="sparse_frequent", info={"label": name}))
        return out

    def after_run(self, run: Run, path: Path, summary: dict[str, Any], settings: Any,
                  log: Callable[[str], None]) -> dict[str, Any]:
        """Add the OOD set's size (``ood_size``: the run's ``test_size``), which the verdict's
        measurement s.e. of the OOD accuracy needs, to the run's ``summary.json``."""
        if "ood_size" in summary:
            return summary
        rd = RunDir(path)
        rd.write_json("summary.json", {**rd.read_json("summary.json"),
                                       "ood_size": run.config.test_size})
        return {**summary, "ood_size": run.config.test_size}

    def verdict(self, summaries: list[dict[str, Any]]) -> dict[str, Any]:
        return sparse_frequent_verdict(summaries)


def _finite(x: Any) -> bool:
    """Whether ``x`` is a finite number (not None, NaN or ±inf)."""
    return isinstance(x, int | float) and not isinstance(x, bool) and math.isfinite(x)


def _lower(sparse: Any, frequent: Any) -> str | None:
    """``"sparse"`` or ``"frequent"``, whichever value is lower, ``"tie"`` when they are equal,
    None when either is not a finite number."""
    if not (_finite(sparse) and _finite(frequent)):
        return None
    return "tie" if sparse == frequent else "sparse" if sparse < frequent else "frequent"


def sparse_frequent_verdict(summaries: list[dict[str, Any]]) -> dict[str, Any]:
    """Four parts, each the mean over the case's runs (its settings and seed replicates) with
    Student's t over runs, positive when the run follows its low-sensitivity feature, Holm over
    the four: case 1 ``0.5 − OOD acc`` and ``align sparse − align frequent``; case 2 ``OOD acc −
    0.9`` and ``align frequent − align sparse``. "not comparable" if a run has a final number
    the verdict reads (:data:`FINITE`) that is not finite (named), an OOD accuracy outside
    [0, 1], did not train (train acc < 0.95), a setting's designed feature is not the less
    sensitive one (equally sensitive solutions are a tie, neither feature: until 2026-12-07 a
    tie counted as "frequent"), or a case has no runs. In the evidence, ``relies_on`` is the
    feature v aligns with more (``"tie"`` when equally)."""
    evidence: dict[str, Any] = {}
    problems = []
    for s in summaries:
        f, case = s["final"], s["case"]
        # None where a number is not finite: a null read back from a reused run's summary.json
        # failed the comparison with a raw TypeError before the finiteness check below
        # a tie is "tie", neither feature: "x < y else frequent" made the frequent solution the
        # less sensitive one when the two were equally sensitive, so a case-2 run passed its
        # design check on a setting that does not separate the features
        low = _lower(f["solution/sparse"], f["solution/frequent"])
        relies = _lower(-f["align/sparse"] if _finite(f["align/sparse"]) else None,
                        -f["align/frequent"] if _finite(f["align/frequent"]) else None)
        evidence[s["name"]] = {
            "train_acc": f["train/acc"], "ood_acc": f["ood/acc"],
            "align_sparse": f["align/sparse"], "align_frequent": f["align/frequent"],
            "attn_sparse": f["attn/sparse"], "attn_frequent": f["attn/frequent"],
            "sens_model": f["sens/train"], "sens_sparse_solution": f["solution/sparse"],
            "sens_frequent_solution": f["solution/frequent"], "low_sensitivity_feature": low,
            "relies_on": relies,
        }
        # first: a NaN train accuracy passed the "did not train" check (NaN < 0.95 is False),
        # and a NaN solution sensitivity made "frequent" the less sensitive feature (NaN < x is
        # False), so a case-2 run passed its design check and a case-1 run was misdescribed
        bad = [k for k in FINITE if not _finite(f[k])]
        if bad:
            problems.append(f"{s['name']}: {', '.join(bad)} not a finite number")
        elif not 0 <= f["ood/acc"] <= 1:  # its measurement s.e. √(p(1 − p) + 1/n) needs it
            problems.append(f"{s['name']}: OOD accuracy {f['ood/acc']} is not in [0, 1]")
        elif f["train/acc"] < MIN_TRAIN_ACC:
            problems.append(f"{s['name']} reached train acc {f['train/acc']:.3f} only")
        elif low == "tie":
            problems.append(f"{s['name']}: the sparse and frequent solutions are equally "
                            f"sensitive ({f['solution/sparse']:g}), so neither is the less "
                            f"sensitive one the case is built for ({EXPECTED_FEATURE[case]}); "
                            "check the setting's parameters (SPARSE_FREQUENT_SETTINGS)")
        elif low != EXPECTED_FEATURE[case]:
            problems.append(f"{s['name']}: the {low} solution is the less sensitive one, not "
                            f"the {EXPECTED_FEATURE[case]} one the case is built for")
    old = [s["name"] for s in summaries if not isinstance(s.get("ood_size"), int)]
    if old:
        problems.append(f"no OOD set size in the summaries of {old} (written before 2026-11-30): "
                        "run the experiment again on its directory (finished runs are reused)")
    cases = {s["case"] for s in summaries}
    if cases != {1, 2}:
        problems.append(f"needs runs of both cases, got case(s) {sorted(cases)}")
    if problems:
        return not_comparable("; ".join(problems), evidence)
    by_case = {c: [s["final"] for s in summaries if s["case"] == c] for c in (1, 2)}
    ood_se = {c: [accuracy_se(s["final"]["ood/acc"], s["ood_size"]) for s in summaries
                  if s["case"] == c] for c in (1, 2)}
    parts = {
        "case 1 OOD collapses": over_seeds(
            [OOD_COLLAPSED - f["ood/acc"] for f in by_case[1]], ood_se[1],
            what=f"{OOD_COLLAPSED} − case-1 OOD acc", unit="run"),
        "case 1 aligns with sparse": over_seeds(
            [f["align/sparse"] - f["align/frequent"] for f in by_case[1]],
            what="case-1 align sparse − align frequent", unit="run"),
        "case 2 OOD kept": over_seeds(
            [f["ood/acc"] - OOD_KEPT for f in by_case[2]], ood_se[2],
            what=f"case-2 OOD acc − {OOD_KEPT}", unit="run"),
        "case 2 aligns with frequent": over_seeds(
            [f["align/frequent"] - f["align/sparse"] for f in by_case[2]],
            what="case-2 align frequent − align sparse", unit="run"),
    }
    detail = "; ".join(
        f"{n}: OOD {e['ood_acc']:.2f}, align S/F {e['align_sparse']:.2f}/"
        f"{e['align_frequent']:.2f}" for n, e in evidence.items())
    return verdict(parts, claim="each run relies on its low-sensitivity feature (case 1: sparse, "
                                "OOD collapses; case 2: frequent, OOD stays high), mean over "
                                f"{len(by_case[1])} and {len(by_case[2])} runs",
                   evidence=evidence, note=f"Runs: {detail}")
