"""Measurements taken once from a run's final checkpoint, after standard training.

Several vision experiments need more than the Tracker measures during training: a σ sweep, the
whole-input noise variant, accuracy under corruptions, sharpness with its standard error. They
train with the standard loop (``"fit"``) as usual; :class:`FinalMeasureExperiment`'s
:meth:`~FinalMeasureExperiment.after_run` then calls :meth:`FinalMeasureExperiment.
measure_final` on the restored model. The result is written to ``<run>/final_measure.json``
together with the settings that produced it and the step of the checkpoint measured, reused when
both match (so re-running an experiment only redoes what changed) and attached to the run's
summary under ``"final_measure"`` for the verdict (a reused one with NaN where the file has
null, as the first pass gave it: :func:`known_values`). A result stored under another key, or
in a file that cannot be read as one, is measured again (a damaged file is set aside with a
warning: :func:`~._cache.read_cache`).

The final model is the run's final checkpoint (:meth:`~senslab.train.rundir.RunDir.
final_checkpoint`), the one summary.json's numbers describe: when it is damaged or missing the
measurement is refused, naming the fix, rather than taken on an earlier checkpoint.
"""

from __future__ import annotations

import math
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import nn

from ...data import ArrayDataset
from ...tokens.base import model_device
from ...train.config import RunConfig
from ...train.loop import build_model, load_data, resolve_device
from ...train.rundir import RunDir, checkpoint_step
from ...train.track import Tracker
from ..base import Experiment, Run
from ._cache import read_cache, write_cache

FINAL_FILE = "final_measure.json"


def final_state(run_dir: Path) -> tuple[int, dict[str, Any]]:
    """(step, state) of a finished run's final checkpoint: never an earlier one in its place (a
    :class:`~senslab.train.rundir.RunDirError` naming the damaged or missing file and the fix)."""
    found = RunDir(run_dir).final_checkpoint()
    if found is None:
        raise FileNotFoundError(f"{run_dir} has no checkpoint to measure; train it first")
    path, state = found
    return checkpoint_step(path), state


def load_final(cfg: RunConfig, run_dir: Path, state: dict[str, Any] | None = None
               ) -> tuple[nn.Module, ArrayDataset, ArrayDataset]:
    """The model of a finished run with its final checkpoint's weights (eval mode; ``state``:
    that checkpoint, already loaded by :func:`final_state`), and the train/test data exactly as
    the run saw them (same subset, same normalisation)."""
    if state is None:
        state = final_state(run_dir)[1]
    train, test = load_data(cfg)
    model = build_model(cfg, train)
    model.load_state_dict(state["model"])
    return model.to(resolve_device(cfg.device)).eval(), train, test


def tracking_subset(cfg: RunConfig, model: nn.Module, train: ArrayDataset,
                    test: ArrayDataset) -> ArrayDataset:
    """The fixed training subset the Tracker measured sensitivity on during training, on the
    model's device."""
    subset = Tracker(cfg, model, train, test, torch.device("cpu")).sens_train
    return subset.to(model_device(model) or "cpu")


def reuse_finished(src: Path, dst: Path, cfg: RunConfig) -> bool:
    """Copy the finished run ``src`` to ``dst`` if it was trained with exactly ``cfg``.

    Lets one experiment share the trained models of another (sharpness reads robustness's);
    a run with any other configuration is never reused.
    """
    if dst.exists() or not (src / "summary.json").exists() or not (src / "config.json").exists():
        return False
    if RunDir(src).read_json("config.json") != cfg.to_dict():
        return False
    shutil.copytree(src, dst)
    return True


def known_values(value: Any) -> Any:
    """``value`` read back from :data:`FINAL_FILE` with every null as NaN, in dicts and lists at
    any depth: :meth:`~senslab.train.rundir.RunDir.write_json` writes a number that is not
    finite (an undefined standard error, a diverged model's sensitivity) as null, so a reused
    measurement gave the verdict None where the first pass gave NaN, and the verdicts, which
    take NaN (naming the run, or judging it not finite), failed with a raw TypeError
    (``math.hypot(None, ...)``, ``None < x``) on a resumed experiment."""
    if value is None:
        return math.nan
    if isinstance(value, dict):
        return {k: known_values(v) for k, v in value.items()}
    if isinstance(value, list):
        return [known_values(v) for v in value]
    return value


class FinalMeasureExperiment(Experiment):
    """Runs trained with ``fit``, each final model then measured once (see module docstring).

    Subclasses define ``runs``, ``verdict``, :meth:`final_settings` (a JSON-able dict that
    identifies the measurement) and :meth:`measure_final`.
    """

    def final_settings(self, settings: Any) -> dict[str, Any]:
        return {}

    def measure_final(self, cfg: RunConfig, model: nn.Module, train: ArrayDataset,
                      test: ArrayDataset, settings: Any) -> dict[str, Any]:
        raise NotImplementedError

    def after_run(self, run: Run, path: Path, summary: dict[str, Any], settings: Any,
                  log: Callable[[str], None]) -> dict[str, Any]:
        measure = self.final_settings(settings)
        rd = RunDir(path)
        step, state = final_state(path)
        # a result without the step (older senslab) may be of an earlier checkpoint, one of
        # another config.json of a directory re-run with other settings: redone
        key = {"settings": measure, "step": step}
        values = read_cache(rd, FINAL_FILE, key, "values", "the final model")
        if values is not None:  # a null: a number not finite when written, as NaN (known_values)
            values = known_values(values)
        else:
            log(f"    measuring the final model of {run.name}")
            model, train, test = load_final(run.config, path, state)
            values = self.measure_final(run.config, model, train, test, settings)
            write_cache(rd, FINAL_FILE, key, "values", values)
        return {**summary, "final_measure": values}
