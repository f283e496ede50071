"""track.report_to: what a reporter receives besides the values — TensorBoard's time axis across
a resume, W&B settings it cannot start with, and a reporter package that cannot be imported —
each checked on a tiny real run (mlp on digits)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from senslab.train.config import RunConfig, apply_overrides
from senslab.train.loop import fit
from senslab.train.rundir import RunDir

TINY = [
    "model.name=mlp", "data.name=digits", "model.overrides.widths=[16]", "train.batch_size=64",
    "train.epochs=2", "optim.lr=0.05", "track.num_examples=16", "track.eval_examples=64",
    "track.unit=step", "track.every=7", "train.max_steps=40", "train.checkpoint_every=14",
    "seed=3",
]


def tiny(*extra: str) -> RunConfig:
    return apply_overrides(RunConfig(name="tiny"), TINY + list(extra))


def _records(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


def _cut_back(run: Path) -> int:
    """Make ``run`` look interrupted after its first kept checkpoint (the later ones and the
    summary go; metrics.jsonl and the reporters' files keep what was logged after it)."""
    first, *later = RunDir(run).checkpoints()
    for path in later:
        path.unlink()
    (run / "summary.json").unlink()
    return int(first.stem.split("-")[1])


# -- TensorBoard: the time axis ------------------------------------------------------------------


def _wall_times(run: Path) -> list[tuple[int, float]]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(run / "tensorboard"), size_guidance={"scalars": 0})
    acc.Reload()
    return [(e.step, e.wall_time) for e in acc.Scalars("train/loss")]


def _assert_relative_time_is_training_time(run: Path) -> None:
    """TensorBoard's "Relative" axis (wall time since the first point) equals the records'
    ``time`` since the first record, at every step."""
    records, walls = _records(run), _wall_times(run)
    assert [s for s, _ in walls] == [r["step"] for r in records]
    t0, w0 = records[0]["time"], walls[0][1]
    for r, (_, wall) in zip(records, walls, strict=True):
        assert wall - w0 == pytest.approx(r["time"] - t0, abs=1e-4), (r["step"], wall - w0)


def test_tensorboard_time_axis_is_the_runs_time_after_a_resume_and_an_export(tmp_path):
    pytest.importorskip("tensorboard")
    run = tmp_path / "run"
    cfg = tiny("track.report_to=tensorboard")
    fit(cfg, run, progress=False)
    _assert_relative_time_is_training_time(run)

    # resumed: the event files are rebuilt from metrics.jsonl; the rebuilt points sat at the
    # instant of the rebuild (0 s apart), however long the run had trained to reach them
    step = _cut_back(run)
    fit(cfg, run, progress=False)
    records = _records(run)
    assert records[-1]["step"] > step and records[step // 7]["time"] > records[0]["time"]
    _assert_relative_time_is_training_time(run)

    # a finished run re-run: rebuilt again, without training
    fit(cfg, run, progress=False)
    _assert_relative_time_is_training_time(run)


# -- W&B (offline) -----------------------------------------------------------------------------


@pytest.fixture
def wandb_offline(tmp_path, monkeypatch):
    pytest.importorskip("wandb")
    for var, value in {"WANDB_MODE": "offline", "WANDB_SILENT": "true",
                       "WANDB_CONFIG_DIR": tmp_path / "wandb-config",
                       "WANDB_CACHE_DIR": tmp_path / "wandb-cache",
                       "WANDB_DATA_DIR": tmp_path / "wandb-data"}.items():
        monkeypatch.setenv(var, str(value))


def test_wandb_settings_it_cannot_start_with_stop_a_resume_before_it_trains(tmp_path,
                                                                           wandb_offline,
                                                                           monkeypatch):
    run = tmp_path / "run"
    cfg = tiny("track.report_to=wandb")
    fit(cfg, run, progress=False)
    step = _cut_back(run)
    # the state an interruption just after that checkpoint leaves: every record up to it sent
    state = json.loads((run / "wandb.json").read_text())
    (run / "wandb.json").write_text(json.dumps({"id": state["id"], "step": step}))

    # "entity/project" in WANDB_PROJECT: W&B refuses the project name. The resume started W&B
    # only at its first new record, after training up to it; that training was lost (no
    # checkpoint follows a failed record), and every retry lost it again
    monkeypatch.setenv("WANDB_PROJECT", "team/senslab")
    with pytest.raises(RuntimeError, match=r"names wandb, but W&B could not start.*"
                                           r"Invalid project name.*drop wandb"):
        fit(cfg, run, progress=False)
    assert [r["step"] for r in _records(run)] == [r for r in (0, 7, 14, 21, 28, 35) if r <= step]
    assert [int(p.stem.split("-")[1]) for p in RunDir(run).checkpoints()] == [step]


# -- a reporter package that cannot be imported ----------------------------------------------


def test_a_broken_reporter_package_is_an_error_before_anything_is_written(tmp_path,
                                                                         monkeypatch):
    # an installed but broken wandb (as a protobuf that its generated code does not match):
    # found by find_spec, failing when imported
    broken = tmp_path / "site" / "wandb"
    broken.mkdir(parents=True)
    (broken / "__init__.py").write_text(
        "raise TypeError('Descriptors cannot be created directly')\n")
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    monkeypatch.delitem(sys.modules, "wandb", raising=False)
    with pytest.raises(ImportError, match=r"names wandb, but wandb cannot be imported "
                                          r"\(TypeError: Descriptors.*senslab\[wandb\]"):
        fit(tiny("track.report_to=wandb"), tmp_path / "run", progress=False)
    assert not (tmp_path / "run").exists()


def test_report_to_none_names_the_empty_list(tmp_path):
    """Hugging Face's ``report_to="none"`` was refused naming only the reporters; the error
    names the empty list, which the command line takes as ``[]`` (no reporter, as the
    default), on the command line and in a configuration built in Python alike."""
    with pytest.raises(ValueError, match=r"must be one of tensorboard, wandb, or none at all: "
                                         r"an empty list \(--set 'track.report_to=\[\]'"):
        tiny("track.report_to=none")
    cfg = tiny()
    cfg.track.report_to = ["none"]
    with pytest.raises(ValueError, match=r"none at all: an empty list \(--set "
                                         r"'track.report_to=\[\]'.*got 'none'"):
        fit(cfg, tmp_path / "run", progress=False)
    assert not (tmp_path / "run").exists()
    assert tiny("track.report_to=[]").track.report_to == []
