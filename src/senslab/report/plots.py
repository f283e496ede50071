"""Plots of run directories: training curves, final bars, per-position profiles, scatter.

Every function takes loaded :class:`~senslab.report.runs.Run` objects and an output path, writes
one PNG and returns its path. matplotlib is imported inside the functions (``import senslab``
stays light) and only through its object-oriented API (``Figure`` + Agg), never ``pyplot``: no
global figure state, no GUI backend, nothing ever shown. A label keeps its colour in every plot of
a report, and mostly across reports, because its colour follows from its own text
(:func:`label_colors`; only two labels that want one colour push one of them to another), and
every figure takes its colours from all the runs it is given, not only from those it draws.
"""

from __future__ import annotations

import io
import math
import threading
import warnings
import zlib
from collections.abc import Collection, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from senslab.report.aggregate import (
    Curve,
    aggregate_curve,
    final_table,
    format_number,
    format_percent,
    is_number,
    metric_keys,
)
from senslab.report.runs import PathLike, Run, group_by_label
from senslab.train.rundir import atomic_write_bytes

if TYPE_CHECKING:
    from matplotlib.figure import Figure

# (panel title, y-axis label, metric keys drawn in it); other numeric metrics get a panel each.
PANELS: tuple[tuple[str, str, tuple[str, ...]], ...] = (
    ("Accuracy", "accuracy", ("train/acc", "val/acc", "test/acc")),
    ("Loss", "loss", ("train/loss", "val/loss", "test/loss")),
    ("Token-wise sensitivity", "P(prediction flips)", ("sens/train", "sens/val")),
    ("Boolean sensitivity", "average sensitivity", ("bool_sens",)),
    ("Weight norm", "‖θ‖₂", ("weight_norm",)),
    ("Sharpness ShOp", "E‖f(θ+Δ) − f(θ)‖₁", ("sharpness/shop",)),
    ("Sharpness ShPred", "P(prediction changes)", ("sharpness/shpred",)),
    ("Sharpness (loss)", "E L(θ+Δ) − L(θ)", ("sharpness/loss",)),
)
SPLIT_STYLES = {"train": "-", "val": "--", "test": ":"}
#: opacity of a curve where it is the mean of only some of its label's runs
FEWER_ALPHA = 0.4
YLABELS = {k: ylabel for _, ylabel, keys in PANELS for k in keys}
# House style, applied through rc_context so the caller's matplotlib settings are left alone.
STYLE = {
    "font.size": 9,
    "axes.titlesize": 10,
    "axes.grid": True,
    "grid.alpha": 0.3,
    "axes.spines.top": False,
    "axes.spines.right": False,
    "legend.frameon": False,
    "savefig.dpi": 110,
}


def label_colors(labels: Collection[str]) -> dict[str, Any]:
    """A colour per label that depends on the label's own text, not on which other labels are
    drawn, so a label has the same colour in every figure of a report and in the reports of
    other run sets.

    Assigning colours by rank in the label list (as before) shifted every colour when a label
    was added or missing: the bar chart, which leaves out labels without the metric, drew ``b``
    in ``a``'s colour of the curves next to it. Each label now prefers the tab10 colour its
    CRC-32 picks (stable across processes, unlike ``hash``; tab10's grey is left out); two
    labels that prefer the same colour must still be told apart, so the later in sorted order
    takes the next free one, after tab10's nine the lighter shades of tab20. More than 18
    labels cannot all have distinct palette colours: they are spread evenly over a continuous
    colour map instead (distinct, but then a label's colour depends on how many there are).
    """
    import matplotlib

    names = sorted(set(labels))
    strong = matplotlib.colormaps["tab10"]
    light = matplotlib.colormaps["tab20"]
    # tab10's grey (7) is left out: grey is the legend's colour for line styles and faded tails
    hues = [i for i in range(10) if i != 7]
    palette = [strong(i) for i in hues] + [light(2 * i + 1) for i in hues]
    n = len(hues)
    if len(names) > len(palette):
        spread = matplotlib.colormaps["turbo"]
        return {name: spread(i / (len(names) - 1)) for i, name in enumerate(names)}
    taken: set[int] = set()
    out = {}
    for name in names:
        first = zlib.crc32(name.encode("utf-8")) % n
        order = [(first + k) % n for k in range(n)]
        slot = next(s for s in order + [n + s for s in order] if s not in taken)
        taken.add(slot)
        out[name] = palette[slot]
    return out


def _run_colors(runs: Sequence[Run]) -> dict[str, Any]:
    """The colours of all of ``runs``' labels, also those a figure leaves out (no such metric):
    two labels that prefer one colour are resolved the same way in every figure of a report."""
    return label_colors({run.group_label for run in runs})


def _split(key: str) -> str:
    """``train/acc`` -> ``train``; ``sens/val`` -> ``val``; keys without a split -> ``""``."""
    parts = key.split("/")
    return next((p for p in parts if p in SPLIT_STYLES), "")


def _figure(width: float, height: float) -> Figure:
    from matplotlib.figure import Figure

    return Figure(figsize=(width, height), layout="constrained")


#: the PNG this thread wrote last: (path, bytes) (:func:`written_png`)
_WRITTEN = threading.local()


def _save(fig: Figure, out: PathLike) -> Path:
    """Write ``fig`` as the PNG file ``out`` atomically (a reader never sees part of it), and
    keep its bytes for :func:`written_png`."""
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    _WRITTEN.last = (out, buf.getvalue())
    atomic_write_bytes(out, _WRITTEN.last[1])
    return out


