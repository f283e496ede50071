"""Experiments: a named set of runs, a claim from a paper, and a verdict computed from numbers.

An experiment lists its runs for a ``scale`` (one of :data:`SCALES`: "cpu" runs here in minutes,
"paper" is the paper's settings, for a GPU), trains each into its own run directory below the
experiment directory, then
computes a verdict from the run summaries and writes ``experiment.json`` and ``verdict.json``
(format: docs/run-directory.md). ``senslab report EXP_DIR`` turns that into report.html.

Overrides (``senslab run NAME --set key=value``) take one path for every experiment:
:func:`senslab.train.config.apply_overrides` on the experiment's dataclasses — each
:class:`RunConfig` of :meth:`Experiment.runs`, or the settings dataclass of an experiment with its
own loop (:attr:`Experiment.scales`). :func:`run_experiment` resolves them before it writes
anything, so a bad key or value fails with the same message for every experiment.
"""

from __future__ import annotations

import copy
import json
import time
from collections.abc import Callable
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, ClassVar

import torch

from ..data import locate
from ..registry import Registry
from ..train.config import RunConfig, apply_overrides, validate
from ..train.rundir import RunDir, git_commit

#: the scales every experiment runs at, smallest first; "cpu" is the default everywhere
SCALES = ("cpu", "paper")


def check_scale(scale: str) -> str:
    """``scale`` when it is one of :data:`SCALES`, else a ``ValueError`` listing them."""
    if scale not in SCALES:
        raise ValueError(f"unknown scale {scale!r}; use one of {', '.join(SCALES)}")
    return scale


class Experiment:
    """Subclass and register with ``@register_experiment("name")``.

    An experiment trained by the standard loop defines :meth:`runs`; one with its own loop sets
    :attr:`scales` and reads :meth:`settings` in :meth:`execute`.
    """

    name: str = ""
    paper: str = ""
    claim: str = ""
    #: for an experiment never run here only: a guess at the CPU-scale runtime, labelled as one
    #: (e.g. "~10 min (estimate: CIFAR-10 is not available here)"). Measured runtimes are never
    #: typed: they live in the records (``reproduction/<name>.json``, ``runtime_s``), which
    #: REPRODUCTION.md and ``senslab list experiments`` read.
    runtime_estimate: str = ""
    #: how the CPU-scale runs differ from the paper (smaller model, data subset, fewer epochs...);
    #: shown in REPRODUCTION.md next to the result
    cpu_scale_note: str = ""
    #: why the CPU-scale runs cannot run on this kind of machine (e.g. "CIFAR-10 must be placed
    #: in data.root"), shown in REPRODUCTION.md when no result has been recorded
    requires: str = ""
    #: the settings dataclass of an experiment with its own loop, one instance per scale of
    #: :data:`SCALES` (empty: the experiment is a list of :meth:`runs`)
    scales: ClassVar[dict[str, Any]] = {}

    def runs(self, scale: str) -> list[RunConfig]:
        """The runs of this experiment, as configurations for the standard training loop."""
        raise NotImplementedError

    def configs(self, scale: str, overrides: list[str]) -> list[RunConfig]:
        """:meth:`runs` at ``scale`` with ``overrides`` applied to each and checked."""
        return [validate(apply_overrides(cfg, list(overrides)))
                for cfg in self.runs(check_scale(scale))]

    def settings(self, scale: str, overrides: list[str] | tuple[str, ...] = ()) -> Any:
        """A copy of this experiment's :attr:`scales` entry for ``scale`` with ``overrides``
        applied and checked."""
        if check_scale(scale) not in self.scales:
            raise ValueError(f"{self.name} has no settings for scale {scale!r}")
        return validate(apply_overrides(copy.deepcopy(self.scales[scale]), list(overrides)))

    def check(self, scale: str, overrides: list[str]) -> None:
        """Resolve ``overrides`` at ``scale`` without writing anything: an unknown key, a value
        of the wrong type or out of range fails here, before any directory exists."""
        if self.scales:
            self.settings(scale, overrides)
        else:
            self.configs(scale, overrides)

    def execute(self, out: Path, scale: str, overrides: list[str],
                progress: bool | None, log: Callable[[str], None]) -> list[dict[str, Any]]:
        """Produce one run directory per run below ``out`` and return their summaries.

        The default trains every config of :meth:`runs` with :func:`senslab.train.loop.fit`
        (resuming finished or partial runs). Experiments that need their own loop (full-batch
        training of a small model, Boolean sensitivity, attention metrics...) override this and
        write run directories in the same format with :class:`senslab.train.rundir.RunDir`.
        """
        from ..train.loop import fit

        configs = self.configs(scale, overrides)
        for cfg in configs:
            locate_data(cfg)  # before any training: a missing dataset stops the experiment here
        write_experiment_json(out, self, scale, [c.name for c in configs])
        summaries = []
        for i, cfg in enumerate(configs, 1):
            log(f"[{i}/{len(configs)}] {cfg.name}: {cfg.model.name} on {cfg.data.name}")
            summaries.append(fit(cfg, out / cfg.name, progress=progress))
        return summaries

    def verdict(self, summaries: list[dict[str, Any]]) -> dict[str, Any]:
        """``{"verdict": "holds" | "does not hold" | "not comparable", "reason": ...,
        "evidence": {...}}`` computed from the run summaries."""
        raise NotImplementedError


