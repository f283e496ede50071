"""The trainer registry: every way senslab trains a run, by name.

A trainer takes a run's configuration (a dataclass: :class:`~senslab.train.config.RunConfig` for
``"fit"``, its own for the others) and a run directory, trains, and returns the run's summary.
Every trainer writes the same run directory (docs/run-directory.md: ``config.json``,
``env.json``, ``metrics.jsonl``, checkpoints, ``summary.json``), reuses a finished run of the
same configuration, refuses a directory that holds another one, and resumes an interrupted run
from its newest checkpoint bit-identically (same seed, same thread count: same numbers).

Experiments name a trainer and hold no optimizer and no step loop (see
:mod:`senslab.experiments.base`):

===================  ==================================================================
``fit``              the standard minibatch loop, :func:`senslab.train.loop.fit`
``boolean``          a Boolean transformer on PARITY, MAJORITY, … (Hahn & Rofin)
``attention``        one-layer attention geometry, fixed or joint head (implicit bias)
``sparse_frequent``  the sparse/frequent-token task (low-sensitivity paper, §4.1)
``grokking``         modular addition until it generalises
``sparse_parity``    sparse parity with a transformer, progress measures
``pretrained``       no training: a pretrained (timm) model measured on images
===================  ==================================================================

(the table lists the trainers registered by senslab's own modules; ``list_trainers()`` is the
authority.)
"""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..registry import Registry


@dataclass(frozen=True)
class Trainer:
    """A registered trainer.

    ``train(config, path, progress=..., log=...)`` trains one run into ``path`` and returns its
    summary; ``check(config)`` runs before anything is written (finds the data, so that a
    missing dataset stops an experiment before its first run); ``config_type`` is the
    dataclass its runs are configured by; ``example()`` returns a small configuration that
    trains in a few seconds on a CPU with several checkpoints (the tests kill and resume it).

    ``check_dir(config, path)`` refuses, taking no lock and writing nothing, what ``train``
    would refuse in the run directory ``path`` before it trains (a run of another configuration
    that trained there, a checkpoint of a newer senslab, …). An experiment calls it for every
    run before it sets an earlier verdict aside (:func:`senslab.experiments.base.
    run_experiment`): refused by ``train`` only, settings the runs refuse left a finished
    directory reading as unfinished. None: no such check (the refusal then comes from ``train``,
    after the verdict was set aside, which is put back only when no run trained).

    ``label(config)`` is the label the run's summary gives where its configuration leaves
    ``label`` empty, read from the run's config.json (a dict): a report shows an unfinished
    run under the label its finished runs have. None: the summary's label is the
    configuration's own ``label`` (or the run's name), and the report reads it from there.
    """

    name: str
    config_type: type
    train: Callable[..., dict[str, Any]]
    check: Callable[[Any], None] | None = None
    example: Callable[[], Any] | None = None
    check_dir: Callable[[Any, Path], None] | None = None
    label: Callable[[dict[str, Any]], Any] | None = None


TRAINERS: Registry[Trainer] = Registry("trainer")  # type: ignore[type-var]

def register_trainer(name: str, config_type: type,
                     check: Callable[[Any], None] | None = None,
                     example: Callable[[], Any] | None = None,
                     check_dir: Callable[[Any, Path], None] | None = None,
                     label: Callable[[dict[str, Any]], Any] | None = None,
                     ) -> Callable[[Callable[..., dict[str, Any]]], Callable[..., dict[str, Any]]]:
    """Decorator: register ``fn(config, path, *, progress, log) -> summary`` as trainer
    ``name`` for configurations of type ``config_type`` (see :class:`Trainer`)."""

    def deco(fn: Callable[..., dict[str, Any]]) -> Callable[..., dict[str, Any]]:
        trainer = Trainer(name, config_type, fn, check, example, check_dir, label)
        TRAINERS.register(name)(trainer)  # type: ignore[arg-type]
        return fn

    return deco


def _load() -> None:
    """Import every module of :mod:`senslab.train.loops` (each registers its trainer)."""
    loops = importlib.import_module("senslab.train.loops")
    for info in pkgutil.iter_modules(loops.__path__, prefix=f"{loops.__name__}."):
        if not info.name.rsplit(".", 1)[-1].startswith("_"):
            importlib.import_module(info.name)


def get_trainer(name: str) -> Trainer:
    _load()
    return TRAINERS.get(name)  # type: ignore[return-value]


def list_trainers() -> list[str]:
    _load()
    return TRAINERS.names()


def trainer_of(raw: Any, besides: str | None = None, *, unique: bool = False) -> str | None:
    """The registered trainer other than ``besides`` whose configuration has every top-level key
    of the config.json ``raw`` (of several, the one with the fewest fields ``raw`` lacks; with
    ``unique``, None: no guess), or None — also where every key is one of ``besides``'s own (a
    run of that trainer)."""
    import dataclasses

    if not isinstance(raw, dict) or not raw:
        return None
    keys, best, lacking, found = set(raw), None, 0, 0
    if besides is not None and keys <= {
            f.name for f in dataclasses.fields(get_trainer(besides).config_type)}:
        return None
    for name in list_trainers():
        config_type = get_trainer(name).config_type
        if name == besides or not dataclasses.is_dataclass(config_type):
            continue
        fields = {f.name for f in dataclasses.fields(config_type)}
        if keys <= fields:
            found += 1
            if best is None or len(fields - keys) < lacking:
                best, lacking = name, len(fields - keys)
    return None if unique and found > 1 else best


def experiment_of(run: Path) -> str:
    """`` (of experiment NAME, in DIR)`` when ``run``'s parent is an experiment directory
    that lists it, else ``""``."""
    import json

    try:
        info = json.loads((Path(run).parent / "experiment.json").read_text())
    except (OSError, ValueError):
        return ""
    if not isinstance(info, dict) or Path(run).name not in (info.get("runs") or []):
        return ""
    return f" (of experiment {info.get('name')}, in {Path(run).parent})"


def held_run(path: Path, old: Any, own: set[str], ours: str = "") -> str:
    """What the run directory ``path``, whose config.json is ``old``, holds in words, for a
    trainer whose configuration has the top-level keys ``own``: a run of the trainer whose
    keys ``old`` has (``ours`` said after its name), where ``own`` lacks some of them, else a
    run with a different configuration."""
    other = trainer_of(old) if isinstance(old, dict) and set(old) - own else None
    if other is None:
        return "a run with a different configuration"
    return (f"a run of the {other!r} trainer{experiment_of(path)}{ours}, so its configuration "
            "differs")


def train_run(trainer: str, config: Any, path: str | Path, *, progress: bool | None = None,
              log: Callable[[str], None] = print) -> dict[str, Any]:
    """Train ``config`` with the trainer named ``trainer`` into ``path``; returns the summary."""
    t = get_trainer(trainer)
    if not isinstance(config, t.config_type):
        raise TypeError(f"trainer {trainer!r} takes a {t.config_type.__name__}, got "
                        f"{type(config).__name__}")
    return t.train(config, Path(path), progress=progress, log=log)