def written_png(path: Path) -> bytes:
    """The PNG this thread has just written to ``path`` (its last plot), as written: another
    report writing into the same folder at the same time may have replaced the file since, and
    report.html embedded its figures, or half of one, beside its own table."""
    last = getattr(_WRITTEN, "last", None)
    if last is None or last[0] != path:
        raise RuntimeError(f"{path} is not the PNG this thread wrote last")
    del _WRITTEN.last
    return last[1]


def _plain(text: str) -> str:
    """``text`` (a label or metric key: user text) as matplotlib is to draw it, letter for
    letter: matplotlib reads what stands between two ``$`` as mathtext, so that the label
    ``$5 vs $1e-3`` was drawn as ``5 vs 1e-3`` in italics, and ``a $_$ b`` failed the whole
    report with a bare ``ValueError`` from the mathtext parser. An escaped ``\\$`` is drawn
    as ``$``."""
    return text.replace("$", r"\$")


def _label_handles(
    colors: dict[str, Any], labels: Sequence[str], points: bool = False
) -> list[Any]:
    """Legend entries, one per label: a line, or a dot for scatter plots."""
    from matplotlib.lines import Line2D

    style = {"marker": "o", "ls": ""} if points else {"lw": 2}
    return [Line2D([], [], color=colors[lb], label=_plain(lb), **style) for lb in labels]


def _draw_lone_points(ax: Any, xs: np.ndarray, curve: Curve, drawn: np.ndarray, color: Any,
                     mark: bool) -> None:
    """Draw the points of ``curve`` (where ``drawn``) that have no drawn neighbour: a line
    between NaNs draws nothing of them, nor does a band, whose area there has no width. A curve
    of one point (a model measured once, by two seeds) was drawn with no band, as if its seeds
    agreed exactly: its band is drawn as an error bar, and ``mark`` adds the point's marker
    (a curve of three or more points had none)."""
    shown = drawn & np.isfinite(curve.mean)
    alone = shown & ~np.r_[False, shown[:-1]] & ~np.r_[shown[1:], False]
    if not alone.any():
        return
    if mark:
        ax.plot(xs[alone], curve.mean[alone], color=color, ls="", marker="o", ms=4)
    band = alone & np.isfinite(curve.low) & np.isfinite(curve.high)
    if band.any():
        ax.vlines(xs[band], curve.low[band], curve.high[band], color=color, lw=2.5, alpha=0.35)


def curve_panels(
    runs: Sequence[Run], keys: Sequence[str] | None = None
) -> list[tuple[str, str, list[str]]]:
    """The panels :func:`plot_curves` draws: known groups first, then one per other metric.

    By default only metrics logged over training (in some run's ``metrics.jsonl``) get a panel:
    a number that exists only in ``summary.json`` has no curve to draw. A key of ``keys`` that
    no run logged over training gets its (empty) panel with a warning naming the keys there
    are: it was drawn without a word (a misspelt ``sens/trian``).
    """
    logged = {k for run in runs for row in run.metrics for k in row}
    if keys is None:
        present = {k for k in metric_keys(runs) if k in logged}
    else:
        if isinstance(keys, str):  # one key, not a collection of its characters
            keys = [keys]
        present = set(keys)
        unknown = [k for k in keys if k not in logged]
        if unknown:
            choices = [k for _, _, group in curve_panels(runs) for k in group]
            warnings.warn(
                f"no run logged {', '.join(map(repr, unknown))} over training (in its "
                f"metrics.jsonl), so its panel is empty; the metrics logged over training "
                f"are {', '.join(map(repr, choices)) or 'none'}: pass some of them as keys=, "
                "or keys=None for all", stacklevel=3)
    present.discard("epoch")
    panels = []
    for title, ylabel, group in PANELS:
        found = [k for k in group if k in present]
        if found:
            panels.append((title, ylabel, found))
            present -= set(found)
    panels += [(k, k, [k]) for k in sorted(present)]
    return panels


