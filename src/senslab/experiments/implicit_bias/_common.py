"""Shared pieces of the implicit-bias experiments: the loss-race verdict of the optimiser races
(``ib_vit_mnist``, ``ib_text``) and the runs of the attention-geometry experiments
(``ib_fixed_v``, ``ib_joint``), which train with the ``"attention"`` trainer
(:mod:`senslab.train.loops.attention`: task, metrics and loop).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

from ...train.loops.attention import AttentionConfig, AttentionData, load_task
from ...verdicts import CONTRADICTED, Effect, describe, judge, not_comparable, over_seeds, verdict
from ..base import Run

#: the four runs of a loss race (:func:`loss_race_verdict`), by label
RACE = ("sgd", "sngd", "sps", "adam")


def duplicate_runs(summaries: list[dict[str, Any]]) -> str | None:
    """Why ``summaries`` cannot be paired by seed — two runs of one optimiser with the same seed
    (a summary without ``seed`` is seed 0), of which the verdict would keep one and drop the
    other without a word — or None."""
    names: dict[tuple[Any, Any], list[str]] = {}
    for s in summaries:
        names.setdefault((s["label"], s.get("seed", 0)), []).append(
            str(s.get("name", f"{s['label']} (seed {s.get('seed', 0)})")))
    twice = [f"{label} seed {seed}: {', '.join(n)}" for (label, seed), n in names.items()
             if len(n) > 1]
    if not twice:
        return None
    return (f"more than one run of an optimiser with the same seed ({'; '.join(twice)}); the "
            "verdict pairs one run of each optimiser per seed: give each summary its own "
            "'seed' (load_summaries takes it from the run's config.json) or judge the runs of "
            "one experiment directory at a time")


def by_seed(summaries: list[dict[str, Any]]) -> dict[int, dict[str, dict[str, Any]]]:
    """``{seed: {label: summary}}`` (a summary without ``seed`` is seed 0)."""
    out: dict[int, dict[str, dict[str, Any]]] = {}
    for s in summaries:
        out.setdefault(s.get("seed", 0), {})[s["label"]] = s
    return dict(sorted(out.items()))


def loss_race_verdict(summaries: list[dict[str, Any]],
                      chance_loss: float = math.log(10)) -> dict[str, Any]:
    """SNGD and SPS: final train loss below SGD's and closer to Adam's than to SGD's, all after
    the same number of steps, judged over seeds (:mod:`senslab.verdicts`): per contender o two
    parts, ``loss_sgd − loss_o`` and ``|loss_o − loss_sgd| − |loss_o − loss_adam|`` of each seed
    (the four runs of a seed share its data subset, order and initialisation), their means over
    seeds with Student's t, Holm over the four. "not comparable" when a seed lacks a run or has
    two of one optimiser (:func:`duplicate_runs`), the runs stopped after different numbers of
    steps, or a loss is not finite (the reason names the run and its step).

    The initial plateau (loss ≥ 95% of the chance loss, ln 10 for MNIST): where SGD and a
    contender o both still sit on it in some seed, the race between them has not started, and
    the part "o below sgd" is withheld (two stuck runs differ by noise). The part "o closer to
    adam" is still judged when Adam has left the plateau in every seed: then |o − adam| is a real
    distance, and a contender that is as far from Adam as SGD is measurably not "close to Adam"
    after this many steps. The judged parts keep the levels of the fixed Holm family of four
    (a withheld part counts as not significant, i.e. last), so withholding never loosens a test.
    If a judged part is contradicted, the claim is contradicted (it fails whatever the withheld
    parts would say); otherwise the verdict is "not comparable" (train longer), with the judged
    parts in the reason. All four parts are judged as before when no pair is stuck.
    Correction of 2026-11-30: the guard first returned "not comparable" whenever a pair was
    stuck, even when the data already contradicted the "closer to Adam" half (e.g. a ViT record
    with sgd 2.30, sngd 2.32, sps 2.30, adam 0.22)."""
    labels = {s["label"] for s in summaries}
    if labels != set(RACE):
        return not_comparable(f"need runs {', '.join(RACE)}; got {', '.join(sorted(labels))}")
    if (twice := duplicate_runs(summaries)) is not None:  # by_seed kept the last, silently
        return not_comparable(twice)
    seeds = by_seed(summaries)
    steps = {f"{o} (seed {k})": r.get("steps") for k, runs in seeds.items()
             for o, r in runs.items()}
    loss = {k: {o: r["final"].get("train/loss") for o, r in runs.items()}
            for k, runs in seeds.items()}
    evidence: dict[str, Any] = {}
    for o in RACE:
        per = {k: runs[o] for k, runs in seeds.items() if o in runs}
        entry: dict[str, Any] = {
            "train_loss": _mean([r["final"].get("train/loss") for r in per.values()]),
            "train_acc": _mean([r["final"].get("train/acc") for r in per.values()]),
            "steps": next(iter(per.values())).get("steps")}
        if len(seeds) > 1:
            entry["seeds"] = {str(k): {"train_loss": r["final"].get("train/loss"),
                                       "train_acc": r["final"].get("train/acc")}
                              for k, r in per.items()}
        evidence[o] = entry
    missing = {k: sorted(set(RACE) - set(runs)) for k, runs in seeds.items()
               if set(RACE) - set(runs)}
    if missing:
        return not_comparable(f"seeds without every run: {missing}", evidence)
    if len(set(steps.values())) != 1:
        return not_comparable(f"runs stopped after different numbers of steps: {steps}",
                              evidence)
    bad = [f"{seeds[k][o].get('name', f'{o} (seed {k})')} (train/loss = {v}"
           + (f" at step {seeds[k][o]['steps']})" if seeds[k][o].get("steps") is not None
              else ")")
           for k, per in loss.items() for o, v in per.items()
           if not (isinstance(v, (int, float)) and math.isfinite(v))]
    if bad:  # named: "a run" left the researcher to search the run directories
        evidence["not_finite"] = bad
        return not_comparable(f"a run has no finite final train/loss: {'; '.join(bad)}",
                              evidence)
    mean = {o: evidence[o]["train_loss"] for o in RACE}
    detail = ", ".join(f"{o} {v:.4f}" for o, v in mean.items())
    if len(seeds) > 1:
        detail += " (means over seeds)"
    plateau = 0.95 * chance_loss
    stuck = [f"{o} (seed {k})" for k, per in loss.items() for o in ("sngd", "sps")
             if min(per[o], per["sgd"]) >= plateau]
    n_steps = next(iter(steps.values()))
    adam_moved = all(per["adam"] < plateau for per in loss.values())
    parts, withheld = {}, []
    for o in ("sngd", "sps"):
        race = not any(min(per[o], per["sgd"]) >= plateau for per in loss.values())
        below = over_seeds([per["sgd"] - per[o] for per in loss.values()],
                           what=f"loss_sgd − loss_{o}")
        closer = over_seeds(
            [abs(per[o] - per["sgd"]) - abs(per[o] - per["adam"]) for per in loss.values()],
            what=f"|{o} − sgd| − |{o} − adam|")
        for name, effect, judged in ((f"{o} below sgd", below, race),
                                     (f"{o} closer to adam", closer, race or adam_moved)):
            if judged:
                parts[name] = effect
            else:
                withheld.append(name)
    sgd, adam = mean["sgd"], mean["adam"]  # the former per-run checks, on the means
    evidence["checks"] = {}
    for o in ("sngd", "sps"):
        evidence["checks"][f"{o} < sgd"] = mean[o] < sgd
        evidence["checks"][f"{o} closer to adam"] = abs(mean[o] - adam) < abs(mean[o] - sgd)
    claim = "SNGD and SPS end below SGD, closer to Adam"
    if not withheld:
        return verdict(parts, evidence=evidence, claim=claim,
                       note=f"Train loss after {n_steps} steps: {detail}")
    stuck_reason = (f"after {n_steps} steps SGD and {', '.join(stuck)} are still at the initial "
                    f"plateau (loss ≥ {plateau:.3f})")
    evidence["withheld"] = withheld
    if not parts:
        return not_comparable(f"{stuck_reason}; train longer. Train loss: {detail}", evidence)
    # the judged parts at their levels in the fixed family of four: a withheld part is a
    # not-significant one (NaN p-value: Holm puts it last)
    j = judge({**parts, **{name: Effect(math.nan, math.nan, what=name) for name in withheld}})
    judged = {name: j["parts"][name] for name in parts}
    body = "; ".join(describe(name, p) for name, p in judged.items())
    if any(p["verdict"] == CONTRADICTED for p in judged.values()):
        return {"verdict": CONTRADICTED,
                "reason": f"{claim}: {body}; not judged: {', '.join(withheld)} ({stuck_reason}, "
                          f"Adam not). Train loss after {n_steps} steps: {detail}",
                "evidence": evidence, "effects": judged,
                "correction": f"Holm over 4 parts ({len(withheld)} withheld as not "
                              "significant: both runs on the initial plateau)"}
    evidence["judged_parts"] = judged
    return not_comparable(f"{stuck_reason}; train longer. Train loss: {detail}. Judged without "
                          f"{', '.join(withheld)} (no contradiction): {body}", evidence)


def _mean(values: list[Any]) -> Any:
    """The mean of numbers; None if one is missing (a run without that metric)."""
    if any(not isinstance(v, (int, float)) for v in values):
        return None
    return sum(values) / len(values)


#: the step-size fields of :class:`AttentionConfig` each optimiser reads (every run reads the rest)
READS = {"sgd": ("lr",), "ngd": ("lr", "eta_max"), "polyak": (), "sps": ("sps_c", "eta_max"),
         "adam": ("lr",)}


def check_run_overrides(name: str, runs: list[Run], built: list[Run],
                        pinned: dict[str, tuple[Any, str]]) -> None:
    """Refuse run-configuration overrides (``--set head=joint``) that would test another claim or
    change nothing: ``runs`` as resolved, ``built`` as :meth:`~senslab.experiments.base.
    Experiment.runs` built them from the same settings. ``pinned``: field → (the value the claim
    needs, why); a step-size field (:data:`READS`) that an override changed while none of the
    runs' optimisers reads it would be recorded but train nothing differently."""
    for field_name, (value, why) in pinned.items():
        got = {getattr(r.config, field_name) for r in runs}
        if got != {value}:
            shown = ", ".join(sorted(map(str, got)))
            raise ValueError(f"--set {field_name}={shown}: {name} {why}, so its runs keep "
                             f"{field_name}={value}; train a run of your own with another "
                             f"{field_name} through senslab.train.loops.attention."
                             "train_attention")
    optimisers = sorted({r.config.optimizer for r in runs})
    for field_name in sorted({f for fs in READS.values() for f in fs}):
        changed = [r for r, b in zip(runs, built, strict=True)
                   if getattr(r.config, field_name) != getattr(b.config, field_name)]
        if changed and not any(field_name in READS[r.config.optimizer] for r in changed):
            raise ValueError(
                f"--set {field_name}={getattr(changed[0].config, field_name)}: no run of {name} "
                f"reads {field_name} (its optimisers: {', '.join(optimisers)}; {field_name} is "
                f"read by {', '.join(o for o, fs in READS.items() if field_name in fs)}), so the "
                "setting would be recorded but change no run")


