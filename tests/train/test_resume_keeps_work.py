"""A recorded run resumes without losing what it trained: ``train.keep_checkpoints`` (how many
checkpoints stay on disk, not what is trained; senslab.train.config.LOGGING_ONLY) is no
difference, and a reporter's failure checkpoints the steps trained before it."""

from __future__ import annotations

import json

import pytest

from senslab.train.config import RunConfig, apply_overrides
from senslab.train.loop import fit
from senslab.train.rundir import RunDir

TINY = [
    "model.name=mlp", "data.name=digits", "model.overrides.widths=[16]", "train.batch_size=64",
    "train.epochs=2", "optim.lr=0.05", "track.num_examples=16", "track.eval_examples=64",
    "track.unit=step", "track.every=7", "train.max_steps=40", "train.checkpoint_every=7",
    "seed=3", "device=cpu",
]


def tiny(*extra: str) -> RunConfig:
    return apply_overrides(RunConfig(name="tiny"), TINY + list(extra))


def _metrics(path) -> list[dict]:
    return [{k: v for k, v in json.loads(line).items() if k != "time"}
            for line in (path / "metrics.jsonl").read_text().splitlines()]


def test_a_run_resumes_with_fewer_checkpoints_kept(tmp_path):
    # before: "holds a run with a different configuration (differs in
    # train.keep_checkpoints)", so a run on a full disk could not be resumed keeping fewer
    ref = tmp_path / "ref"
    fit(tiny("train.keep_checkpoints=0"), ref, progress=False)
    run = tmp_path / "run"
    fit(tiny("train.keep_checkpoints=0"), run, progress=False)
    first, *later = RunDir(run).checkpoints()
    assert len(later) >= 2
    for path in later:  # interrupted after its first checkpoint
        path.unlink()
    (run / "summary.json").unlink()
    fit(tiny("train.keep_checkpoints=1"), run, progress=False)  # resumed, not refused
    assert len(RunDir(run).checkpoints()) == 1
    assert _metrics(run) == _metrics(ref)  # the same run, as if never interrupted
    assert json.loads((run / "config.json").read_text())["train"]["keep_checkpoints"] == 0
    # a finished run is reused whatever it keeps; a setting that trains otherwise is refused
    summary = json.loads((run / "summary.json").read_text())
    assert fit(tiny("train.keep_checkpoints=5"), run, progress=False) == summary
    with pytest.raises(ValueError, match=r"different configuration \(differs in optim.lr\)"):
        fit(tiny("train.keep_checkpoints=5", "optim.lr=0.01"), run, progress=False)


def test_a_reporter_failing_keeps_the_steps_trained_before_it(tmp_path, monkeypatch):
    """A reporter that fails on a record (W&B's network, a full disk) ended the run before
    that step's checkpoint: the resume went back to the last one and trained those steps again.
    The run now checkpoints at that step before the error goes up, and resumes from it to the
    numbers of a run never interrupted."""
    from senslab.train import report_to

    cfg = tiny("train.keep_checkpoints=0", "train.checkpoint_every=14")
    ref = tmp_path / "ref"
    fit(cfg, ref, progress=False)
    plain_log = report_to.Reporters.log

    def failing(self, record):
        if record["step"] == 21:
            raise ConnectionError("the reporter's server went away")
        plain_log(self, record)

    run = tmp_path / "run"
    with monkeypatch.context() as patch:
        patch.setattr(report_to.Reporters, "log", failing)
        with pytest.raises(ConnectionError, match="went away"):
            fit(cfg, run, progress=False)
    from senslab.train.rundir import checkpoint_step

    assert [checkpoint_step(p) for p in RunDir(run).checkpoints()] == [14, 21]  # was [14]
    assert _metrics(run)[-1]["step"] == 21
    fit(cfg, run, progress=False)  # resumed from step 21
    assert _metrics(run) == _metrics(ref)