def plot_curves(
    runs: Sequence[Run],
    out: PathLike,
    *,
    x: str = "epoch",
    keys: Sequence[str] | None = None,
    logx: bool = False,
    logy: bool | Collection[str] = False,
    title: str | None = None,
) -> Path:
    """Metrics over training, one panel per metric group, one colour per label.

    Each line is the mean over the label's runs aligned on ``step``; the band is ± std across
    those runs (a single run shows its 95% CI when it logged ``<key>_ci`` or ``<key>_se``).
    Train/val/test of a metric share a panel, told apart by line style. ``x`` is ``"epoch"`` or
    ``"step"``; ``logy`` is ``True`` for every panel or a set of metric keys whose panels get a
    log y-axis; ``logx`` masks x = 0 (the step-0 evaluation), with a warning naming any curve
    left with no point. Where a run logs records without an epoch (a pretrained model's
    measurement), every curve is drawn against the step instead, and the axis says so.
    A point whose mean is NaN or inf (a run logged one) is not drawn, with a warning naming it.
    Where only some of a label's runs logged a step (the others stopped earlier, e.g. on
    reaching ``train.target_train_acc``, or logged at other steps) the mean there is over those
    runs alone, not the label's: the line goes on faded, without a band, and a warning names the
    steps. A metric that some of a label's runs never logged is the mean of the others over the
    whole curve: the legend says so under the label (``sens/train: 2 of 3 runs``), as the final
    table does, and a warning names it. A point ≤ 0 on a log y-axis cannot be drawn: a warning
    names it.
    """
    import matplotlib

    if x not in ("epoch", "step"):
        raise ValueError(f"x must be 'epoch' or 'step', got {x!r}")
    xlabel = "epoch" if x == "epoch" else "optimizer step"
    if x == "epoch" and any(row.get("epoch") is None for run in runs for row in run.metrics):
        # against the epoch, such a run's curves would have no x and draw nothing (an epoch
        # logged as null is no epoch either: it failed as a TypeError)
        x, xlabel = "step", "step (some runs log no epoch)"
    if isinstance(logy, str):  # one key, not a collection of its characters
        logy = {logy}
    panels = curve_panels(runs, keys)
    if not panels:
        raise ValueError("no metric to plot: the runs logged nothing besides step/epoch/time")
    if not isinstance(logy, bool):
        # a key of no panel gave no log axis anywhere, without a word (a misspelt key)
        drawn = [k for _, _, pkeys in panels for k in pkeys]
        stray = [k for k in logy if k not in drawn]
        if stray:
            warnings.warn(f"{out}: logy names {', '.join(map(repr, stray))}, which no panel "
                          "of the figure draws, so no axis is made logarithmic for it; the "
                          f"panels draw {', '.join(map(repr, drawn))} (logy=True makes every "
                          "axis logarithmic)", stacklevel=2)
    groups = group_by_label(runs)
    colors = _run_colors(runs)
    ncols = min(3, len(panels))
    nrows = math.ceil(len(panels) / ncols)
    splits_used: set[str] = set()
    not_finite: list[str] = []
    null: list[str] = []  # points a run logged as null (a NaN or inf is written as null)
    fewer: list[str] = []
    nonpositive: list[str] = []
    # (key, label, x values) of the points at x ≤ 0, which a log x-axis cannot place, and
    # the curves that have no other point (nothing of them is drawn)
    off_axis: list[tuple[str, str, list[float]]] = []
    unseen: list[str] = []
    # label -> (key, k, R) for metrics only k of the label's R runs logged
    partial: dict[str, list[tuple[str, int, int]]] = {}
    with matplotlib.rc_context(STYLE):
        fig = _figure(3.8 * ncols + 1.6, 2.9 * nrows + 0.4)
        axes = fig.subplots(nrows, ncols, squeeze=False).ravel()
        for ax, (ptitle, ylabel, pkeys) in zip(axes, panels, strict=False):
            panel_log = logy is True or (not isinstance(logy, bool)
                                         and bool(set(pkeys) & set(logy)))
            for label, group in groups.items():
                for key in pkeys:
                    curve = aggregate_curve(group, key)
                    if curve is None:
                        # every point null (a sharpness inf at each measurement): no line at
                        # all, where the table reads "null"; the panel is another label's
                        at = sorted({int(row["step"]) for run in group for row in run.metrics
                                     if key in row and row[key] is None})
                        if at:
                            null.append(f"{key} of {label!r} at {len(at)} step(s) (first: step "
                                        f"{at[0]}; every point, so no line at all)")
                        continue
                    bad = ~np.isfinite(curve.mean)
                    if bad.any():
                        not_finite.append(f"{key} of {label!r} at {int(bad.sum())} step(s) (first: "
                                          f"step {curve.steps[bad][0]}, "
                                          f"{format_number(float(curve.mean[bad][0]))})")
                    if curve.null:  # a diverged run's last points: the curve ended unsaid
                        null.append(f"{key} of {label!r} at {len(curve.null)} step(s) (first: "
                                    f"step {curve.null[0]})")
                    if curve.runs is not None and curve.of is not None and curve.runs < curve.of:
                        # the table says "(k of R runs)"; a curve drawn as the label's would not
                        partial.setdefault(label, []).append((key, curve.runs, curve.of))
                    masked = panel_log & np.isfinite(curve.mean) & (curve.mean <= 0)
                    if masked.any():
                        nonpositive.append(f"{key} of {label!r} at {int(masked.sum())} step(s) "
                                           f"(first: step {curve.steps[masked][0]}, "
                                           f"{format_number(float(curve.mean[masked][0]))})")
                    xs = curve.x(x)
                    # a log x-axis has no 0: the step-0 (epoch-0) evaluation every loop logs
                    # first, or a whole curve measured at step 0 alone, was left out unsaid
                    drawable = np.isfinite(curve.mean)
                    unplaced = logx & drawable & (xs <= 0)
                    if unplaced.any():
                        off_axis.append((key, label, [float(v) for v in xs[unplaced]]))
                        if unplaced.sum() == drawable.sum():
                            unseen.append(f"{key} of {label!r} (at {x} "
                                          f"{format_number(float(xs[unplaced][0]))}: "
                                          f"{format_number(float(curve.mean[unplaced][0]))})")
                    style = SPLIT_STYLES.get(_split(key), "-")
                    if len(pkeys) > 1:
                        splits_used.add(_split(key))
                    # where some of the label's runs have no point (they stopped earlier, e.g.
                    # at train.target_train_acc) the mean is over the others alone: a tail that
                    # jumps to the longest seed's values, not the label's. Those steps are drawn
                    # faded under the full mean (which stops there), without a band.
                    full = curve.full
                    if not full.all():
                        fewer.append(f"{key} of {label!r} at {int((~full).sum())} step(s) "
                                     f"(first: step {curve.steps[~full][0]}, "
                                     f"{int(curve.count[~full][0])} of {curve.runs} runs)")
                        ax.plot(xs, curve.mean, color=colors[label], ls=style, lw=1.0,
                                alpha=FEWER_ALPHA, marker="o" if len(xs) < 3 else None)
                    # a lone point needs a marker to show
                    marker = "o" if int(full.sum()) < 3 else None
                    ax.plot(xs, np.where(full, curve.mean, np.nan), color=colors[label],
                            ls=style, lw=1.6, marker=marker)
                    if np.isfinite(curve.low[full]).any():
                        ax.fill_between(xs, np.where(full, curve.low, np.nan),
                                        np.where(full, curve.high, np.nan),
                                        color=colors[label], alpha=0.18, lw=0)
                    # a point beside one a log x-axis masks (step 0) is alone there too
                    _draw_lone_points(ax, xs, curve, full & ~unplaced, colors[label],
                                      marker is None)
            ax.set_title(_plain(ptitle))
            ax.set_xlabel(xlabel)
            ax.set_ylabel(_plain(ylabel))
            if logx:
                ax.set_xscale("log", nonpositive="mask")
            if panel_log:
                ax.set_yscale("log", nonpositive="mask")
        for ax in axes[len(panels) :]:
            fig.delaxes(ax)
        handles = _label_handles(colors, list(groups))
        for handle, label in zip(handles, groups, strict=True):
            notes = partial.get(label)
            if notes:
                handle.set_label(handle.get_label() + "\n(" + "; ".join(
                    f"{_plain(k)}: {n} of {r} runs" for k, n, r in notes) + ")")
        if len(splits_used) > 1:
            from matplotlib.lines import Line2D

            handles += [
                Line2D([], [], color="0.3", ls=SPLIT_STYLES[s], label=s)
                for s in SPLIT_STYLES
                if s in splits_used
            ]
        if fewer:
            from matplotlib.lines import Line2D

            handles.append(Line2D([], [], color="0.3", lw=1.0, alpha=FEWER_ALPHA,
                                  label="faded: not all\nof a label's runs"))
        fig.legend(handles=handles, loc="outside right upper", title="label")
        fig.suptitle(title or "Training curves (mean ± std over seeds)")
        if fewer:
            warnings.warn(f"{out}: curves drawn faded, without a band, where only some of a "
                          f"label's runs logged a point (the others stopped earlier, or logged "
                          f"at other steps), as their mean there is not the label's: "
                          f"{'; '.join(fewer)}", stacklevel=2)
        if partial:
            # a run that logged the metric as null alone (a NaN or inf each time) is one of
            # "the others" too: it was said to have never logged it
            warnings.warn(f"{out}: some curves are the mean of only some of their label's runs, "
                          "as the others never logged the metric as a number (not at all, or "
                          "as null alone: a NaN or inf) (the legend says so under the "
                          "label): " + "; ".join(f"{k} of {lb!r}: {n} of {r} runs"
                                                 for lb, notes in partial.items()
                                                 for k, n, r in notes)
                          + "; the runs' metrics.jsonl say which", stacklevel=2)
        if nonpositive:
            warnings.warn(f"{out}: curve points not drawn as their mean is ≤ 0 on a log y-axis: "
                          f"{'; '.join(nonpositive)}; draw that panel without logy to see them",
                          stacklevel=2)
        if unseen:
            # the step-0 evaluation every loop logs first is left out of a log x-axis by design
            # (logx's documented mask, in every curve of a log-spaced schedule): said only
            # where a curve has no other point, so that nothing of it is drawn
            at = sorted({v for _, _, vs in off_axis for v in vs})
            warnings.warn(f"{out}: nothing is drawn of {'; '.join(unseen)}, as a log x-axis "
                          f"has no {x} ≤ 0 ({x} {', '.join(format_number(v) for v in at)} "
                          "left out) and the curve has no other point; draw the curves "
                          "without logx to see them", stacklevel=2)
        if null:
            warnings.warn(f"{out}: curve points missing where a run logged the metric as null "
                          f"(not known: a NaN or inf, e.g. of a run that diverged, is written as "
                          f"null): {'; '.join(null)}; the runs' metrics.jsonl say which",
                          stacklevel=2)
        if not_finite:
            warnings.warn(f"{out}: curves not drawn where their mean is NaN or inf (a run logged "
                          f"such a value): {'; '.join(not_finite)}; the runs' metrics.jsonl say "
                          "which", stacklevel=2)
        return _save(fig, out)


