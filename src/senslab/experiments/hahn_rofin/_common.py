"""Shared pieces of the Hahn & Rofin experiments (docs/definitions.md#hahn-and-rofin-setup): the
settings every one of them has, the run configuration of the ``boolean`` trainer built from them
(:mod:`senslab.train.loops.boolean`: training loop and measures), the ``--set`` refusals they
share (:class:`BooleanExperiment`) and least-squares fits."""

from __future__ import annotations

import dataclasses
import math
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

from ...train.loops.boolean import BooleanRunConfig, BooleanSetup
from ..base import Experiment, Run, Settings


@dataclass
class Setup(Settings, BooleanSetup):
    """The base of the four experiments' settings: the ``boolean`` trainer's training and
    measurement fields (:class:`~senslab.train.loops.boolean.BooleanSetup`) and ``seeds``."""


def boolean_run(name: str, s: BooleanSetup, info: dict[str, Any] | None = None,
                **run: Any) -> Run:
    """Run ``name`` of the ``boolean`` trainer: the training and measurement fields of ``s``,
    then ``run`` (label, function, n, seed, ...); ``info`` goes into its summary."""
    setup = {f.name: getattr(s, f.name) for f in dataclasses.fields(BooleanSetup)}
    return Run(name, BooleanRunConfig(**{**setup, "name": name, **run}), trainer="boolean",
               info=info or {})


#: why fresh-sampling runs (``train_size`` None) take no ``--set`` of the subset-training fields
SUBSET_ONLY = ("only subset training (train_size) uses it, and these runs train on fresh strings "
               "every step: it would be recorded but change no run")
#: ``BooleanExperiment.fixed`` of an experiment that trains on fresh strings
FRESH: dict[str, str] = {
    "train_size": ("these runs train on fresh strings every step (train_size None), as the claim "
                   "states: a subset of the cube would train every run on other data than its "
                   "name and the claim say; subset training is hr_random_functions, or one run "
                   "of your own with `senslab train`"),
    "function_seed": SUBSET_ONLY, "completion": SUBSET_ONLY}
#: ``BooleanExperiment.unused`` of an experiment that trains on fresh strings
FRESH_UNUSED: dict[str, str] = {
    "subset_batch": ("only subset training (train_size) draws its batches with it; these runs "
                     "train on `batch` fresh strings per step: set batch")}


class BooleanExperiment(Experiment):
    """An experiment of ``boolean`` trainer runs: :meth:`resolve` also catches two kinds of
    ``--set`` the base class lets through, each recorded in every run's config though it trains
    something else than the runs' names, labels and the claim say, or nothing else at all.

    * ``fixed``: run-configuration fields that say what each run trains on (the target, its
      length, the data) and that :meth:`runs` sets to one value for all runs or per run from
      settings (``function`` = parity in hr_parity_dynamics, ``train_size`` of a single k): a
      run-configuration override that changes one of them is refused with the reason given.
      (A field whose value differs between the runs is refused by the base class already.)
    * ``unused``: settings fields these runs do not use (``batch`` in subset training): a
      ``--set`` of one changes no number, so it is warned (a ``UserWarning`` with the reason
      given), not refused: one list of ``--set`` for several experiments stays usable."""

    fixed: ClassVar[dict[str, str]] = {}
    unused: ClassVar[dict[str, str]] = {}

    def resolve(self, scale: str, overrides: list[str] | tuple[str, ...] = ()
                ) -> tuple[Any, list[Run]]:
        settings, runs = super().resolve(scale, overrides)
        names = {f.name for f in dataclasses.fields(settings)}
        built = self.runs(settings)  # with the settings overrides, before the run ones
        for item in overrides:
            key = item.split("=", 1)[0].strip()
            if key.split(".", 1)[0] in names:
                if key in self.unused:
                    warnings.warn(f"--set {item}: {self.name} does not use {key}: "
                                  f"{self.unused[key]}; the runs record it in their config, "
                                  "but it changes no number", UserWarning, stacklevel=2)
            elif key in self.fixed:
                was = [getattr(b.config, key) for b in built]
                if any(getattr(r.config, key) != w for r, w in zip(runs, was, strict=True)):
                    shown = ", ".join(sorted({repr(w) for w in was}))
                    raise ValueError(
                        f"--set {item}: {self.name} sets {key} itself ({shown} in its runs); "
                        f"{self.fixed[key]} ({self.name}'s settings: "
                        f"{', '.join(f.name for f in dataclasses.fields(settings))})")
        return settings, runs


def refuse_empty(s: Any, names: Sequence[str], runs: str) -> None:
    """Refuse settings ``s`` where any of the lists ``names`` is empty, saying what the ``runs``
    are made of: an empty list trained nothing (or failed deep in the sweep, naming no setting)
    and was recorded as "not comparable"."""
    empty = [name for name in names if not getattr(s, name)]
    if empty:
        raise ValueError(f"{' and '.join(empty)} {'is' if len(empty) == 1 else 'are'} empty: "
                         f"{runs}; give at least one of each, e.g. --set "
                         "functions=parity,majority --set n_values=[4,6,8]")


def refuse_repeated_names(summaries: Sequence[dict[str, Any]], into: str, unit: str) -> None:
    """Refuse two summaries of one run name: the run would enter ``into`` ("the mean over
    seeds", "the correlation") twice, as two independent ``unit``s."""
    seen: set[str] = set()
    for s in summaries:
        if s["name"] in seen:
            raise ValueError(f"two runs named {s['name']}: each would enter {into} as an "
                             f"independent {unit}; judge one run directory per {unit} (remove "
                             "or rename the other)")
        seen.add(s["name"])


def linear_fit(xs: list[float], ys: list[float]) -> tuple[float, float, float]:
    """Least-squares slope, its standard error and the intercept of y on x.

    se(slope) = sqrt(Σ r² / (m − 2) / Σ (x − x̄)²) for m points (NaN for m ≤ 2)."""
    m = len(xs)
    if m < 2 or len(set(xs)) < 2:
        raise ValueError(f"a slope needs at least two distinct x values, got {sorted(set(xs))}")
    xbar, ybar = sum(xs) / m, sum(ys) / m
    sxx = sum((x - xbar) ** 2 for x in xs)
    slope = sum((x - xbar) * (y - ybar) for x, y in zip(xs, ys, strict=True)) / sxx
    intercept = ybar - slope * xbar
    if m <= 2:
        return slope, math.nan, intercept
    rss = sum((y - intercept - slope * x) ** 2 for x, y in zip(xs, ys, strict=True))
    return slope, math.sqrt(rss / (m - 2) / sxx), intercept


def slope(points: Sequence[tuple[float, float]]) -> float:
    """Least-squares slope of y on x over ``(x, y)`` points; NaN with fewer than two distinct x
    (a bootstrap resample that drew one n only, :func:`senslab.verdicts.bootstrap`)."""
    xs = [float(x) for x, _ in points]
    if len(set(xs)) < 2:
        return math.nan
    return linear_fit(xs, [float(y) for _, y in points])[0]


