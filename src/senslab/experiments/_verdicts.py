"""Verdicts shared by experiments of more than one paper package (and by ``demo``).

A verdict that only one paper's experiments use lives in that package's shared module
(``lowsens/_vision.py``, ``implicit_bias/_common.py`` ...); one used across packages lives here,
so that no experiment module imports another.

The pieces of a sensitivity comparison between models trained with several seeds
(docs/definitions.md#effects-over-seeds): the runs grouped by label and seed
(:func:`by_label`); the precondition (:func:`precondition`: every model has the same seeds,
finite final numbers, and seed-mean train accuracies within a gap); one part per pair of models,
``high − low`` paired by seed (:func:`lower_parts`); the evidence per model, seed by seed
(:func:`sensitivity_evidence`); and the claim "``winner`` has the lowest sensitivity"
(:func:`lowest_sensitivity_verdict`).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from ..verdicts import Effect, not_comparable, over_seeds, paired_by_seed, verdict

#: the runs of one model: ``{seed: summary}``
Runs = dict[int, dict[str, Any]]
#: run facts copied seed by seed into the evidence, where a summary has them
RUN_FACTS = ("name", "epochs", "stopped")
#: an accuracy gap within this relative distance of ``max_acc_gap`` is at it (the rounding of seed
#: means: 0.85 − 0.82 is 0.030000000000000027 in floating point)
GAP_ROUNDING = 1e-9


def accuracy_se(p: float, n: int) -> float:
    r"""The measurement standard error of an accuracy (or any share) ``p`` of ``n`` items,
    :math:`\sqrt{(p(1-p) + 1/n)/n}`: the binomial s.e. with one item's worth, :math:`1/n`,
    added to the variance, so it is :math:`1/n`, not 0, at p = 0 or 1. Seeds that all score
    1.000 on 1,000 examples do not make the mean exact: with s.e. 0 their tie would "support"
    any threshold below it at a zero-width interval. Passed to
    :func:`~senslab.verdicts.over_seeds` as ``measure_ses``, it floors the s.e. of the mean.
    (Chosen over a Wilson half-width for being closed-form and monotone in n; both are ≈ 1/n
    at the ends and the binomial s.e. inside.)"""
    if not n >= 1:
        raise ValueError(f"accuracy_se: need at least one item, got n = {n}")
    if not 0.0 <= p <= 1.0:
        raise ValueError(f"accuracy_se: p = {p} is no share of items (it must lie in [0, 1])")
    return math.sqrt((p * (1 - p) + 1 / n) / n)


def by_label(summaries: Iterable[dict[str, Any]]) -> dict[str, Runs]:
    """``{label: {seed: summary}}`` in the order the labels first appear; a summary without
    ``seed`` is seed 0."""
    out: dict[str, Runs] = {}
    for s in summaries:
        seeds = out.setdefault(s["label"], {})
        seed = int(s.get("seed", 0))
        if seed in seeds:
            raise ValueError(f"two runs of {s['label']!r} have seed {seed}")
        seeds[seed] = s
    return out


def final(runs: Runs, key: str) -> dict[int, float]:
    """``{seed: summary["final"][key]}`` (NaN where it is missing or not a number)."""
    out = {}
    for seed, s in runs.items():
        v = s.get("final", {}).get(key)
        out[seed] = float(v) if isinstance(v, int | float) else math.nan
    return out


def mean(values: Iterable[float]) -> float:
    vals = list(values)
    return sum(vals) / len(vals) if vals else math.nan


def acc_gap(groups: Mapping[str, Runs], labels: Iterable[str], key: str = "train/acc"
            ) -> float:
    """The largest difference between the models' seed-mean train accuracies (NaN when one is
    not finite)."""
    accs = [mean(final(groups[k], key).values()) for k in labels]
    if not all(math.isfinite(a) for a in accs):
        return math.nan
    return max(accs) - min(accs)


def precondition(groups: Mapping[str, Runs], labels: list[str], max_acc_gap: float | None,
                 keys: tuple[str, ...] = ("sens/train", "sens/train_se", "train/acc")
                 ) -> str | None:
    """Why ``labels`` cannot be compared, or None: a model without runs, models with different
    seeds, a final number in ``keys`` that is missing or not finite, or seed-mean train
    accuracies further apart than ``max_acc_gap`` (None: no accuracy precondition; a gap equal to
    it up to rounding, :data:`GAP_ROUNDING`, is within it)."""
    missing = [k for k in labels if k not in groups]
    if missing:
        return f"no runs of {', '.join(missing)} (got {', '.join(groups) or 'none'})"
    seeds = {k: sorted(groups[k]) for k in labels}
    if len({tuple(v) for v in seeds.values()}) > 1:
        return "the models have different seeds: " + "; ".join(
            f"{k} {v}" for k, v in seeds.items())
    bad = [f"{groups[k][s].get('name', k)}: {key}" for k in labels for key in keys
           for s, v in final(groups[k], key).items() if not math.isfinite(v)]
    if bad:
        return "a run has no finite final number (σ = 0?): " + ", ".join(bad)
    if max_acc_gap is None:
        return None
    gap = acc_gap(groups, labels)
    if not (gap <= max_acc_gap or math.isclose(gap, max_acc_gap, rel_tol=GAP_ROUNDING)):
        return f"seed-mean train accuracies differ by {gap:.3f} (> {max_acc_gap})"
    return None


def sens_by_seed(runs: Runs, key: str = "sens/train") -> dict[int, tuple[float, float]]:
    """``{seed: (final sensitivity, its measurement standard error)}``."""
    values, ses = final(runs, key), final(runs, f"{key}_se")
    return {seed: (values[seed], ses[seed]) for seed in runs}


def lower_parts(groups: Mapping[str, Runs], low: list[str], high: list[str]
                ) -> dict[str, Effect]:
    """One part per pair: ``high − low`` final sensitivity paired by seed (positive: ``low`` is
    less sensitive, the claimed direction), named ``"high − low"``."""
    parts = {}
    for h in high:
        for lo in low:
            name = f"{h} − {lo}"
            parts[name] = paired_by_seed(sens_by_seed(groups[lo]), sens_by_seed(groups[h]), name)
    return parts


def model_evidence(runs: Runs) -> dict[str, Any]:
    """One model's numbers: the seed means of train accuracy and sensitivity, the standard error
    of the mean sensitivity (over seeds; the measurement's with one seed), and every seed's."""
    sens = sens_by_seed(runs)
    acc = final(runs, "train/acc")
    mean_sens = over_seeds([v for v, _ in sens.values()], [se for _, se in sens.values()])
    return {"train_acc": mean(acc.values()), "sensitivity": mean_sens.value,
            "stderr": mean_sens.se,
            "seeds": {str(seed): {"train_acc": acc[seed], "sensitivity": sens[seed][0],
                                  "stderr": sens[seed][1],
                                  **{k: runs[seed][k] for k in RUN_FACTS if k in runs[seed]}}
                      for seed in sorted(runs)}}


def sensitivity_evidence(groups: Mapping[str, Runs]) -> dict[str, Any]:
    """:func:`model_evidence` per label, the gap of the seed-mean train accuracies and the
    largest gap within each seed."""
    ev: dict[str, Any] = {k: model_evidence(v) for k, v in groups.items()}
    ev["train_acc_gap"] = acc_gap(groups, groups)
    seeds = sorted({s for v in groups.values() for s in v})
    per_seed = {}
    for s in seeds:
        accs = [final(v, "train/acc")[s] for v in groups.values() if s in v]
        per_seed[str(s)] = max(accs) - min(accs) if all(map(math.isfinite, accs)) else math.nan
    ev["train_acc_gap_per_seed"] = per_seed
    return ev


def values_note(evidence: Mapping[str, Any], labels: Iterable[str]) -> str:
    """"Sensitivity (mean over 3 seeds): vit_small 0.01 ± 0.0031 (train acc 0.816), ...": three
    significant digits, two for the standard error (four decimals wrote a fully trained model's
    3e-05 ± 2e-06 as "0.0000 ± 0.0000", next to a part whose effect was 5e-05)."""
    labels = list(labels)
    n = len(evidence[labels[0]]["seeds"])
    return f"Sensitivity (mean over {n} seed{'s' if n != 1 else ''}): " + ", ".join(
        f"{k} {evidence[k]['sensitivity']:.3g} ± {evidence[k]['stderr']:.2g} (train acc "
        f"{evidence[k]['train_acc']:.3f})" for k in labels)


def lowest_sensitivity_verdict(summaries: list[dict[str, Any]], winner: str,
                               max_acc_gap: float = 0.03) -> dict[str, Any]:
    """"``winner`` has the lowest final sensitivity": one part per other model, ``other −
    winner`` paired by seed, all parts judged together (Holm). Not comparable without ``winner``
    or another model, with different seeds per model, a non-finite final number, or seed-mean
    train accuracies further apart than ``max_acc_gap``."""
    groups = by_label(summaries)
    others = [k for k in groups if k != winner]
    if winner not in groups or not others:
        return not_comparable(f"need {winner} and at least one other model; got "
                              f"{', '.join(groups) or 'none'}")
    evidence = sensitivity_evidence(groups)
    why = precondition(groups, list(groups), max_acc_gap)
    if why is not None:
        return not_comparable(why, evidence)
    return verdict(lower_parts(groups, [winner], others),
                   claim=f"{winner} has the lowest sensitivity", evidence=evidence,
                   note=values_note(evidence, groups))


def budget_stops(summaries: list[dict[str, Any]]) -> tuple[str, dict[str, dict[str, Any]]]:
    """The runs that stopped on their epoch budget (``stopped`` is ``"budget"``), not at a
    train-accuracy target: words for the end of the reason (``""`` when none did) and, by run
    name, their final train accuracy and epochs for the evidence.

    An accuracy-gap precondition compares seed means only: models that all ran out of epochs
    far from the target (near chance, say) pass it, and a barely trained model is trivially
    insensitive; robustness's part (a) has no train-accuracy precondition at all (a CNN that
    ran out of epochs near chance loses on every corruption). The rules stay as they are; the
    reason names such runs with their train accuracy. When no run stopped at a target the words
    cannot tell a target that no run reached from no target at all (the paper scale sets none),
    and say so."""
    # without a run name, label and seed: the label alone would merge the seeds into one entry
    short = {s.get("name") or f"{s['label']}/seed {s.get('seed', 0)}": {
        "train_acc": s.get("final", {}).get("train/acc"), "epochs": s.get("epochs")}
        for s in summaries if s.get("stopped") == "budget"}
    if not short:
        return "", {}

    def acc(v: Any) -> str:
        return f"{v:.3f}" if isinstance(v, int | float) else "not recorded"

    runs = ", ".join(f"{name} (train acc {acc(r['train_acc'])})" for name, r in short.items())
    if any(s.get("stopped") == "target_train_acc" for s in summaries):
        return f" (did not reach the train-accuracy target within the epoch budget: {runs})", short
    return (f" (stopped on the epoch budget, and no run at a train-accuracy target: none was "
            f"set, or none reached it: {runs})"), short


#: at most this many run names in a verdict's words (all of them are in its evidence)
SHOWN = 10


def listed(names: Sequence[str], limit: int = SHOWN) -> str:
    """``names`` joined by commas, the first ``limit`` of them and "… and k more" after (the
    paper scales have hundreds of runs; the evidence lists every one)."""
    shown = ", ".join(names[:limit])
    return shown + (f" … and {len(names) - limit} more" if len(names) > limit else "")


def final_value(summary: dict[str, Any], key: str, name: str | None = None) -> str:
    """``"<run> (<key> = nan at its final evaluation, step 1500)"``: a run's final ``key`` in
    words, for a verdict that names the run whose value it cannot judge."""
    step = summary.get("final", {}).get("step")
    where = f", step {step}" if step is not None else ""
    value = summary["final"][key]
    # records hold NaN and inf as null: a summary read back gives None, shown as what it was
    shown = "null (NaN or inf when recorded)" if value is None else value
    return (f"{name or summary.get('name', '?')} ({key} = {shown} at its final "
            f"evaluation{where})")
