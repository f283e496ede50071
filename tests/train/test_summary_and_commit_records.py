"""Run records that must agree (audit fix54 H2): a finished run's summary.json is reused only
when its ``final`` numbers are those of the metric log's last record, and a commit recorded as
``+unknown`` (git status failed) is not taken for another commit."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

from senslab.train.config import RunConfig, apply_overrides
from senslab.train.loop import fit
from senslab.train.looprun import LoopRun
from senslab.train.rundir import RunDir, RunDirError, commit_relation

SHA = "0123456789abcdef0123456789abcdef01234567"
OTHER = "fedcba9876543210fedcba9876543210fedcba98"


@pytest.fixture(autouse=True)
def _one_thread() -> None:
    torch.set_num_threads(1)  # conftest restores the count afterwards


@pytest.fixture(scope="module")
def finished(tmp_path_factory: pytest.TempPathFactory) -> tuple[RunConfig, Path]:
    """A finished fit run: mlp on digits, 8 steps, a checkpoint after each 4."""
    torch.set_num_threads(1)
    cfg = apply_overrides(RunConfig(name="tiny"), [
        "model.name=mlp", "data.name=digits", "data.train_subset=64", "track.num_examples=16",
        "track.eval_examples=64", "train.epochs=1", "train.batch_size=8",
        "train.checkpoint_every=4"])
    run = tmp_path_factory.mktemp("rec54") / "run"
    fit(cfg, run, progress=False)
    return cfg, run


def _edit_final(run: Path, key: str, value: float) -> dict:
    path = run / "summary.json"
    summary = json.loads(path.read_text())
    summary["final"][key] = value
    path.write_text(json.dumps(summary))
    return summary


def test_an_edited_summary_is_not_reused(finished: tuple[RunConfig, Path],
                                         tmp_path: Path) -> None:
    """repro53 S2: a summary.json whose final train/loss was set by hand was reused as the run's
    result (and changed a verdict) without a word; it is refused, naming the file and the fix."""
    cfg, src = finished
    run = Path(shutil.copytree(src, tmp_path / "run"))
    last = RunDir(run).metrics()[-1]
    _edit_final(run, "train/loss", 1e-6)
    with pytest.raises(RunDirError) as err:
        fit(cfg, run, progress=False)
    text = str(err.value)
    assert f"{run / 'summary.json'}: its final numbers are not those of the last record" in text
    assert f"step {last['step']}" in text
    assert f"train/loss: 1e-06 in summary.json, {last['train/loss']!r} in the log" in text
    assert f"delete {run / 'summary.json'} and re-run" in text


def test_the_fix_the_refusal_names_writes_the_summary_again(
        finished: tuple[RunConfig, Path], tmp_path: Path) -> None:
    """Deleting the edited summary.json and running again recomputes it from the finished
    training (no step is trained again): the original final numbers come back."""
    cfg, src = finished
    run = Path(shutil.copytree(src, tmp_path / "run"))
    original = json.loads((run / "summary.json").read_text())
    _edit_final(run, "train/loss", 1e-6)
    (run / "summary.json").unlink()
    again = fit(cfg, run, progress=False)
    assert again["final"] == original["final"] and again["steps"] == original["steps"]
    assert RunDir(run).metrics() == RunDir(src).metrics()


def test_a_consistent_summary_is_reused_with_measurements_added(
        finished: tuple[RunConfig, Path], tmp_path: Path) -> None:
    """Numbers measured after training (an experiment's after_run adds them to ``final``) are
    not in the log and are no disagreement; NaN equals NaN."""
    cfg, src = finished
    run = Path(shutil.copytree(src, tmp_path / "run"))
    summary = _edit_final(run, "sens_end/train", 0.25)
    assert fit(cfg, run, progress=False) == summary
    rd = RunDir(run)
    lines = rd.metrics_path.read_text().splitlines()
    last = json.loads(lines[-1])
    last["extra"] = float("nan")
    rd.metrics_path.write_text("\n".join([*lines[:-1], json.dumps(last)]) + "\n")
    rd.check_summary({"final": {**summary["final"], "extra": float("nan")}})


def test_a_torn_or_emptied_log_of_a_finished_run_is_refused(
        finished: tuple[RunConfig, Path], tmp_path: Path) -> None:
    """A finished run's log ends with the record its summary came from: a torn last line or an
    emptied file was damaged after the run ended (an experiment reusing the run read the rest,
    or nothing, and wrote a verdict of lost data without a word)."""
    run = Path(shutil.copytree(src := finished[1], tmp_path / "run"))
    rd = RunDir(run)
    whole = rd.metrics_path.read_text()
    rd.metrics_path.write_text(whole + '{"step": 9, "train/lo')
    with pytest.raises(RunDirError, match="ends in a torn line: it was damaged after the run"):
        rd.read_json("summary.json")
    rd.metrics_path.write_text("")
    with pytest.raises(RunDirError, match="is empty: it was damaged after the run ended"):
        rd.read_json("summary.json")
    rd.metrics_path.write_text(whole)
    assert rd.read_json("summary.json") == json.loads((src / "summary.json").read_text())


def _toy(path: Path) -> dict | None:
    """A LoopRun trainer's loop: 4 steps, a record and a checkpoint every 2."""
    with LoopRun(path, {"seed": 3}) as run:
        if run.summary is not None:
            return run.summary
        state = run.restore()
        step, value, record = (0, 0.0, {}) if state is None else (
            state["step"], float(state["value"]), state["record"])
        while step < 4:
            step += 1
            value += 0.5 * step
            if step % 2 == 0:
                record = run.log({"step": step, "value": value})
                run.checkpoint(step, {"value": torch.tensor(value, dtype=torch.float64),
                                      "record": record})
        return run.finish({"name": path.name, "final": record})


def test_a_looprun_trainer_refuses_an_edited_summary_too(tmp_path: Path) -> None:
    run = tmp_path / "toy"
    first = _toy(run)
    assert first is not None and _toy(run) == first  # a consistent summary is reused
    _edit_final(run, "value", 99.0)
    with pytest.raises(RunDirError, match=r"value: 99\.0 in summary\.json, 5\.0 in the log"):
        _toy(run)
    (run / "summary.json").unlink()
    again = _toy(run)
    assert again is not None and again["final"] == first["final"]


@pytest.mark.parametrize(("recorded", "now", "how"), [
    (SHA, SHA, "same"),
    (SHA + "+dirty", SHA + "+dirty", "same"),
    (SHA + "+unknown", SHA + "+unknown", "unknown"),  # neither status known
    (SHA + "+unknown", SHA, "unknown"),
    (SHA, SHA + "+unknown", "unknown"),
    (SHA + "+dirty", SHA + "+unknown", "unknown"),
    (SHA, SHA + "+dirty", "other"),
    (SHA + "+unknown", OTHER, "other"),
    (OTHER, SHA + "+unknown", "other"),
])
def test_commit_relation(recorded: str, now: str, how: str) -> None:
    """An ``+unknown`` commit (git status failed) of the same SHA is neither the same code nor
    another: it cannot be told; another SHA is another commit, known or not."""
    assert commit_relation(recorded, now) == how
