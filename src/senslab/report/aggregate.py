"""Aggregating runs over seeds: final-number tables and mean ± std training curves.

Runs that share a label differ only in their seed (:func:`~senslab.report.runs.load_runs` sees
to that), so a label's number is the mean over its runs
and its spread the sample standard deviation

    std = sqrt( Σ_r (v_r − mean)² / (R − 1) ),   R ≥ 2 runs,

which estimates the seed-to-seed variation. A label with a single run has no seed spread; where
the run logged a standard error for the metric (``<key>_se``, e.g. ``sens/train_se``) that is
shown instead, marked "se".

Only finished runs are averaged: a run without ``summary.json`` (stopped, or still training)
is its own row and curve, labelled ``<label> (unfinished, step N)``
(:attr:`~senslab.report.runs.Run.group_label`), since its last logged values describe a model
trained for fewer steps, and their gap to the finished runs is not seed-to-seed variation.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from senslab.report.runs import Run, group_by_label

# Column order for tables; other numeric metrics follow alphabetically.
KNOWN_KEYS = (
    "epoch",
    "train/acc",
    "val/acc",
    "test/acc",
    "train/loss",
    "val/loss",
    "test/loss",
    "sens/train",
    "sens/val",
    "bool_sens",
    "weight_norm",
    "sharpness/shop",
    "sharpness/shpred",
    "sharpness/loss",
)
# Keys that are bookkeeping or another metric's error bar, never a column of their own.
SKIP_KEYS = frozenset({"step", "time"})
SKIP_SUFFIXES = ("_se", "_ci", "_positions", "_per_position")


def is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


@dataclass(frozen=True)
class Stat:
    """A number with its spread: ``mean ± spread`` where ``kind`` says what the spread is
    (``"std"`` over ``n`` ≥ 2 runs, ``"se"`` a single run's standard error, ``""`` none).

    A single run's standard error is marked in the text (``0.1 ± 0.01 (se)``): it is the
    error of one measurement, not the seed-to-seed spread a std over runs is, and a table
    holding both would otherwise print them alike (before 2026-12-06 ``senslab report`` did).
    ``of`` is how many runs the number's row holds, where only ``n`` of them have the metric:
    the text then says so (``0.2 ± 0.14 (2 of 3 runs)``). ``null`` is how many of the others
    logged the metric as null (not known: a NaN or inf, e.g. a run that diverged, is written
    as null), said apart from runs that never logged it (``0.6 ± 0.14 (2 of 3 runs, 1 null)``):
    the mean of the seeds that did not diverge is not the label's. A row whose runs all logged
    null has ``n`` 0 and a NaN mean, and reads ``null``."""

    mean: float
    spread: float | None = None
    n: int = 1
    kind: str = ""
    of: int | None = None
    null: int = 0

    def __str__(self) -> str:
        if self.n == 0:  # no number at all: every run that logged the metric logged null
            text = "null"
            if self.of is not None and self.null < self.of:
                text += f" ({self.null} of {self.of} runs)"
            return text
        text = format_number(self.mean, digits=_digits_beside(self.mean, self.spread))
        if self.spread is not None:
            text += f" ± {self.spread:.2g}" + (" (se)" if self.kind == "se" else "")
        if self.of is not None and self.n < self.of:
            text += f" ({self.n} of {self.of} runs" + (f", {self.null} null)" if self.null
                                                       else ")")
        return text


def _digits_beside(mean: float, spread: float | None) -> int:
    """Significant digits for ``mean`` shown beside ``spread`` (written to 2): at least 4, and
    enough to reach the spread's second digit. 4 alone wrote 1234.52 ± 0.014 as ``1235 ±
    0.014``, 34 spreads away, and labels of 0.98764 and 0.98761 (± 1.4e-05 each) alike."""
    if (spread is None or not math.isfinite(spread) or spread <= 0 or not math.isfinite(mean)
            or mean == 0):
        return 4
    need = math.floor(math.log10(abs(mean))) - (math.floor(math.log10(spread)) - 1) + 1
    return min(max(4, need), 17)


def format_number(value: Any, digits: int = 4) -> str:
    """Compact text for a table cell: ints as is, floats to ``digits`` (4) significant digits.

    A float that is not exactly ±1 never reads as ``1``: 4 digits would round an accuracy
    of 0.99996 to ``1``, a perfect score it is not, so it gets the digits it needs
    (``0.99996``). A whole number is written whole, as an int is: a table's numbers are
    floats (:func:`summarize`), and 4 digits wrote a run's epoch 12345 as ``1.234e+04``, and
    99999 as ``1e+05``."""
    if not isinstance(value, float):
        return str(value)
    if value.is_integer() and abs(value) < 1e15:  # exact below 2**53
        return str(int(value))
    text = f"{value:.{digits}g}"
    while text in ("1", "-1") and abs(value) != 1.0 and digits < 17:
        digits += 1
        text = f"{value:.{digits}g}"
    return text


def format_percent(value: float) -> str:
    """A fraction as a percentage to one decimal, where rounding never claims a bound: a value
    just under 1 reads ``>99.9%``, not ``100.0%``, and one just above 0 reads ``<0.1%``, not
    ``0.0%`` (perfect accuracy, and none at all, are exact claims)."""
    text = f"{value:.1%}"
    if text == "100.0%" and value < 1:
        return ">99.9%"
    if text == "0.0%" and value > 0:
        return "<0.1%"
    return text


def summarize(values: Sequence[float], se: float | None = None) -> Stat:
    """Mean ± sample std of ``values``; a single value carries ``se`` as its spread if given."""
    if not values:
        raise ValueError("summarize needs at least one value")
    arr = np.asarray(values, dtype=float)
    if len(arr) >= 2:
        return Stat(float(arr.mean()), float(arr.std(ddof=1)), len(arr), "std")
    if se is not None:
        return Stat(float(arr[0]), float(se), 1, "se")
    return Stat(float(arr[0]))


def metric_keys(runs: Sequence[Run]) -> list[str]:
    """Numeric scalar final metrics present in any run, a number or null (not known): known
    ones first, the rest sorted."""
    present: set[str] = set()
    for run in runs:
        for key, value in run.final.items():
            # null (a NaN or inf, written as null) is a column too: a metric null in every run
            # (one that diverged before its first measurement, a sharpness of inf at each) was
            # dropped unsaid, as if never measured
            if ((value is None or is_number(value)) and key not in SKIP_KEYS
                    and not key.endswith(SKIP_SUFFIXES)):
                present.add(key)
    known = [k for k in KNOWN_KEYS if k in present]
    return known + sorted(present - set(known))


def final_table(
    runs: Sequence[Run], keys: Sequence[str] | None = None, per_run: bool = False
) -> list[dict[str, Any]]:
    """One row per label (or per run with ``per_run=True``) of final numbers.

    Each row has ``label``, ``runs`` (how many runs it aggregates), ``seeds`` and, per metric key,
    a :class:`Stat` (mean ± std over the label's runs that logged it, ``n`` of them; a single
    value shows its own run's ``<key>_se`` when logged, ``± nan`` when logged as null). A
    metric a run never logged, or logged as null last (not known: a NaN or inf is written as
    null), is left out of that run's mean, and the Stat's text says over how many of the row's
    runs it is, and how many of the others are null (``0.2 ± 0.14 (2 of 3 runs, 1 null)``); a
    label whose runs are all null has a Stat that reads ``null`` (NaN mean, ``n`` 0), and one
    where no run logged it has no entry for it. Per-run rows have ``label``, ``run`` (its
    name) and ``seed``. An unfinished run (no ``summary.json``) is left out of its label's row
    and has a row of its own, labelled ``<label> (unfinished, step N)``.
    """
    keys = list(keys) if keys is not None else metric_keys(runs)
    groups = [[r] for r in runs] if per_run else list(group_by_label(runs).values())
    rows = []
    for group in groups:
        row: dict[str, Any] = {"label": group[0].group_label}
        if per_run:
            row["run"], row["seed"] = group[0].name, group[0].seed
        else:
            row["runs"], row["seeds"] = len(group), [r.seed for r in group]
        finals = [r.final for r in group]
        for key in keys:
            supplied = [f for f in finals if is_number(f.get(key))]
            values = [f[key] for f in supplied]
            # null: the run logged the metric, but not a number (a NaN or inf, written as null)
            null = sum(1 for f in finals if key in f and f[key] is None)
            if not values:
                if null:  # a label whose every run diverged read "-", as if never measured
                    row[key] = Stat(math.nan, n=0, of=len(group), null=null)
                continue
            # a single value's standard error is that run's, not the label's first run's
            se = supplied[0].get(f"{key}_se") if len(values) == 1 else None
            if len(values) == 1 and se is None and f"{key}_se" in supplied[0]:
                # logged as null: not known (a standard error over one example is NaN, written
                # as null), not absent; it read as a number known exactly ("0.3"), where the
                # same NaN written bare by an older senslab read "0.3 ± nan (se)"
                se = math.nan
            stat = summarize(values, se if is_number(se) else None)
            # a run that lacks the metric is left out: the row's run count is not this one's
            row[key] = (replace(stat, of=len(group), null=null) if len(values) < len(group)
                        else stat)
        rows.append(row)
    return rows


def format_table(rows: Sequence[dict[str, Any]], columns: Sequence[str] | None = None) -> str:
    """Plain-text table with aligned columns (numbers right-aligned) for the terminal."""
    if not rows:
        return "(no runs)"
    if columns is None:
        columns = []
        for row in rows:
            columns += [k for k in row if k not in columns and k != "seeds"]
    cells = [[_cell(row.get(c)) for c in columns] for row in rows]
    widths = [max(len(c), *(len(r[i]) for r in cells)) for i, c in enumerate(columns)]
    numeric = [all(_is_numeric_cell(row.get(c)) for row in rows) for c in columns]

    def line(items: Sequence[str]) -> str:
        parts = [
            s.rjust(w) if num else s.ljust(w)
            for s, w, num in zip(items, widths, numeric, strict=True)
        ]
        return "  ".join(parts).rstrip()

    out = [line(list(columns)), line(["-" * w for w in widths])]
    out += [line(r) for r in cells]
    return "\n".join(out)


def _cell(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, list):
        return ",".join(str(v) for v in value)
    return str(value) if isinstance(value, Stat) else format_number(value)


def _is_numeric_cell(value: Any) -> bool:
    return value is None or isinstance(value, Stat) or is_number(value)


@dataclass
class Curve:
    """A label's metric over training, aggregated over its runs at each logged step.

    ``low``/``high`` bound the shaded band: mean ± std where ≥ 2 runs logged the step, else the
    single run's 95% interval (``<key>_ci``, or value ± 1.96·``<key>_se``), NaN where unknown.

    ``count`` is how many runs each point holds, ``runs`` how many of the label's runs logged
    ``key`` at all and ``of`` how many runs the label holds (as :class:`Stat`'s ``n`` and
    ``of``): a point is the mean of all of them only where ``count == runs == of``.
    ``null`` holds the steps where a run logged ``key`` as null (not known: a NaN or inf is
    written as null), which are in no point of that run.
    """

    label: str
    key: str
    steps: np.ndarray
    epochs: np.ndarray
    mean: np.ndarray
    low: np.ndarray
    high: np.ndarray
    count: np.ndarray
    runs: int | None = None
    of: int | None = None
    null: tuple[int, ...] = ()

    @property
    def full(self) -> np.ndarray:
        """Where the point is the mean of every run that logged ``key`` (``count == runs``).

        Elsewhere it is the mean of fewer: the others stopped earlier, or logged ``key`` at
        other steps (interleaved steps would otherwise zigzag between single runs' values,
        drawn as a mean over seeds)."""
        n = self.runs if self.runs is not None else int(self.count.max())
        return self.count == n

    def x(self, axis: str) -> np.ndarray:
        return self.epochs if axis == "epoch" else self.steps.astype(float)


def aggregate_curve(runs: Sequence[Run], key: str) -> Curve | None:
    """Align ``runs`` (one label: one group of :func:`~senslab.report.runs.group_by_label`) on
    ``step`` and average ``key``; ``None`` if none logged it.

    Runs with the same config log the same steps, so aligning on the step is exact; a seed that
    stopped early contributes to fewer steps (``count`` says how many runs each point has).
    Where ``count`` is below its maximum the mean is over the remaining runs alone, not the
    label's (after a seed stops, the curve would jump to the longer seeds' values):
    :func:`~senslab.report.plots.plot_curves` draws those steps faded and warns. A label's run
    that never logged ``key`` is in no point: ``runs`` < ``of`` then says the whole curve is
    over only some of the label's runs.
    """
    per_step: dict[int, list[tuple[float, float, float, float]]] = {}
    logged = 0
    null: set[int] = set()
    for run in runs:
        null.update(int(row["step"]) for row in run.metrics if key in row and row[key] is None)
        steps, epochs, values = run.series(key)
        logged += any(is_number(v) for v in values)
        ci_steps, _, cis = run.series(f"{key}_ci")
        se_steps, _, ses = run.series(f"{key}_se")
        ci_at = dict(zip(ci_steps, cis, strict=True))
        se_at = dict(zip(se_steps, ses, strict=True))
        for step, epoch, value in zip(steps, epochs, values, strict=True):
            if not is_number(value):
                continue
            low, high = _interval(value, ci_at.get(step), se_at.get(step))
            per_step.setdefault(step, []).append((epoch, float(value), low, high))
    if not per_step:
        return None
    steps = sorted(per_step)
    mean, low, high, count, epochs = [], [], [], [], []
    for step in steps:
        pts = per_step[step]
        vals = np.array([p[1] for p in pts])
        epochs.append(pts[0][0])
        mean.append(vals.mean())
        count.append(len(pts))
        if len(pts) >= 2:
            sd = vals.std(ddof=1)
            low.append(vals.mean() - sd)
            high.append(vals.mean() + sd)
        else:
            low.append(pts[0][2])
            high.append(pts[0][3])
    return Curve(
        runs[0].group_label,
        key,
        np.array(steps),
        np.array(epochs, dtype=float),
        np.array(mean),
        np.array(low),
        np.array(high),
        np.array(count),
        runs=logged,
        of=len(runs),
        null=tuple(sorted(null)),
    )


def _interval(value: float, ci: Any, se: Any) -> tuple[float, float]:
    """A single run's 95% interval: its logged CI, else value ± 1.96·se, else unknown (NaN)."""
    if isinstance(ci, list | tuple) and len(ci) == 2 and all(is_number(c) for c in ci):
        return float(ci[0]), float(ci[1])
    if is_number(se):
        return value - 1.96 * se, value + 1.96 * se
    return math.nan, math.nan
