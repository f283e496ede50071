"""Shared pieces of the Hahn & Rofin experiments (docs/definitions.md#hahn-and-rofin-setup): the
settings every one of them has, the run configuration of the ``boolean`` trainer built from them
(:mod:`senslab.train.loops.boolean`: training loop and measures) and least-squares fits."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ...train.loops.boolean import BooleanRunConfig, BooleanSetup
from ..base import Run, Settings


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
