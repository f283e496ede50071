"""Audit 85 of the report's plots: data a figure left out without a word.

* ``plot_final_bars`` (the bar chart of report.html) drew no bar for a label none of whose runs
  logged the metric (a boolean model's ``bool_sens`` beside token-wise models'
  ``sens/train``), and said nothing: a chart "per label" without it reads as all the labels.
* ``plot_curves(logx=True)`` (``senslab report``'s log x-axis) masks every point at step or
  epoch 0, as documented; a run measured at step 0 alone lost its whole curve, said only by
  matplotlib's "Data has no positive values".
* ``plot_curves`` drew a point with no drawn neighbour (a curve of one point, or the steps all
  seeds logged between steps only some did) without its band, and past two points without a
  marker: two seeds measured once, 0.1 and 0.5, read as one value known exactly.
* ``plot_curves`` said nothing of a label whose every point of a metric was null (a sharpness
  inf at each measurement) in a panel another label's line drew: the table read ``null``.
* report.html's per-position figure and caption called every profile right-aligned ("−1 = last
  token"), also a token-vector model's, whose positions count from 0 = the first token.

Run directories are written by hand in the format of docs/run-directory.md.
"""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import numpy as np
import pytest

from senslab.report import label_colors, load_runs, make_report, plot_curves, plot_final_bars
from senslab.report.plots import position_alignment


