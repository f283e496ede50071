"""``senslab report`` on runs that have not finished (no summary.json: killed, or still training).

Their numbers are the last values they logged: a model trained for fewer steps than the
finished seeds of its label. Averaging the two as "mean ± std over seeds" reported the gap as
seed-to-seed spread. An unfinished run is shown apart (``<label> (unfinished, step N)``), with
one warning, and report.html says so; finished runs are reported as before.
"""

from __future__ import annotations

import json
import statistics
import warnings
from pathlib import Path

import pytest

from senslab.cli import main
from senslab.report import aggregate_curve, final_table, format_table, load_runs, make_report
from senslab.report.runs import group_by_label

LABEL = "parity"


def write_run(path: Path, seed: int, steps: int, acc: float, *, finished: bool,
              config: dict | None = None) -> Path:
    """A run logged every 10 steps up to ``steps``, its accuracy rising to ``acc``; with
    ``finished`` its summary.json too."""
    path.mkdir(parents=True)
    cfg = {"name": f"{LABEL}-s{seed}", "label": LABEL, "seed": seed, **(config or {})}
    (path / "config.json").write_text(json.dumps(cfg))
    rows = [{"step": s, "epoch": s / 100, "test/acc": acc * s / steps, "train/loss": 1 - s / 1000}
            for s in range(0, steps + 1, 10)]
    (path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    if finished:
        (path / "summary.json").write_text(json.dumps(
            {"label": LABEL, "final": {"test/acc": acc}, "steps": steps}))
    return path


def experiment(root: Path, killed: bool = True) -> Path:
    """Seeds 0 and 1 finished at step 400; seed 2 killed at step 20 (or finished too)."""
    exp = root / "exp"
    write_run(exp / "s0", 0, 400, 0.90, finished=True)
    write_run(exp / "s1", 1, 400, 0.94, finished=True)
    write_run(exp / "s2", 2, 20 if killed else 400, 0.50 if killed else 0.92, finished=not killed)
    (exp / "experiment.json").write_text(json.dumps(
        {"name": "hr_sharpness_vs_length", "claim": "c", "runs": ["s0", "s1", "s2"]}))
    return exp


def test_an_unfinished_run_is_not_averaged_with_the_finished_seeds(tmp_path: Path) -> None:
    exp = experiment(tmp_path)
    with pytest.warns(UserWarning) as caught:
        runs = load_runs(exp)
    unfinished = [w for w in caught if "have not finished" in str(w.message)]
    assert len(unfinished) == 1  # one warning for the experiment, not one per run
    msg = str(unfinished[0].message)
    assert f"1 run(s) have not finished (no summary.json): {exp / 's2'} (step 20)" in msg
    assert "not averaged with finished runs" in msg
    rows = {row["label"]: row for row in final_table(runs)}
    assert list(rows) == [LABEL, f"{LABEL} (unfinished, step 20)"]
    finished = rows[LABEL]
    assert finished["runs"] == 2 and finished["seeds"] == [0, 1]
    assert finished["test/acc"].mean == pytest.approx(0.92)
    assert finished["test/acc"].spread == pytest.approx(statistics.stdev([0.90, 0.94]))
    killed = rows[f"{LABEL} (unfinished, step 20)"]
    assert killed["runs"] == 1 and killed["seeds"] == [2]
    assert killed["test/acc"].mean == pytest.approx(0.50) and killed["test/acc"].spread is None
    text = format_table(final_table(runs))
    assert f"{LABEL} (unfinished, step 20)" in text
    # the curves too: the finished seeds' band is over those two alone
    groups = group_by_label(runs)
    curve = aggregate_curve(groups[LABEL], "test/acc")
    assert curve is not None and curve.count.tolist() == [2] * 41
    short = aggregate_curve(groups[f"{LABEL} (unfinished, step 20)"], "test/acc")
    assert short is not None and short.label == f"{LABEL} (unfinished, step 20)"
    assert short.steps.tolist() == [0, 10, 20]


def test_finished_runs_are_reported_as_before(tmp_path: Path) -> None:
    exp = experiment(tmp_path, killed=False)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no warning at all
        runs = load_runs(exp)
        html = make_report(exp).read_text(encoding="utf-8")
    assert all(r.status == "finished" and r.group_label == r.label == LABEL for r in runs)
    rows = final_table(runs)
    assert len(rows) == 1 and rows[0]["runs"] == 3
    assert "unfinished" not in html and "<td>finished</td>" in html


def test_report_html_shows_the_status_of_every_run(tmp_path: Path) -> None:
    exp = experiment(tmp_path)
    with pytest.warns(UserWarning, match="have not finished"):
        html = make_report(exp).read_text(encoding="utf-8")
    assert "1 of 3 run(s) unfinished" in html
    assert "parity-s2 (unfinished, step 20)" in html
    assert "<td>parity (unfinished, step 20)</td>" in html  # its own row
    assert html.count("<td>finished</td>") == 2 and "<td>unfinished, step 20</td>" in html


def test_senslab_report_warns_once_and_labels_the_row(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The command reads the runs twice (report.html, then the table): one warning."""
    exp = experiment(tmp_path)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("default")
        assert main(["report", str(exp)]) == 0
    assert sum("have not finished" in str(w.message) for w in caught) == 1
    out = capsys.readouterr().out
    lines = [line for line in out.splitlines() if line.startswith(LABEL)]
    assert len(lines) == 2 and lines[1].startswith(f"{LABEL} (unfinished, step 20)")
    assert lines[0].split()[1] == "2"  # the finished label counts its 2 runs


def test_a_sweep_keeps_its_settings_in_an_unfinished_runs_label(tmp_path: Path) -> None:
    """Runs of one label over n (a sweep in one experiment): the unfinished run is labelled with
    its setting and its status; a finished run of the same setting and seed is no twin of it."""
    exp = tmp_path / "exp"
    write_run(exp / "n3", 0, 400, 0.9, finished=True, config={"n": 3})
    write_run(exp / "n4", 0, 30, 0.6, finished=False, config={"n": 4})
    write_run(exp / "n4-again", 1, 400, 0.8, finished=True, config={"n": 4})
    (exp / "experiment.json").write_text(json.dumps(
        {"name": "x", "claim": "c", "runs": ["n3", "n4", "n4-again"]}))
    with pytest.warns(UserWarning, match="have not finished") as caught:
        runs = load_runs(exp)
    assert not [w for w in caught if "same settings and seed" in str(w.message)]
    assert [r.group_label for r in runs] == [
        f"{LABEL} (n=3)", f"{LABEL} (n=4) (unfinished, step 30)", f"{LABEL} (n=4)"]
    assert [row["runs"] for row in final_table(runs)] == [1, 1, 1]


def test_a_run_that_logged_nothing_yet(tmp_path: Path) -> None:
    run = write_run(tmp_path / "r", 0, 400, 0.9, finished=False)
    (run / "metrics.jsonl").write_text("")
    with pytest.warns(UserWarning, match="nothing logged"):
        (loaded,) = load_runs(run)
    assert loaded.group_label == f"{LABEL} (unfinished, nothing logged)"
