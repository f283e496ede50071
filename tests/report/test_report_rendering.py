"""How a report draws and writes its numbers: what a reader compares across figures and reads
off a cell or an annotation.

* Colours were assigned by rank in the list of labels a figure draws: the bar chart (which
  leaves out labels without the metric) drew a label in another label's colour of the curves
  next to it, adding a run of a new label recoloured every other label, and past 20 labels two
  labels shared one colour.
* A label whose seeds stopped at different steps (``train.target_train_acc``) had a curve whose
  tail was the mean of the longer seeds alone, drawn like the label's mean, without a word.
* A scatter point with a NaN value (or one ≤ 0 on a log axis) was left out without a word,
  which reads as a run that was never there.
* 4 significant digits wrote an accuracy of 0.99996 as ``1``, and the bar annotation wrote
  0.9996 as ``100.0%`` and 0.0004 as ``0.0%``: perfect (or no) accuracy it is not.

Run directories are written by hand in the format of docs/run-directory.md.
"""

from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np
import pytest
from runrecords import write_run

from senslab.report import (
    final_table,
    format_table,
    label_colors,
    load_runs,
    plot_curves,
    plot_final_bars,
    plot_scatter,
)
from senslab.report.aggregate import format_number, format_percent


def colour_pixels(png: Path, colour: tuple[float, ...]) -> int:
    """How many pixels of ``png`` are ``colour`` (RGB within 2%)."""
    import matplotlib.image

    image = matplotlib.image.imread(str(png))[..., :3]
    return int((np.abs(image - np.array(colour[:3])) < 0.02).all(axis=-1).sum())


# --- colours -------------------------------------------------------------------------------


def test_a_label_has_its_curve_colour_in_the_bar_chart(tmp_path: Path) -> None:
    """'a' logged no sensitivity, so the bar chart drew only 'b' and 'c', and coloured them by
    rank among those two: 'b' took the colour 'a' has in the curves, 'c' the one 'b' has."""
    runs = []
    for label, sens, acc in (("a", None, 0.1), ("b", 0.2, 0.2), ("c", 0.4, 0.3)):
        rows = [{"step": 10 * i, "epoch": float(i), "train/acc": acc * i,
                 **({"sens/train": sens / i} if sens else {})} for i in (1, 2, 3)]
        runs.append(write_run(tmp_path / label, label, 0, rows))
    loaded = load_runs(runs)
    colours = label_colors(r.group_label for r in loaded)  # what the curves use
    bars = plot_final_bars(loaded, tmp_path / "bars.png", key="sens/train")
    for label in ("b", "c"):  # each bar is filled with its label's curve colour
        assert colour_pixels(bars, colours[label]) > 2000, label
    curves = plot_curves(loaded, tmp_path / "curves.png")
    for label in ("a", "b", "c"):
        assert colour_pixels(curves, colours[label]) > 100, label


def test_adding_a_label_keeps_the_other_labels_colours() -> None:
    """'cnn' sorts before 'lstm' and 'mlp': by rank, adding it recoloured both. These three
    labels prefer different colours, so each keeps its own whatever else is drawn."""
    two = label_colors(["mlp", "lstm"])
    three = label_colors(["cnn", "mlp", "lstm"])
    assert two["mlp"] == three["mlp"] and two["lstm"] == three["lstm"]
    assert label_colors(["mlp"])["mlp"] == two["mlp"]
    assert label_colors(["lstm", "lstm", "mlp"]) == two  # a set of labels, not a list


@pytest.mark.parametrize("n", [2, 9, 18, 19, 25])
def test_labels_drawn_together_never_share_a_colour(n: int) -> None:
    """Past 20 labels (tab20), label k and label k + 20 were given one colour: two curves a
    reader could not tell apart. Labels that prefer one colour get different ones."""
    labels = [f"model-{i}" for i in range(n)]
    colours = label_colors(labels)
    assert len({tuple(np.round(c, 6)) for c in colours.values()}) == n
    grey = (0.4980392156862745,) * 3  # the legend's colour for line styles and faded tails
    assert all(not np.allclose(c[:3], grey) for c in colours.values())


# --- curve tails ---------------------------------------------------------------------------


def seed_rows(stop: int, seed: int) -> list[dict]:
    """Train accuracy over epochs 1 … ``stop`` (steps 10, 20, …), nearly the same per seed."""
    return [{"step": 10 * i, "epoch": float(i), "train/acc": 0.09 * i + 0.001 * seed}
            for i in range(1, stop + 1)]


