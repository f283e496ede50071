"""A record rests on its runs (audit repro53 D2): ``senslab reproduction`` refuses a directory
whose listed runs are missing or unfinished, and one whose verdict.json no longer follows from
its runs' summaries. Built from one tiny real ``ib_joint`` directory (8 runs of a few steps)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from senslab.cli import main
from senslab.experiments import run_experiment
from senslab.reproduction import load_records, record

SETS = ["steps=20", "seeds=2", "batch_size=4", "data.num_samples=8", "data.seq_len=4",
        "data.dim=8"]
AGAIN = "senslab run ib_joint " + " ".join(f"--set {s}" for s in SETS)


@pytest.fixture(scope="module")
def finished(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict]:
    out = tmp_path_factory.mktemp("ib") / "joint"
    verdict = run_experiment("ib_joint", out, overrides=SETS, log=lambda _: None)
    return out, verdict


@pytest.fixture
def exp_dir(finished: tuple[Path, dict], tmp_path: Path) -> Path:
    """A copy of the finished directory, for a test to damage."""
    return Path(shutil.copytree(finished[0], tmp_path / "joint"))


def test_a_finished_directory_is_recorded(finished: tuple[Path, dict], tmp_path: Path) -> None:
    out, verdict = finished
    path = record(out, tmp_path / "rec")
    rec = load_records(tmp_path / "rec")["ib_joint"]
    assert path.name == "ib_joint.json" and rec["runs"] == 8 and rec["seeds"] == 2
    assert rec["verdict"] == verdict["verdict"] and rec["effects"] == verdict["effects"]
    assert rec["overrides"] == SETS


def test_missing_or_unfinished_runs_are_refused(exp_dir: Path, tmp_path: Path) -> None:
    (exp_dir / "sgd-s1" / "summary.json").unlink()  # unfinished
    shutil.rmtree(exp_dir / "adam-s1")  # gone
    with pytest.raises(FileNotFoundError) as err:
        record(exp_dir, tmp_path / "rec")
    text = str(err.value)
    assert "2 of the 8 runs its experiment.json lists have no summary.json" in text
    assert "sgd-s1, adam-s1" in text
    assert f"`{AGAIN} --out {exp_dir}`" in text  # resumes them with the same settings
    assert not (tmp_path / "rec").exists()


def test_the_cli_refuses_too(exp_dir: Path, tmp_path: Path,
                             capsys: pytest.CaptureFixture[str]) -> None:
    (exp_dir / "sps-s0" / "summary.json").unlink()
    md = tmp_path / "R.md"
    assert main(["reproduction", str(exp_dir), "--records", str(tmp_path / "rec"),
                 "--out", str(md)]) == 2
    assert "sps-s0" in capsys.readouterr().err and not md.exists()


def test_a_verdict_the_runs_no_longer_give_is_stale(exp_dir: Path, tmp_path: Path) -> None:
    verdict = json.loads((exp_dir / "verdict.json").read_text())
    other = "supported" if verdict["verdict"] != "supported" else "contradicted"
    (exp_dir / "verdict.json").write_text(json.dumps({**verdict, "verdict": other}))
    with pytest.raises(ValueError, match=rf"verdict.json is stale: .*verdict: recorded "
                                         rf"'{other}', its runs give '{verdict['verdict']}'"):
        record(exp_dir, tmp_path / "rec")
    assert not (tmp_path / "rec").exists()


def test_an_edited_summary_makes_the_verdict_stale(exp_dir: Path, tmp_path: Path) -> None:
    path = exp_dir / "sngd-s1" / "summary.json"
    summary = json.loads(path.read_text())
    summary["final"]["attn/alignment"] -= 5.0
    path.write_text(json.dumps(summary))
    with pytest.raises(ValueError, match=r"verdict.json is stale: .*'sngd attn/alignment > sgd'"
                                         r"\.\w+: recorded -?[0-9.]+, its runs give"):
        record(exp_dir, tmp_path / "rec")
    assert not (tmp_path / "rec").exists()


def test_a_verdict_written_before_an_effect_gained_a_field_is_not_stale(
        exp_dir: Path, tmp_path: Path) -> None:
    """A verdict.json written by code whose effects lacked a field that later code adds (the
    committed hr_norm_vs_blowup run's rho before its scale and z) was refused as stale, with two
    identical intervals in the message; only fields both hold are compared."""
    path = exp_dir / "verdict.json"
    verdict = json.loads(path.read_text())
    part = sorted(verdict["effects"])[0]
    field = sorted(verdict["effects"][part])[-1]
    del verdict["effects"][part][field]
    path.write_text(json.dumps(verdict))
    assert record(exp_dir, tmp_path / "rec").is_file()
