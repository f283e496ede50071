"""Audit 85, run directories (senslab.train.rundir): arrays in records, a last record longer
than the tail read, a configuration JSON cannot hold, a null against a number in summary.json."""

from __future__ import annotations

import json
import math
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from senslab.train.looprun import LoopRun
from senslab.train.rundir import RunDir, RunDirError


def _run(tmp_path: Path) -> RunDir:
    rd = RunDir(tmp_path / "run")
    rd.path.mkdir()
    return rd


def test_a_tensor_or_array_of_several_numbers_is_logged_as_its_list(tmp_path: Path) -> None:
    rd = _run(tmp_path)
    profile = torch.linspace(0, 1, 7, dtype=torch.float64).reshape(7)[::2]  # a strided view
    table = np.arange(6, dtype=np.float32).reshape(2, 3) / 7
    rd.log({"step": 1, "sens/train_per_position": profile, "table": table})
    with pytest.warns(UserWarning, match=r"x\[1\]=nan"):
        rd.log({"step": 2, "x": torch.tensor([0.5, math.nan, 2.0])})
    got = rd.metrics()
    assert got[0]["sens/train_per_position"] == profile.tolist()
    assert got[0]["table"] == table.tolist()
    assert got[1]["x"] == [0.5, None, 2.0]
    for line in rd.metrics_path.read_text().splitlines():  # strict JSON, numbers not text
        json.loads(line, parse_constant=lambda c: pytest.fail(f"bare {c}"))


def test_a_record_s_array_is_written_as_numbers_not_its_text(tmp_path: Path) -> None:
    rd = _run(tmp_path)
    arr, t = np.array([0.5, 0.25]), torch.tensor([[1, 2], [3, 4]])
    rd.write_json("final_measure.json", {"sigmas": arr, "counts": t, "one": np.float32(0.5)})
    data = json.loads((rd.path / "final_measure.json").read_text())
    assert data == {"sigmas": arr.tolist(), "counts": t.tolist(), "one": 0.5}


def test_a_finished_run_whose_last_record_is_long_is_read_whole(tmp_path: Path) -> None:
    rd = RunDir(tmp_path / "run")
    with rd.writing():
        rd.write_json("config.json", {"a": 1})
        rd.log({"step": 1, "loss": 0.5})
        profile = [0.123456789 + i * 1e-9 for i in range(100_000)]  # > 1 MiB as one line
        rd.log({"step": 2, "loss": 0.25, "sens/train_per_position": profile})
        rd.write_json("summary.json", {"final": {"step": 2, "loss": 0.25}, "steps": 2})
    assert len(rd.metrics_path.read_bytes().splitlines()[-1]) > 1 << 20
    assert rd.read_json("summary.json")["final"]["loss"] == 0.25
    assert rd._last_record() == rd.metrics()[-1]
    # still caught when the long last record disagrees
    rd.write_json("summary.json", {"final": {"step": 2, "loss": 0.125}, "steps": 2})
    with pytest.raises(RunDirError, match="loss: 0.125 in summary.json, 0.25 in the log"):
        rd.read_json("summary.json")


@pytest.mark.parametrize("value", [math.inf, -math.inf, math.nan])
def test_a_configuration_json_cannot_hold_is_refused_at_the_start(tmp_path: Path,
                                                                   value: float) -> None:
    path = tmp_path / "run"
    cfg = {"lr": 0.1, "clip": {"max_norm": value}}
    with pytest.raises(RunDirError, match=r"clip\.max_norm=-?(inf|nan).*give a finite number"):
        with LoopRun(path, cfg) as run:
            run.restore()
    assert not (path / "config.json").exists()  # never a config.json saying null
    # the same run with a finite value starts there, and resumes
    cfg["clip"]["max_norm"] = 1e30
    with LoopRun(path, cfg) as run:
        assert run.restore() is None
        run.log({"step": 1, "loss": 0.5})
        run.checkpoint(1, {"w": torch.zeros(2)})
    with LoopRun(path, cfg) as run:
        assert run.restore()["step"] == 1


def test_other_records_still_write_a_non_finite_number_as_null(tmp_path: Path) -> None:
    rd = _run(tmp_path)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        rd.write_json("summary.json", {"final": {"loss": math.nan}})
    assert json.loads((rd.path / "summary.json").read_text()) == {"final": {"loss": None}}


@pytest.mark.parametrize(("in_summary", "in_log"), [(None, 0.5), (0.5, math.nan)])
def test_a_null_against_a_number_in_summary_json_is_refused(tmp_path: Path, in_summary: Any,
                                                            in_log: float) -> None:
    rd = RunDir(tmp_path / "run")
    with rd.writing(), warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the log's NaN is warned of
        rd.write_json("config.json", {"a": 1})
        rd.log({"step": 1, "loss": in_log})
        rd.write_json("summary.json", {"final": {"step": 1, "loss": in_summary}, "steps": 1})
    with pytest.raises(RunDirError, match="loss: .* in summary.json, .* in the log"):
        rd.read_json("summary.json")


def test_a_null_in_both_still_agrees(tmp_path: Path) -> None:
    rd = RunDir(tmp_path / "run")
    with rd.writing(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        rd.write_json("config.json", {"a": 1})
        rd.log({"step": 1, "loss": math.inf})
        rd.write_json("summary.json", {"final": {"step": 1, "loss": math.inf}, "steps": 1})
    assert rd.read_json("summary.json")["final"]["loss"] is None