def plot_final_bars(
    runs: Sequence[Run],
    out: PathLike,
    *,
    key: str = "sens/train",
    acc_key: str | None = None,
    logy: bool = False,
    title: str | None = None,
) -> Path:
    """Final ``key`` per label as bars, annotated with the label's final ``acc_key``
    (default: ``"train/acc"`` where the runs logged it; one given that no run logged — a typo —
    is a warning, and the bars carry no annotation).

    Error bars: ± std over the label's seeds; a label with one run shows ± 1.96 s.e. (its
    ``<key>_se``), i.e. a 95% interval for that run's estimate; none if neither is known. A
    bar that cannot be drawn — NaN or inf, or ≤ 0 on a log y-axis (``logy``) — has its value
    written in its place, with a warning. A label none of whose runs logged ``key`` has no bar,
    and a warning names it.
    """
    import matplotlib

    given = acc_key is not None
    acc_key = "train/acc" if acc_key is None else acc_key
    table = final_table(runs, keys=[key, acc_key])
    if given and not any(acc_key in r for r in table):
        # a typo (acc_key="test_acc") left every bar without its accuracy, without a word
        warnings.warn(f"{out}: no run logged a final {acc_key!r}, so the bars carry no "
                      f"{acc_key}; pass acc_key= a metric the runs logged (their "
                      "metrics.jsonl)", stacklevel=2)
    rows = [r for r in table if key in r]
    if not rows:
        raise ValueError(f"no run has a final {key!r}; choose a metric the runs logged")
    # a label whose runs never logged the metric has no bar: a chart "per label" without it
    # reads as the labels there are (a boolean model beside token-wise ones measured bool_sens)
    absent = [r["label"] for r in table if key not in r]
    if absent:
        warnings.warn(f"{out}: no bar for {len(absent)} of {len(table)} label(s), as none of "
                      f"their runs logged a final {key}: {', '.join(map(repr, absent))}; "
                      "their final numbers are in the table (plot_final_bars' key= draws "
                      "another metric)", stacklevel=2)
    colors = _run_colors(runs)
    means = [r[key].mean for r in rows]
    errs = [
        r[key].spread * (1.96 if r[key].kind == "se" else 1.0) if r[key].spread else 0.0
        for r in rows
    ]
    # a NaN or inf mean draws no bar, which reads as 0: its value is written in its place
    bad = [i for i, m in enumerate(means) if not math.isfinite(m)]
    if bad:
        warnings.warn(f"{out}: the final {key} of "
                      + ", ".join(f"{rows[i]['label']!r} is {_bar_text(rows[i][key])}"
                                  for i in bad)
                      + " (a run has NaN or inf, or logged null: not known): no bar is drawn, "
                      "the value is written in its place; the per-run numbers say which run",
                      stacklevel=2)
        for i in bad:
            means[i], errs[i] = math.nan, 0.0
    # a bar ≤ 0 cannot be drawn on a log y-axis, and a tick without a bar reads as a value too
    # small to see (a negative sharpness/loss is one to see): it is written in its place too
    nonpositive = [i for i, m in enumerate(means) if logy and m <= 0]
    if nonpositive:
        warnings.warn(f"{out}: the final {key} of "
                      + ", ".join(f"{rows[i]['label']!r} is {format_number(means[i])}"
                                  for i in nonpositive)
                      + ", ≤ 0, which a log y-axis cannot draw: no bar is drawn, the value is "
                      "written in its place; draw the bars without logy to see it",
                      stacklevel=2)
        for i in nonpositive:
            means[i], errs[i] = math.nan, 0.0
    # a NaN or inf spread (a single run's s.e. from one example) draws no error bar, which
    # reads as a bar known exactly, or with no s.e. logged: it is written above the bar
    unbounded = [i for i, e in enumerate(errs) if not math.isfinite(e)]
    if unbounded:
        warnings.warn(f"{out}: the final {key} of "
                      + ", ".join(f"{rows[i]['label']!r} is {rows[i][key]}" for i in unbounded)
                      + ": a NaN or inf spread draws no error bar, so it is written above the "
                      "bar; the per-run numbers say which run (a standard error over a single "
                      "example is NaN: track more examples)", stacklevel=2)
    # a label's bar over fewer of its runs than the row holds says so under its name
    names = [_plain(r["label"]) + (f"\n({r[key].n} of {r[key].of} runs)"
                                   if r[key].of is not None and r[key].n < r[key].of else "")
             for r in rows]
    with matplotlib.rc_context(STYLE):
        fig = _figure(max(4.5, 1.0 + 0.9 * len(rows)), 3.8)
        ax = fig.subplots()
        pos = np.arange(len(rows))
        ax.bar(pos, means, yerr=errs, capsize=4, color=[colors[r["label"]] for r in rows])
        for i in bad + nonpositive:
            # at the axis' foot: a log axis has no 0
            ax.annotate(_bar_text(rows[i][key]), (pos[i], 0), xytext=(0, 3),
                        xycoords=ax.get_xaxis_transform() if logy else "data",
                        textcoords="offset points", ha="center", va="bottom", color="#c62828")
        for i, (p, m, e, row) in enumerate(zip(pos, means, errs, rows, strict=True)):
            lines = []
            if i in unbounded:
                stat = row[key]
                lines.append(f"± {format_number(stat.spread)}"
                             + (" (se)" if stat.kind == "se" else ""))
            if acc_key in row and math.isfinite(m):
                acc = row[acc_key].mean
                text = (_bar_text(row[acc_key]) if row[acc_key].n == 0 else format_percent(acc)
                        if 0 <= acc <= 1 else format_number(acc))
                lines.append(f"{_split(acc_key) or acc_key} acc\n{text}" if "acc" in acc_key
                             else text)
            if lines:
                ax.annotate(
                    "\n".join(lines),
                    (p, m + e if math.isfinite(e) else m),
                    xytext=(0, 3),
                    textcoords="offset points",
                    ha="center",
                    va="bottom",
                    fontsize=7,
                )
        ax.set_xticks(pos, names, rotation=30 if len(rows) > 4 else 0)
        ax.set_ylabel(f"final {_plain(key)}" + (f"\n{YLABELS[key]}" if key in YLABELS else ""))
        ax.margins(y=0.2)  # head room for the annotations
        ax.grid(axis="x", visible=False)
        if logy and any(math.isfinite(m) for m in means):  # no bar left: a log axis of
            # nothing fails to place its ticks (the values are written in place)
            ax.set_yscale("log", nonpositive="clip")  # "mask" hid every bar (from 0)
        ax.set_title(
            title or f"Final {_plain(key)} per label\n(± std over seeds; a single run ± 1.96 s.e.)"
        )
        return _save(fig, out)


