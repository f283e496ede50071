"""Audit 83: REPRODUCTION.md rows of runs made with overrides, and the commands records quote."""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path

import pytest

from senslab.experiments import get_experiment
from senslab.reproduction import record, render


def test_a_cpu_row_run_with_overrides_says_the_note_is_the_scale_before_them() -> None:
    # the note says "1,000 train"; the run trained 500: "*CPU scale: 1,000 train …* (run with
    # `--set train_size=500`)" read as what ran, or as two claims that conflict
    name = "synthetic_sparse_frequent"
    note = get_experiment(name).cpu_scale_note
    assert "1,000 train" in note
    rec = {"name": name, "scale": "cpu", "verdict": "supported", "reason": "measured",
           "overrides": ["train_size=500"], "schema": 2}
    row = next(line for line in render({name: rec}).splitlines()
               if line.startswith(f"| `{name}`"))
    result = row.split(" | ")[3]
    assert f"*CPU scale: {note}*" not in result
    assert f"*CPU scale, before this run's overrides: {note}*" in result
    assert result.endswith("(run with `--set train_size=500`, which replace those values where "
                           "they differ)")
    # without overrides the row is as before
    plain_row = next(line for line in render({name: {**rec, "overrides": []}}).splitlines()
                     if line.startswith(f"| `{name}`"))
    assert plain_row.split(" | ")[3] == f"measured *CPU scale: {note}*"


def test_the_resume_command_of_an_unfinished_directory_is_quoted(tmp_path: Path) -> None:
    # an override or a directory with a space: the command the refusal gives split into other
    # arguments when pasted into a shell
    d = tmp_path / "my runs"
    d.mkdir()
    (d / "experiment.json").write_text(json.dumps(
        {"name": "synthetic_sparse_frequent", "scale": "cpu", "runs": ["case1-s0"]}))
    (d / "verdict.json").write_text(json.dumps(
        {"verdict": "supported", "reason": "r", "scale": "cpu",
         "overrides": ["only=case1-s0, case2-s0"]}))
    with pytest.raises(FileNotFoundError, match="no summary.json") as err:
        record(d, tmp_path / "rec")
    command = re.search(r"Resume them with `([^`]*)`", str(err.value)).group(1)
    assert shlex.split(command) == ["senslab", "run", "synthetic_sparse_frequent", "--set",
                                    "only=case1-s0, case2-s0", "--out", str(d)]


def test_a_ladder_rung_run_with_extra_overrides_says_so() -> None:
    # a rung trained with `--set seeds=1` beyond its own overrides showed only its note
    # ("4 epochs of a 5,000-image subset"), as if it ran its protocol unchanged
    row = {"rung": "cpu", "scale": "cpu", "size": 200, "note": "4 epochs of a subset",
           "overrides": [], "cpu": True, "command": "senslab run ib_vit_mnist",
           "status": "done", "verdict": "inconclusive", "reason": "r",
           "extra_overrides": ["train.eval_every=2"], "seeds": 3, "effects": {}}
    lad = {"name": "ib_vit_mnist", "summary": "s", "rungs": [row, {**row, "rung": "longer",
                                                                  "extra_overrides": []}]}
    from senslab.reproduction import render_ladders

    lines = render_ladders({"ib_vit_mnist": lad})
    cpu = next(line for line in lines if line.startswith("| cpu |"))
    longer = next(line for line in lines if line.startswith("| longer |"))
    assert "| 4 epochs of a subset (run with `--set train.eval_every=2`) |" in cpu
    assert "| 4 epochs of a subset |" in longer
