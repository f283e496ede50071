"""REPRODUCTION.md generation: records from experiment directories, rendering, error paths."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from senslab.cli import main
from senslab.experiments import get_experiment, list_experiments
from senslab.reproduction import (
    format_runtime,
    load_ladders,
    load_records,
    record,
    render,
    reproduction,
)


@pytest.fixture(autouse=True)
def _made_up_runs(monkeypatch: pytest.MonkeyPatch) -> None:
    """The directories here are made up (experiment.json lists runs that do not exist): these
    tests are about records and rendering, so the check that a verdict follows from its runs
    (tests/test_reproduction_records.py, on real runs) is left out."""
    monkeypatch.setattr("senslab.reproduction.check_verdict", lambda *args: None)


def _exp_dir(root: Path, name: str, verdict: str = "supported", scale: str = "cpu",
             **extra: object) -> Path:
    d = root / name
    d.mkdir(parents=True)
    (d / "experiment.json").write_text(json.dumps(
        {"name": name, "paper": "p", "claim": "c", "scale": scale, "runs": ["a", "b"]}))
    (d / "verdict.json").write_text(json.dumps(
        {"verdict": verdict, "reason": f"{name}: measured 0.123 vs 0.456", "evidence": {"x": 1},
         "scale": scale, "runtime_s": 125.0, "overrides": [], **extra}))
    return d


EFFECTS = {"mlp": {"what": "mlp − vit", "effect": 0.012, "interval": [0.004, 0.02],
                   "level": 0.975, "se": 0.002, "se_measure": 0.0015, "se_seed": 0.0013,
                   "seeds": 3, "verdict": "supported"}}


def test_record_and_render(tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    _exp_dir(runs, "grokking", effects=EFFECTS, seeds=3, device="CPU: X, 2 cores", threads=1)
    _exp_dir(runs, "ib_joint", verdict="inconclusive", overrides=["steps=50"])
    out = reproduction(records=tmp_path / "rec", out=tmp_path / "R.md", runs_root=runs,
                       log=lambda _: None)
    recs = load_records(tmp_path / "rec")
    assert set(recs) == {"grokking", "ib_joint"}
    assert recs["grokking"]["runs"] == 2 and recs["grokking"]["runtime_s"] == 125.0
    assert recs["grokking"]["schema"] == 2 and recs["grokking"]["seeds"] == 3
    assert "evidence" not in recs["grokking"]  # records stay small
    text = out.read_text()
    # one row per registered experiment, recorded or not
    for name in list_experiments():
        assert f"`{name}`" in text
    row = next(line for line in text.splitlines() if line.startswith("| `grokking`"))
    cells = row.split(" | ")
    assert cells[2] == "cpu" and cells[4] == "3"
    assert cells[5] == "mlp − vit +0.012 [+0.004, +0.02] (s.e. 0.002: meas. 0.0015, seeds 0.0013)"
    assert cells[7] == "CPU: X, 2 cores, 1 thread"
    assert "grokking: measured 0.123 vs 0.456" in row and "2.1 min" in row
    assert "**supported**" in row and get_experiment("grokking").claim in row
    assert "`--set steps=50`" in text and "**inconclusive**" in text
    demo = next(line for line in text.splitlines() if line.startswith("| `demo`"))
    assert "not run here" in demo
    assert "Summary, CPU scale: 1 supported, 1 inconclusive," in text
    # rendering is a pure function of the records: same records, same text
    assert render(load_records(tmp_path / "rec")) == text


def test_paper_scale_rows(tmp_path: Path) -> None:
    """A paper-scale run is recorded beside the CPU one (``<name>.paper.json``) and gets its own
    row; the summary counts each scale apart."""
    _exp_dir(tmp_path / "cpu", "grokking")
    _exp_dir(tmp_path / "paper", "grokking", verdict="contradicted", scale="paper",
             device="NVIDIA H100 (CUDA)")
    record(tmp_path / "cpu" / "grokking", tmp_path / "rec")
    path = record(tmp_path / "paper" / "grokking", tmp_path / "rec")
    assert path.name == "grokking.paper.json"
    recs = load_records(tmp_path / "rec")
    assert set(recs) == {"grokking", "grokking.paper"}
    text = render(recs)
    rows = [line.split(" | ") for line in text.splitlines() if line.startswith("| `grokking`")]
    assert [r[2] for r in rows] == ["cpu", "paper"]
    assert rows[1][7] == "NVIDIA H100 (CUDA)" and rows[1][8] == "**contradicted** |"
    assert "Paper scale: 1 contradicted." in text


def test_record_errors(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="no experiment.json"):
        record(tmp_path / "nothing", tmp_path / "rec")
    d = _exp_dir(tmp_path, "grokking")
    (d / "verdict.json").unlink()
    with pytest.raises(FileNotFoundError, match="did not finish"):
        record(d, tmp_path / "rec")
    with pytest.raises(KeyError, match="not registered"):
        record(_exp_dir(tmp_path, "no_such_experiment"), tmp_path / "rec")
    with pytest.raises(ValueError, match="records the scales cpu, paper"):
        record(_exp_dir(tmp_path / "p", "grokking", scale="ladder"), tmp_path / "rec")
    assert not (tmp_path / "rec").exists()


def test_newer_or_damaged_schemas_are_refused(tmp_path: Path) -> None:
    """An experiment directory of a newer senslab is not recorded as a current record (report
    refuses it too); ladder records get the same schema check as experiment records; a schema
    that is not a whole number from 1 up, or a record without a verdict, is damaged."""
    d = _exp_dir(tmp_path, "grokking")
    (d / "senslab.json").write_text(json.dumps({"kind": "experiment", "schema": 99}))
    with pytest.raises(ValueError, match="newer senslab"):
        record(d, tmp_path / "rec")
    assert not (tmp_path / "rec").exists()
    rec = tmp_path / "records"
    (rec / "ladders").mkdir(parents=True)
    ladder = rec / "ladders" / "demo.json"
    ladder.write_text(json.dumps({"name": "demo", "rungs": [], "schema": 99}))
    with pytest.raises(ValueError, match="newer senslab"):
        load_ladders(rec)
    ladder.unlink()
    good = {"name": "demo", "verdict": "supported", "scale": "cpu"}
    for schema in (True, 0, -1, "2"):
        (rec / "demo.json").write_text(json.dumps({**good, "schema": schema}))
        with pytest.raises(ValueError, match="invalid record schema"):
            load_records(rec)
    (rec / "demo.json").write_text(json.dumps({"name": "demo", "schema": 2}))
    with pytest.raises(ValueError, match="lacks 'verdict'"):
        load_records(rec)
    (rec / "demo.json").write_text(json.dumps({**good, "schema": 2}))
    assert load_records(rec)["demo"]["verdict"] == "supported"


def test_cli(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    d = _exp_dir(tmp_path / "runs", "sparse_parity", verdict="not comparable")
    md = tmp_path / "R.md"
    assert main(["reproduction", str(d), "--records", str(tmp_path / "rec"),
                 "--out", str(md)]) == 0
    assert "**not comparable**" in md.read_text()
    assert main(["reproduction", str(tmp_path / "missing"), "--out", str(md)]) == 2
    assert "no experiment.json" in capsys.readouterr().err


def test_checked_in_records_are_current() -> None:
    """The committed REPRODUCTION.md is exactly what the committed records render to."""
    root = Path(__file__).resolve().parents[1]
    if not (root / "reproduction").is_dir():
        pytest.skip("no records in this checkout")
    assert (root / "REPRODUCTION.md").read_text() == render(load_records(root / "reproduction"),
                                                             load_ladders(root / "reproduction"))


def test_runtimes_come_from_records_only(tmp_path: Path) -> None:
    """A runtime is a measurement: it lives in a record's ``runtime_s``, never in a class
    attribute. An experiment may carry a runtime *estimate* only while it has no record, and
    the estimate says it is one."""
    root = Path(__file__).resolve().parents[1]
    recorded = set(load_records(root / "reproduction")) if (root / "reproduction").is_dir() \
        else set()
    for name in list_experiments():
        exp = get_experiment(name)
        assert not hasattr(exp, "cpu_runtime"), name
        if exp.runtime_estimate:
            assert "estimate" in exp.runtime_estimate, name
            assert name not in recorded, f"{name} has a record: drop its runtime_estimate"
    # rendered: a record's runtime_s, "—" for a record without one, the estimate when unrecorded
    _exp_dir(tmp_path / "runs", "grokking")
    _exp_dir(tmp_path / "runs", "sparse_parity", runtime_s=None)
    reproduction(records=tmp_path / "rec", out=tmp_path / "R.md",
                 runs_root=tmp_path / "runs", log=lambda _: None)
    rows = {line.split(" | ")[0].split("`")[1]: line.split(" | ")
            for line in (tmp_path / "R.md").read_text().splitlines() if line.startswith("| `")}
    assert rows["grokking"][6] == "2.1 min"
    assert rows["sparse_parity"][6] == "—"
    assert rows["cifar10"][6] == get_experiment("cifar10").runtime_estimate
    assert rows["imagenet"][6] == "—"
    assert (format_runtime(84.0), format_runtime(125.0), format_runtime(None)) \
        == ("84 s", "2.1 min", "—")


def test_list_shows_recorded_runtimes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                      capsys: pytest.CaptureFixture[str]) -> None:
    """`senslab list experiments` reads ./reproduction/ when there is one, and shows nothing
    measured when there is none (an installed senslab run outside the repository)."""
    monkeypatch.chdir(tmp_path)
    assert main(["list", "experiments", "grokking"]) == 0
    assert "on CPU" not in capsys.readouterr().out
    assert main(["list", "experiments", "cifar10"]) == 0
    assert "(estimate: CIFAR-10 is not available here) on CPU]" in capsys.readouterr().out
    record(_exp_dir(tmp_path / "runs", "grokking"), tmp_path / "reproduction")
    assert main(["list", "experiments", "grokking"]) == 0
    assert "[2.1 min on CPU, recorded]" in capsys.readouterr().out
    (tmp_path / "reproduction" / "grokking.json").write_text("{")  # damaged: warn, list anyway
    with pytest.warns(UserWarning, match="runtimes not shown: .*grokking.json is not valid"):
        assert main(["list", "experiments", "grokking"]) == 0
    out = capsys.readouterr().out
    assert "grokking" in out and "on CPU" not in out


def _readme_runtime_cells(readme: str) -> list[tuple[list[str], str]]:
    """(experiment names, runtime cell) of every README table row whose first cell names
    experiments in backticks, in tables with a "CPU runtime" column."""
    out, col = [], None
    for line in readme.splitlines():
        if not line.startswith("|"):
            col = None
            continue
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if "CPU runtime" in cells:
            col = cells.index("CPU runtime")
        elif col is not None and cells[0].startswith("`"):
            names = [n.strip().strip("`") for n in cells[0].split(",")]
            out.append((names, cells[col]))
    return out


def test_readme_runtimes_match_the_records() -> None:
    """README's experiment tables show, for every recorded experiment, the runtime REPRODUCTION.md
    renders from its record (a row naming several experiments: theirs joined by " / ")."""
    root = Path(__file__).resolve().parents[1]
    if not (root / "reproduction").is_dir() or not (root / "README.md").is_file():
        pytest.skip("no records or README in this checkout")
    records = load_records(root / "reproduction")
    rows = _readme_runtime_cells((root / "README.md").read_text())
    assert len(rows) >= 10, "README's experiment tables were not found"
    registered = set(list_experiments())
    checked = set()
    for names, cell in rows:
        assert set(names) <= registered, f"README names unknown experiments: {names}"
        if not any(n in records for n in names):
            # not run here: an estimate shown is the experiment's own (senslab list's), which
            # said ~30 and ~18 min where this table said ~10
            if "min" in cell:
                estimates = [get_experiment(n).runtime_estimate.split(",")[0] for n in names]
                assert all(estimates), f"README estimates {names} without a runtime_estimate"
                assert cell == " / ".join(estimates) + " (estimate)", (names, cell)
            continue
        want = " / ".join(format_runtime(records[n].get("runtime_s")) if n in records
                          else "not run" for n in names)
        assert cell == want, f"README runtime of {', '.join(names)}: {cell!r}, record: {want!r}"
        checked.update(n for n in names if n in records)
    assert checked == set(records) & registered, "recorded experiments missing from README"
