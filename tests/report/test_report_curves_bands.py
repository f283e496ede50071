"""How a label's runs become one curve and one band, and what the figure says about them.

* Per-position profiles: at a position only one of a label's runs reached, the std was set to
  0, so the band pinched to zero width there, which reads as "the seeds agree exactly".
* A metric that some of a label's runs never logged drew a curve over the others alone, with
  nothing to say so, while the final table says "(k of R runs)".
* Runs that logged a metric at different steps (interleaved) drew a line that zigzags between
  single runs' values, as the label's mean over seeds, without a word.
* A point ≤ 0 on a log y-axis (a sensitivity of exactly 0) vanished without a word.

Every expected number below is worked out by hand from the values written into the runs.
Run directories are written by hand in the format of docs/run-directory.md.
"""

from __future__ import annotations

import math
import os
import statistics
import warnings
from pathlib import Path

import numpy as np
import pytest
from runrecords import write_run

from senslab.report import (
    RunFormatError,
    aggregate_curve,
    final_table,
    load_runs,
    plot_curves,
    plot_position_profiles,
)
from senslab.report.plots import aggregate_positions


def profile_run(path: Path, seed: int, positions: list[int] | None,
                values: list[float | None] | None) -> Path:
    row: dict = {"step": 10, "epoch": 1.0, "sens/train": 0.1}
    if positions is not None:
        row["sens/train_positions"] = positions
        row["sens/train_per_position"] = values
    return write_run(path, "lstm", seed, [row])


def messages(caught: list[warnings.WarningMessage]) -> str:
    return " ".join(str(w.message) for w in caught)


# --- per-position profiles -----------------------------------------------------------------


def test_a_position_only_one_run_reached_has_no_band_not_a_zero_width_one(
        tmp_path: Path) -> None:
    """Seed 0 reached positions −3…−1, seed 1 (shorter sequences) only −2 and −1. At −3 the
    band was mean ± 0, i.e. [0.5, 0.5]: "the seeds agree exactly", from a single value."""
    runs = load_runs([profile_run(tmp_path / "s0", 0, [-3, -2, -1], [0.5, 0.2, 0.3]),
                      profile_run(tmp_path / "s1", 1, [-3, -2, -1], [None, 0.4, 0.5])])
    curve = aggregate_positions(runs)
    assert curve is not None
    assert curve.steps.tolist() == [-3, -2, -1]
    assert curve.count.tolist() == [1, 2, 2]
    np.testing.assert_allclose(curve.mean, [0.5, 0.3, 0.4])
    sd = statistics.stdev([0.2, 0.4])  # = stdev([0.3, 0.5]) = 0.1414…
    assert math.isnan(curve.low[0]) and math.isnan(curve.high[0])  # unknown, not 0 wide
    np.testing.assert_allclose(curve.low[1:], [0.3 - sd, 0.4 - sd])
    np.testing.assert_allclose(curve.high[1:], [0.3 + sd, 0.4 + sd])
    # −3 is seed 0 alone: drawn faded, without a band, and said
    assert curve.full.tolist() == [False, True, True]
    with pytest.warns(UserWarning, match=r"only some of a label's runs reached a position.*"
                                         r"'lstm' at 1 position\(s\) \(first: -3, 1 of 2 runs\)"):
        plot_position_profiles(runs, tmp_path / "positions.png")


def test_a_label_whose_runs_all_reached_every_position_draws_as_before(tmp_path: Path) -> None:
    runs = load_runs([profile_run(tmp_path / "s0", 0, [-2, -1], [0.2, 0.3]),
                      profile_run(tmp_path / "s1", 1, [-2, -1], [0.4, 0.5])])
    curve = aggregate_positions(runs)
    assert curve is not None and curve.full.all() and (curve.runs, curve.of) == (2, 2)
    np.testing.assert_allclose(curve.high - curve.low, 2 * statistics.stdev([0.2, 0.4]))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        plot_position_profiles(runs, tmp_path / "positions.png")


def test_a_profile_some_runs_never_logged_says_over_how_many(tmp_path: Path) -> None:
    runs = load_runs([profile_run(tmp_path / "s0", 0, [-2, -1], [0.2, 0.3]),
                      profile_run(tmp_path / "s1", 1, [-2, -1], [0.4, 0.5]),
                      profile_run(tmp_path / "s2", 2, None, None)])
    curve = aggregate_positions(runs)
    assert curve is not None and (curve.runs, curve.of) == (2, 3)
    np.testing.assert_allclose(curve.mean, [0.3, 0.4])
    with pytest.warns(UserWarning, match=r"'lstm' is the mean of 2 of 3 runs"):
        plot_position_profiles(runs, tmp_path / "positions.png")


# --- curves --------------------------------------------------------------------------------


