"""Audit 86 (cliexp): `senslab reproduction` with a records folder that holds no record, and
ladder directories with a damaged ladder.json or rung file."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from senslab.cli import main
from senslab.reproduction import render, shown_records


def _error_line(err: str) -> str:
    lines = [line for line in err.strip().splitlines() if line.startswith("senslab: error: ")]
    assert len(lines) == 1, err
    return lines[0]


RECORD = {"name": "demo", "scale": "cpu", "verdict": "supported", "reason": "ViT lowest",
          "seeds": 3, "schema": 2}


def test_a_records_folder_without_records_does_not_blank_the_rows(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`senslab reproduction --records reproducton` (a typo, or the command run in another
    directory) rewrote REPRODUCTION.md from no records: every recorded row read "not run here",
    exit status 0. Refused, naming --records and the rows; the file is left as it was."""
    md = tmp_path / "R.md"
    text = render({"demo": RECORD})
    md.write_text(text)
    assert shown_records(text) == ["demo"]
    (tmp_path / "runs").mkdir()
    typo = tmp_path / "reproducton"
    argv = ["reproduction", "--runs", str(tmp_path / "runs"), "--out", str(md)]
    assert main([*argv, "--records", str(typo)]) == 2
    line = _error_line(capsys.readouterr().err)
    assert f"--records {typo} holds no record" in line and "1 recorded row (demo)" in line, line
    assert md.read_text() == text and not typo.exists()
    # an empty folder holds no record either
    typo.mkdir()
    assert main([*argv, "--records", str(typo)]) == 2
    assert "no record in it" in _error_line(capsys.readouterr().err)
    assert md.read_text() == text
    # the folder the rows were recorded in: written as before
    records = tmp_path / "rec"
    records.mkdir()
    (records / "demo.json").write_text(json.dumps(RECORD))
    assert main([*argv, "--records", str(records)]) == 0
    assert md.read_text() == text
    # no file yet (a new project): written from no records, and the note says so
    fresh = tmp_path / "new.md"
    assert main([*argv, "--records", str(typo), "--out", str(fresh)]) == 0
    assert "(none: every experiment's row reads" in capsys.readouterr().err
    assert fresh.is_file() and shown_records(fresh.read_text()) == []


def test_shown_records_reads_the_paper_and_ladder_rows() -> None:
    paper = {**RECORD, "scale": "paper"}
    ladder = {"name": "demo", "summary": "s", "rungs": [
        {"rung": "cpu", "status": "not run", "cpu": True, "command": "c"}]}
    from senslab.reproduction import render as rendered

    text = rendered({"demo": RECORD, "demo.paper": paper}, {"demo": ladder})
    assert shown_records(text) == ["demo", "demo (paper)", "demo (ladder)"]


def _ladder_dir(tmp_path: Path) -> Path:
    """A ladder directory of demo whose rung cpu started (its experiment.json, no verdict)."""
    lad = tmp_path / "lad"
    (lad / "cpu").mkdir(parents=True)
    (lad / "cpu" / "experiment.json").write_text(json.dumps({"name": "demo", "runs": []}))
    return lad


@pytest.mark.parametrize("damage", ['{"nam', "{}", "[1]"])
def test_a_damaged_ladder_json_is_read_past_to_its_rungs(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], damage: str) -> None:
    """A ladder.json cut short failed as "a JSON file is truncated or damaged ... run with
    SENSLAB_DEBUG=1 to see which", one without its name as the bare error "name". The rung
    directories name the experiment: recorded, and ladder.json written again."""
    lad = _ladder_dir(tmp_path)
    (lad / "ladder.json").write_text(damage)
    records = tmp_path / "rec"
    assert main(["reproduction", str(lad), "--records", str(records),
                 "--out", str(tmp_path / "R.md")]) == 0, capsys.readouterr().err
    rec = json.loads((records / "ladders" / "demo.json").read_text())
    assert rec["name"] == "demo" and rec["rungs"][0]["status"].startswith("started")
    assert json.loads((lad / "ladder.json").read_text())["name"] == "demo"


def test_a_damaged_ladder_json_without_rungs_is_named(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    lad = tmp_path / "lad"
    lad.mkdir()
    (lad / "ladder.json").write_text("{}")
    assert main(["reproduction", str(lad), "--records", str(tmp_path / "rec"),
                 "--out", str(tmp_path / "R.md")]) == 2
    line = _error_line(capsys.readouterr().err)
    assert f"{lad / 'ladder.json'} is damaged" in line and "--scale ladder" in line, line
    assert not (tmp_path / "R.md").exists()