def _bar_text(stat: Any) -> str:
    """A bar's value as written in its place: ``null`` where its runs logged null (not known),
    which a NaN mean would have read as a value computed to be NaN."""
    return "null" if stat.n == 0 else format_number(stat.mean)


def position_profile(run: Run, key: str = "sens/train") -> tuple[list[int], list[float]] | None:
    """The run's final per-position profile of ``key`` (``<key>_positions``, ``<key>_per_position``)
    or ``None`` when it logged none. A position no example reached is logged as null and comes
    back as NaN."""
    final = run.final
    pos, vals = final.get(f"{key}_positions"), final.get(f"{key}_per_position")
    if not isinstance(pos, list) or not isinstance(vals, list) or not pos:
        return None
    if len(pos) != len(vals):
        raise ValueError(
            f"run {run.path}: {key}_positions has {len(pos)} entries but {key}_per_position has "
            f"{len(vals)}; they must match one to one"
        )
    return [int(p) for p in pos], [math.nan if v is None else float(v) for v in vals]


def position_alignment(runs: Sequence[Run], key: str = "sens/train") -> str:
    """How the positions of ``runs``' per-position profiles of ``key`` count, in words for an
    axis or a caption: right-aligned from the end (negative: embedding tokens, −1 = the last
    real token), left-aligned from the start (0 and up: the token's index, for sequence
    vectors and image patches; docs/definitions.md#per-position-profile), or both. Every
    profile was drawn as right-aligned, and the first token of a left-aligned one read as the
    last but one."""
    positions = {p for r in runs for prof in [position_profile(r, key)] if prof is not None
                 for p in prof[0]}
    if positions and min(positions) >= 0:
        return "left-aligned, 0 = first token"
    if positions and max(positions) >= 0:  # some runs of each
        return "≥ 0 left-aligned (0 = first token), < 0 right-aligned (−1 = last token)"
    return "right-aligned, −1 = last token"


