"""Shared pieces of the implicit-bias experiments: the loss-race verdict of the optimiser races
(``ib_vit_mnist``, ``ib_text``) and the runs of the attention-geometry experiments
(``ib_fixed_v``, ``ib_joint``), which train with the ``"attention"`` trainer
(:mod:`senslab.train.loops.attention`: task, metrics and loop).
"""

from __future__ import annotations

import math
from typing import Any

from ...train.loops.attention import AttentionConfig, AttentionData
from ..base import Run

#: the four runs of a loss race (:func:`loss_race_verdict`), by label
RACE = ("sgd", "sngd", "sps", "adam")


def loss_race_verdict(summaries: list[dict[str, Any]],
                      chance_loss: float = math.log(10)) -> dict[str, Any]:
    """SNGD and SPS: final train loss below SGD's and closer to Adam's than to SGD's, all after
    the same number of steps. "not comparable" when SGD and a contender both still sit on the
    initial plateau (loss ≥ 95% of the chance loss ln 10): the race has not started."""
    final = {s["label"]: s for s in summaries}
    if set(final) != set(RACE):
        return {"verdict": "not comparable", "evidence": {},
                "reason": f"need runs {', '.join(RACE)}; got {', '.join(sorted(final))}"}
    steps = {k: s.get("steps") for k, s in final.items()}
    loss = {k: s["final"].get("train/loss") for k, s in final.items()}
    evidence = {k: {"train_loss": loss[k], "train_acc": final[k]["final"].get("train/acc"),
                    "steps": steps[k]} for k in final}
    detail = ", ".join(f"{k} {v:.4f}" for k, v in loss.items() if isinstance(v, (int, float)))
    if len(set(steps.values())) != 1:
        return {"verdict": "not comparable", "evidence": evidence,
                "reason": f"runs stopped after different numbers of steps: {steps}"}
    if not all(isinstance(v, (int, float)) and math.isfinite(v) for v in loss.values()):
        return {"verdict": "not comparable", "evidence": evidence,
                "reason": "a run has no finite final train/loss"}
    plateau = 0.95 * chance_loss
    stuck = [o for o in ("sngd", "sps") if min(loss[o], loss["sgd"]) >= plateau]
    if stuck:
        return {"verdict": "not comparable", "evidence": evidence,
                "reason": f"after {steps['sgd']} steps SGD and {', '.join(stuck)} are still at "
                          f"the initial plateau (loss ≥ {plateau:.3f}); train longer. Train "
                          f"loss: {detail}"}
    sgd, adam = loss["sgd"], loss["adam"]
    checks = {}
    for o in ("sngd", "sps"):
        checks[f"{o} < sgd"] = loss[o] < sgd
        checks[f"{o} closer to adam"] = abs(loss[o] - adam) < abs(loss[o] - sgd)
    failed = [k for k, ok in checks.items() if not ok]
    head = f"failed: {', '.join(failed)}" if failed else "SNGD and SPS beat SGD, close to Adam"
    return {"verdict": "does not hold" if failed else "holds",
            "reason": f"{head}; train loss after {steps['sgd']} steps: {detail}",
            "evidence": {**evidence, "checks": checks}}


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
