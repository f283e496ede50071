"""An experiment directory's records (audit fix54 H2): a verdict.json set aside (damaged, or of
other settings) never overwrites one set aside before; a run whose commit was recorded as
``+unknown`` is not said to be another commit's; a recorded effect field the runs no longer give
makes verdict.json stale.

The experiment here is a real one, unregistered (so that no other test's list of experiments
changes): one ``fit`` run of an mlp on 64 digits per setting ``k``, run through the same locked
path as ``senslab run`` (:func:`~senslab.experiments.base._run_locked`)."""

from __future__ import annotations

import json
import shutil
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import torch

from senslab.experiments import run_experiment
from senslab.experiments.base import (
    DAMAGED,
    SUPERSEDED,
    Experiment,
    Run,
    Settings,
    _run_locked,
)
from senslab.reproduction import _differences, record
from senslab.train.config import RunConfig, apply_overrides
from senslab.train.rundir import RunDir, git_commit


@dataclass
class Tiny(Settings):
    k: int = 1


class TinyExperiment(Experiment):
    name = "records54"
    claim = "an mlp trains"
    scales = {"cpu": Tiny()}

    def runs(self, settings: Any) -> list[Run]:
        cfg = apply_overrides(RunConfig(name=f"mlp{settings.k}"), [
            "model.name=mlp", "data.name=digits", "data.train_subset=64",
            "track.num_examples=16", "track.eval_examples=64", "train.epochs=1",
            "train.batch_size=8"])
        return [Run(cfg.name, cfg)]

    def verdict(self, summaries: list[dict[str, Any]]) -> dict[str, Any]:
        loss = summaries[0]["final"]["train/loss"]
        return {"verdict": "inconclusive", "reason": f"train loss {loss:.3g}",
                "evidence": {"train/loss": loss}}


def _run(out: Path, k: int = 1) -> tuple[dict[str, Any], list[str]]:
    """Run the experiment with ``k`` into ``out``: (its verdict, the lines it logged)."""
    lines: list[str] = []
    exp = TinyExperiment()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # provenance warnings: not what these tests check
        with RunDir(out, kind="experiment").writing():
            verdict = _run_locked(exp, out, "cpu", [f"k={k}"], False, lines.append)
    return verdict, lines


@pytest.fixture(autouse=True)
def _one_thread() -> None:
    torch.set_num_threads(1)  # conftest restores the count afterwards


@pytest.fixture(scope="module")
def finished(tmp_path_factory: pytest.TempPathFactory) -> Path:
    torch.set_num_threads(1)
    out = tmp_path_factory.mktemp("rec54") / "exp"
    _run(out)
    return out


def _copy(finished: Path, tmp_path: Path) -> Path:
    return Path(shutil.copytree(finished, tmp_path / "exp"))


def test_a_second_damaged_verdict_keeps_the_first(finished: Path, tmp_path: Path) -> None:
    """A damaged verdict.json went to verdict.damaged.json, and the next damaged one replaced
    it: the first was lost. Each now gets a file of its own, and the log names it."""
    out = _copy(finished, tmp_path)
    first = (out / "verdict.json").read_bytes()[:30]
    (out / "verdict.json").write_bytes(first)
    verdict, lines = _run(out)
    assert any(f"moved to {DAMAGED};" in line for line in lines)
    second = (out / "verdict.json").read_bytes()[:20]
    (out / "verdict.json").write_bytes(second)
    again, lines = _run(out)
    assert any("is damaged" in line and "moved to verdict.damaged.2.json;" in line
               for line in lines)
    assert (out / DAMAGED).read_bytes() == first
    assert (out / "verdict.damaged.2.json").read_bytes() == second
    assert again["evidence"] == verdict["evidence"]  # the same runs, reused


