"""Hahn & Rofin (4): how a transformer completes a random function it has only partly seen.

Claim (docs/definitions.md#hr_random_functions): train on k of the 1,024 strings of {±1}¹⁰ labelled
by a uniformly random function (k = 128, 256, 512). The completion the transformer picks for the
unseen strings has a lower average sensitivity as(f̂) than a random completion of the same labels
(as ≈ n/2 = 5), and a transformer fitted to such a random completion (all 1,024 strings) is sharper
on the k shared training strings than the one that chose its own completion.

Command: ``senslab run hr_random_functions`` (``--scale paper`` on a GPU).

Per (k, seed): the ``boolean`` dataset's "subset" split (k training strings of a random table,
function seed = seed) → run ``learned-k…``: training on the k strings; as(f̂) of its thresholded
truth table, exact. The random completion keeps the k labels and draws the other 1,024 − k from
a seeded generator; its as is exact. Run ``random-k…``: the same model and optimiser trained on
all 1,024 strings of the random completion. Sharpness (×4, σ = 0.02, positional embeddings
excluded) of both models on the k common training strings.

Settings. Paper (the authors' first-step sweeps and config): n = 10, k ∈ {128, 256, 512}, 100
seeds per k, d = 128, PyTorch's encoder initialisation, AdamW lr 3e-4, wd 0.1, 10,000 steps of
1,024 strings drawn with replacement from the training set (``subset_batch``), no early stop,
sharpness on the k strings from 100 weight draws, fitted = training accuracy > 0.99 and training
loss < 0.001. CPU scale: n = 8 with the same fractions of the cube, k ∈ {32, 64, 128} of 256
strings (on 2 cores a full-batch step on all 1,024 strings of n = 10 is too slow to fit a random
table), a narrower model d = 64 (FF 64, 2 layers, 2 heads, post-LN), AdamW lr 3e-3 (wd 0.1), at
most 2,000 full-batch steps, stopping at the first evaluation with training loss < 0.01, 2 seeds
per k, 20 weight draws, fitted = training accuracy > 0.99.
A random completion of n = 8 has as ≈ n/2 = 4. Subset training uses neither ``batch`` nor
``eval_size``: a ``--set`` of either is warned (it would be recorded in every run's config
and change nothing); ``function``, ``train_size``, ``function_seed`` and ``completion`` are
set per run from the settings, and a ``--set`` that changes them is refused
(:class:`~senslab.experiments.hahn_rofin._common.BooleanExperiment`). A ``stop_loss`` above
``converged_loss`` is refused: runs stopped between the two would count as not fitted.

Verdict (:mod:`senslab.verdicts`), over the (k, seed) pairs whose two models both fit their
training labels (the trainer's ``converged``, docs/definitions.md#hahn-and-rofin-setup): two
parts, Holm-corrected: ``random_as − learned_as`` (the random completion's exact as minus the
learned completion's; positive = the transformer's completion is less sensitive) and
``random_sharpness − learned_sharpness`` (on the k shared strings, with the sharpness estimates'
standard errors as the measurement part; positive = the learned model is flatter). "not
comparable" when no pair fitted. The reason names the pairs left out (not fitted, or lacking a
run) and every value that is not finite, by run, measure and step (a NaN makes its part "cannot
be judged").

The unit of replication is the **seed**, not the (k, seed) pair: the runs of one seed share the
hidden random table (``function_seed = seed``), the model initialisation, nested training
subsets (the k = 32 strings lie inside the k = 64 ones, ...) and the random completion outside
them, so the pairs of one seed are one table seen through several windows, not independent
replicates. Each part is therefore the mean over seeds of the seed's mean difference over its
fitted k values, with Student's t on seeds − 1 degrees of freedom (the sharpness part's
measurement error of a seed is that of its mean over k). Correction of 2026-11-30: the rule
first treated every (k, seed) pair as an independent replicate (Student's t on pairs − 1
degrees of freedom), which overstated the evidence (pseudo-replication); the committed CPU
record was re-judged from its per-pair numbers with this rule (``rejudged`` in
reproduction/hr_random_functions.json).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ...measure import boolean_sensitivity
from ...train.config import ranged
from ...train.loops.boolean import CONVERGED_ACC, subset_data
from ...verdicts import not_comparable, over_seeds, verdict
from .._verdicts import listed
from ..base import Run, register_experiment
from ._common import BooleanExperiment, Setup, boolean_run

N_BITS = 10


@dataclass
class RandomSettings(Setup):
    train_sizes: tuple[int, ...] = ranged((128, 256, 512), ge=1)
    seeds: int = ranged(5, ge=1)
    n: int = ranged(N_BITS, ge=1)
    stop_loss: float | None = ranged(0.01, ge=0)  # None: train all ``steps``


SCALES = {
    "cpu": RandomSettings(dim=64, steps=2000, lr=3e-3, eval_every=100, seeds=2, n=8,
                          train_sizes=(32, 64, 128)),
    "paper": RandomSettings(eval_every=100, seeds=100, sharp_draws=100, subset_batch=1024,
                            stop_loss=None, init="torch_encoder", converged_loss=1e-3),
}


@register_experiment("hr_random_functions")
class RandomFunctions(BooleanExperiment):
    paper = "Hahn & Rofin, Why are Sensitive Functions Hard for Transformers? (2024), §5"
    claim = ("Trained on part of a random function on n = 10, a transformer completes it with "
             "lower average sensitivity and lower sharpness than a random completion of the "
             "same labels.")
    cpu_scale_note = (
        "n = 8 instead of 10 with the same fractions of the cube (k ∈ {32, 64, 128} of 256 "
        "strings), d = 64, AdamW lr 3e-3"
    )

    scales = SCALES
    seed_aware = True  # the verdict judges every run, seed replicates included
    fixed = {
        "function": ("the claim is about uniformly random functions (function=random), and the "
                     "verdict compares with a random completion of their labels; subset "
                     "training of another function is a run of your own with `senslab train`"),
        "train_size": "set it through train_sizes (the runs are named by it: -k…)",
        "function_seed": ("each seed's hidden table and training subset is function_seed = "
                          "seed: set it through seeds"),
        "completion": "each (k, seed) pair has one run of each completion"}
    unused = {
        "batch": ("subset training fits the k strings full batch (or subset_batch strings drawn "
                  "from them per step): set subset_batch"),
        "eval_size": ("loss, sharpness and blow-up are measured on the k training strings, "
                      "held-out accuracy on all the others: no eval_size is drawn")}

    def runs(self, s: RandomSettings) -> list[Run]:
        if not s.train_sizes:  # trained nothing, recorded as "no (k, seed) pair ... fit"
            raise ValueError("train_sizes is empty: the runs are one pair per training-set size "
                             "k and seed; give at least one k below 2^n, e.g. --set "
                             "train_sizes=[32,64,128]")
        if s.stop_loss is not None and s.converged_loss is not None \
                and s.stop_loss > s.converged_loss:
            # the runs stopped between the two (training accuracy 1.0, loss 0.007) were left out
            # as "did not fit", and with them every pair: "not comparable"
            raise ValueError(
                f"stop_loss={s.stop_loss:g} stops each run at the first evaluation with a "
                f"training loss below {s.stop_loss:g}, but converged_loss={s.converged_loss:g} "
                f"counts a run as fitted only with a final training loss below "
                f"{s.converged_loss:g}: the runs stopped between the two would be left out as "
                f"not fitted; give stop_loss at most converged_loss (e.g. --set "
                f"stop_loss={s.converged_loss:g}) or stop_loss=none (train all steps)")
        return [boolean_run(f"{kind}-k{k}-s{seed}", s, info={"train_size": k},
                            label=f"{kind} k={k}", function="random", n=s.n, seed=seed,
                            stop_below=s.stop_loss, train_size=k, function_seed=seed,
                            completion=kind)
                for k in s.train_sizes for seed in range(s.seeds)
                for kind in ("learned", "random")]

    def after_run(self, run: Run, path: Path, summary: dict[str, Any], settings: RandomSettings,
                  log: Callable[[str], None]) -> dict[str, Any]:
        """The average sensitivity of the random completion the ``random-…`` run trains on."""
        completed = subset_data(run.config).completed
        sens = boolean_sensitivity(completed * 2 - 1, method="exact").average
        return {**summary, "random_completion_sens": sens}

    def verdict(self, summaries: list[dict[str, Any]]) -> dict[str, Any]:
        return completion_verdict(summaries)


#: what :func:`completion_verdict` reads for a summary without ``sharpness/loss_se``
_NO_SE = object()


def _nan_if_null(value: Any) -> Any:
    """A final value as the verdict reads it: a null (a number not finite when summary.json was
    written, :meth:`~senslab.train.rundir.RunDir.write_json`) as NaN, "cannot be judged" as a
    fresh run's NaN, never a TypeError; :data:`_NO_SE` (no value) as None."""
    return None if value is _NO_SE else math.nan if value is None else value


