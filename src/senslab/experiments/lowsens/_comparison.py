"""Shared pieces of the MNIST-type vision comparisons (``mnist_binary``, ``fashion_mnist``):
models trained with :func:`~senslab.train.loop.fit` to a common train accuracy, then compared
on token-wise sensitivity (docs/definitions.md#token-wise-sensitivity) at :data:`SIGMA` and at
the larger σ of :data:`SWEEP` (A.3, the effect of the variance). Every model is trained with
the same seeds (3 by default) and the models are compared seed by seed
(docs/definitions.md#effects-over-seeds).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from ..._seeds import noise_seed
from ...train.config import RunConfig, ranged
from ...verdicts import judge, paired_by_seed
from .._verdicts import by_label, lowest_sensitivity_verdict
from ..base import Experiment, Run, Settings
from ._cache import read_cache, write_cache

#: noise std of the main number: the paper code's 0.1 on pixels normalised to [−1, 1]
#: (docs/definitions.md#noise-level-and-pixel-scale)
SIGMA = 0.1
#: larger σ measured once on the final models (A.3, "effect of the variance")
SWEEP = (0.25, 0.5, 1.0)
#: the cache of :func:`sigma_sweep` in each run directory
SWEEP_FILE = "sigma_sweep.json"


@dataclass
class ComparisonSettings(Settings):
    """What differs between the scales of a comparison: ``target`` (stop at this train
    accuracy), ``epochs`` (at most), ``train_subset`` (seeded training images; None: all),
    ``track_examples`` × ``repeats`` (the tracking subset, noise draws per token),
    ``eval_examples`` (train/test accuracy on this many images; None: all), ``small`` (the
    CPU-sized models); ``seeds``: 3 at every scale (a model comparison is judged over seeds)."""

    seeds: int = ranged(3, ge=1)
    target: float = ranged(0.95, ge=0, le=1)
    epochs: int = ranged(50, ge=1)
    train_subset: int | None = ranged(None, ge=1)
    track_examples: int = ranged(2000, ge=1)
    repeats: int = ranged(5, ge=1)
    eval_examples: int | None = ranged(None, ge=1)
    small: bool = False


def comparison_common(s: ComparisonSettings) -> list[str]:
    """The overrides of every run of a comparison at settings ``s`` (after its data's)."""
    out = [f"train.target_train_acc={s.target}", f"train.epochs={s.epochs}",
           f"track.sigma={SIGMA}", f"track.repeats={s.repeats}",
           f"track.num_examples={s.track_examples}"]
    if s.train_subset is not None:
        out.append(f"data.train_subset={s.train_subset}")
    if s.eval_examples is not None:
        out.append(f"track.eval_examples={s.eval_examples}")
    return out


class VisionComparison(Experiment):
    """Models trained with :func:`~senslab.train.loop.fit` to a common train accuracy, then
    compared on token-wise sensitivity at ``SIGMA`` (tracked every epoch) and ``sweep``
    (measured on each final model by :meth:`after_run`).

    Subclasses give :meth:`runs`; the verdict is :func:`comparison_verdict`: "``winner`` has
    the lowest sensitivity" at the main σ, one part per other model paired by seed, with the σ
    sweep judged the same way in the evidence. CPU scale: one intra-op thread (small models on a
    shared 2-core machine lose far more to thread hand-offs than they gain).
    """

    seed_aware = True  # the verdict judges every run, seed replicates included
    winner = "vit_small"
    sweep: tuple[float, ...] = SWEEP
    max_acc_gap = 0.03
    one_thread_at = ("cpu",)

    def resolve(self, scale: str, overrides: list[str] | tuple[str, ...] = ()
                ) -> tuple[ComparisonSettings, list[Run]]:
        """As :meth:`Experiment.resolve`, refusing a ``track.sigma`` that is not above 0: the
        verdict compares the tracked ``sens/train``, which σ = 0 does not measure (until
        2026-12-07 every run trained, its σ sweep too, and the verdict was "not comparable")."""
        settings, runs = super().resolve(scale, overrides)
        for run in runs:
            sigma = run.config.track.sigma
            if not sigma > 0:
                raise ValueError(
                    f"--set track.sigma={sigma:g}: {self.name} compares the models' token-wise "
                    f"sensitivity tracked at track.sigma (σ = {SIGMA:g} as the experiment sets "
                    "it), and a σ that is not above 0 measures none: every run would train for "
                    "a verdict of \"not comparable\". Leave track.sigma as the experiment sets "
                    f"it, or give a noise level above 0 (e.g. track.sigma={SIGMA:g})")
        return settings, runs

    def after_run(self, run: Run, path: Path, summary: dict[str, Any], settings: Any,
                  log: Callable[[str], None]) -> dict[str, Any]:
        summary["sigma_sweep"] = sigma_sweep(path, self.sweep)
        log(f"{run.name}: σ sweep " + ", ".join(
            f"{k}: {v['estimate']:.4f}" for k, v in summary["sigma_sweep"].items()))
        return summary

    def verdict(self, summaries: list[dict[str, Any]]) -> dict[str, Any]:
        return comparison_verdict(summaries, self.winner, self.max_acc_gap)


def sigma_sweep(run_dir: Path, sigmas: tuple[float, ...]) -> dict[str, dict[str, float]]:
    """Sensitivity of a finished run's final model at each σ in ``sigmas``.

    Measured on the run's own tracking subset (same examples, repeats and noise seed as the
    per-epoch numbers) and read with the run's own decision rule
    (:func:`~senslab.train.track.decision_rule`: a one-column ``train.loss=mse`` output by its
    0.5 boundary, not by its sign), so the sweep and the tracked curve describe the same data
    and the same predictions. The model is
    the run's final checkpoint (:meth:`~senslab.train.rundir.RunDir.final_checkpoint`): a
    damaged or missing one is an error naming the fix, never replaced by an earlier checkpoint.
    Cached in ``sigma_sweep.json``, keyed by the checkpoint step, the σ and the run's
    config.json (:func:`~._cache.read_cache`), so a resumed experiment does not redo it and a
    sweep of another checkpoint or configuration is not reused; a damaged cache is set aside
    with a warning and the sweep measured again.
    """
    from ...measure import TokenSensitivity
    from ...train.loop import build_model, load_data, resolve_device
    from ...train.rundir import RunDir, checkpoint_step
    from ...train.track import decision_rule

    rd = RunDir(run_dir)
    found = rd.final_checkpoint()
    if found is None:
        raise FileNotFoundError(f"{run_dir} has no checkpoint to measure; delete it and rerun")
    path, state = found
    cfg = RunConfig.from_dict(rd.read_json("config.json"))
    # read_cache checks the run's config.json too: a directory re-run with another
    # configuration after its checkpoints were deleted reached the same step and was served
    # the old sweep
    key: dict[str, Any] = {"step": checkpoint_step(path), "sigmas": list(sigmas)}
    if cfg.train.loss == "mse":
        # the only loss whose decision rule is not the model's own (a one-column output's 0.5
        # boundary): a sweep cached before the rule was read here took the sign instead
        key["decision_rule"] = "train.loss"
    cached = read_cache(rd, SWEEP_FILE, key, "results", "the σ sweep",
                        valid=lambda results: _is_sweep(results, sigmas))
    if cached is not None:  # a null (not finite when written: RunDir.write_json) as NaN
        return {sig: {k: math.nan if v is None else v for k, v in r.items()}
                for sig, r in cached.items()}
    train, _ = load_data(cfg)
    device = resolve_device(cfg.device)
    model = build_model(cfg, train).to(device)
    model.load_state_dict(state["model"])
    g = torch.Generator().manual_seed(cfg.seed + 1)  # the Tracker's subset
    subset = train.first(min(cfg.track.num_examples, len(train)), generator=g)
    kind, threshold = decision_rule(cfg, model, subset, device)  # the Tracker's
    results = {}
    for sigma in sigmas:
        metric = TokenSensitivity(model, sigma=sigma, repeats=cfg.track.repeats,
                                  generator=noise_seed(cfg.seed), chunk_size=cfg.track.chunk_size,
                                  output_kind=kind, threshold=threshold)
        for lo in range(0, len(subset), 256):
            x, _ = subset.batch(slice(lo, lo + 256))
            metric.update(x.to(device))
        r = metric.compute()
        results[f"{sigma:g}"] = {"estimate": r.estimate, "stderr": r.stderr}
    write_cache(rd, SWEEP_FILE, key, "results", results)
    return results


def _is_sweep(results: Any, sigmas: tuple[float, ...]) -> bool:
    """Whether ``results`` has :func:`sigma_sweep`'s shape: a number ``estimate`` and ``stderr``
    at each σ of ``sigmas``, keyed as ``f"{σ:g}"`` (a null: a number not finite when written)."""

    def number(x: Any) -> bool:
        return x is None or isinstance(x, (int, float)) and not isinstance(x, bool)

    return isinstance(results, dict) and set(results) == {f"{s:g}" for s in sigmas} and all(
        isinstance(r, dict) and number(r.get("estimate")) and number(r.get("stderr"))
        for r in results.values())


def comparison_verdict(summaries: list[dict[str, Any]], winner: str,
                       max_acc_gap: float = 0.03) -> dict[str, Any]:
    """:func:`~.._verdicts.lowest_sensitivity_verdict` at the main σ; the evidence also holds the
    epochs each run trained and why it stopped (seed by seed), each run's σ sweep, and at every σ
    of the sweep the same claim judged the same way (``winner_lowest_at``: one part per other
    model, paired by seed, Holm), which does not decide the verdict."""
    out = lowest_sensitivity_verdict(summaries, winner, max_acc_gap)
    if not out["evidence"]:
        return out
    groups = by_label(summaries)
    if all(s.get("sigma_sweep") for s in summaries):
        out["evidence"]["sigma_sweep"] = {
            k: {str(seed): runs[seed]["sigma_sweep"] for seed in sorted(runs)}
            for k, runs in groups.items()}
        same_seeds = len({tuple(sorted(runs)) for runs in groups.values()}) == 1
        if winner in groups and len(groups) > 1 and same_seeds:
            out["evidence"]["winner_lowest_at"] = sweep_verdicts(groups, winner)
    short = [s.get("name", s["label"]) for s in summaries if s.get("stopped") != "target_train_acc"]
    if short:
        out["reason"] += f" (did not reach the target: {', '.join(short)})"
    return out


def sweep_verdicts(groups: dict[str, dict[int, dict[str, Any]]], winner: str
                   ) -> dict[str, dict[str, Any]]:
    """At each σ of the winner's sweep: ``{"verdict", "parts", "correction", ...}`` of
    :func:`~senslab.verdicts.judge` with one part per other model, ``other − winner`` paired by
    seed on the sweep's estimates and their standard errors."""

    def at(runs: dict[int, dict[str, Any]], sigma: str) -> dict[int, tuple[float, float]]:
        out = {}
        for seed, s in runs.items():
            point = s["sigma_sweep"].get(sigma, {})
            out[seed] = (point.get("estimate", math.nan), point.get("stderr", math.nan))
        return out

    sigmas = next(iter(groups[winner].values()))["sigma_sweep"]
    return {sigma: judge({f"{k} − {winner}": paired_by_seed(
        at(groups[winner], sigma), at(runs, sigma), f"{k} − {winner} at σ = {sigma}")
        for k, runs in groups.items() if k != winner}) for sigma in sigmas}
