"""Audit 83 of the report: metrics logged as null, whole numbers, and a folder of runs.

* a run's metric logged as null at its end (a NaN or inf is written as null: a run that
  diverged) was read as a metric the run never logged: the label's row was the mean of the
  other seeds, said as ``(2 of 3 runs)`` as if the third had not measured it, and a label
  whose every run was null showed ``-`` (never measured), was left out of the bar chart, and
  where every run was null the column was gone; its curve ended a step early without a word.
* a whole number in a table was rounded to 4 digits: a run's epoch 12345 read ``1.234e+04``.
* ``senslab report runs/`` (a folder of run directories) said only that it is not one.

Run directories are written by hand in the format of docs/run-directory.md.
"""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import pytest

from senslab.report import final_table, format_table, load_runs
from senslab.report.aggregate import format_number
from senslab.report.html import make_report
from senslab.report.plots import plot_curves, plot_final_bars
from senslab.report.runs import RunFormatError, load_run


def write_run(path: Path, label: str, seed: int, rows: list[dict]) -> Path:
    """A finished run of ``label`` that logged ``rows`` (final = the last row)."""
    path.mkdir(parents=True)
    (path / "config.json").write_text(json.dumps({"name": path.name, "label": label,
                                                  "seed": seed}))
    (path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (path / "summary.json").write_text(json.dumps({"label": label, "final": rows[-1]}))
    return path


def run_ending(path: Path, label: str, seed: int, loss: float | None) -> Path:
    """A run whose train/loss is 1.0 at step 0 and ``loss`` (None: null) at step 10."""
    return write_run(path, label, seed, [
        {"step": 0, "epoch": 0.0, "train/loss": 1.0, "sens/train": 0.3},
        {"step": 10, "epoch": 1.0, "train/loss": loss, "sens/train": 0.2}])


def test_a_seed_whose_metric_is_null_is_said_apart(tmp_path: Path) -> None:
    runs = load_runs([run_ending(tmp_path / f"r{s}", "mlp", s, loss)
                      for s, loss in enumerate([0.5, 0.7, None])])
    stat = final_table(runs)[0]["train/loss"]
    assert (stat.mean, stat.n, stat.of, stat.null) == (pytest.approx(0.6), 2, 3, 1)
    assert str(stat) == "0.6 ± 0.14 (2 of 3 runs, 1 null)"  # was "(2 of 3 runs)"
    per_run = final_table(runs, per_run=True)
    assert str(per_run[2]["train/loss"]) == "null"  # was "-", as if never logged
    assert "null" in format_table(per_run).splitlines()[-1]


def test_a_label_whose_runs_are_all_null_reads_null(tmp_path: Path) -> None:
    runs = load_runs([run_ending(tmp_path / "a0", "a", 0, None),
                      run_ending(tmp_path / "a1", "a", 1, None)])
    row = final_table(runs)[0]
    assert "train/loss" in row  # the column was gone: every run's final was null
    assert str(row["train/loss"]) == "null"
    assert row["train/loss"].n == 0 and row["train/loss"].null == 2


def test_a_null_bar_is_written_in_its_place(tmp_path: Path) -> None:
    runs = load_runs([write_run(tmp_path / "a", "a", 0, [
        {"step": 0, "train/acc": 0.5, "sens/train": 0.3},
        {"step": 10, "train/acc": 0.1, "sens/train": None}]),
        run_ending(tmp_path / "b", "b", 0, 0.4)])
    with pytest.warns(UserWarning, match=r"'a' is null"):  # was left out without a word
        plot_final_bars(runs, tmp_path / "bars.png")


def test_a_curve_missing_its_null_points_says_so(tmp_path: Path) -> None:
    runs = load_runs([run_ending(tmp_path / f"r{s}", "mlp", s, None) for s in range(2)])
    with pytest.warns(UserWarning, match=r"logged the metric as null.*train/loss of 'mlp' at "
                                         r"1 step\(s\) \(first: step 10\)"):
        plot_curves(runs, tmp_path / "curves.png")


def test_a_report_without_nulls_says_nothing_of_them(tmp_path: Path) -> None:
    dirs = [run_ending(tmp_path / f"r{s}", "mlp", s, 0.5 + s) for s in range(2)]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        html = make_report(dirs, tmp_path / "out").read_text()
    assert "0.5" in html and "null</td>" not in html


@pytest.mark.parametrize(("value", "text"), [(12345.0, "12345"), (99999.0, "99999"),
                                             (-12345.0, "-12345"), (2500.0, "2500"),
                                             (0.00004, "4e-05"), (0.123456, "0.1235")])
def test_a_whole_number_is_written_whole(value: float, text: str) -> None:
    assert format_number(value) == text  # 12345.0 read "1.234e+04"


def test_a_runs_whole_epoch_is_shown_whole(tmp_path: Path) -> None:
    runs = load_runs([write_run(tmp_path / "r", "g", 0, [
        {"step": 1, "epoch": 1.0, "generalisation_epoch": 12345}])])
    assert str(final_table(runs)[0]["generalisation_epoch"]) == "12345"


def test_a_folder_of_runs_is_refused_naming_them(tmp_path: Path) -> None:
    for s in range(2):
        run_ending(tmp_path / "runs" / f"mlp-s{s}", "mlp", s, 0.5)
    with pytest.raises(RunFormatError, match=r"holds 2 run directories \(mlp-s0, mlp-s1\): "
                                             r"pass those"):
        load_run(tmp_path / "runs")
    (tmp_path / "empty").mkdir()
    with pytest.raises(RunFormatError, match="Pass a directory written by"):
        load_run(tmp_path / "empty")