def _fitted(summary: dict[str, Any]) -> bool:
    """Training accuracy > 0.99 and the trainer's ``converged`` (which adds the loss bound of a
    scale that sets ``converged_loss``)."""
    acc = summary["final"]["train/acc"]  # null: not finite when written, never fitted
    return acc is not None and acc > CONVERGED_ACC and summary.get("converged", True)


def completion_verdict(summaries: list[dict[str, Any]]) -> dict[str, Any]:
    by_pair: dict[tuple[int, int], dict[str, dict[str, Any]]] = {}
    for s in summaries:
        kind = s["name"].split("-", 1)[0]
        pair = by_pair.setdefault((s["train_size"], s["seed"]), {})
        if kind in pair:  # the later run replaced the earlier one without a word
            raise ValueError(f"two {kind} runs for k={s['train_size']} seed {s['seed']} "
                             f"({pair[kind]['name']} and {s['name']}): each (k, seed) pair is "
                             "one learned and one random run; judge one run directory per "
                             "(k, seed) and completion (remove or rename the other)")
        pair[kind] = s
    rows = []
    left_out: list[str] = []  # the pairs the parts do not rest on, and why
    for (k, seed), pair in sorted(by_pair.items()):
        lacking = sorted({"learned", "random"} - set(pair))
        if lacking:
            left_out.append(f"k={k} seed {seed} (no {' or '.join(lacking)} run)")
            continue
        unfit = [pair[kind]["name"] for kind in ("learned", "random") if not _fitted(pair[kind])]
        if unfit:
            left_out.append(f"k={k} seed {seed} ({' and '.join(unfit)} did not fit)")
            continue
        lf, rf = pair["learned"]["final"], pair["random"]["final"]
        rows.append({"k": k, "seed": seed, "learned_as": _nan_if_null(lf["bool_sens"]),
                     "random_as": _nan_if_null(pair["learned"]["random_completion_sens"]),
                     "random_model_as": _nan_if_null(rf["bool_sens"]),
                     "learned_sharpness": _nan_if_null(lf["sharpness/loss"]),
                     "random_sharpness": _nan_if_null(rf["sharpness/loss"]),
                     # absent (an older run): no standard error; null: not finite
                     "learned_sharpness_se": _nan_if_null(lf.get("sharpness/loss_se", _NO_SE)),
                     "random_sharpness_se": _nan_if_null(rf.get("sharpness/loss_se", _NO_SE))})
    evidence: dict[str, Any] = {"pairs": rows, "total_pairs": len(by_pair)}
    if left_out:
        evidence["left_out"] = left_out
    if not rows:  # the pairs named, as the module docstring says (they were in evidence only)
        return not_comparable("no (k, seed) pair where both models fit their training labels "
                              "(the trainer's converged: training accuracy > 0.99, and the loss "
                              f"bound where the scale sets one): {listed(left_out)}", evidence)
    steps = {s["name"]: s["final"].get("step") for s in summaries if "name" in s}
    return judge_pairs(rows, evidence, steps=steps, left_out=left_out)