def locate_data(cfg: RunConfig) -> None:
    """Find ``cfg``'s dataset by the one rule of :mod:`senslab.data._roots` (explicit
    ``data.root``, else ``$SENSLAB_DATA/<name>``, else an installed package's copy), raising its
    error — every place looked in, the files, the fixes — before any training. A folder found in
    the data home is recorded in ``cfg.data.root`` (absolute), so that config.json says which
    copy was read; a package's copy and a download are left to the loader."""
    d = cfg.data
    found = locate(d.name, d.root, download=d.download)
    if found is not None and found.step == "data home":
        d.root = str(found.path.resolve())


def write_experiment_json(out: Path, exp: Experiment, scale: str, runs: list[str]) -> None:
    """experiment.json: the experiment's name, paper, claim, scale and run subdirectories."""
    RunDir(out, kind="experiment").write_json("experiment.json", {
        "name": exp.name, "paper": exp.paper, "claim": exp.claim, "scale": scale, "runs": runs,
    })


def model_runs(models: dict[str, list[str]], common: list[str]) -> list[RunConfig]:
    """One :class:`RunConfig` per model name (also its run name and label): the ``common``
    overrides, then the model's own."""
    out = []
    for name, extra in models.items():
        cfg = RunConfig(name=name, label=name)
        cfg.model.name = name
        out.append(apply_overrides(cfg, common + extra))
    return out


EXPERIMENTS: Registry[Callable[[], Experiment]] = Registry("experiment")


def register_experiment(name: str) -> Callable[[type[Experiment]], type[Experiment]]:
    def deco(cls: type[Experiment]) -> type[Experiment]:
        cls.name = name
        EXPERIMENTS.register(name)(cls)
        return cls

    return deco


def list_experiments(pattern: str = "*") -> list[str]:
    return EXPERIMENTS.names(pattern)


def get_experiment(name: str) -> Experiment:
    return EXPERIMENTS.get(name)()


def run_experiment(name: str, out_dir: str | Path, scale: str = "cpu",
                   overrides: list[str] | None = None, progress: bool | None = None,
                   log: Callable[[str], None] = print) -> dict[str, Any]:
    """Train every run of experiment ``name`` (resuming finished/partial ones), write
    experiment.json and verdict.json, and return the verdict.

    ``scale`` is one of :data:`SCALES`; ``overrides`` (``["key=value", ...]``) are checked before
    anything is written (:meth:`Experiment.check`). The experiment directory is locked for the
    whole call: a second ``senslab run`` on it fails at once (see
    :meth:`senslab.train.rundir.RunDir.writing`)."""
    check_scale(scale)
    exp = get_experiment(name)
    exp.check(scale, list(overrides or []))
    out = Path(out_dir)
    with RunDir(out, kind="experiment").writing():
        return _run_locked(exp, out, scale, list(overrides or []), progress, log)


def _run_locked(exp: Experiment, out: Path, scale: str, overrides: list[str],
                progress: bool | None, log: Callable[[str], None]) -> dict[str, Any]:
    previous = _previous_verdict(out, scale, overrides)
    start = time.perf_counter()
    summaries = exp.execute(out, scale, overrides, progress, log)
    verdict = exp.verdict(summaries)
    seconds = round(time.perf_counter() - start, 1)
    # Provenance for REPRODUCTION.md. A verdict.json is written only once every run finished,
    # so re-running the same experiment reuses finished runs: its runtime stays that of the
    # run that did the work, and this invocation's time is kept apart.
    runtime = previous.get("runtime_s", seconds) if previous else seconds
    verdict.update(scale=scale, overrides=list(overrides), runtime_s=runtime,
                   last_invocation_s=seconds,
                   finished=datetime.now(timezone.utc).isoformat(timespec="seconds"),
                   commit=git_commit(),
                   threads=torch.get_num_threads())
    RunDir(out, kind="experiment").write_json("verdict.json", verdict)
    return verdict


def _previous_verdict(out: Path, scale: str, overrides: list[str]) -> dict[str, Any] | None:
    """The verdict.json of an earlier run of the same experiment settings in ``out``, if any."""
    try:
        old = json.loads((out / "verdict.json").read_text())
    except (OSError, ValueError):
        return None
    same = old.get("scale") == scale and old.get("overrides") == overrides
    return old if same else None


def load_summaries(exp_dir: str | Path) -> list[dict[str, Any]]:
    exp = json.loads((Path(exp_dir) / "experiment.json").read_text())
    return [json.loads((Path(exp_dir) / r / "summary.json").read_text()) for r in exp["runs"]]
