"""The hand-written-loop run directories (experiments/_manual.py): what a run writes when it
starts, logs and finishes, and when a run directory is reused or started over."""

from __future__ import annotations

import json
from pathlib import Path

from senslab.experiments import _manual
from senslab.experiments.hahn_rofin import _common as hr_common
from senslab.experiments.lowsens import grokking


def test_start_run_writes_config_env_and_a_fresh_log(tmp_path: Path) -> None:
    path = tmp_path / "run"
    rd = _manual.start_run(path, {"lr": 0.1})
    rd.log({"step": 0})
    assert json.loads((path / "config.json").read_text()) == {"lr": 0.1}
    assert "torch" in json.loads((path / "env.json").read_text())
    assert _manual.finished_summary(path) is None  # started, not finished
    # a restart discards the interrupted attempt's metrics
    _manual.start_run(path, {"lr": 0.2})
    assert not rd.metrics_path.exists()
    assert json.loads((path / "config.json").read_text()) == {"lr": 0.2}


def test_manual_run_round_trip_and_reuse(tmp_path: Path) -> None:
    run = _manual.ManualRun(tmp_path / "a", "label", "a")
    run.start({"steps": 2})
    run.log({"step": 1, "train/loss": 0.5})
    summary = run.finish({"train/loss": 0.5}, steps=2)
    config = json.loads((tmp_path / "a" / "config.json").read_text())
    assert config == {"steps": 2, "label": "label", "name": "a"}
    (record,) = run.dir.metrics()
    assert record["train/loss"] == 0.5 and record["time"] >= 0
    assert summary["label"] == "label" and summary["steps"] == 2 and summary["seconds"] >= 0
    assert _manual.finished_summary(tmp_path / "a") == summary

    calls: list[str] = []

    def body(i: int, name: str) -> dict[str, object]:
        calls.append(name)
        return {"name": name, "i": i}

    logged: list[str] = []
    got = _manual.run_all(tmp_path, ["a", "b"], body, logged.append)
    assert calls == ["b"] and got == [summary, {"name": "b", "i": 1}]  # "a" reused
    assert "reusing" in logged[0] and logged[1] == "[2/2] b"


def test_experiment_packages_share_the_writer() -> None:
    # one implementation: the sub-packages re-export or call the shared module
    assert grokking.ManualRun is _manual.ManualRun
    assert grokking.run_all is _manual.run_all
    assert hr_common.start_run is _manual.start_run