def test_a_tail_over_only_some_seeds_is_drawn_faded_and_said(tmp_path: Path) -> None:
    """Seeds 1 and 2 stopped at epoch 3 (their target accuracy), seed 0 went on to epoch 10:
    epochs 4-10 were drawn as the label's mean, though they were seed 0 alone."""
    mixed = load_runs([write_run(tmp_path / "m" / f"s{s}", "mlp", s, seed_rows(stop, s))
                       for s, stop in ((0, 10), (1, 3), (2, 3))])
    alone = load_runs([write_run(tmp_path / "alone", "mlp", 0, seed_rows(10, 0))])
    colour = label_colors(["mlp"])["mlp"]
    with pytest.warns(UserWarning, match=r"drawn faded.*train/acc of 'mlp' at 7 step\(s\) "
                                         r"\(first: step 40, 1 of 3 runs\)"):
        tail = colour_pixels(plot_curves(mixed, tmp_path / "mixed.png"), colour)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # one run: its whole curve is its label's
        full = colour_pixels(plot_curves(alone, tmp_path / "alone.png"), colour)
        with pytest.warns(UserWarning, match="no run logged 'no/such_metric'"):
            legend = colour_pixels(plot_curves(alone, tmp_path / "none.png",
                                               keys=["no/such_metric"]), colour)
    # the full-colour line covers epochs 1-3 of 1-10 (2 of 9 spans), the rest is faded
    assert full - legend > 300
    assert tail - legend < 0.5 * (full - legend)


def test_seeds_of_equal_length_draw_no_faded_tail(tmp_path: Path) -> None:
    runs = load_runs([write_run(tmp_path / f"s{s}", "mlp", s, seed_rows(5, s)) for s in (0, 1)])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        plot_curves(runs, tmp_path / "curves.png")


def test_a_scatter_point_that_cannot_be_drawn_is_named(tmp_path: Path) -> None:
    runs = load_runs([
        write_run(tmp_path / "ok", "mlp", 0, [{"step": 1, "epoch": 1.0, "a": 0.5, "b": 0.1}]),
        write_run(tmp_path / "nan", "mlp", 1,
                  [{"step": 1, "epoch": 1.0, "a": 0.6, "b": float("nan")}]),
        write_run(tmp_path / "zero", "mlp", 2, [{"step": 1, "epoch": 1.0, "a": 0.0, "b": 0.3}]),
    ])
    # the bare NaN reads as a null (never logged, or not a number): the run is named
    with pytest.warns(UserWarning, match=r"run\(s\) have no point.*: nan$"):
        plot_scatter(runs, "a", "b", tmp_path / "scatter.png")
    with pytest.warns(UserWarning) as caught:
        plot_scatter(runs, "a", "b", tmp_path / "log.png", logx=True)
    said = [str(w.message) for w in caught]
    assert any(m.endswith("(never logged, or not a number): nan") for m in said)
    assert any(m.endswith("≤ 0 on a log axis: zero (0, 0.3)") for m in said)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        plot_scatter(runs[:1], "a", "b", tmp_path / "fine.png", logx=True, logy=True)


# --- number formatting ---------------------------------------------------------------------


def test_a_near_perfect_accuracy_does_not_read_as_exactly_one(tmp_path: Path) -> None:
    rows = [{"step": 10, "epoch": 1.0, "train/acc": 0.99996, "test/acc": 1.0}]
    runs = load_runs([write_run(tmp_path / "r", "mlp", 0, rows)])
    (row,) = final_table(runs)
    assert str(row["train/acc"]) == "0.99996"  # was "1"
    assert str(row["test/acc"]) == "1"  # exactly 1 still reads 1
    assert "0.99996" in format_table(final_table(runs))
    for value in (0.99996, 0.9999999, 1.00004, -0.99996, 1 - 2**-52):
        text = format_number(value)
        assert text not in ("1", "-1") and float(text) == pytest.approx(value, abs=1e-15)
    assert format_number(0.123456) == "0.1235" and format_number(1.0) == "1"


@pytest.mark.parametrize(("value", "text"), [
    (0.9996, ">99.9%"), (0.99949, "99.9%"), (1.0, "100.0%"),
    (0.0004, "<0.1%"), (0.0005, "0.1%"), (0.0, "0.0%"), (0.5, "50.0%"),
])
def test_percentages_never_round_to_a_bound(value: float, text: str) -> None:
    """The bar chart annotates each bar with its train accuracy as a percentage."""
    assert format_percent(value) == text
