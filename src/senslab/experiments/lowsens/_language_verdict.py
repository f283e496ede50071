"""The verdict of the language experiments (``language.py``): one judged claim per claim of the
paper's §6 / A.4, computed from the run summaries alone, and an overall verdict on the main claim.

A summary is what ``language.finish_run`` writes: ``final`` has ``sens_end/train``,
``sens_end/val`` (σ² = 15, end of training), ``sens_alt/*`` (σ² = 4), ``sens_init/train``
(untrained weights), ``recency/*`` and ``sens_first/*``, all with standard errors over examples,
and ``train/acc``; :func:`numbers` falls back to the tracked ``sens/*`` and the step-0 record for
summaries without them. ``language.label_counts.train`` (each label's count among the
examples ``train/acc`` is measured on), where a run records it, gives its majority-class rate,
and a run whose train accuracy is at that rate is named in the reason (:func:`at_majority`).
``seed`` (from the run's info) pairs the models: seed k of every model
was trained on the same data subset and measured on the same examples with the same noise seed.
The at-init claim (``below_lstm_at_init``) is "not comparable" when replicates of a model share
untrained inits (:func:`shared_inits`: runs measured before 2026-11-30, whose seeds k and k + 1
shared 4 of their 5 inits, so the values over seeds were not independent replicates).

Every claim is a set of parts (:mod:`senslab.verdicts`), each an effect positive in the claimed
direction: "A below B" is B − A paired by seed (Student's t over seeds, the measurement standard
errors reported beside it); a rise towards the end is the late − early flip-rate difference; a
flat profile is :data:`RISE_RATIO` − (late/early ratio), positive when the ratio stays below the
rise threshold (flatness cannot be supported by a test against zero, so it is tested against
that margin). Several parts: Holm. The main claim decides the verdict; the others are judged
separately in ``evidence["claims"]``.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from ...verdicts import (
    NOT_COMPARABLE,
    Effect,
    not_comparable,
    over_seeds,
    paired_by_seed,
    verdict,
)
from .._verdicts import GAP_ROUNDING

#: final train accuracies (of the models of one seed) further apart than this make the
#: comparison "not comparable"
MAX_ACC_GAP = 0.05
#: an encoder is "flat" when its late/early flip-rate ratio is below this (part
#: ``RISE_RATIO − ratio``); the LSTM "rises" when late − early > 0
RISE_RATIO = 1.5
#: below this every model counts as insensitive (no flips to compare)
INSENSITIVE = 1e-3
#: a run whose train accuracy is within this of its training set's majority-class rate is named
#: in the reason (words only: the rule does not change)
MAJORITY_MARGIN = 0.01
ENCODERS = ("roberta", "roberta_relu")
#: the main claim's number: the end-of-training measurement on the larger train subset
MAIN = "sens_end/train"
MAIN_CLAIM = "both RoBERTas below the LSTM (end of training, train subset, σ² = 15)"
#: the main claim's (low, high) pairs: parts ``lstm − roberta`` and ``lstm − roberta_relu``
BELOW = [(m, "lstm") for m in ENCODERS]

Runs = dict[str, dict[int, dict[str, Any]]]  # label → seed → final numbers


def numbers(summary: dict[str, Any]) -> dict[str, Any]:
    """The summary's final numbers, with the end-of-training measurements' fallbacks: a run
    without ``sens_end/*`` (larger end subset) uses the last tracked ``sens/*``, one without
    ``sens_init/train`` the logged step-0 record; a null (a number not finite when written) is
    NaN."""
    f = dict(summary["final"])
    init = summary.get("language", {}).get("init", {})
    for split in ("train", "val"):
        for suffix in ("", "_se"):
            if f"sens/{split}{suffix}" in f:
                f.setdefault(f"sens_end/{split}{suffix}", f[f"sens/{split}{suffix}"])
    for suffix in ("", "_se"):
        if f"sens/train{suffix}" in init:
            f.setdefault(f"sens_init/train{suffix}", init[f"sens/train{suffix}"])
    # a null is a number not finite when summary.json was written (a one-example s.e.): as NaN,
    # the value the verdict got on the first pass. A reused run's summary read back with it
    # failed the whole verdict with a raw TypeError (float(None) in recency())
    return {k: math.nan if v is None else v for k, v in f.items()}


def _get(f: dict[str, Any], key: str) -> tuple[float, float]:
    value, se = f.get(key), f.get(f"{key}_se")
    return (math.nan if value is None else float(value)), (math.nan if se is None else float(se))


def recency(f: dict[str, Any]) -> tuple[float, float, float, float]:
    """(late rate, early rate, late − early, its s.e.) of a run's final model."""
    return (float(f["recency/late"]), float(f["recency/early"]), float(f["recency/diff"]),
            float(f["recency/diff_se"]))


def ratio(f: dict[str, Any]) -> float:
    """The late/early flip-rate ratio (1 when neither window flips, inf when only late does,
    NaN when either rate is not a number: a NaN early rate had read as "no flips" and an
    encoder measured as NaN as flat)."""
    late, early, _, _ = recency(f)
    if not (math.isfinite(late) and math.isfinite(early)):
        return math.nan
    if early > 0:
        return late / early
    return math.inf if late > 0 else 1.0


def _mean(values: list[Any]) -> float | None:
    if not values or any(v is None for v in values):
        return None
    return sum(float(v) for v in values) / len(values)


def _fmt(runs: Runs, model: str, key: str) -> str:
    """``value ± se`` of one seed; the mean and each seed's value of several."""
    per = runs[model]
    if len(per) == 1:
        v, se = _get(next(iter(per.values())), key)
        return f"{v:.4f} ± {se:.4f}"
    vals = [_get(per[s], key)[0] for s in sorted(per)]
    return f"{sum(vals) / len(vals):.4f} (seeds {', '.join(f'{v:.4f}' for v in vals)})"


# --------------------------------------------------------------------------- claims


def _claim(parts: dict[str, Effect], note: str = "") -> dict[str, Any]:
    """One claim judged: ``{"verdict", "detail", "effects", "correction"}``."""
    v = verdict(parts, note=note)
    return {"verdict": v["verdict"], "detail": v["reason"], "effects": v["effects"],
            "correction": v["correction"]}


def _unjudged(detail: str) -> dict[str, Any]:
    return {"verdict": NOT_COMPARABLE, "detail": detail, "effects": {}}


def _unmeasured(runs: Runs, key: str, models: tuple[str, ...]) -> list[str]:
    """The runs (``model/seed``) of ``models`` where ``key`` or its s.e. is missing or not
    finite."""
    return [f"{m}/seed {s}" for m in models for s, f in sorted(runs[m].items())
            if not all(math.isfinite(x) for x in _get(f, key))]


def _paired(runs: Runs, key: str, pairs: list[tuple[str, str]]) -> dict[str, Effect]:
    """Each ``(low, high)``: the part ``high − low`` of ``key``, paired by seed."""
    return {f"{high} − {low}": paired_by_seed(
        {s: _get(f, key) for s, f in runs[low].items()},
        {s: _get(f, key) for s, f in runs[high].items()}, f"{high} − {low} ({key})")
        for low, high in pairs}


def _below(runs: Runs, key: str, pairs: list[tuple[str, str]]) -> dict[str, Any]:
    """The claim that each ``(low, high)`` has ``low``'s ``key`` below ``high``'s."""
    bad = _unmeasured(runs, key, tuple(dict.fromkeys(m for p in pairs for m in p)))
    if bad:
        return _unjudged(f"{key} not measured (or not finite) in {', '.join(bad)}")
    return _claim(_paired(runs, key, pairs))


def _per_seed(runs: Runs, model: str, value: Callable[[dict[str, Any]], float]
              ) -> dict[int, float]:
    return {s: value(f) for s, f in runs[model].items()}


def _recency_claims(runs: Runs) -> dict[str, dict[str, Any]]:
    """The LSTM rises towards the end while the encoders are flat; GPT-2 rises more than the
    encoders."""
    models = tuple(runs)
    if any("recency/late" not in f for m in models for f in runs[m].values()):
        return {"lstm_recency": _unjudged("recency contrast not measured")}
    # the rates and their difference must be numbers (its s.e. may be NaN: one example)
    bad = [f"{m}/seed {s}" for m in models for s, f in sorted(runs[m].items())
           if not all(math.isfinite(x) for x in recency(f)[:3])]
    if bad:
        why = f"recency contrast not measured (or not finite) in {', '.join(bad)}"
        return {"lstm_recency": _unjudged(why), **({"gpt2_recency": _unjudged(why)}
                                                   if "gpt2" in runs else {})}
    ratios = {m: _per_seed(runs, m, ratio) for m in models}
    undefined = [f"{m}/seed {s}" for m in models for s, r in sorted(ratios[m].items())
                 if not math.isfinite(r)]
    ratio_text = "late/early flip-rate ratio " + ", ".join(
        f"{m} " + "/".join(f"{ratios[m][s]:.2f}" for s in sorted(ratios[m])) for m in models)

    def rise(m: str) -> Effect:
        per = runs[m]
        return over_seeds([recency(per[s])[2] for s in sorted(per)],
                          [recency(per[s])[3] for s in sorted(per)], f"{m} late − early")

    if undefined:
        why = (f"late/early ratio undefined (no flips in the first half, some in the last "
               f"quarter) in {', '.join(undefined)}")
        out = {"lstm_recency": _unjudged(why)}
        if "gpt2" in runs:
            out["gpt2_recency"] = _unjudged(why)
        return out
    parts = {"lstm late − early": rise("lstm")}
    for m in ENCODERS:
        vals = [RISE_RATIO - r for _, r in sorted(ratios[m].items())]
        parts[f"{RISE_RATIO:g} − {m} late/early"] = over_seeds(
            vals, what=f"{RISE_RATIO:g} − {m} late/early ratio")
    out = {"lstm_recency": _claim(parts, ratio_text)}
    if "gpt2" in runs:
        parts = {"gpt2 late − early": rise("gpt2")}
        for m in ENCODERS:
            seeds = sorted(set(ratios["gpt2"]) & set(ratios[m]))
            parts[f"gpt2 − {m} late/early"] = over_seeds(
                [ratios["gpt2"][s] - ratios[m][s] for s in seeds],
                what=f"gpt2 − {m} late/early ratio")
        out["gpt2_recency"] = _claim(parts, ratio_text)
    return out


def _cls_bump(runs: Runs) -> dict[str, Any]:
    """Softmax RoBERTa: the flip rate at ``<s>`` above the rate over all tokens."""
    bad = _unmeasured(runs, "sens_first/train", ("roberta",)) + _unmeasured(runs, MAIN,
                                                                            ("roberta",))
    if bad:
        return _unjudged(f"flip rate at <s> not measured (or not finite) in {', '.join(bad)}")
    per = runs["roberta"]
    seeds = sorted(per)
    first = [_get(per[s], "sens_first/train") for s in seeds]
    every = [_get(per[s], MAIN) for s in seeds]
    return _claim({"roberta <s> − all tokens": over_seeds(
        [f - a for (f, _), (a, _) in zip(first, every, strict=True)],
        [math.hypot(fs, as_) for (_, fs), (_, as_) in zip(first, every, strict=True)],
        "roberta flip rate at <s> − over all tokens")})


def shared_inits(summaries: list[dict[str, Any]]) -> str | None:
    """Why the untrained numbers of different replicates are not independent, or None: two
    replicates of a model whose untrained models share an init seed (``language.init_seeds``;
    runs measured before 2026-11-30 used seeds seed … seed + 4)."""
    by: dict[str, list[tuple[int, set[int]]]] = {}
    for s in summaries:
        seeds = s.get("language", {}).get("init_seeds", {}).get("seeds")
        if seeds:
            by.setdefault(s["label"], []).append((int(s.get("seed", 0)), set(seeds)))
    shared = [f"{m} seeds {a} and {b} share inits {sorted(x & y)}"
              for m, reps in by.items() for i, (a, x) in enumerate(reps)
              for b, y in reps[i + 1:] if x & y]
    if not shared:
        return None
    return ("the replicates' untrained models overlap (" + "; ".join(shared[:3])
            + ("; …" if len(shared) > 3 else "") + "): their values are correlated, so Student's "
            "t over seeds does not apply; run the experiment again with the same --out: it "
            "measures the untrained models again with disjoint inits, and keeps the rest")


def claims(runs: Runs, init_overlap: str | None = None) -> dict[str, dict[str, Any]]:
    """Every claim judged on its own (the main one first); ``init_overlap``: why the at-init
    claim cannot be judged (:func:`shared_inits`), or None."""
    out = {"roberta_below_lstm": _below(runs, MAIN, BELOW),
           "below_lstm_at_init": (_unjudged(init_overlap) if init_overlap else
                                  _below(runs, "sens_init/train", BELOW)),
           "below_lstm_on_validation": _below(runs, "sens_end/val", BELOW),
           "below_lstm_at_alt_sigma": _below(runs, "sens_alt/train", BELOW),
           "relu_below_softmax": _below(runs, MAIN, [("roberta_relu", "roberta")])}
    recent = _recency_claims(runs)
    out["lstm_recency"] = recent["lstm_recency"]
    if any("sens_first/train" in f for f in runs["roberta"].values()):
        out["softmax_cls_bump"] = _cls_bump(runs)
    if "gpt2" in runs:
        out["gpt2_between"] = _below(runs, MAIN, [(m, "gpt2") for m in ENCODERS]
                                     + [("gpt2", "lstm")])
        if "gpt2_recency" in recent:
            out["gpt2_recency"] = recent["gpt2_recency"]
    return out


# --------------------------------------------------------------------------- majority class


def majority_rate(summary: dict[str, Any]) -> float | None:
    """The share of the most frequent label among the examples ``train/acc`` is measured on,
    from ``summary["language"]["label_counts"]["train"]`` (the count of each label), or None
    when the run does not record it (``language.finish_run`` writes the counts since
    2026-12-04; an older run gives None, and is not named by :func:`at_majority`)."""
    counts = summary.get("language", {}).get("label_counts", {}).get("train")
    if not isinstance(counts, list | tuple) or not counts or not all(
            isinstance(c, int | float) and math.isfinite(c) and c >= 0 for c in counts):
        return None
    total = sum(counts)
    return max(counts) / total if total > 0 else None


def at_majority(summaries: list[dict[str, Any]]) -> tuple[str, dict[str, Any]]:
    """The runs whose train accuracy is within :data:`MAJORITY_MARGIN` of their majority-class
    rate (:func:`majority_rate`): words for the end of the reason (``""`` when none) and the
    evidence (each run's rate, None where not recorded, and the runs named).

    An encoder that learned nothing but the majority class predicts it whatever the noise, so
    its sensitivity is 0 and it is "below the LSTM" without having learned the task. The
    accuracy-gap precondition does not catch it when every model stalls there alike, nor does
    the "every model is insensitive" one when the LSTM still flips; the verdict goes ahead as
    before, and the reason names these runs."""
    rates: dict[str, dict[int, float | None]] = {}
    named = []
    for s in summaries:
        seed = int(s.get("seed", 0))
        rate = rates.setdefault(s["label"], {})[seed] = majority_rate(s)
        acc = s.get("final", {}).get("train/acc")
        # within the margin up to rounding: 0.68 − 0.67 is 0.010000000000000009
        if rate is not None and isinstance(acc, int | float) and (
                abs(acc - rate) <= MAJORITY_MARGIN
                or math.isclose(abs(acc - rate), MAJORITY_MARGIN, rel_tol=GAP_ROUNDING)):
            named.append(f"{s['label']}/seed {seed} (train acc {acc:.3f}, majority class "
                         f"{rate:.3f})")
    evidence = {"rate": rates, "at_majority": named, "margin": MAJORITY_MARGIN}
    if not named:
        return "", evidence
    return (f" (train accuracy within {MAJORITY_MARGIN} of the share of the majority class, the "
            f"accuracy of a model that predicts that class for every input and so has "
            f"sensitivity 0 whatever it learned: {', '.join(named)})"), evidence


# --------------------------------------------------------------------------- evidence


def _run_evidence(f: dict[str, Any]) -> dict[str, Any]:
    return {"train_acc": f.get("train/acc"), "val_acc": f.get("test/acc"),
            "sens_train": f.get(MAIN), "se": f.get(f"{MAIN}_se"),
            "sens_val": f.get("sens_end/val"), "sens_alt_train": f.get("sens_alt/train"),
            "sens_init": f.get("sens_init/train"), "sens_last_tracked": f.get("sens/train"),
            "recency_ratio": ratio(f) if "recency/late" in f else None,
            "sens_first": f.get("sens_first/train")}


def _model_evidence(per: dict[int, dict[str, Any]]) -> dict[str, Any]:
    """One model's numbers: a single seed's as they are; several seeds' means (``se``: the
    measurement s.e. of the mean) with each seed's numbers in ``per_seed``."""
    rows = {s: _run_evidence(per[s]) for s in sorted(per)}
    if len(rows) == 1:
        return {**next(iter(rows.values())), "seeds": list(rows)}
    out = {k: _mean([r[k] for r in rows.values()]) for k in next(iter(rows.values()))}
    ses = [r["se"] for r in rows.values()]
    out["se"] = (None if any(s is None for s in ses)
                 else math.sqrt(sum(float(s) ** 2 for s in ses)) / len(ses))
    return {**out, "seeds": list(rows), "per_seed": rows}


def language_verdict(summaries: list[dict[str, Any]],
                     max_acc_gap: float = MAX_ACC_GAP) -> dict[str, Any]:
    """The verdict on the main claim (both RoBERTas below the LSTM at the end of training, train
    subset, σ² = 15: parts ``lstm − roberta`` and ``lstm − roberta_relu``, paired by seed,
    Holm) with every claim judged on its own in ``evidence["claims"]``. Runs whose train
    accuracy is at their majority-class rate, where recorded, are named in the reason after the
    train accuracies (:func:`at_majority`)."""
    runs: Runs = {}
    for s in summaries:
        seed = int(s.get("seed", 0))
        per = runs.setdefault(s["label"], {})
        if seed in per:
            raise ValueError(f"two {s['label']} runs with seed {seed}")
        per[seed] = numbers(s)
    missing = [m for m in ("lstm", *ENCODERS) if m not in runs]
    if missing:
        return not_comparable(f"runs missing: {', '.join(missing)}")
    seed_sets = {m: sorted(per) for m, per in runs.items()}
    if len({tuple(v) for v in seed_sets.values()}) > 1:  # a missing run: never paired away
        return not_comparable("the models have different seeds (a run is missing): " + "; ".join(
            f"{m} {v}" for m, v in seed_sets.items()))
    evidence: dict[str, Any] = {m: _model_evidence(per) for m, per in runs.items()}
    for s in summaries:  # the end-of-training per-position profile (right-aligned), first seed
        lang = s.get("language", {})
        prof = lang.get("sens_end_profile_train") or lang.get("profile_train")
        if prof and int(s.get("seed", 0)) == min(runs[s["label"]]):
            evidence[s["label"]]["profile"] = prof
    majority, evidence["majority_class"] = at_majority(summaries)
    judged = claims(runs, shared_inits(summaries))
    evidence["claims"] = judged
    seeds = sorted({s for per in runs.values() for s in per})
    gaps = {}
    for seed in seeds:
        accs = [float(per[seed].get("train/acc", math.nan)) for per in runs.values()
                if seed in per]
        gaps[seed] = max(accs) - min(accs) if all(map(math.isfinite, accs)) else math.nan
    gap = max(gaps.values()) if all(map(math.isfinite, gaps.values())) else math.nan
    evidence["acc_gap"] = gap
    evidence["acc_gap_by_seed"] = gaps

    main = ", ".join(f"{m} {_fmt(runs, m, MAIN)}" for m in runs)
    init = ", ".join(f"{m} {_fmt(runs, m, 'sens_init/train')}" for m in runs)
    acc = ", ".join(f"{m} {_mean([f.get('train/acc', math.nan) for f in runs[m].values()]):.3f}"
                    for m in runs)
    subs = "; ".join(f"{k}: {v['verdict']}" for k, v in judged.items()
                     if k != "roberta_below_lstm")
    numbers_text = (f"end-of-training train-subset sensitivity (σ² = 15) {main}; at init {init}; "
                    f"train acc {acc} ({len(seeds)} seed{'s' if len(seeds) != 1 else ''})"
                    f"{majority}. "
                    f"Sub-claims — {subs}")
    head = judged["roberta_below_lstm"]
    if head["verdict"] == NOT_COMPARABLE:
        return not_comparable(f"{head['detail']}: {numbers_text}", evidence)
    if not (gap <= max_acc_gap or math.isclose(gap, max_acc_gap, rel_tol=GAP_ROUNDING)):
        return not_comparable(f"train accuracies differ by {gap:.3f} (> {max_acc_gap}): "
                              + numbers_text, evidence)
    if all(_get(f, MAIN)[0] < INSENSITIVE for per in runs.values() for f in per.values()):
        return not_comparable("every model is insensitive (no flips to compare): "
                              + numbers_text, evidence)
    return verdict(_paired(runs, MAIN, BELOW), claim=MAIN_CLAIM, evidence=evidence,
                   note=numbers_text)
