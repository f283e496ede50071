"""Audit 86, reading and aggregating runs for reports (senslab.report.runs / aggregate)."""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import pytest

from senslab.report.aggregate import aggregate_curve, final_table
from senslab.report.html import make_report
from senslab.report.plots import plot_final_bars
from senslab.report.runs import load_runs
from senslab.train.looprun import LoopRun
from senslab.train.loops.attention import AttentionConfig
from senslab.train.loops.grokking import GrokkingRun


def stopped_run(path: Path, config: object, record: dict) -> Path:
    """A run directory as its trainer's LoopRun writes it (config.json, env.json, one record
    in metrics.jsonl), stopped before its summary.json."""
    with LoopRun(path, config) as run:
        assert run.restore() is None  # a fresh start: config.json as the trainer writes it
        run.log(record)
    assert not (path / "summary.json").exists()
    return path


@pytest.mark.filterwarnings("ignore:1 run\\(s\\) have not finished")
def test_an_unfinished_run_of_the_attention_and_grokking_loops_has_its_finished_label(
        tmp_path: Path) -> None:
    """The attention loop's summary label is ``cfg.label or cfg.optimizer`` and the grokking
    loop's is ``"modadd"``, given only at the finish: an unfinished run (its config.json label
    empty, or none) read as its name, ``att-s0 (unfinished, step 5)``, never beside the
    finished runs of its label."""
    att = stopped_run(tmp_path / "att", AttentionConfig(name="att-s0", optimizer="sgd"),
                      {"step": 5, "train/loss": 0.5})
    grok = stopped_run(tmp_path / "grok", GrokkingRun(name="modadd-p113-s0"),
                       {"step": 3, "epoch": 3, "train/loss": 4.0})
    named = stopped_run(tmp_path / "named",
                        AttentionConfig(name="ngd-s1", label="NGD", optimizer="ngd"),
                        {"step": 5, "train/loss": 0.4})
    assert json.loads((att / "config.json").read_text())["label"] == ""
    assert "label" not in json.loads((grok / "config.json").read_text())
    for path, label, step in ((att, "sgd", 5), (grok, "modadd", 3), (named, "NGD", 5)):
        (run,) = load_runs(path)
        assert run.label == label  # was att-s0 and modadd-p113-s0 (NGD was right)
        assert run.group_label == f"{label} (unfinished, step {step})"
        assert final_table([run])[0]["label"] == run.group_label


def test_a_config_written_by_hand_is_not_given_a_trainer_label(tmp_path: Path) -> None:
    """A config.json of ``name`` and ``seed`` alone fits several trainers' configurations: no
    trainer's label is guessed for it, it reads as its name."""
    path = tmp_path / "mine"
    path.mkdir()
    (path / "config.json").write_text(json.dumps({"name": "mine", "seed": 0, "lr": 0.1}))
    (path / "metrics.jsonl").write_text('{"step": 1, "train/loss": 0.5}\n')
    with pytest.warns(UserWarning, match="have not finished"):
        (run,) = load_runs(path)
    assert run.label == "mine"


def write_run(path: Path, seed: int, loss: str, se: str | None = None) -> Path:
    """A finished run of label ``mlp`` whose final train/loss is written as the JSON text
    ``loss`` (``NaN`` bare, as senslab wrote it before, or ``null`` as it writes it now)."""
    path.mkdir()
    (path / "config.json").write_text(json.dumps({"name": path.name, "label": "mlp",
                                                  "seed": seed}))
    extra = "" if se is None else f', "train/loss_se": {se}'
    last = f'{{"step": 2, "epoch": 2, "train/loss": {loss}{extra}}}'
    (path / "metrics.jsonl").write_text(f'{{"step": 1, "epoch": 1, "train/loss": 0.9}}\n{last}\n')
    (path / "summary.json").write_text(f'{{"label": "mlp", "final": {last}}}')
    return path


def test_a_bare_nan_written_by_an_older_senslab_reads_as_todays_null(tmp_path: Path) -> None:
    """One seed of three diverged: written as null today, it is left out of the mean and said
    (``0.5 ± 0.14 (2 of 3 runs, 1 null)``); written bare as NaN by an older senslab, the mean
    read ``nan ± nan`` and the curve's last point NaN, with no null step named."""
    texts = {}
    for style, bad in (("old", "NaN"), ("new", "null")):
        (tmp_path / style).mkdir()
        runs = load_runs([write_run(tmp_path / style / f"s{s}", s, v)
                          for s, v in enumerate(("0.4", "0.6", bad))])
        (row,) = final_table(runs)
        texts[style] = str(row["train/loss"])
        curve = aggregate_curve(runs, "train/loss")
        assert curve is not None
        assert curve.count.tolist() == [3, 2] and curve.null == (2,)
        assert curve.mean.tolist() == pytest.approx([0.9, 0.5])
        assert runs[2].final["train/loss"] is None
        assert runs[2].series("train/loss")[0] == [1]
    assert texts["old"] == texts["new"] == "0.5 ± 0.14 (2 of 3 runs, 1 null)"


def test_a_single_runs_standard_error_logged_as_null_is_not_read_as_exact(
        tmp_path: Path) -> None:
    """A standard error over one example is NaN, written as null: a single run's number read
    ``0.3``, as if known exactly (the bar drew no error bar without a word), where the same NaN
    written bare read ``0.3 ± nan (se)`` and the bar chart said it draws no error bar."""
    runs = load_runs([write_run(tmp_path / "m0", 0, "0.3", se="null")])
    (row,) = final_table(runs)
    assert str(row["train/loss"]) == "0.3 ± nan (se)"
    with pytest.warns(UserWarning, match=r"'mlp' is 0\.3 ± nan \(se\): a NaN or inf spread"):
        plot_final_bars(runs, tmp_path / "bars.png", key="train/loss")
    # a logged standard error is still shown, and a run that logged none has no spread
    runs = load_runs([write_run(tmp_path / "m1", 0, "0.3", se="0.01"),
                      write_run(tmp_path / "m2", 1, "0.3")])
    assert [str(r["train/loss"]) for r in final_table(runs, per_run=True)] == [
        "0.3 ± 0.01 (se)", "0.3"]


def test_report_html_of_an_unfinished_attention_run_names_its_label(tmp_path: Path) -> None:
    """report.html's rows of an unfinished attention run read under the optimizer's label."""
    stopped_run(tmp_path / "att", AttentionConfig(name="att-s0", optimizer="adam"),
                {"step": 5, "train/loss": 0.5})
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        page = make_report(tmp_path / "att", out_dir=tmp_path / "out").read_text()
    assert "<td>adam (unfinished, step 5)</td>" in page
