"""``senslab`` options that contradicted each other and were taken without a word: two models
(``measure --hf`` and ``--timm``), and a report of several directories written over the first
run's own report.html."""

from __future__ import annotations

from pathlib import Path

import pytest
from cliproc import QUICK_TRAIN

from senslab.cli import main


def _error_line(err: str) -> str:
    lines = [line for line in err.strip().splitlines() if line.startswith("senslab: error: ")]
    assert len(lines) == 1, err
    return lines[0]


def test_hf_and_timm_together_are_refused(tmp_path: Path,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    """``--hf DIR --timm NAME`` measured the --hf model and dropped --timm without a word."""
    assert main(["measure", "--hf", str(tmp_path / "bert"), "--timm", "vit_tiny_patch16_224",
                 "--num-examples", "4"]) == 2
    line = _error_line(capsys.readouterr().err)
    assert "--hf" in line and "--timm vit_tiny_patch16_224" in line and "drop" in line, line


def test_report_of_several_directories_needs_out(tmp_path: Path,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    """``senslab report A B`` without --out wrote the combined report into A, replacing the
    report.html (and plots) of A alone; now refused before anything is written, and with --out
    both runs are reported there and A's own report stays as it was."""
    a, b = tmp_path / "a", tmp_path / "b"
    assert main(["train", "--out", str(a), *QUICK_TRAIN]) == 0
    assert main(["train", "--out", str(b), "--seed", "1", *QUICK_TRAIN]) == 0
    assert main(["report", str(a)]) == 0
    own = (a / "report.html").read_text()
    capsys.readouterr()
    assert main(["report", str(a), str(b)]) == 2
    captured = capsys.readouterr()
    line = _error_line(captured.err)
    assert "--out" in line and str(a) in line, line
    assert captured.out == ""
    assert (a / "report.html").read_text() == own
    out = tmp_path / "both"
    assert main(["report", str(a), str(b), "--out", str(out)]) == 0
    assert "mlp       2" in capsys.readouterr().out  # both runs, one label
    assert (out / "report.html").is_file()
    assert (a / "report.html").read_text() == own