def test_a_curve_some_runs_never_logged_says_k_of_r_runs(tmp_path: Path) -> None:
    """Three seeds, the third never logged sens/train: the curve is the mean of two of them.
    The final table says "(2 of 3 runs)"; the curve now says it too."""
    paths = [write_run(tmp_path / f"s{s}", "mlp", s,
                       [{"step": 10, "epoch": 1.0, "train/acc": 0.5,
                         **({"sens/train": 0.1 * (s + 1)} if s < 2 else {})},
                        {"step": 20, "epoch": 2.0, "train/acc": 0.6,
                         **({"sens/train": 0.05 * (s + 1)} if s < 2 else {})}])
             for s in range(3)]
    runs = load_runs(paths)
    curve = aggregate_curve(runs, "sens/train")
    assert curve is not None and (curve.runs, curve.of) == (2, 3)
    np.testing.assert_allclose(curve.mean, [(0.1 + 0.2) / 2, (0.05 + 0.1) / 2])
    assert curve.count.tolist() == [2, 2] and curve.full.all()
    acc = aggregate_curve(runs, "train/acc")
    assert acc is not None and (acc.runs, acc.of) == (3, 3)  # every run logged it: nothing said
    assert str(final_table(runs)[0]["sens/train"]).endswith("(2 of 3 runs)")
    with pytest.warns(UserWarning) as caught:
        plot_curves(runs, tmp_path / "curves.png")
    said = messages(caught)
    assert "sens/train of 'mlp': 2 of 3 runs" in said and "train/acc of 'mlp'" not in said


def test_runs_that_logged_other_steps_are_aligned_by_step_and_said(tmp_path: Path) -> None:
    """Seed 0 logged steps 10, 20, 30; seed 1 only 10 and 30. Aligned by step (not by index,
    which would average seed 0's step 20 with seed 1's step 30): 20 is seed 0 alone."""
    a = write_run(tmp_path / "a", "mlp", 0, [{"step": s, "epoch": s / 10, "train/acc": v}
                                             for s, v in ((10, 0.1), (20, 0.2), (30, 0.3))])
    b = write_run(tmp_path / "b", "mlp", 1, [{"step": s, "epoch": s / 10, "train/acc": v}
                                             for s, v in ((10, 0.5), (30, 0.9))])
    curve = aggregate_curve(load_runs([a, b]), "train/acc")
    assert curve is not None
    assert curve.steps.tolist() == [10, 20, 30] and curve.count.tolist() == [2, 1, 2]
    np.testing.assert_allclose(curve.mean, [0.3, 0.2, 0.6])
    assert curve.full.tolist() == [True, False, True]


def test_interleaved_steps_are_not_drawn_as_a_mean_over_seeds(tmp_path: Path) -> None:
    """Seed 0 logged steps 10 and 30, seed 1 steps 20 and 40: every point is one run, so the
    line zigzagged 0.1, 0.9, 0.3, 0.95 as "the mean over seeds", without a word."""
    a = write_run(tmp_path / "a", "cnn", 0, [{"step": 10, "epoch": 1.0, "train/acc": 0.1},
                                             {"step": 30, "epoch": 3.0, "train/acc": 0.3}])
    b = write_run(tmp_path / "b", "cnn", 1, [{"step": 20, "epoch": 2.0, "train/acc": 0.9},
                                             {"step": 40, "epoch": 4.0, "train/acc": 0.95}])
    runs = load_runs([a, b])
    curve = aggregate_curve(runs, "train/acc")
    assert curve is not None and curve.count.tolist() == [1, 1, 1, 1] and curve.runs == 2
    assert not curve.full.any()
    with pytest.warns(UserWarning, match=r"drawn faded.*train/acc of 'cnn' at 4 step\(s\) "
                                         r"\(first: step 10, 1 of 2 runs\)"):
        plot_curves(runs, tmp_path / "curves.png")


def test_a_point_at_zero_on_a_log_axis_is_named(tmp_path: Path) -> None:
    """A sensitivity of exactly 0 (seeds 0.0 and 0.0 at step 10) has no place on a log axis."""
    paths = [write_run(tmp_path / f"s{s}", "mlp", s,
                       [{"step": 10, "epoch": 1.0, "sens/train": 0.0, "train/loss": 1.0},
                        {"step": 20, "epoch": 2.0, "sens/train": 0.1 + 0.1 * s,
                         "train/loss": 0.5}]) for s in (0, 1)]
    runs = load_runs(paths)
    with pytest.warns(UserWarning, match=r"≤ 0 on a log y-axis: sens/train of 'mlp' at 1 "
                                         r"step\(s\) \(first: step 10, 0\)"):
        plot_curves(runs, tmp_path / "log.png", logy=True)
    with pytest.warns(UserWarning, match="sens/train of 'mlp'"):
        plot_curves(runs, tmp_path / "log_sens.png", logy={"sens/train"})
    with warnings.catch_warnings():  # a linear axis, or a log axis on another panel: nothing
        warnings.simplefilter("error")
        plot_curves(runs, tmp_path / "lin.png")
        plot_curves(runs, tmp_path / "log_loss.png", logy={"train/loss"})


def test_a_run_reached_twice_through_a_symlink_is_refused(tmp_path: Path) -> None:
    """The same run through a symlink would count as a second seed with identical numbers, and
    halve nothing but the apparent spread: it is refused, as a directory given twice is."""
    run = write_run(tmp_path / "s0", "mlp", 0, [{"step": 10, "epoch": 1.0, "train/acc": 0.5}])
    os.symlink(run, tmp_path / "again")
    with pytest.raises(RunFormatError, match="given twice"):
        load_runs([run, tmp_path / "again"])