def has_positions(runs: Sequence[Run], key: str = "sens/train") -> bool:
    """Whether a run's final per-position profile of ``key`` has a value at some position (one
    whose every position is null, none reached, has nothing to draw)."""
    return any(prof is not None and not all(math.isnan(v) for v in prof[1])
               for prof in (position_profile(r, key) for r in runs))


def _no_value(label: str, key: str) -> str:
    """``label``, and why its per-position ``key`` has no line or colour: its profiles are null
    at every position."""
    return (f"{label!r}, whose runs' {key}_per_position are null at every position (no example "
            "reached one)")


def aggregate_positions(runs: Sequence[Run], key: str = "sens/train") -> Curve | None:
    """The per-position profile of one label (one group of
    :func:`~senslab.report.runs.group_by_label`), as a :class:`Curve` over positions
    (``steps`` holds the positions); ``None`` if none of ``runs`` logged one.

    At each position: the mean over the runs that reached it, ``count`` of them, and the band
    mean ± std over those runs where there are two or more. Where only one run reached a
    position its band is NaN (unknown), not a zero-width band: a single value says nothing
    about how much seeds differ, while a band of width 0 reads as "the seeds agree exactly".
    ``runs`` counts the runs that logged a profile, ``of`` the label's runs."""
    per_pos: dict[int, list[float]] = {}
    logged = 0
    for run in runs:
        prof = position_profile(run, key)
        if prof is None:
            continue
        logged += 1
        for p, v in zip(*prof, strict=True):
            if not math.isnan(v):  # no example reached this position in this run
                per_pos.setdefault(p, []).append(v)
    if not per_pos:
        return None
    xs = sorted(per_pos)
    mean = np.array([np.mean(per_pos[p]) for p in xs])
    sd = np.array([np.std(per_pos[p], ddof=1) if len(per_pos[p]) > 1 else math.nan for p in xs])
    return Curve(runs[0].group_label, key, np.array(xs), np.array(xs, dtype=float), mean,
                 mean - sd, mean + sd, np.array([len(per_pos[p]) for p in xs]),
                 runs=logged, of=len(runs))


