"""What a report calls a run and what its plots say (senslab.report.runs / plots): an empty
label in a finished run's summary is none; warnings name what the runs logged."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from senslab.report.aggregate import final_table
from senslab.report.runs import load_runs


def boolean_run(path: Path, finished: bool) -> Path:
    """A boolean trainer's run configured without a label: its summary (when finished) says
    ``"label": ""``, as the trainer writes ``cfg.label``."""
    path.mkdir()
    config = {"name": path.name, "label": "", "function": "parity", "n": 5, "seed": 0}
    (path / "config.json").write_text(json.dumps(config))
    last = {"step": 20, "train/loss": 0.25}
    (path / "metrics.jsonl").write_text(json.dumps(last) + "\n")
    if finished:
        (path / "summary.json").write_text(json.dumps({"label": "", "name": path.name,
                                                       "final": last}))
    return path


@pytest.mark.filterwarnings("ignore:1 run\\(s\\) have not finished")
def test_an_empty_summary_label_reads_as_the_runs_name(tmp_path: Path) -> None:
    # before: the finished run read as "" (a bar and a table row without a name) while the
    # same run unfinished read as its name
    done = boolean_run(tmp_path / "parity-s0", finished=True)
    (run,) = load_runs(done)
    assert run.label == "parity-s0"
    assert final_table([run])[0]["label"] == "parity-s0"
    (stopped,) = load_runs(boolean_run(tmp_path / "parity-s1", finished=False))
    assert stopped.label == "parity-s1"
    # a summary's own label still wins over the name
    summary = json.loads((done / "summary.json").read_text())
    (done / "summary.json").write_text(json.dumps({**summary, "label": "PARITY"}))
    (run,) = load_runs(done)
    assert run.label == "PARITY"


def test_a_curve_of_some_runs_names_a_run_that_logged_null_alone(tmp_path: Path) -> None:
    """Of a label's two runs one logged the metric only as null (a NaN each time): the curve
    is the other's alone, and the warning said the first "never logged the metric"."""
    from senslab.report.plots import plot_curves

    paths = []
    for seed, value in ((0, 0.5), (1, None)):
        path = tmp_path / f"mlp-s{seed}"
        path.mkdir()
        (path / "config.json").write_text(json.dumps({"name": path.name, "label": "mlp",
                                                      "seed": seed}))
        rows = [{"step": s, "epoch": s, "sens/train": value} for s in (1, 2)]
        (path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
        (path / "summary.json").write_text(json.dumps({"label": "mlp", "final": rows[-1]}))
        paths.append(path)
    with pytest.warns(UserWarning) as said:
        plot_curves(load_runs(paths), tmp_path / "curves.png", keys=["sens/train"])
    texts = [str(w.message) for w in said]
    partial = [t for t in texts if "mean of only some" in t]
    assert len(partial) == 1 and "or as null alone" in partial[0], texts
    assert "sens/train of 'mlp': 1 of 2 runs" in partial[0]
    assert any("logged the metric as null" in t for t in texts)  # the second word, as before


def test_an_acc_key_no_run_logged_is_said(tmp_path: Path) -> None:
    """plot_final_bars(acc_key="test_acc") (a typo of test/acc) drew bars without their
    accuracy, without a word; the default (train/acc, where logged) stays quiet."""
    import warnings

    from senslab.report.plots import plot_final_bars

    path = tmp_path / "mlp-s0"
    path.mkdir()
    (path / "config.json").write_text(json.dumps({"name": path.name, "label": "mlp",
                                                  "seed": 0}))
    last = {"step": 2, "epoch": 2, "sens/train": 0.2, "sens/train_se": 0.01, "test/acc": 0.9}
    (path / "metrics.jsonl").write_text(json.dumps(last) + "\n")
    (path / "summary.json").write_text(json.dumps({"label": "mlp", "final": last}))
    runs = load_runs(path)
    with pytest.warns(UserWarning, match=r"no run logged a final 'test_acc'.*pass acc_key="):
        plot_final_bars(runs, tmp_path / "typo.png", acc_key="test_acc")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        plot_final_bars(runs, tmp_path / "default.png")  # no train/acc: no annotation, quiet
        plot_final_bars(runs, tmp_path / "test.png", acc_key="test/acc")