def write_run(path: Path, label: str, seed: int, rows: list[dict]) -> Path:
    """A finished run of ``label`` that logged ``rows`` (its final numbers: the last of each)."""
    path.mkdir(parents=True)
    (path / "config.json").write_text(json.dumps({"name": path.name, "label": label,
                                                  "seed": seed}))
    (path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    final: dict = {}
    for row in rows:
        final.update(row)
    (path / "summary.json").write_text(json.dumps({"label": label, "final": final}))
    return path


def test_a_label_without_the_bar_metric_is_named(tmp_path: Path) -> None:
    runs = load_runs([
        write_run(tmp_path / "t0", "tokenwise", 0, [{"step": 1, "sens/train": 0.2}]),
        write_run(tmp_path / "t1", "tokenwise", 1, [{"step": 1, "sens/train": 0.3}]),
        write_run(tmp_path / "b0", "boolean", 0, [{"step": 1, "bool_sens": 0.5}]),
    ])
    with pytest.warns(UserWarning, match=r"no bar for 1 of 2 label\(s\).*final sens/train: "
                                         r"'boolean'"):
        plot_final_bars(runs, tmp_path / "bars.png")
    with warnings.catch_warnings():  # every label has a bar: nothing to say
        warnings.simplefilter("error")
        plot_final_bars(runs[:2], tmp_path / "all.png")


def test_points_at_step_zero_on_a_log_x_axis_are_left_out_quietly(tmp_path: Path) -> None:
    """logx's documented mask of step 0 (the evaluation every loop logs first, in every curve
    of a log-spaced schedule) is not worth a warning where the curve has other points."""
    rows = [{"step": s, "epoch": float(s // 10), "train/loss": 1.0 / (s + 1)} for s in (0, 10, 20)]
    runs = load_runs([write_run(tmp_path / "r0", "mlp", 0, rows),
                      write_run(tmp_path / "r1", "mlp", 1, rows)])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        plot_curves(runs, tmp_path / "curves.png", logx=True)
        plot_curves(runs, tmp_path / "steps.png", x="step", logx=True)
        plot_curves(runs, tmp_path / "linear.png")


def test_a_curve_measured_at_step_zero_alone_is_said_to_be_missing(tmp_path: Path) -> None:
    """A model measured once, at step 0, has nothing on a log x-axis: matplotlib's "Data has
    no positive values" named neither the metric nor the label."""
    runs = load_runs([write_run(tmp_path / "p", "pretrained", 0,
                                [{"step": 0, "sens/train": 0.25}])])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        plot_curves(runs, tmp_path / "curves.png", logx=True)
    said = [str(w.message) for w in caught if "log x-axis" in str(w.message)]
    assert len(said) == 1
    assert "nothing is drawn of sens/train of 'pretrained' (at step 0: 0.25)" in said[0]


def colour_pixels(png: Path, colour: tuple[float, ...]) -> int:
    """How many pixels of ``png`` are ``colour`` (RGB within 2%)."""
    import matplotlib.image

    image = matplotlib.image.imread(str(png))[..., :3]
    return int((np.abs(image - np.array(colour[:3])) < 0.02).all(axis=-1).sum())


def test_the_spread_of_a_one_point_curve_is_drawn(tmp_path: Path) -> None:
    """Two seeds measured once (0.1 and 0.5: 0.3 ± 0.28) drew a lone dot and no band, the
    same figure as two seeds that agree exactly: a band over one x has no width."""
    colour = label_colors(["m"])["m"]
    tint = tuple(0.35 * np.array(colour[:3]) + 0.65)  # the error bar, at alpha 0.35 on white
    drawn = {}
    for name, values in (("agree", (0.3, 0.3)), ("differ", (0.1, 0.5))):
        runs = load_runs([write_run(tmp_path / name / f"s{i}", "m", i,
                                    [{"step": 5, "epoch": 1.0, "sens/train": v}])
                          for i, v in enumerate(values)])
        drawn[name] = colour_pixels(plot_curves(runs, tmp_path / f"{name}.png"), tint)
    assert drawn["agree"] < 20 < 100 < drawn["differ"]


def test_a_point_between_gaps_is_marked(tmp_path: Path) -> None:
    """Seed 0 logged every step, seed 1 every other: the steps both logged are each between
    two of seed 0 alone, so the full-colour line (the mean of both) drew nothing of them."""
    colour = label_colors(["m"])["m"]
    every = [{"step": s, "epoch": float(s), "sens/train": 0.2 + 0.01 * s} for s in range(6)]
    runs = load_runs([write_run(tmp_path / "s0", "m", 0, every),
                      write_run(tmp_path / "s1", "m", 1, every[::2])])
    with pytest.warns(UserWarning, match="drawn faded"):
        png = plot_curves(runs, tmp_path / "curves.png")
    legend = colour_pixels(plot_curves(runs[:1], tmp_path / "none.png",
                                       keys=["no/such_metric"]), colour)
    assert colour_pixels(png, colour) - legend > 60  # three dots


def test_a_label_whose_every_point_is_null_is_said(tmp_path: Path) -> None:
    """Label b's sharpness was inf (written as null) at every measurement: the table reads
    ``null``, but the curves drew no line for b in the panel of a's, without a word."""
    rows = [{"step": s, "epoch": float(s), "train/loss": 1.0} for s in (1, 2, 3)]
    runs = load_runs([
        write_run(tmp_path / "a", "a", 0, [{**r, "sharpness/shop": 0.1 * r["step"]}
                                           for r in rows]),
        write_run(tmp_path / "b", "b", 0, [{**r, "sharpness/shop": None} for r in rows]),
    ])
    with pytest.warns(UserWarning, match=r"as null.*sharpness/shop of 'b' at 3 step\(s\) "
                                         r"\(first: step 1; every point, so no line at all\)"):
        plot_curves(runs, tmp_path / "curves.png")


def profile_run(path: Path, label: str, positions: list[int]) -> Path:
    """A run whose final sens/train profile is over ``positions`` (0.1 per step back)."""
    values = [0.1 * (i + 1) for i in range(len(positions))]
    return write_run(path, label, 0, [{"step": 1, "epoch": 1.0, "sens/train": 0.2,
                                       "sens/train_positions": positions,
                                       "sens/train_per_position": values}])


def test_a_left_aligned_profile_is_not_called_right_aligned(tmp_path: Path) -> None:
    """A token-vector model's profile (``Sequence``: position = token index, 0 = first; what
    ``senslab train --model sparse_attention`` logs, 20 positions) was drawn and captioned as
    right-aligned, "−1 = last token": its first token read as the one after the last."""
    left = make_report([profile_run(tmp_path / "sa", "sa", list(range(20)))],
                       tmp_path / "left").read_text(encoding="utf-8")
    assert "Sensitivity per token position, left-aligned, 0 = first token." in left
    assert "right-aligned" not in left and "patch grid" not in left
    right = make_report([profile_run(tmp_path / "lstm", "lstm", list(range(-6, 0)))],
                        tmp_path / "right").read_text(encoding="utf-8")
    assert "Sensitivity per token position, right-aligned, −1 = last token." in right
    assert "left-aligned" not in right
    runs = load_runs([tmp_path / "sa", tmp_path / "lstm"])
    assert position_alignment(runs) == ("≥ 0 left-aligned (0 = first token), < 0 "
                                        "right-aligned (−1 = last token)")
