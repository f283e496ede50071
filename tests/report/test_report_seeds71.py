"""Seeds a report split into rows, warnings said twice, and a verdict shown without its runs.

* ib_joint and ib_fixed_v draw each seed's data from it (``data.seed = seed``), and
  hr_random_functions each seed's target (``function_seed = seed``): the report read the seed
  field as a setting, so every seed was a row of its own (``sgd (data.seed=0)``) and no label
  had a mean ± std over seeds. A seed field that equals each run's seed is a seed now; one that
  does not (two data seeds under one model seed) still splits the label.
* ``senslab report`` reads its runs twice (report.html, then the table): "listed run … is
  missing" and "skipping truncated last line" were said twice.
* report.html showed verdict.json's verdict when a run it was computed from was gone (only a
  warning said so), and ``senslab report EXP`` printed no verdict line at all.

Run directories are written by hand in the format of docs/run-directory.md, but for the
end-to-end ib_joint run (``--set`` overrides as in tests/experiments/).
"""

from __future__ import annotations

import json
import shutil
import warnings
from pathlib import Path

import pytest

from senslab.cli import main
from senslab.report import final_table, load_experiment, load_runs, make_report


def write_run(path: Path, label: str, seed: int, final: dict, config: dict | None = None) -> Path:
    """A finished run of ``label``: two metric lines, the last at ``final``."""
    path.mkdir(parents=True)
    cfg = {"name": path.name, "label": label, "seed": seed, **(config or {})}
    (path / "config.json").write_text(json.dumps(cfg))
    rows = [{"step": 10, "epoch": 1.0, **final}, {"step": 20, "epoch": 2.0, **final}]
    (path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (path / "summary.json").write_text(json.dumps({"label": label, "seed": seed,
                                                   "final": rows[-1]}))
    return path


def write_experiment(out: Path, runs: dict[str, tuple[str, int, dict, dict]],
                     verdict: dict | None = None) -> Path:
    """An experiment directory: ``runs`` maps each run's name to (label, seed, final, config)."""
    for name, (label, seed, final, config) in runs.items():
        write_run(out / name, label, seed, final, config)
    (out / "experiment.json").write_text(json.dumps({"name": "ib_joint", "scale": "cpu",
                                                     "runs": list(runs)}))
    if verdict is not None:
        (out / "verdict.json").write_text(json.dumps(verdict))
    return out


def attention_config(seed: int, data_seed: int) -> dict:
    return {"optimizer": "sgd", "lr": 0.1, "data": {"num_samples": 32, "seed": data_seed}}


def test_a_data_seed_equal_to_the_seed_is_a_seed_not_a_setting(tmp_path: Path) -> None:
    """ib_joint's runs: sgd-s0, sgd-s1 with data.seed = seed. The table had the rows
    ``sgd (data.seed=0)`` and ``sgd (data.seed=1)``, 1 run each; now one row, 2 runs, mean ±
    std over the seeds."""
    exp = write_experiment(tmp_path / "exp", {
        f"sgd-s{s}": ("sgd", s, {"train/loss": loss}, attention_config(s, s))
        for s, loss in ((0, 0.6), (1, 0.8))})
    (row,) = final_table(load_runs(exp))
    assert row["label"] == "sgd" and row["runs"] == 2 and row["seeds"] == [0, 1]
    assert row["train/loss"].mean == pytest.approx(0.7)
    assert row["train/loss"].kind == "std" and row["train/loss"].spread == pytest.approx(0.1414,
                                                                                        abs=1e-4)


def test_a_function_seed_equal_to_the_seed_is_a_seed(tmp_path: Path) -> None:
    """hr_random_functions: ``function_seed = seed`` in every run of ``learned k=32``."""
    paths = [write_run(tmp_path / f"r{s}", "learned k=32", s, {"bool_sens": 1.0 + s},
                       {"train_size": 32, "function_seed": s}) for s in range(3)]
    (row,) = final_table(load_runs(paths))
    assert row["label"] == "learned k=32" and row["runs"] == 3
    assert row["bool_sens"].mean == pytest.approx(2.0)


def test_a_data_seed_that_is_not_the_seed_still_splits_the_label(tmp_path: Path) -> None:
    """Two runs of one model seed on two data seeds differ in their data, not their seed: they
    are shown apart (and the runs whose data.seed = seed stay together)."""
    exp = write_experiment(tmp_path / "exp", {
        "a": ("sgd", 0, {"train/loss": 0.6}, attention_config(0, 0)),
        "b": ("sgd", 0, {"train/loss": 0.8}, attention_config(0, 7))})
    labels = [r["label"] for r in final_table(load_runs(exp))]
    assert labels == ["sgd (data.seed=0)", "sgd (data.seed=7)"]
    # a real setting next to data.seed = seed: named, data.seed not
    exp2 = write_experiment(tmp_path / "exp2", {
        "a": ("sgd", 0, {"train/loss": 0.6}, attention_config(0, 0)),
        "b": ("sgd", 1, {"train/loss": 0.8}, {**attention_config(1, 1), "lr": 0.5})})
    labels = [r["label"] for r in final_table(load_runs(exp2))]
    assert labels == ["sgd (lr=0.1)", "sgd (lr=0.5)"]
    # a non-seed setting that happens to equal the seed in every run is still a setting
    paths = [write_run(tmp_path / f"n{s}", "parity", s, {"bool_sens": 1.0}, {"n": s})
             for s in (4, 6)]
    with pytest.warns(UserWarning, match="differ in n: shown apart"):
        split = final_table(load_runs(paths))
    assert [r["label"] for r in split] == ["parity (n=4)", "parity (n=6)"]


def test_missing_run_and_truncated_line_are_each_warned_once(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """``senslab report EXP`` with a listed run gone and a truncated last metric line: each
    warning was given twice (report.html, then the table)."""
    exp = write_experiment(tmp_path / "exp", {
        f"sgd-s{s}": ("sgd", s, {"train/loss": 0.5}, attention_config(s, s)) for s in range(3)})
    shutil.rmtree(exp / "sgd-s2")
    (exp / "sgd-s1" / "summary.json").unlink()  # unfinished: a cut last line is a crash's
    with open(exp / "sgd-s1" / "metrics.jsonl", "a") as f:
        f.write('{"step": 30, "train/lo')
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert main(["report", str(exp)]) == 0
    said = [str(w.message) for w in caught]
    assert sum("listed run 'sgd-s2' is missing" in m for m in said) == 1, said
    assert sum("skipping truncated last line 3" in m for m in said) == 1, said


def test_report_says_a_verdict_rests_on_runs_that_are_gone(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """verdict.json says "supported" over sgd-s0, sgd-s1; sgd-s1 is deleted. report.html showed
    the green "Verdict: supported" box as if the runs shown gave it, and ``senslab report``
    printed no verdict at all; both now print it with the runs it lacks, next to the verdict."""
    verdict = {"verdict": "supported", "reason": "SNGD ahead", "scale": "cpu",
               "overrides": ["steps=50"]}
    exp = write_experiment(tmp_path / "exp", {
        f"sgd-s{s}": ("sgd", s, {"train/loss": 0.5}, attention_config(s, s)) for s in range(2)},
        verdict)
    assert load_experiment(exp).verdict_caveat() is None
    assert main(["report", str(exp)]) == 0
    assert "\nverdict: supported — SNGD ahead\n" in capsys.readouterr().out
    html = (exp / "report.html").read_text(encoding="utf-8")
    assert 'class="verdict holds"' in html and "not backed" not in html

    shutil.rmtree(exp / "sgd-s1")
    with pytest.warns(UserWarning, match="listed run 'sgd-s1' is missing"):
        assert main(["report", str(exp)]) == 0
    out = capsys.readouterr().out
    assert "verdict (of runs not all here): supported — SNGD ahead" in out
    assert "1 is missing (sgd-s1)" in out and "--set steps=50 --out" in out
    html = (exp / "report.html").read_text(encoding="utf-8")
    assert 'class="verdict holds"' not in html
    box = html.split("Verdict not backed by the runs shown", 1)[1].split("</div>", 1)[0]
    assert "1 is missing (sgd-s1)" in box and html.index(box) < html.index("Verdict (of runs")


def test_report_says_a_verdict_rests_on_an_unfinished_run(tmp_path: Path) -> None:
    """A listed run without summary.json (retraining, or its summary removed) under a verdict:
    as `senslab reproduction`, which refuses to record it, the report says so by the verdict."""
    exp = write_experiment(tmp_path / "exp", {
        f"sgd-s{s}": ("sgd", s, {"train/loss": 0.5}, attention_config(s, s)) for s in range(2)},
        {"verdict": "contradicted", "reason": "r"})
    (exp / "sgd-s0" / "summary.json").unlink()
    with pytest.warns(UserWarning, match="have not finished"):
        report = make_report(exp)
    html = report.read_text(encoding="utf-8")
    assert "Verdict not backed by the runs shown" in html
    assert "1 has no summary.json (unfinished: sgd-s0)" in html
    assert 'class="verdict fails"' not in html


def test_report_of_an_unjudged_experiment_says_so(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    exp = write_experiment(tmp_path / "exp", {
        "sgd-s0": ("sgd", 0, {"train/loss": 0.5}, attention_config(0, 0))})
    assert main(["report", str(exp)]) == 0
    assert "verdict: not judged yet (no verdict.json)" in capsys.readouterr().out


def test_ib_joint_table_averages_its_seeds(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """``senslab run ib_joint --set seeds=2``: four labels of two seeds each, each row the mean
    of the seeds' own numbers; `senslab report` prints the verdict `run` printed."""
    out = tmp_path / "joint"
    sets = ["steps=10", "seeds=2", "batch_size=4", "data.num_samples=8", "data.seq_len=4",
            "data.dim=8"]
    assert main(["run", "ib_joint", "--out", str(out), *(f"--set={s}" for s in sets)]) == 0
    run_out = capsys.readouterr().out
    verdict_line = next(line for line in run_out.splitlines() if line.startswith("verdict: "))
    rows = {r["label"]: r for r in final_table(load_runs(out))}
    assert sorted(rows) == ["adam", "sgd", "sngd", "sps"]
    for label, row in rows.items():
        assert row["runs"] == 2 and row["seeds"] == [0, 1]
        losses = [json.loads((out / f"{label}-s{s}" / "summary.json").read_text())["final"]
                  ["train/loss"] for s in (0, 1)]
        assert row["train/loss"].mean == pytest.approx(sum(losses) / 2)
    assert "(data.seed=" not in run_out
    assert main(["report", str(out)]) == 0
    assert verdict_line in capsys.readouterr().out.splitlines()