#: the run and final measure behind each value of a fitted pair (``None``: the learned run's
#: record of its random completion, exact, no evaluation step), and the part it enters
SOURCES = {"learned_as": ("learned", "bool_sens", "as"),
           "random_as": ("learned", "random_completion_sens", "as"),
           "learned_sharpness": ("learned", "sharpness/loss", "sharpness"),
           "random_sharpness": ("random", "sharpness/loss", "sharpness"),
           "learned_sharpness_se": ("learned", "sharpness/loss_se", "sharpness"),
           "random_sharpness_se": ("random", "sharpness/loss_se", "sharpness")}


def _not_finite(rows: list[dict[str, Any]], steps: dict[str, Any],
                with_se: bool) -> dict[str, list[str]]:
    """``{"value" | "se": ["<run> (<measure> = nan at its final evaluation, step s; part p)"]}``:
    the values of the fitted pairs that are not finite, named by run, measure and step;
    ``with_se``: the sharpness part uses the measurement errors (every pair has them)."""
    out: dict[str, list[str]] = {}
    for r in rows:
        for field, (kind, key, part) in SOURCES.items():
            if field.endswith("_se") and not with_se:
                continue
            v = r.get(field)
            if v is None or math.isfinite(float(v)):
                continue  # None: no measurement error given (the part says so itself)
            run = f"{kind}-k{r['k']}-s{r['seed']}"
            step = steps.get(run)
            where = ("" if key == "random_completion_sens"
                     else f" at its final evaluation{f', step {step}' if step is not None else ''}")
            out.setdefault("se" if field.endswith("_se") else "value", []).append(
                f"{run} ({key} = {v}{where}; part {part})")
    return out