def plot_position_profiles(
    runs: Sequence[Run], out: PathLike, *, key: str = "sens/train", title: str | None = None
) -> Path:
    """Final sensitivity per token position, one line per label (mean ± std over its runs;
    :func:`aggregate_positions`).

    Embedding tokens' positions are right-aligned (−1 = last real token), so sequences of
    different lengths line up at their end, where recency effects (e.g. an LSTM's) show; token
    vectors' (``Sequence``) count from 0 = the first token, and the axis says which
    (:func:`position_alignment`). A position that only some of
    a label's runs reached (their longest sequences differ) is the mean of those runs alone:
    as in :func:`plot_curves`, the line goes on faded there, without a band, and a warning names
    the positions. A label whose runs did not all log a profile says so in the legend.
    """
    import matplotlib
    from matplotlib.ticker import MaxNLocator

    profiles = {}
    empty: list[str] = []  # labels whose profiles are null at every position
    for label, group in group_by_label(runs).items():
        curve = aggregate_positions(group, key)
        if curve is not None:
            profiles[label] = curve
        elif any(position_profile(r, key) is not None for r in group):
            empty.append(_no_value(label, key))
    if not profiles and empty:
        raise ValueError(f"no per-position {key} to draw: {'; '.join(empty)}; the per-run "
                         f"numbers say which runs, and track more examples to reach positions")
    if not profiles:
        raise ValueError(
            f"no run logged {key}_positions / {key}_per_position; per-position profiles need "
            "sequence models tracked with per-position sensitivity"
        )
    colors = _run_colors(runs)
    fewer: list[str] = []
    with matplotlib.rc_context(STYLE):
        fig = _figure(6.4, 3.6)
        ax = fig.subplots()
        for label, curve in profiles.items():
            xs = curve.x("step")
            full = curve.full
            if not full.all():
                fewer.append(f"{label!r} at {int((~full).sum())} position(s) (first: "
                             f"{curve.steps[~full][0]}, {int(curve.count[~full][0])} of "
                             f"{curve.runs} runs)")
                ax.plot(xs, curve.mean, color=colors[label], lw=1.0, alpha=FEWER_ALPHA,
                        marker="." if len(xs) < 40 else None)
            ax.plot(xs, np.where(full, curve.mean, np.nan), color=colors[label], lw=1.6,
                    marker="." if len(xs) < 40 else None)
            if np.isfinite(curve.low[full]).any():  # a band needs two or more runs
                ax.fill_between(xs, np.where(full, curve.low, np.nan),
                                np.where(full, curve.high, np.nan),
                                color=colors[label], alpha=0.18, lw=0)
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))  # positions are whole tokens
        ax.set_xlabel(f"token position ({position_alignment(runs, key)})")
        ax.set_ylabel(YLABELS.get(key, _plain(key)))
        handles = _label_handles(colors, list(profiles))
        # the label's runs that logged no profile are in no point of it
        partial = [c for c in profiles.values() if c.runs is not None and c.of is not None
                   and c.runs < c.of]
        for handle, curve in zip(handles, profiles.values(), strict=True):
            if curve.runs is not None and curve.of is not None and curve.runs < curve.of:
                handle.set_label(f"{_plain(curve.label)}\n({curve.runs} of {curve.of} runs)")
        if fewer:
            from matplotlib.lines import Line2D

            handles.append(Line2D([], [], color="0.3", lw=1.0, alpha=FEWER_ALPHA,
                                  label="faded: not all\nof a label's runs"))
        fig.legend(handles=handles, loc="outside right upper")
        ax.set_title(title or f"Per-position {_plain(key)} (mean ± std over seeds)")
        if fewer:
            warnings.warn(f"{out}: per-position {key} drawn faded, without a band, where only "
                          "some of a label's runs reached a position, as their mean there is "
                          f"not the label's: {'; '.join(fewer)}", stacklevel=2)
        if partial:
            warnings.warn(f"{out}: the per-position {key} of "
                          + ", ".join(f"{c.label!r} is the mean of {c.runs} of {c.of} runs"
                                      for c in partial)
                          + f", as the others logged no {key}_per_position (the legend says "
                          "so under the label)", stacklevel=2)
        if empty:  # a label missing from the legend would read as one never measured
            warnings.warn(f"{out}: no line for {'; '.join(empty)}", stacklevel=2)
        return _save(fig, out)


def _model_tokens(run: Run) -> str | None:
    """What the tokens of ``run``'s model are, by the model its config.json names
    (``model.name``): ``"patches"`` for a registered image classifier (its config an
    ``ImageConfig``, whose default tokens are patches), ``"other"`` for another registered
    model (token vectors, ``Sequence``, count from 0 too), ``"unknown"`` for a name not
    registered in this process, None where the run names no model (a hand-written run)."""
    model = run.config.get("model")
    name = model.get("name") if isinstance(model, dict) else None
    if not isinstance(name, str):
        return None
    from senslab.models import model_config
    from senslab.models.vision import ImageConfig

    try:
        config = model_config(name)
    except Exception:  # not registered, or a factory that cannot build with its defaults
        return "unknown"
    return "patches" if isinstance(config, ImageConfig) else "other"


def patch_grid(runs: Sequence[Run], key: str = "sens/train") -> tuple[int, int] | None:
    """The patch grid of image runs' per-position profiles, or ``None`` for sequences.

    Image tokens are patches numbered row by row from 0; a profile whose positions are exactly
    ``0 … g² − 1`` (g ≥ 2) is a g × g grid. Embedding positions are right-aligned (negative),
    so they never qualify; token vectors (``Sequence``) count from 0 too, so a run whose
    config names its model is a grid only where that model is an image classifier (a
    16-token sequence model's profile was drawn as a 4 × 4 grid); a model not registered in
    this process is not guessed at (its profile is drawn as a line, with a warning). Every run
    with a profile must have the same grid."""
    grids = set()
    unknown: set[str] = set()
    for run in runs:
        prof = position_profile(run, key)
        if prof is None:
            continue
        pos = prof[0]
        g = math.isqrt(len(pos))
        if g < 2 or g * g != len(pos) or sorted(pos) != list(range(len(pos))):
            return None
        tokens = _model_tokens(run)
        if tokens == "other":
            return None
        if tokens == "unknown":
            unknown.add(str(run.config["model"]["name"]))
        grids.add((g, g))
    if unknown and len(grids) == 1:
        warnings.warn(f"the per-position {key} profiles are not drawn as a patch grid: the "
                      f"runs' model {', '.join(map(repr, sorted(unknown)))} is not registered "
                      "here, so whether its positions are image patches or a sequence's tokens "
                      "is not known; import the module that registers it to draw image patches "
                      "on their grid", stacklevel=2)
        return None
    return grids.pop() if len(grids) == 1 else None


