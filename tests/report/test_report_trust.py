"""Numbers a report showed wrong, or drew as something else, without a word.

* ``report.html`` (``make_report``) read its runs apart from ``load_runs``: runs of other
  settings sharing a label were averaged there as seeds of one, and a run given twice counted
  as two seeds, while the terminal table showed them apart or refused.
* A metric some of a label's runs lack was averaged over the others, shown in a row that says
  how many runs it holds: the table now says over how many the number is.
* A summary.json whose final numbers disagree with its metric log's last record (one of the two
  edited or damaged) was shown as the run's result; every trainer refuses it, and so does the
  report now.
* A NaN or inf mean drew no bar, which reads as 0, and no curve point, without a word.
* Runs that log no epoch (a pretrained model's measurement) drew empty curve panels against the
  epoch.

Run directories are written by hand in the format of docs/run-directory.md.
"""

from __future__ import annotations

import json
import statistics
import warnings
from pathlib import Path

import numpy as np
import pytest

from senslab.cli import main
from senslab.report import (
    RunFormatError,
    final_table,
    format_table,
    label_colors,
    load_runs,
    make_report,
    plot_curves,
    plot_final_bars,
)

LABEL = "mlp"


def write_run(path: Path, seed: int, final: dict, *, label: str = LABEL,
              config: dict | None = None, rows: list[dict] | None = None) -> Path:
    """A finished run of ``label``: metrics.jsonl is ``rows`` (default: steps 10 and 20, the
    first at half of ``final``, the last at ``final``) and summary.json's ``final``
    is ``final``."""
    path.mkdir(parents=True)
    cfg = {"name": f"{label}-s{seed}", "label": label, "seed": seed, **(config or {})}
    (path / "config.json").write_text(json.dumps(cfg))
    if rows is None:
        rows = [{"step": 10, "epoch": 1.0, **{k: v / 2 for k, v in final.items()}},
                {"step": 20, "epoch": 2.0, **final}]
    (path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (path / "summary.json").write_text(json.dumps({"label": label, "final": final}))
    return path


def html_rows(html: str) -> list[str]:
    return [row for row in html.split("<tr>") if row.startswith(f"<td>{LABEL}")]


def test_report_html_shows_runs_of_other_settings_apart(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Two loose runs of one label, lr 0.1 and lr 0.5: the table printed them apart, but
    report.html averaged them as two seeds (0.7 ± 0.28); now both show them apart, and the
    command warns once."""
    a = write_run(tmp_path / "a", 0, {"test/acc": 0.9}, config={"optim": {"lr": 0.1}})
    b = write_run(tmp_path / "b", 1, {"test/acc": 0.5}, config={"optim": {"lr": 0.5}})
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert main(["report", str(a), str(b), "--out", str(tmp_path / "out")]) == 0
    said = [w for w in caught if "differ in optim.lr" in str(w.message)]
    assert len(said) == 1  # report.html and the table read the runs: one warning
    html = (tmp_path / "out" / "report.html").read_text(encoding="utf-8")
    labels = [row.split("</td>")[0].removeprefix("<td>") for row in html_rows(html)]
    assert labels == ["mlp (optim.lr=0.1)", "mlp (optim.lr=0.5)"] * 2  # by label, then per run
    assert "± 0.28" not in html and '<td class="num">0.9</td>' in html
    table = capsys.readouterr().out
    assert "mlp (optim.lr=0.1)" in table and "mlp (optim.lr=0.5)" in table


def test_report_html_refuses_a_run_given_twice(tmp_path: Path) -> None:
    """A run given with its experiment counted as two seeds of its label in report.html."""
    exp = tmp_path / "exp"
    write_run(exp / "s0", 0, {"test/acc": 0.9})
    write_run(exp / "s1", 1, {"test/acc": 0.8})
    (exp / "experiment.json").write_text(json.dumps({"name": "x", "runs": ["s0", "s1"]}))
    with pytest.raises(RunFormatError, match="given twice"):
        make_report([exp, exp / "s1"], out_dir=tmp_path / "out")
    assert not (tmp_path / "out" / "report.html").exists()


def test_a_metric_some_runs_lack_says_over_how_many_runs(tmp_path: Path) -> None:
    """Three seeds, one without sens/train: its mean and std are over the other two, and the
    row that says "3 runs" now says so; the numbers are those of before."""
    paths = [write_run(tmp_path / "s0", 0, {"test/acc": 0.9, "sens/train": 0.1}),
             write_run(tmp_path / "s1", 1, {"test/acc": 0.8, "sens/train": 0.3}),
             write_run(tmp_path / "s2", 2, {"test/acc": 0.7})]
    (row,) = final_table(load_runs(paths))
    assert row["runs"] == 3
    sens, acc = row["sens/train"], row["test/acc"]
    assert (sens.mean, sens.n) == (pytest.approx(0.2), 2)
    assert sens.spread == pytest.approx(statistics.stdev([0.1, 0.3]))
    assert str(sens) == "0.2 ± 0.14 (2 of 3 runs)"
    assert str(acc) == "0.8 ± 0.1"  # every run has it: as before
    text = format_table(final_table(load_runs(paths)))
    assert "0.2 ± 0.14 (2 of 3 runs)" in text
    html = make_report(paths, out_dir=tmp_path / "out").read_text(encoding="utf-8")
    assert "0.2 ± 0.14 (2 of 3 runs)" in html and "(k of R runs)" in html
    # the per-run rows hold one run each: nothing added
    assert [str(r["sens/train"]) for r in final_table(load_runs(paths), per_run=True)
            if "sens/train" in r] == ["0.1", "0.3"]


def test_a_summary_that_disagrees_with_its_log_is_refused(tmp_path: Path) -> None:
    """summary.json says test/acc 0.9, the log's last record 0.2: the report showed 0.9."""
    log = [{"step": 10, "epoch": 1.0, "test/acc": 0.1}, {"step": 20, "epoch": 2.0, "test/acc": 0.2}]
    edited = write_run(tmp_path / "edited", 0, {"test/acc": 0.9}, rows=log)
    for read in (lambda: load_runs([edited]),
                 lambda: make_report([edited], out_dir=tmp_path / "out")):
        with pytest.raises(RunFormatError, match=r"test/acc: 0\.9 in summary\.json, 0\.2 in the "
                                                 r"log.*delete .*summary\.json and re-run"):
            read()
    # a number measured after training, which the log lacks, is no disagreement
    after = write_run(tmp_path / "after", 0, {"test/acc": 0.2, "sens/test": 0.05}, rows=log)
    (run,) = load_runs([after])
    assert run.final["test/acc"] == 0.2 and run.final["sens/test"] == 0.05


def test_nan_and_inf_are_named_not_drawn_as_nothing(tmp_path: Path) -> None:
    """A label whose final sensitivity is NaN (one seed diverged) or inf drew no bar, which
    reads as a sensitivity of 0, and no curve, without a word."""
    paths = [write_run(tmp_path / "a0", 0, {"sens/train": 0.3}),
             write_run(tmp_path / "a1", 1, {"sens/train": float("nan")}),
             write_run(tmp_path / "b", 0, {"sens/train": 0.2}, label="b"),
             write_run(tmp_path / "c", 0, {"sens/train": float("inf")}, label="c")]
    runs = load_runs(paths)
    rows = {row["label"]: row for row in final_table(runs)}
    # a bare NaN in a run's files (written before 2026-11) reads as today's null: the row says
    # how many runs it rests on
    assert str(rows["mlp"]["sens/train"]) == "0.3 (1 of 2 runs, 1 null)"
    assert str(rows["c"]["sens/train"]) == "inf"
    with pytest.warns(UserWarning, match=r"final sens/train of 'c' is inf"):  # mlp: 1 of 2
        plot_final_bars(runs, tmp_path / "bars.png")
    with pytest.warns(UserWarning) as caught:
        plot_curves(runs, tmp_path / "curves.png")
    said = " ".join(str(w.message) for w in caught)
    assert "curves not drawn where their mean is NaN or inf" in said
    assert "logged the metric as null" in said  # the bare NaN, read as today's null
    assert "sens/train of 'mlp' at 2 step(s) (first: step 10)" in said
    assert "sens/train of 'c' at 2 step(s) (first: step 10, inf)" in said
    assert "'b'" not in said
    with warnings.catch_warnings():  # finite numbers: no warning
        warnings.simplefilter("error")
        plot_final_bars([r for r in runs if r.label == "b"], tmp_path / "b.png")
        plot_curves([r for r in runs if r.label == "b"], tmp_path / "b_curves.png")


def colour_pixels(png: Path, colour: tuple[float, ...]) -> int:
    """How many pixels of ``png`` are ``colour`` (RGB within 2%)."""
    import matplotlib.image

    image = matplotlib.image.imread(str(png))[..., :3]
    return int((np.abs(image - np.array(colour[:3])) < 0.02).all(axis=-1).sum())


def test_runs_without_an_epoch_are_drawn_against_the_step(tmp_path: Path) -> None:
    """A pretrained model's records (step, images; the measurement on the last) have no epoch:
    against the default x = epoch every panel was empty but for its legend."""
    rows = [{"step": s, "images": 8 * s} for s in range(1, 5)]
    rows.append({"step": 5, "images": 36, "sens/train": 0.1, "train/acc": 0.8})
    run = write_run(tmp_path / "vit", 0, {"sens/train": 0.1, "train/acc": 0.8}, rows=rows)
    runs = load_runs([run])
    colour = label_colors([LABEL])[LABEL]
    drawn = colour_pixels(plot_curves(runs, tmp_path / "curves.png"), colour)
    legend_only = colour_pixels(
        plot_curves(runs, tmp_path / "none.png", keys=["no/such_metric"]), colour)
    assert drawn > legend_only + 300  # three panels with a line or a point each
    # runs that log their epoch are drawn against it as before
    fit = write_run(tmp_path / "fit", 1, {"sens/train": 0.1})
    fit_run = load_runs([fit])
    by_epoch = colour_pixels(plot_curves(fit_run, tmp_path / "e.png"), colour)
    by_step = colour_pixels(plot_curves(fit_run, tmp_path / "s.png", x="step"), colour)
    assert by_epoch > legend_only + 100 and by_step > legend_only + 100
