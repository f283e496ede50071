"""Audit 77 of the report: steps that are not whole numbers, epochs logged as null, scatter
points and heatmap runs left out without a word, and seed 10 sorted between seeds 1 and 2.

* ``read_metrics`` took any ``step``: 1.5 and 1.7 were both read as step 1 (one record lost
  without a word, the run "unfinished, step 1"), a null step failed later as a TypeError, and
  text steps went past the order check.
* ``"epoch": null`` made ``Run.series`` (and so ``plot_curves``) fail with a TypeError.
* ``plot_scatter`` left out the runs lacking either key without a word.
* ``plot_position_heatmaps`` drew a label's mean over only the runs that logged a profile,
  titled as the label's.
* an experiment without a ``runs`` list read its runs in plain name order: s0, s1, s10, s2.

Run directories are written by hand in the format of docs/run-directory.md.
"""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import pytest

from senslab.report import RunFormatError, load_experiment, load_run, load_runs, plot_curves
from senslab.report.plots import plot_position_heatmaps, plot_scatter


def write_run(path: Path, label: str, seed: int, rows: list[dict], *,
              finished: bool = True) -> Path:
    """A run of ``label`` that logged ``rows``; finished: with summary.json (final = last row)."""
    path.mkdir(parents=True)
    (path / "config.json").write_text(json.dumps({"name": path.name, "label": label,
                                                  "seed": seed}))
    (path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    if finished:
        (path / "summary.json").write_text(json.dumps({"label": label, "final": rows[-1]}))
    return path


@pytest.mark.parametrize("step", [1.5, None, "2", True])
def test_a_step_that_is_not_a_whole_number_is_an_error_naming_the_line(
        tmp_path: Path, step: object) -> None:
    """Steps 1.5 then 1.7 were read as step 1 twice: the curve had one point of two and the run
    was "unfinished, step 1"; a null step failed as a TypeError in ``Run.series``."""
    run = write_run(tmp_path / "r", "mlp", 0, [
        {"step": 0, "epoch": 0.0, "train/loss": 2.0},
        {"step": step, "epoch": 0.5, "train/loss": 1.0},
        {"step": 1.7 if step == 1.5 else 3, "epoch": 1.0, "train/loss": 0.5}], finished=False)
    with pytest.raises(RunFormatError, match=r"line 2 has step .*a step is a whole number"):
        load_run(run)


def test_a_whole_number_step_written_as_a_float_is_read(tmp_path: Path) -> None:
    """A NumPy integer step goes through ``json.dumps(default=float)`` as 5.0: still a step."""
    run = load_run(write_run(tmp_path / "r", "mlp", 0, [
        {"step": 5.0, "epoch": 1.0, "train/loss": 1.0},
        {"step": 10.0, "epoch": 2.0, "train/loss": 0.5}]))
    assert run.series("train/loss") == ([5, 10], [1.0, 2.0], [1.0, 0.5])


def test_an_epoch_logged_as_null_is_no_epoch_not_a_type_error(tmp_path: Path) -> None:
    """``"epoch": null`` failed with "float() argument must be … not 'NoneType'"."""
    runs = load_runs([write_run(tmp_path / "r", "mlp", 0, [
        {"step": 1, "epoch": None, "train/loss": 1.0},
        {"step": 2, "epoch": 1.0, "train/loss": 0.5}])])
    steps, epochs, values = runs[0].series("train/loss")
    assert steps == [1, 2] and values == [1.0, 0.5]
    assert epochs[0] != epochs[0] and epochs[1] == 1.0  # NaN: not known
    # against the epoch the first point would have no x: the curves are drawn against the step
    assert plot_curves(runs, tmp_path / "curves.png").is_file()


def test_runs_left_out_of_a_scatter_are_named(tmp_path: Path) -> None:
    """Three runs, one without test/acc: the scatter had two points and no word of the third."""
    runs = load_runs([
        write_run(tmp_path / f"s{s}", f"m{s}", s,
                  [{"step": 1, "epoch": 1.0, "sens/train": 0.1 * s,
                    **({"test/acc": 0.5 + 0.1 * s} if s else {})}])
        for s in range(3)])
    with pytest.warns(UserWarning, match=r"1 of 3 run\(s\) have no point in the scatter of "
                                         r"test/acc against sens/train.*: s0$"):
        plot_scatter(runs, "sens/train", "test/acc", tmp_path / "scatter.png")
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # every run has a point: nothing to say
        plot_scatter(runs[1:], "sens/train", "test/acc", tmp_path / "all.png")


def patch_run(path: Path, seed: int, profile: list[float] | None) -> Path:
    row: dict = {"step": 1, "epoch": 1.0, "sens/train": 0.1}
    if profile is not None:
        row["sens/train_positions"] = list(range(len(profile)))
        row["sens/train_per_position"] = profile
    return write_run(path, "vit", seed, [row])


def test_a_heatmap_over_some_of_a_labels_runs_says_so(tmp_path: Path) -> None:
    """One of three vit runs logged a profile: its heatmap was drawn as the label's mean over
    seeds, without a word (the per-position profile plot says "(1 of 3 runs)")."""
    runs = load_runs([patch_run(tmp_path / f"s{s}", s, [0.1, 0.2, 0.3, 0.4] if s == 0 else None)
                      for s in range(3)])
    with pytest.warns(UserWarning, match=r"per-patch sens/train of 'vit' is the mean of 1 of 3 "
                                         r"runs"):
        plot_position_heatmaps(runs, tmp_path / "heat.png")
    full = load_runs([patch_run(tmp_path / f"f{s}", s, [0.1, 0.2, 0.3, 0.4]) for s in range(2)])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        plot_position_heatmaps(full, tmp_path / "full.png")


def test_an_experiments_runs_are_read_in_seed_order(tmp_path: Path) -> None:
    """Without a runs list the subdirectories were sorted as text: seeds 0, 1, 10, 2."""
    exp = tmp_path / "exp"
    for s in (0, 1, 2, 10):
        write_run(exp / f"mlp-s{s}", "mlp", s, [{"step": 1, "epoch": 1.0, "train/loss": 1.0}])
    (exp / "experiment.json").write_text(json.dumps({"name": "e"}))
    assert [r.seed for r in load_experiment(exp).runs] == [0, 1, 2, 10]