def plot_position_heatmaps(
    runs: Sequence[Run], out: PathLike, *, key: str = "sens/train", title: str | None = None
) -> Path:
    """Final sensitivity per image patch, one heatmap over the patch grid per label (mean over
    its runs; one colour scale for all labels, so the panels compare). A label whose runs did not
    all log a profile is the mean of those that did: its panel's title says over how many, and
    a warning names it (as :func:`plot_position_profiles` does)."""
    import matplotlib

    grid = patch_grid(runs, key)
    if grid is None:
        raise ValueError(f"the runs' {key} profiles are not one square patch grid; use "
                         "plot_position_profiles for sequences")
    maps: dict[str, np.ndarray] = {}
    #: the panel title of each label: its name, and over how many of its runs, where not all
    names: dict[str, str] = {}
    partial: list[str] = []
    for label, group in group_by_label(runs).items():
        stack = []
        for run in group:
            prof = position_profile(run, key)
            if prof is not None:
                m = np.full(grid[0] * grid[1], np.nan)
                m[np.array(prof[0])] = prof[1]
                stack.append(m.reshape(grid))
        if stack:
            with warnings.catch_warnings():  # a patch no run reached is NaN: said below
                warnings.simplefilter("ignore", RuntimeWarning)
                maps[label] = np.nanmean(np.stack(stack), axis=0)
            names[label] = _plain(label)
            if len(stack) < len(group):  # as plot_position_profiles' legend says it
                names[label] += f"\n({len(stack)} of {len(group)} runs)"
                partial.append(f"{label!r} is the mean of {len(stack)} of {len(group)} runs")
    if partial:
        warnings.warn(f"{out}: the per-patch {key} of {', '.join(partial)}, as the others "
                      f"logged no {key}_per_position (the panel's title says so)", stacklevel=2)
    empty = [_no_value(label, key) for label, m in maps.items() if np.isnan(m).all()]
    if empty:
        warnings.warn(f"{out}: blank panel for {'; '.join(empty)}", stacklevel=2)
    # one scale for all panels, from the finite values alone: max() over the panels' maxima
    # depended on their order where one is NaN (a panel of no value first made the top NaN
    # and drew every other panel in one colour, on a scale of −0.1 to 0.1)
    finite = np.concatenate([m[np.isfinite(m)] for m in maps.values()])
    top = (float(finite.max()) if finite.size else 0.0) or 1.0
    with matplotlib.rc_context(STYLE):
        fig = _figure(2.6 * len(maps) + 1.2, 3.0)
        axes = np.atleast_1d(fig.subplots(1, len(maps)))
        for ax, (label, m) in zip(axes, maps.items(), strict=True):
            im = ax.imshow(m, cmap="viridis", vmin=0, vmax=top)
            ax.set_title(names[label], fontsize=9)
            ax.set_xticks([])
            ax.set_yticks([])
        fig.colorbar(im, ax=list(axes), shrink=0.85, label=YLABELS.get(key, _plain(key)))
        fig.suptitle(title or f"Per-patch {_plain(key)} ({grid[0]}×{grid[1]} grid, mean over "
                     "seeds)")
        return _save(fig, out)


def plot_scatter(
    runs: Sequence[Run],
    x_key: str,
    y_key: str,
    out: PathLike,
    *,
    logx: bool = False,
    logy: bool = False,
    title: str | None = None,
) -> Path:
    """One point per run: final ``x_key`` against final ``y_key``, coloured by label.

    Keys are final metrics, or ``config.<dotted.path>`` for a configuration value (e.g.
    ``config.data.n``). Runs lacking either key (or with a value that is not a number) are
    left out, named in a warning; it is an error if all are. A run whose point cannot be drawn
    (a NaN or inf value, or one ≤ 0 on a log axis) is named in a warning too: a missing point
    would otherwise read as a run that was never there.
    """
    import matplotlib

    points: dict[str, list[tuple[float, float]]] = {}
    undrawn: list[str] = []
    lacking: list[str] = []  # runs without a number for either key: no point either
    for run in runs:
        try:
            xv, yv = run.lookup(x_key), run.lookup(y_key)
        except KeyError:
            lacking.append(run.name)
            continue
        if not (is_number(xv) and is_number(yv)):
            lacking.append(run.name)
            continue
        xf, yf = float(xv), float(yv)
        points.setdefault(run.group_label, []).append((xf, yf))
        if not (math.isfinite(xf) and math.isfinite(yf)) or (logx and xf <= 0) or (
                logy and yf <= 0):
            undrawn.append(f"{run.name} ({format_number(xf)}, {format_number(yf)})")
    if not points:
        raise ValueError(f"no run has numeric values for both {x_key!r} and {y_key!r}")
    if lacking:
        warnings.warn(f"{out}: {len(lacking)} of {len(runs)} run(s) have no point in the scatter "
                      f"of {y_key} against {x_key}, as they have no number for one of them (never "
                      f"logged, or not a number): {', '.join(lacking)}", stacklevel=2)
    if undrawn:
        warnings.warn(f"{out}: {len(undrawn)} run(s) have no point in the scatter of {y_key} "
                      f"against {x_key}, as their value is NaN, inf or ≤ 0 on a log axis: "
                      f"{', '.join(undrawn)}", stacklevel=2)
    colors = _run_colors(runs)
    with matplotlib.rc_context(STYLE):
        fig = _figure(6.0, 4.2)
        ax = fig.subplots()
        for label, pts in points.items():
            arr = np.array(pts)
            ax.scatter(arr[:, 0], arr[:, 1], color=colors[label], s=22, alpha=0.85)
        ax.set_xlabel(_plain(x_key))
        ax.set_ylabel(_plain(y_key))
        if logx:
            ax.set_xscale("log", nonpositive="mask")
        if logy:
            ax.set_yscale("log", nonpositive="mask")
        handles = _label_handles(colors, list(points), points=True)
        fig.legend(handles=handles, loc="outside right upper")
        ax.set_title(title or f"{_plain(y_key)} vs {_plain(x_key)} (one point per run)")
        return _save(fig, out)
