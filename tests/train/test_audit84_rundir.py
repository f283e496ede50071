"""Audit 84 of run directories and of the report's reading of runs.

* two runs of one name from two directories (``senslab report dirA dirB``, both holding
  ``mlp-s0``) had identical per-run rows in report.html: which numbers were whose could not be
  told. They are now named by as much of their path as tells them apart (``dirA/mlp-s0``).
* the trainer's reading of metrics.jsonl (``RunDir.metrics``: resume, checkpoints) refused a
  log with a blank line in it, telling to delete the run, where ``senslab report`` read it; a
  line that is a JSON list, or not UTF-8, was a bare AttributeError / UnicodeDecodeError.
* a damaged ``senslab.json`` (the directory's format marker) said to delete the whole run
  directory, where deleting the marker alone keeps the run.

Run directories are written through ``RunDir`` or by hand in the format of
docs/run-directory.md; nothing is trained.
"""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import pytest
import torch

from senslab.report import final_table, format_table, load_runs
from senslab.report.runs import RunFormatError
from senslab.train.rundir import RunDir, RunDirError


def write_run(path: Path, loss: float, seed: int = 0, label: str = "mlp",
              name: str | None = None) -> Path:
    """A finished run of ``label`` whose train/loss ended at ``loss``."""
    path.mkdir(parents=True)
    (path / "config.json").write_text(json.dumps({"name": name or path.name, "label": label,
                                                  "seed": seed}))
    rows = [{"step": 0, "train/loss": 1.0}, {"step": 10, "train/loss": loss}]
    (path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (path / "summary.json").write_text(json.dumps({"label": label, "final": rows[-1]}))
    return path


# -- same-named runs of two directories -------------------------------------------------------


def test_same_named_runs_of_two_directories_are_told_apart(tmp_path: Path) -> None:
    a = write_run(tmp_path / "dirA" / "mlp-s0", 0.3)
    b = write_run(tmp_path / "dirB" / "mlp-s0", 0.7)
    c = write_run(tmp_path / "dirA" / "mlp-s1", 0.5, seed=1)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # same settings and seed: warned of elsewhere
        runs = load_runs([a, b, c])
    rows = final_table(runs, per_run=True)
    # both rows read "mlp  mlp-s0  0": which loss was whose could not be told
    assert [r["run"] for r in rows] == ["dirA/mlp-s0", "dirB/mlp-s0", "mlp-s1"]
    assert [r["train/loss"].mean for r in rows] == [0.3, 0.7, 0.5]
    assert "dirB/mlp-s0" in format_table(rows).splitlines()[3]
    # labels, and so the aggregated rows, are as before
    assert [r.label for r in runs] == ["mlp"] * 3
    assert final_table(runs)[0]["runs"] == 3


def test_same_config_names_in_one_directory_are_told_apart_by_theirs(tmp_path: Path) -> None:
    runs = load_runs([write_run(tmp_path / f"r{s}", 0.1 * (s + 1), seed=s, name="mlp")
                      for s in range(2)])
    assert [r.name for r in runs] == ["mlp (r0)", "mlp (r1)"]
    assert [r.label for r in runs] == ["mlp", "mlp"]


def test_parents_of_one_name_go_further_up(tmp_path: Path) -> None:
    a = write_run(tmp_path / "x" / "exp" / "mlp-s0", 0.3, label="a")
    b = write_run(tmp_path / "y" / "exp" / "mlp-s0", 0.7, label="b")
    assert [r.name for r in load_runs([a, b])] == ["x/exp/mlp-s0", "y/exp/mlp-s0"]
    assert load_runs([a])[0].name == "mlp-s0"  # alone: its own name


# -- the trainer's reading of metrics.jsonl -------------------------------------------------------


def _log(rd: RunDir, middle: bytes) -> None:
    with rd.writing():
        rd.write_json("config.json", {"name": "run", "seed": 0})
    rd.metrics_path.write_bytes(b'{"step": 1, "train/loss": 1.0}\n' + middle
                                + b'{"step": 10, "train/loss": 0.5}\n')


def test_a_blank_line_in_the_metric_log_does_not_refuse_the_resume(tmp_path: Path) -> None:
    """A blank line (left by an edit) made every resume and checkpoint fail with "delete the
    run and train again", where the report read the same log without a word."""
    torch.manual_seed(0)
    rd = RunDir(tmp_path / "run")
    _log(rd, b"\n   \n")
    assert [r["step"] for r in rd.metrics()] == [1, 10]
    with rd.writing():
        rd.save_checkpoint({"model": {"w": torch.randn(3)}}, step=10)
        found = rd.load_latest(resume=True)
    assert found is not None and found[0].name == "step-00000010.safetensors"


@pytest.mark.parametrize(("middle", "why"), [
    (b"[1, 2]\n", "is not a JSON object"),  # was AttributeError: 'list' object has no 'get'
    (b'{"step": 5, "note": "\xe9"}\n', r"is not valid JSON \(not UTF-8 text\)"),  # was a bare
    (b'{"step": 5, "train/lo\n', "is not valid JSON"),                             # decode error
])
def test_a_damaged_line_of_the_metric_log_is_named(tmp_path: Path, middle: bytes,
                                                   why: str) -> None:
    rd = RunDir(tmp_path / "run")
    _log(rd, middle)
    with pytest.raises(RunDirError, match=rf"metrics.jsonl:2 {why}.*; the metric log is damaged"):
        rd.metrics()


def test_a_damaged_last_line_is_still_a_crash_s(tmp_path: Path) -> None:
    rd = RunDir(tmp_path / "run")
    _log(rd, b"")
    with open(rd.metrics_path, "ab") as f:
        f.write(b'{"step": 11, "x": "\xe9')  # torn inside a character
    assert [r["step"] for r in rd.metrics()] == [1, 10]


# -- the directory's marker -----------------------------------------------------------------------


def test_a_damaged_marker_is_deleted_alone_not_the_run(tmp_path: Path) -> None:
    """The message said "restore it, or delete <run> to start over": the run's records and
    checkpoints lost for a 60-byte file that is written again when the run is opened."""
    run = tmp_path / "run"
    with RunDir(run).writing() as rd:
        rd.write_json("config.json", {"name": "run", "label": "mlp", "seed": 0})
        rd.log({"step": 0, "train/loss": 1.0})
    (run / "senslab.json").write_bytes(b"")  # damaged
    with pytest.raises(RunDirError, match=r"senslab.json is not valid JSON.*delete that file "
                                          r"alone \(the runs, their records and checkpoints "
                                          r"are kept\)"):
        RunDir(run).check_readable()
    with pytest.raises(RunFormatError, match="delete that file alone"):
        load_runs([run])
    (run / "senslab.json").write_text(json.dumps({"kind": "run"}))  # no schema
    with pytest.raises(RunDirError, match="not a senslab directory marker; delete that file"):
        RunDir(run).check_readable()
    (run / "senslab.json").unlink()  # the fix works: the run is read, then opened again
    with pytest.warns(UserWarning, match="have not finished"):
        assert load_runs([run])[0].final["train/loss"] == 1.0
    with RunDir(run).writing() as rd:
        assert rd.metrics() == [{"step": 0, "train/loss": 1.0}]
    assert json.loads((run / "senslab.json").read_text())["schema"] == 2