def judge_pairs(rows: list[dict[str, Any]], evidence: dict[str, Any] | None = None,
                steps: dict[str, Any] | None = None, left_out: list[str] | None = None
                ) -> dict[str, Any]:
    """The verdict from the fitted pairs (``k``, ``seed``, ``learned_as``, ``random_as``,
    ``learned_sharpness``, ``random_sharpness`` and optionally the sharpness standard errors
    ``learned_sharpness_se``/``random_sharpness_se``): each difference averaged over the k values
    of a seed first, then Student's t over the seeds (the seed is the unit of replication: its
    pairs share the table, the initialisation and nested training subsets).

    The words name the pairs ``left_out`` (not fitted, or lacking a run) and every value that is
    not finite, by run (``learned-k…-s…``/``random-k…-s…``), measure and the step of its final
    evaluation (``steps``: run name → step): a NaN value makes its part "cannot be judged (the
    value is not finite)", which alone does not say where it came from."""
    evidence = dict(evidence or {})
    lower_as = sum(r["learned_as"] < r["random_as"] for r in rows)
    flatter = sum(r["learned_sharpness"] < r["random_sharpness"] for r in rows)
    by_seed: dict[int, list[dict[str, Any]]] = {}
    for r in rows:
        by_seed.setdefault(r["seed"], []).append(r)
    seeds = sorted(by_seed)
    has_se = all(r.get(f"{kind}_sharpness_se") is not None
                 for r in rows for kind in ("learned", "random"))
    per_seed = []
    for seed in seeds:
        mine = by_seed[seed]
        m = len(mine)
        entry = {"seed": seed, "k": [r["k"] for r in mine],
                 "as_diff": sum(r["random_as"] - r["learned_as"] for r in mine) / m,
                 "sharpness_diff": sum(r["random_sharpness"] - r["learned_sharpness"]
                                       for r in mine) / m}
        if has_se:  # the measurement error of the seed's mean over its k values
            entry["sharpness_diff_se"] = math.sqrt(sum(
                r["learned_sharpness_se"] ** 2 + r["random_sharpness_se"] ** 2
                for r in mine)) / m
        per_seed.append(entry)
    evidence.update(lower_as=lower_as, flatter=flatter, seeds=per_seed)
    parts = {  # as is exact: its seeds differ by seed-to-seed variation only
        "as": over_seeds([e["as_diff"] for e in per_seed], what="random_as − learned_as",
                         unit="seed"),
        "sharpness": over_seeds([e["sharpness_diff"] for e in per_seed],
                                [e["sharpness_diff_se"] for e in per_seed] if has_se else None,
                                "random_sharpness − learned_sharpness", unit="seed"),
    }
    detail = "; ".join(
        f"k={r['k']} s{r['seed']}: as {r['learned_as']:.2f} vs {r['random_as']:.2f}, sharpness "
        f"{r['learned_sharpness']:.3g} vs {r['random_sharpness']:.3g}" for r in rows)
    note = (f"Learned completion lower as in {lower_as}/{len(rows)} pairs, flatter in "
            f"{flatter}/{len(rows)}: {detail}")
    bad = _not_finite(rows, steps or {}, has_se)
    if bad.get("value"):
        note += ". Not finite, so the part it enters cannot be judged: " + listed(bad["value"])
    if bad.get("se"):
        note += (". A measurement error not finite (NaN: unknown, the part's standard error "
                 "rests on the spread and the other errors; inf: no standard error): "
                 + listed(bad["se"]))
    if bad:
        evidence["not_finite"] = bad
    if left_out:
        note += f". Left out, not fitted: {listed(left_out)}"
    return verdict(parts, evidence=evidence,
                   claim=f"over {len(seeds)} seed{'s' if len(seeds) != 1 else ''} ({len(rows)} "
                         "fitted (k, seed) pairs; each seed's differences averaged over its k "
                         "first, as its pairs share one table and initialisation), the learned "
                         "completion is less sensitive and flatter than a random one",
                   note=note)