def attention_runs(s: Any, optimizers: dict[str, dict[str, Any]],
                   **common: Any) -> list[Run]:
    """``s.seeds`` × ``optimizers`` runs of the ``"attention"`` trainer, named ``<label>-s<seed>``
    (seed 0 included, as always for these experiments): seed k sets the model seed and, unless
    ``s.data`` names one, the data seed; ``s.steps``, ``s.per_decade`` and ``common`` apply to
    every run, ``optimizers[label]`` (AttentionConfig fields) to that optimiser's."""
    runs = []
    for seed in range(s.seeds):
        for label, opt in optimizers.items():
            cfg = AttentionConfig(name=f"{label}-s{seed}", label=label, seed=seed,
                                  data=AttentionData.of({"seed": seed, **s.data}),
                                  steps=s.steps, per_decade=s.per_decade, **common, **opt)
            runs.append(Run(cfg.name, cfg, trainer="attention", info={"seed": seed}))
    return runs


def check_tasks(name: str, runs: list[Run]) -> None:
    """Build every distinct training set of ``runs`` with its max-margin targets W_mm and v_mm
    (what the ``"attention"`` trainer builds first, in its run directory) and refuse one that has
    none, before anything is written: the trainer found out only after the earlier seeds had
    trained, e.g. ``data.dim=7`` with 32 sequences, whose seed 1 has no W_mm, trained all of
    seed 0's runs and left seed 1's first run directory half-written (a few ms per seed)."""
    seen: set[tuple[Any, ...]] = set()
    for run in runs:
        data = run.config.data
        key = tuple(sorted(dataclasses.asdict(data).items()))
        if key in seen:
            continue
        seen.add(key)
        try:
            load_task(**dataclasses.asdict(data))
        except ValueError as err:
            raise ValueError(
                f"{name}: the training set of {run.name} (data.seed={data.seed}, "
                f"data.num_samples={data.num_samples}, data.dim={data.dim}, "
                f"data.seq_len={data.seq_len}, data.query_signal={data.query_signal}) has no "
                f"max-margin target: {err}. Nothing is trained; use a data.dim of at least "
                f"data.num_samples (random queries are then separable), fewer "
                f"data.num_samples, or a data.query_signal > 0") from None
