"""Audit 81 of the report: labels with ``$``, per-position profiles that are null everywhere,
the heatmaps' colour scale, and bars on a log axis.

* a label or metric key holding ``$`` reached matplotlib's mathtext: ``a $_$ b`` failed the
  whole report with a bare ``ValueError`` from the mathtext parser, and ``$5 vs $6`` was drawn
  as ``5 vs `` in italics.
* ``plot_position_heatmaps`` took its colour scale as ``max`` of the panels' maxima: where one
  label's profile is null at every position its maximum is NaN, and put first it made the
  scale NaN (every other panel drawn in one colour, on a scale of −0.1 to 0.1).
* a label whose profile is null at every position was left out of ``plot_position_profiles``
  without a word, and a report whose only profiles were such failed with "no run logged
  sens/train_positions", which it had.
* ``plot_final_bars(logy=True)`` drew no bar at all (each starts at 0, which the log axis
  masked: only the error bars' caps showed), and a bar ≤ 0 was left out without a word.

Run directories are written by hand in the format of docs/run-directory.md.
"""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import matplotlib
import numpy as np
import pytest
from matplotlib.figure import Figure
from matplotlib.image import imread

from senslab.report import load_runs, make_report
from senslab.report.plots import (
    _plain,
    label_colors,
    plot_curves,
    plot_final_bars,
    plot_position_heatmaps,
    plot_position_profiles,
    plot_scatter,
)


def write_run(path: Path, label: str, seed: int, rows: list[dict]) -> Path:
    """A finished run of ``label`` that logged ``rows`` (final = the last row)."""
    path.mkdir(parents=True)
    (path / "config.json").write_text(json.dumps({"name": path.name, "label": label,
                                                  "seed": seed}))
    (path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (path / "summary.json").write_text(json.dumps({"label": label, "final": rows[-1]}))
    return path


def profile_run(path: Path, label: str, values: list[float | None]) -> Path:
    """A run whose final per-position profile is ``values`` over the positions 0 … n−1 (a
    square number of them: a patch grid)."""
    return write_run(path, label, 0, [{
        "step": 1, "epoch": 1.0, "train/loss": 0.5, "train/acc": 0.9, "sens/train": 0.2,
        "sens/train_positions": list(range(len(values))), "sens/train_per_position": values}])


def has_colour(png: Path, rgba: tuple[float, ...], tol: float = 3 / 255) -> bool:
    """Whether ``png`` has an area (1,000 pixels or more: a patch or a bar, not a colour bar's
    line of it) of the colour ``rgba`` (to within ``tol``)."""
    img = imread(png)[..., :3]
    return int((np.abs(img - np.asarray(rgba[:3])) <= tol).all(axis=-1).sum()) >= 1000


@pytest.mark.parametrize("draw", ["curves", "bars", "scatter", "profiles", "heatmaps"])
def test_a_dollar_in_a_label_is_no_mathtext(tmp_path: Path, draw: str) -> None:
    label = "a $_$ b"  # mathtext's parser refused it: the whole figure failed
    runs = load_runs([profile_run(tmp_path / "r", label, [0.1, 0.2, 0.3, 0.4])])
    out = tmp_path / "fig.png"
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # and no warning either
        if draw == "curves":
            plot_curves(runs, out)
        elif draw == "bars":
            plot_final_bars(runs, out)
        elif draw == "scatter":
            plot_scatter(runs, "train/loss", "sens/train", out)
        elif draw == "profiles":
            plot_position_profiles(runs, out)
        else:
            plot_position_heatmaps(runs, out)
    assert imread(out).shape[0] > 100


@pytest.mark.parametrize("text", ["$5 vs $6", "a $_$ b", "cost $5", r"a\$b"])
def test_a_label_is_drawn_letter_for_letter(text: str) -> None:
    """The escaped label draws exactly as the label with mathtext switched off."""

    def png(s: str, **kw: bool) -> bytes:
        fig = Figure(figsize=(2, 0.5))
        fig.text(0.05, 0.3, s, **kw)
        from io import BytesIO

        buf = BytesIO()
        fig.savefig(buf, format="png")
        return buf.getvalue()

    assert png(_plain(text)) == png(text, parse_math=False)


def test_a_report_of_a_dollar_label_is_written(tmp_path: Path) -> None:
    run = profile_run(tmp_path / "r", "lr=$1e-3$_sgd $_$", [0.1, 0.2, 0.3, 0.4])
    page = make_report([run], tmp_path / "out").read_text()
    assert "lr=$1e-3$_sgd $_$" in page  # the table names it as written


def test_the_heatmaps_scale_does_not_depend_on_label_order(tmp_path: Path) -> None:
    """A label whose profile is null everywhere, first: the scale was NaN and label a's four
    patches one colour; its patches now take their own colours on a scale of 0 to 0.4."""
    empty = profile_run(tmp_path / "b", "b", [None] * 4)
    full = profile_run(tmp_path / "a", "a", [0.1, 0.2, 0.3, 0.4])
    viridis = matplotlib.colormaps["viridis"]
    for i, order in enumerate(([empty, full], [full, empty])):
        out = tmp_path / f"heat{i}.png"
        with pytest.warns(UserWarning, match=r"blank panel for 'b', whose runs' "
                                             r"sens/train_per_position are null"):
            plot_position_heatmaps(load_runs(order), out)
        # 0.1 and 0.3 of 0.4: a quarter and three quarters up the colour map
        assert has_colour(out, viridis(0.1 / 0.4)) and has_colour(out, viridis(0.3 / 0.4))


def test_a_profile_null_everywhere_is_named(tmp_path: Path) -> None:
    runs = load_runs([profile_run(tmp_path / "a", "a", [0.1, 0.2, 0.3]),
                      profile_run(tmp_path / "b", "b", [None] * 3)])
    with pytest.warns(UserWarning, match=r"no line for 'b', whose runs' sens/train_per_position "
                                         r"are null at every position"):
        plot_position_profiles(runs, tmp_path / "p.png")
    with pytest.raises(ValueError, match=r"no per-position sens/train to draw: 'b'"):
        plot_position_profiles(runs[1:], tmp_path / "p.png")


def test_a_report_whose_profiles_are_null_everywhere_is_written(tmp_path: Path) -> None:
    run = profile_run(tmp_path / "b", "b", [None] * 3)
    with pytest.warns(UserWarning, match=r"no per-position figure, as every run's "
                                         r"sens/train_per_position is null"):
        report = make_report([run], tmp_path / "out")
    assert not (tmp_path / "out" / "positions.png").exists()
    assert "Final numbers per label" in report.read_text()


def test_bars_on_a_log_axis_are_drawn(tmp_path: Path) -> None:
    runs = load_runs([write_run(tmp_path / lb, lb, 0, [{"step": 1, "sharpness/loss": v}])
                      for lb, v in (("a", 0.02), ("b", -0.01), ("c", 0.5))])
    colors = label_colors(["a", "b", "c"])
    out = tmp_path / "bars.png"
    with pytest.warns(UserWarning, match=r"'b' is -0.01, ≤ 0, which a log y-axis cannot draw"):
        plot_final_bars(runs, out, key="sharpness/loss", logy=True)
    assert has_colour(out, colors["a"]) and has_colour(out, colors["c"])
    # only bars ≤ 0: no log axis (it failed placing its ticks), the values written in place
    with pytest.warns(UserWarning, match=r"'b' is -0.01"):
        plot_final_bars(runs[1:2], tmp_path / "neg.png", key="sharpness/loss", logy=True)
