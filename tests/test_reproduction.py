"""REPRODUCTION.md generation: records from experiment directories, rendering, error paths."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from senslab.cli import main
from senslab.experiments import get_experiment, list_experiments
from senslab.reproduction import load_records, record, render, reproduction


def _exp_dir(root: Path, name: str, verdict: str = "holds", scale: str = "cpu",
             **extra: object) -> Path:
    d = root / name
    d.mkdir(parents=True)
    (d / "experiment.json").write_text(json.dumps(
        {"name": name, "paper": "p", "claim": "c", "scale": scale, "runs": ["a", "b"]}))
    (d / "verdict.json").write_text(json.dumps(
        {"verdict": verdict, "reason": f"{name}: measured 0.123 vs 0.456", "evidence": {"x": 1},
         "scale": scale, "runtime_s": 125.0, "overrides": [], **extra}))
    return d


def test_record_and_render(tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    _exp_dir(runs, "grokking")
    _exp_dir(runs, "ib_joint", verdict="does not hold", overrides=["steps=50"])
    out = reproduction(records=tmp_path / "rec", out=tmp_path / "R.md", runs_root=runs,
                       log=lambda _: None)
    recs = load_records(tmp_path / "rec")
    assert set(recs) == {"grokking", "ib_joint"}
    assert recs["grokking"]["runs"] == 2 and recs["grokking"]["runtime_s"] == 125.0
    assert "evidence" not in recs["grokking"]  # records stay small
    text = out.read_text()
    # one row per registered experiment, recorded or not
    for name in list_experiments():
        assert f"`{name}`" in text
    row = next(line for line in text.splitlines() if line.startswith("| `grokking`"))
    assert "grokking: measured 0.123 vs 0.456" in row and "2.1 min" in row
    assert "**holds**" in row and get_experiment("grokking").claim in row
    assert "`--set steps=50`" in text and "**does not hold**" in text
    demo = next(line for line in text.splitlines() if line.startswith("| `demo`"))
    assert "not run here" in demo
    assert "Summary: 1 does not hold, 1 holds," in text
    # rendering is a pure function of the records: same records, same text
    assert render(load_records(tmp_path / "rec")) == text


def test_record_errors(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="no experiment.json"):
        record(tmp_path / "nothing", tmp_path / "rec")
    d = _exp_dir(tmp_path, "grokking")
    (d / "verdict.json").unlink()
    with pytest.raises(FileNotFoundError, match="did not finish"):
        record(d, tmp_path / "rec")
    with pytest.raises(KeyError, match="not registered"):
        record(_exp_dir(tmp_path, "no_such_experiment"), tmp_path / "rec")
    with pytest.raises(ValueError, match="CPU-scale runs only"):
        record(_exp_dir(tmp_path / "p", "grokking", scale="paper"), tmp_path / "rec")
    assert not (tmp_path / "rec").exists()


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
    assert (root / "REPRODUCTION.md").read_text() == render(load_records(root / "reproduction"))
