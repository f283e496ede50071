"""A checkpoint's record of its run's config.json (``RunDir.config_digests``).

A checkpoint is refused beside another config.json than the one it was written beside. A
config.json re-indented, or with its keys reordered by an editor, holds the same settings: a
checkpoint that records the canonical digest (of the parsed JSON) is accepted beside it, while a
changed setting is still refused. A checkpoint written before that digest was recorded (the raw
one only) is compared byte for byte, as before.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
import torch

from senslab.train.checkpoint import decode, encode
from senslab.train.config import RunConfig, apply_overrides
from senslab.train.loop import fit
from senslab.train.rundir import RunDir, RunDirError

MLP = ["model.name=mlp", "data.name=digits", "track.num_examples=32", "train.epochs=2"]
FOREIGN = "was written beside another config.json"


def tiny() -> RunConfig:
    """mlp on digits: 15 steps per epoch, a checkpoint after each."""
    return apply_overrides(RunConfig(name="tiny"), MLP)


@pytest.fixture(autouse=True)
def _one_thread() -> None:
    torch.set_num_threads(1)  # conftest restores the count afterwards


@pytest.fixture(scope="module")
def finished(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A finished run (30 steps, checkpoints at 15 and 30), copied by each test."""
    torch.set_num_threads(1)
    run = tmp_path_factory.mktemp("digest") / "run"
    fit(tiny(), run, progress=False)
    return run


def _reordered(obj: Any) -> Any:
    """``obj`` with every object's keys in reverse order (what an editor's reformat may do)."""
    if isinstance(obj, dict):
        return {k: _reordered(obj[k]) for k in reversed(list(obj))}
    return obj


def _reformat(run: Path, **changes: Any) -> None:
    """Rewrite ``run``'s config.json re-indented with its keys reordered (and ``changes``)."""
    config = json.loads((run / "config.json").read_text())
    config.update(changes)
    before = (run / "config.json").read_bytes()
    (run / "config.json").write_text(json.dumps(_reordered(config), indent=4) + "\n")
    assert (run / "config.json").read_bytes() != before


def _interrupted(finished: Path, tmp_path: Path) -> Path:
    """A copy of ``finished`` stopped after its step-15 checkpoint."""
    run = tmp_path / "run"
    shutil.copytree(finished, run)
    (run / "summary.json").unlink()
    (run / "checkpoints" / "step-00000030.safetensors").unlink()
    return run


def _as_before(run: Path) -> None:
    """Rewrite ``run``'s checkpoints as senslab wrote them before the canonical digest: the raw
    digest of config.json only."""
    for path in (run / "checkpoints").glob("*.safetensors"):
        state = decode(path.read_bytes(), path)
        assert state.pop("_config_canonical_sha256") is not None
        assert "_config_sha256" in state
        path.write_bytes(encode(state))


def test_a_reformatted_config_resumes_from_its_checkpoints(
        finished: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run = _interrupted(finished, tmp_path)
    _reformat(run)
    found = RunDir(run).load_latest(resume=True)
    assert found is not None and found[0].name == "step-00000015.safetensors"
    assert "_config_canonical_sha256" not in found[1] and "_config_sha256" not in found[1]
    capsys.readouterr()
    summary = fit(tiny(), run, progress=False)  # resumed at step 15, not refused
    assert "from step 15 (checkpoint step-00000015.safetensors)" in capsys.readouterr().err
    assert summary["steps"] == 30
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == [
        "step-00000015.safetensors", "step-00000030.safetensors"]  # nothing set aside
    assert RunDir(run).final_checkpoint()[0].name == "step-00000030.safetensors"


def test_a_finished_run_is_measured_beside_a_reformatted_config(
        finished: Path, tmp_path: Path) -> None:
    run = tmp_path / "run"
    shutil.copytree(finished, run)
    _reformat(run)
    path, state = RunDir(run).final_checkpoint()
    assert path.name == "step-00000030.safetensors" and state["position"]["step"] == 30


def test_a_changed_setting_is_still_refused(finished: Path, tmp_path: Path) -> None:
    run = _interrupted(finished, tmp_path)
    _reformat(run, seed=1)
    with pytest.raises(RunDirError, match=rf"step-00000015.safetensors {FOREIGN}") as err:
        RunDir(run).load_latest(resume=True)
    assert "byte for byte" not in str(err.value)  # it records the settings, not the bytes
    # the same file, only re-ordered back: still another seed
    config = json.loads((run / "config.json").read_text())
    RunDir(run).write_json("config.json", config)
    with pytest.raises(RunDirError, match=FOREIGN):
        RunDir(run).load_latest(resume=True)
    assert (run / "checkpoints" / "step-00000015.safetensors").exists()  # nothing moved


def test_the_final_model_beside_a_changed_setting_is_refused_not_called_damaged(
        finished: Path, tmp_path: Path) -> None:
    """It said to delete the final checkpoint and retrain, as for a damaged one: that loses the
    run that wrote it."""
    run = tmp_path / "run"
    shutil.copytree(finished, run)
    _reformat(run, seed=1)
    with pytest.raises(RunDirError, match=rf"step-00000030.safetensors {FOREIGN}") as err:
        RunDir(run).final_checkpoint()
    assert "retrains the rest" not in str(err.value)


def test_a_checkpoint_recording_the_raw_digest_only_is_compared_as_before(
        finished: Path, tmp_path: Path) -> None:
    run = _interrupted(finished, tmp_path)
    _as_before(run)
    written = (run / "config.json").read_bytes()
    found = RunDir(run).load_latest(resume=True)  # its own config.json, byte for byte
    assert found is not None and found[0].name == "step-00000015.safetensors"
    _reformat(run)  # the file it was written beside cannot be told from its bytes alone
    with pytest.raises(RunDirError, match=FOREIGN) as err:
        RunDir(run).load_latest(resume=True)
    assert "re-indented" in str(err.value)  # the fix when that is all that changed
    _reformat(run, seed=1)
    with pytest.raises(RunDirError, match=FOREIGN):
        RunDir(run).load_latest(resume=True)
    (run / "config.json").write_bytes(written)
    assert RunDir(run).load_latest(resume=True)[0].name == "step-00000015.safetensors"


def test_the_digests_a_cache_records(finished: Path, tmp_path: Path) -> None:
    """What the cached measurements of a run record and compare (config_digests,
    config_matches)."""
    run = tmp_path / "run"
    shutil.copytree(finished, run)
    rd = RunDir(run)
    recorded = rd.config_digests()
    assert recorded["config_sha256"] == rd.config_digest()
    assert set(recorded) == {"config_sha256", "config_canonical_sha256"}
    assert rd.config_matches(recorded)
    _reformat(run)
    assert rd.config_matches(recorded)
    assert not rd.config_matches({"config_sha256": recorded["config_sha256"]})  # raw only
    assert not rd.config_matches({})
    _reformat(run, seed=1)
    assert not rd.config_matches(recorded)
    (run / "config.json").write_text("{not json")
    assert rd.config_digests() == {"config_sha256": rd.config_digest()}
    assert not rd.config_matches(recorded)
    (run / "config.json").unlink()
    assert rd.config_digests() == {} and not rd.config_matches(recorded)