def test_a_second_superseded_verdict_keeps_the_first(finished: Path, tmp_path: Path) -> None:
    out = _copy(finished, tmp_path)
    one = json.loads((out / "verdict.json").read_text())
    two, _ = _run(out, k=2)  # other settings: verdict of k=1 set aside
    _, lines = _run(out, k=1)  # and back: the verdict of k=2 set aside beside it
    assert any("other settings: moved to verdict.superseded.2.json" in line for line in lines)
    assert json.loads((out / SUPERSEDED).read_text()) == one
    assert json.loads((out / "verdict.superseded.2.json").read_text()) == two


def _set_commit(run: Path, commit: str) -> None:
    env = json.loads((run / "env.json").read_text())
    env["git_commit"] = commit
    env["sittings"] = [{**s, "git_commit": commit} for s in env["sittings"]]
    (run / "env.json").write_text(json.dumps(env))


def test_a_run_recorded_at_an_unknown_commit_is_not_another_commit(
        finished: Path, tmp_path: Path) -> None:
    """A run whose sitting recorded ``<sha>+unknown`` (git status failed) was reported as
    "trained by other commits than this one" when judged at ``<sha>``: it is said that this
    cannot be determined, and no difference is claimed."""
    now = git_commit()
    if now is None:
        pytest.skip("not a git checkout of senslab: no commit to compare")
    sha, _, mark = now.partition("+")
    recorded = sha if mark == "unknown" else sha + "+unknown"
    out = _copy(finished, tmp_path)
    _set_commit(out / "mlp1", recorded)
    verdict, lines = _run(out)
    assert not any("other commits" in line for line in lines)
    said = [line for line in lines if "cannot be determined" in line]
    assert len(said) == 1 and recorded[:10] in said[0] and "+unknown" in said[0]
    assert recorded in verdict["run_commits"]
    _set_commit(out / "mlp1", "f" * 40 + "+unknown")  # another SHA stays another commit
    _, lines = _run(out)
    assert any("other commits" in line and "ffffffffff+unknown" in line for line in lines)
    assert not any("cannot be determined" in line for line in lines)


def test_a_recorded_field_the_runs_no_longer_give_is_a_difference() -> None:
    """Only fields both sides held were compared: a field of the record that the recomputed
    effect lacks (a number the runs no longer give) passed unseen. It is a difference now,
    named; a recorded null (an undefined number) that the runs leave out is not, nor is a
    field only the recomputation has (a later version's addition, audit review53 #2)."""
    fresh = {"effect": 0.5, "se": 0.1, "interval": [0.3, 0.7], "z": 1.2}
    recorded = {"effect": 0.5, "se": 0.1, "interval": [0.3, 0.7], "se_extra": 0.02,
                "detectable": None}
    assert _differences(recorded, fresh, "'part'") == [
        "'part'.se_extra: recorded 0.02, its runs give no 'se_extra'"]
    assert _differences({**recorded, "se": 0.2}, fresh, "'part'") == [
        "'part'.se: recorded 0.2, its runs give 0.1",
        "'part'.se_extra: recorded 0.02, its runs give no 'se_extra'"]
    del recorded["se_extra"]
    assert _differences(recorded, fresh, "'part'") == []


SETS = ["steps=20", "seeds=2", "batch_size=4", "data.num_samples=8", "data.seq_len=4",
        "data.dim=8"]


@pytest.mark.heavy
def test_record_refuses_a_verdict_with_a_field_its_runs_no_longer_give(tmp_path: Path) -> None:
    out = tmp_path / "joint"
    run_experiment("ib_joint", out, overrides=SETS, log=lambda _: None)
    verdict = json.loads((out / "verdict.json").read_text())
    part = sorted(verdict["effects"])[0]
    verdict["effects"][part]["se_removed"] = 0.125  # a field the current code does not give
    (out / "verdict.json").write_text(json.dumps(verdict))
    with pytest.raises(ValueError, match=rf"verdict.json is stale: .*'{part}'\.se_removed: "
                                         r"recorded 0\.125, its runs give no 'se_removed'"):
        record(out, tmp_path / "rec")
    assert not (tmp_path / "rec").exists()
