"""Reports: read run/experiment directories, aggregate over seeds, plot, write ``report.html``.

Reports only read directories written by training (format: ``docs/run-directory.md``); they never
retrain. matplotlib is imported only when a plot is drawn.

>>> from senslab.report import load_runs, final_table, format_table, make_report
>>> runs = load_runs(["runs/my-experiment"])          # doctest: +SKIP
>>> print(format_table(final_table(runs)))            # doctest: +SKIP
>>> make_report(["runs/my-experiment"])               # doctest: +SKIP
"""

from senslab.report.aggregate import (
    Curve,
    Stat,
    aggregate_curve,
    final_table,
    format_table,
    metric_keys,
    summarize,
)
from senslab.report.html import make_report, render_html
from senslab.report.plots import (
    aggregate_positions,
    has_positions,
    label_colors,
    plot_curves,
    plot_final_bars,
    plot_position_profiles,
    plot_scatter,
    position_profile,
)
from senslab.report.runs import (
    Experiment,
    Run,
    RunFormatError,
    group_by_label,
    is_experiment_dir,
    is_run_dir,
    load_all,
    load_experiment,
    load_run,
    load_runs,
    read_metrics,
)

__all__ = [
    "Curve",
    "Experiment",
    "Run",
    "RunFormatError",
    "Stat",
    "aggregate_curve",
    "aggregate_positions",
    "final_table",
    "format_table",
    "group_by_label",
    "has_positions",
    "is_experiment_dir",
    "is_run_dir",
    "label_colors",
    "load_all",
    "load_experiment",
    "load_run",
    "load_runs",
    "make_report",
    "metric_keys",
    "plot_curves",
    "plot_final_bars",
    "plot_position_profiles",
    "plot_scatter",
    "position_profile",
    "read_metrics",
    "render_html",
    "summarize",
]
