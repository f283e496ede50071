"""Hahn & Rofin (3): PARITY training dynamics around the moment the model finds the solution.

Claim (docs/definitions.md#hr_parity_dynamics): aligning training runs at the transition t₀ — the
first step whose loss is below 0.01 — the sharpness and the LayerNorm blow-up peak near t₀:
the loss landscape is sharpest, and the normalisation most amplified, exactly when the sensitive
solution appears.

Command: ``senslab run hr_parity_dynamics`` (``--scale paper`` on a GPU).

Settings. Paper (the authors' dynamics sweep at wd 0.1, the main-text figure): PARITY on n = 25,
d = 128, 1,024 fresh strings per step, AdamW lr 3e-4, wd 0.1, 20,000 steps, 101 seeds, PyTorch's
encoder initialisation; every 100 steps sharpness (500 weight draws), blow-up and norm on one
fixed batch of 1,024 held-out strings; t₀ = the first such evaluation whose loss on that batch is
< 0.01 (``t0_on="eval"``); runs count when their final held-out loss is < 0.001. CPU scale:
PARITY on n = 8 with a narrower model (d = 32, FF 32, 2 layers, 2 heads, post-LN), 256 fresh
strings per step, AdamW lr 1e-3, wd 0.1, 3,000 steps, 3 seeds; sharpness (10 weight draws, 512
held-out strings), blow-up and norm every 25 steps; t₀ = the first training
step whose batch loss is < 0.01 (``t0_on="train"``).

Verdict: a run's peak is "near the transition" when the logged step of its maximum sharpness (and,
separately, of its maximum mean log10 blow-up) lies within ``max(0.25·t₀, 2 evaluations)`` of
t₀ and is not the last evaluation (a maximum there is no peak). "holds" when that is true for
both measures in a majority of the runs that reached t₀ (and, where the scale sets
``converged_loss``, converged, as the authors' figures keep only those); "not comparable" when
fewer than two such runs.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ...train.config import one_of, ranged
from ...train.rundir import RunDir
from ..base import Experiment, Run, register_experiment
from ._common import Setup, boolean_run


@dataclass
class DynamicsSettings(Setup):
    n: int = ranged(25, ge=1)
    seeds: int = ranged(3, ge=1)
    window: float = ranged(0.25, gt=0)  # allowed |t_peak − t₀| as a fraction of t₀
    t0_on: str = one_of("train", "eval")  # t₀ from the training batches or the evaluations


SCALES = {
    "cpu": DynamicsSettings(dim=32, steps=3000, batch=256, lr=1e-3, eval_every=25,
                            eval_size=512, sharp_draws=10, n=8, seeds=3),
    "paper": DynamicsSettings(steps=20_000, eval_every=100, sharp_draws=500, seeds=101,
                              init="torch_encoder", converged_loss=1e-3, t0_on="eval"),
}


@register_experiment("hr_parity_dynamics")
class ParityDynamics(Experiment):
    paper = "Hahn & Rofin, Why are Sensitive Functions Hard for Transformers? (2024), Fig. 4"
    claim = ("Aligned at the first step with training loss < 0.01, PARITY's sharpness and "
             "LayerNorm blow-up peak near that transition.")
    cpu_scale_note = (
        "PARITY on n = 8 instead of 25, d = 32, 256 fresh strings per step, AdamW lr 1e-3, 3,000 "
        "steps, 3 seeds"
    )

    scales = SCALES
    seed_aware = True  # the verdict judges every run, seed replicates included

    def runs(self, s: DynamicsSettings) -> list[Run]:
        return [boolean_run(f"parity-n{s.n}-s{seed}", s, label="parity", function="parity",
                            n=s.n, seed=seed)
                for seed in range(s.seeds)]

    def after_run(self, run: Run, path: Path, summary: dict[str, Any], settings: DynamicsSettings,
                  log: Callable[[str], None]) -> dict[str, Any]:
        # the verdict needs the whole trajectory, not just the final record
        records = RunDir(path).metrics()
        t0 = summary["first_below_001"]
        if settings.t0_on == "eval":
            t0 = next((r["step"] for r in records if r["test/loss"] < 0.01), None)
        return {**summary, "peaks": peaks(records, t0, settings.window, settings.eval_every)}

    def verdict(self, summaries: list[dict[str, Any]]) -> dict[str, Any]:
        return dynamics_verdict(summaries)


def peaks(records: list[dict[str, Any]], t0: int | None, window: float,
          eval_every: int) -> dict[str, Any]:
    """Step of the maximum sharpness and blow-up, their distance to t₀ and whether it is within
    ``max(window·t₀, 2·eval_every)``."""
    out: dict[str, Any] = {"t0": t0}
    if t0 is None or not records:
        return out
    tol = max(window * t0, 2 * eval_every)
    out["tolerance"] = tol
    for key, name in (("sharpness/loss", "sharpness"), ("blowup/log10", "blowup")):
        best = max(records, key=lambda r: r[key])
        # a maximum at the last evaluation may still be rising: that is no peak (yet)
        at_end = best["step"] == records[-1]["step"]
        out[name] = {"peak_step": best["step"], "peak": best[key], "offset": best["step"] - t0,
                     "start": records[0][key], "end": records[-1][key], "at_end": at_end,
                     "near": abs(best["step"] - t0) <= tol and not at_end}
    return out


def dynamics_verdict(summaries: list[dict[str, Any]]) -> dict[str, Any]:
    reached = [s for s in summaries if s.get("peaks", {}).get("t0") is not None
               and (s.get("config", {}).get("converged_loss") is None or s["converged"])]
    evidence = {s["name"]: s.get("peaks", {}) for s in summaries}
    if len(reached) < 2:
        return {"verdict": "not comparable", "evidence": evidence,
                "reason": f"only {len(reached)} of {len(summaries)} runs reached loss < 0.01"}
    near = {k: sum(bool(s["peaks"][k]["near"]) for s in reached) for k in ("sharpness", "blowup")}
    ok = all(2 * v > len(reached) for v in near.values())
    def where(p: dict[str, Any]) -> str:
        return f"{p['offset']:+d}" + (" (last step, still rising)" if p.get("at_end") else "")

    offsets = "; ".join(
        f"{s['name']}: t0={s['peaks']['t0']}, sharpness peak {where(s['peaks']['sharpness'])}, "
        f"blow-up peak {where(s['peaks']['blowup'])}" for s in reached)
    return {
        "verdict": "holds" if ok else "does not hold",
        "reason": (f"peak near t0 in {near['sharpness']}/{len(reached)} runs (sharpness) and "
                   f"{near['blowup']}/{len(reached)} (blow-up): {offsets}"),
        "evidence": evidence,
    }
