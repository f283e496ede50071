"""A researcher's end-to-end use of the command line (session 71): messages that named the wrong
problem, or a number shown for other settings than it belongs to."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from senslab.cli import main
from senslab.experiments import run_experiment


@pytest.fixture(scope="module")
def finished_ib_joint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A finished ``ib_joint`` experiment at its smallest (5 steps, one seed: 4 runs of the
    ``attention`` trainer), verdict.json included."""
    out = tmp_path_factory.mktemp("cli71") / "ib_joint"
    run_experiment("ib_joint", out, overrides=["steps=5", "seeds=1"], progress=False,
                   log=lambda _: None)
    assert (out / "verdict.json").is_file()
    return out


def _one_error(err: str) -> str:
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("senslab: error: ")
    return lines[0]


def test_measure_checkpoint_of_another_trainers_run_names_the_trainer(
        finished_ib_joint: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`senslab measure --checkpoint` on a run of `senslab run ib_joint` said its config.json
    "does not hold a run configuration this senslab can read (unknown config key 'batch_size'.
    Did you mean 'train.batch_size'? …)": a valid run read as a damaged file, with a hint to
    edit it. It names the run's trainer and experiment, and where its numbers are."""
    run = finished_ib_joint / "sgd-s0"
    assert main(["measure", "--checkpoint", str(run)]) == 2
    line = _one_error(capsys.readouterr().err)
    assert "'attention' trainer" in line and "experiment ib_joint" in line, line
    assert f"senslab report {run}" in line
    assert "Did you mean" not in line


def test_measure_checkpoint_with_a_damaged_train_config_still_names_the_key(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A `senslab train` config.json with a key this senslab does not know is still reported
    as such (not taken for another trainer's run)."""
    from senslab.train.config import RunConfig

    raw = RunConfig(name="x").to_dict()
    raw["trainn"] = raw.pop("train")
    (tmp_path / "config.json").write_text(json.dumps(raw))
    assert main(["measure", "--checkpoint", str(tmp_path)]) == 2
    line = _one_error(capsys.readouterr().err)
    assert "does not hold a run configuration" in line and "trainn" in line, line


def _record(records: Path, overrides: list[str]) -> None:
    records.mkdir(exist_ok=True)
    (records / "ib_joint.json").write_text(json.dumps({
        "name": "ib_joint", "schema": 2, "scale": "cpu", "verdict": "inconclusive",
        "reason": "r", "runtime_s": 2.0, "overrides": overrides}))


def test_list_says_a_recorded_runtime_is_of_the_overrides_it_ran_with(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    """A record of `senslab run ib_joint --set steps=50` (a smoke test, 2 s) was listed as
    "[2 s on CPU, recorded]": the experiment's CPU scale takes 41 s."""
    monkeypatch.chdir(tmp_path)
    _record(tmp_path / "reproduction", ["steps=50", "seeds=2"])
    assert main(["list", "experiments", "ib_joint"]) == 0
    line = capsys.readouterr().out.strip()
    assert "[2 s on CPU with --set steps=50 --set seeds=2, recorded]" in line, line
    _record(tmp_path / "reproduction", [])
    assert main(["list", "experiments", "ib_joint"]) == 0
    assert "[2 s on CPU, recorded]" in capsys.readouterr().out


@pytest.mark.parametrize("where", ["missing folder", "a directory"])
def test_reproduction_refuses_an_unwritable_out_before_recording(
        finished_ib_joint: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str],
        where: str) -> None:
    """`senslab reproduction DIR --out nodir/R.md` recorded DIR, then failed naming a temporary
    file (`nodir/.R.md.<pid>.<hex>.tmp: no such file or directory`); `--out` a directory failed
    the same way. Refused first, naming --out, and nothing is recorded."""
    records = tmp_path / "records"
    out = tmp_path / "nodir" / "R.md" if where == "missing folder" else tmp_path
    code = main(["reproduction", str(finished_ib_joint), "--records", str(records),
                 "--out", str(out)])
    line = _one_error(capsys.readouterr().err)
    assert code == 2
    assert f"--out {out}" in line and ".tmp" not in line, line
    assert not records.exists()


def test_reproduction_refuses_records_that_are_a_file(
        finished_ib_joint: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`--records FILE` failed with "FILE: file exists" (exit 1) after checking the runs."""
    records = tmp_path / "records"
    records.write_text("")
    code = main(["reproduction", str(finished_ib_joint), "--records", str(records),
                 "--out", str(tmp_path / "R.md")])
    line = _one_error(capsys.readouterr().err)
    assert code == 2 and f"--records {records} is a file" in line, line
    assert not (tmp_path / "R.md").exists()
