"""track.report_to: TensorBoard event files and W&B history equal metrics.jsonl, also across a
resume; logging-only settings and fields added later leave a recorded run the same run."""

from __future__ import annotations

import dataclasses
import json
import struct
from pathlib import Path

import numpy as np
import pytest

from senslab.train.config import (
    LOGGING_ONLY,
    RunConfig,
    apply_overrides,
    config_differences,
    defaults_of,
)
from senslab.train.loop import fit
from senslab.train.looprun import LoopRun
from senslab.train.report_to import scalars
from senslab.train.rundir import RunDir

TINY = [
    "model.name=mlp", "data.name=digits", "model.overrides.widths=[16]", "train.batch_size=64",
    "train.epochs=2", "optim.lr=0.05", "track.num_examples=16", "track.eval_examples=64",
    "track.unit=step", "track.every=7", "train.max_steps=40",
]


def tiny(*extra: str) -> RunConfig:
    return apply_overrides(RunConfig(name="tiny"), TINY + list(extra))


def _records(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


def _tensorboard(run: Path) -> dict[str, list[tuple[int, float]]]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(run / "tensorboard"), size_guidance={"scalars": 0})
    acc.Reload()
    return {tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}


def _expected(records: list[dict]) -> dict[str, list[tuple[int, float]]]:
    """Every numeric scalar of every record at its step, as float32 (TensorBoard's scalars)."""
    out: dict[str, list[tuple[int, float]]] = {}
    for r in records:
        for key, value in scalars(r).items():
            out.setdefault(key, []).append((r["step"], float(np.float32(value))))
    return out


def _untimed(records: list[dict]) -> list[dict]:
    return [{k: v for k, v in r.items() if k != "time"} for r in records]


def _cut_back(run: Path) -> int:
    """Make ``run`` look interrupted after its first checkpoint: the later checkpoints and the
    summary go, metrics.jsonl (and the reporters' files) keep the records logged after it."""
    rd = RunDir(run)
    first, *later = rd.checkpoints()
    for path in later:
        path.unlink()
    (run / "summary.json").unlink()
    return int(first.stem.split("-")[1])


# -- TensorBoard -------------------------------------------------------------------------------


def test_tensorboard_scalars_equal_metrics_jsonl(tmp_path):
    pytest.importorskip("tensorboard")
    run = tmp_path / "run"
    fit(tiny("track.report_to=tensorboard", "train.checkpoint_every=14"), run, progress=False)
    records = _records(run)
    assert len(records) >= 6 and {"train/loss", "sens/train", "epoch"} <= set(_tensorboard(run))
    assert _tensorboard(run) == _expected(records)  # lists (sens/train_ci...) are left out

    # interrupted after the first checkpoint: the resumed run redoes the later records, and the
    # event files, rebuilt from the cut-back metrics.jsonl, hold each step once
    step = _cut_back(run)
    assert max(s for s, _ in _tensorboard(run)["train/loss"]) > step  # stale steps are there
    fit(tiny("track.report_to=tensorboard", "train.checkpoint_every=14"), run, progress=False)
    assert _untimed(_records(run)) == _untimed(records)  # bit-identical resume
    assert _tensorboard(run) == _expected(_records(run))
    assert len(list((run / "tensorboard").iterdir())) == 1


def test_report_to_added_later_exports_a_finished_run_without_retraining(tmp_path):
    pytest.importorskip("tensorboard")
    run = tmp_path / "run"
    summary = fit(tiny(), run, progress=False)
    assert not (run / "tensorboard").exists()
    # logging only: the same run, so nothing is retrained and the records are exported
    assert fit(tiny("track.report_to=[\"tensorboard\"]"), run, progress=False) == summary
    assert _tensorboard(run) == _expected(_records(run))


# -- W&B (offline) -----------------------------------------------------------------------------


def _wandb_history(run: Path) -> list[tuple[int, dict[str, float]]]:
    """(step, {key: value}) of every history record in the offline W&B files of ``run``, read
    with W&B's own record type (the files are a LevelDB-style log of 32 KiB blocks)."""
    from wandb.proto import wandb_internal_pb2 as pb

    out = []
    for path in sorted((run / "wandb").glob("offline-run-*/run-*.wandb")):
        data, pos, buf = path.read_bytes(), 7, b""  # 7 bytes: ':W&B', magic, version
        while pos + 7 <= len(data):
            left = 32768 - pos % 32768
            if left < 7:  # a block's tail too short for a header is padding
                pos += left
                continue
            _crc, n, kind = struct.unpack("<IHB", data[pos:pos + 7])
            if kind == 0 and n == 0:
                pos += left
                continue
            buf += data[pos + 7:pos + 7 + n]
            pos += 7 + n
            if kind in (1, 4):  # FULL, LAST
                rec = pb.Record()
                rec.ParseFromString(buf)
                buf = b""
                if rec.WhichOneof("record_type") == "history":
                    items = {i.key or "/".join(i.nested_key): json.loads(i.value_json)
                             for i in rec.history.item}
                    out.append((rec.history.step.num,
                                {k: v for k, v in items.items() if not k.startswith("_")}))
    return out


@pytest.fixture
def wandb_offline(tmp_path, monkeypatch):
    pytest.importorskip("wandb")
    for var, value in {"WANDB_MODE": "offline", "WANDB_SILENT": "true",
                       "WANDB_CONFIG_DIR": tmp_path / "wandb-config",
                       "WANDB_CACHE_DIR": tmp_path / "wandb-cache",
                       "WANDB_DATA_DIR": tmp_path / "wandb-data"}.items():
        monkeypatch.setenv(var, str(value))


def test_wandb_history_equals_metrics_jsonl_and_resume_sends_each_step_once(tmp_path,
                                                                            wandb_offline):
    run = tmp_path / "run"
    cfg = tiny("track.report_to=wandb", "train.checkpoint_every=14")
    fit(cfg, run, progress=False)
    state = json.loads((run / "wandb.json").read_text())
    records = _records(run)
    assert state["step"] == records[-1]["step"]
    assert _wandb_history(run) == [(r["step"], scalars(r)) for r in records]

    _cut_back(run)
    fit(cfg, run, progress=False)
    # the same W&B run continues; the redone steps it already had are not sent twice
    assert json.loads((run / "wandb.json").read_text())["id"] == state["id"]
    history = _wandb_history(run)
    assert [s for s, _ in history] == [r["step"] for r in records]
    # bit-identical resume: W&B's first-attempt values are metrics.jsonl's ("time" aside)
    assert [(s, _untimed([v])[0]) for s, v in history] == [
        (r["step"], scalars(r)) for r in _untimed(_records(run))]


# -- what counts as the same run ---------------------------------------------------------------


def test_logging_only_and_later_added_fields_keep_a_run_the_same(tmp_path):
    run = tmp_path / "run"
    summary = fit(tiny(), run, progress=False)
    # a run recorded before track.report_to existed
    old = json.loads((run / "config.json").read_text())
    del old["track"]["report_to"]
    (run / "config.json").write_text(json.dumps(old))
    assert fit(tiny(), run, progress=False) == summary
    assert fit(tiny("track.report_to=[]"), run, progress=False) == summary

    # a real change is still refused, naming what differs
    with pytest.raises(ValueError, match=r"differs in optim\.lr"):
        fit(tiny("optim.lr=0.01"), run, progress=False)


def test_config_differences_rules():
    defaults = defaults_of(RunConfig)
    new = RunConfig(label="x").to_dict()
    old = json.loads(json.dumps(new))
    del old["track"]["report_to"], old["track"]["sigma"]
    assert config_differences(old, new, defaults) == []  # both absent keys at their defaults
    assert config_differences(old, new) == ["track.report_to", "track.sigma"]  # no defaults
    new["track"]["sigma"] = 0.5  # an added field set off its default: another run
    assert config_differences(old, new, defaults, LOGGING_ONLY) == ["track.sigma"]
    new["track"]["sigma"], new["track"]["report_to"] = 0.1, ["wandb"]
    assert config_differences(old, new, defaults, LOGGING_ONLY) == []
    assert config_differences(old, new, defaults) == ["track.report_to"]
    new["model"]["overrides"] = {"depth": 2}  # a free-form entry is never a default
    assert config_differences(old, new, defaults, LOGGING_ONLY) == ["model.overrides.depth"]


@dataclasses.dataclass
class _LoopSettings:
    steps: int = 3
    lr: float = 0.1
    width: int = 8  # "added later" below


def _loop(path: Path, config: object, **kw: object) -> dict:
    with LoopRun(path, config, **kw) as run:
        if run.summary is not None:
            return run.summary
        run.restore()
        run.log({"step": 1, "loss": 1.0})
        return run.finish({"final": 1})


def test_looprun_reads_a_missing_field_as_its_default(tmp_path):
    path = tmp_path / "loop"
    first = _loop(path, _LoopSettings())
    old = json.loads((path / "config.json").read_text())
    del old["width"]
    (path / "config.json").write_text(json.dumps(old))
    assert _loop(path, _LoopSettings()) == first  # a dataclass brings its defaults
    assert _loop(path, dataclasses.asdict(_LoopSettings()),
                 defaults=defaults_of(_LoopSettings)) == first
    with pytest.raises(ValueError, match="differs in width"):
        _loop(path, dataclasses.asdict(_LoopSettings()))  # a dict without defaults
    with pytest.raises(ValueError, match="differs in width"):
        _loop(path, _LoopSettings(width=16))
    with pytest.raises(ValueError, match="differs in lr"):
        _loop(path, _LoopSettings(lr=0.2))
    assert _loop(path, {**dataclasses.asdict(_LoopSettings()), "note": "x"},
                 defaults=defaults_of(_LoopSettings), logging_only={"note"}) == first


def test_report_to_overrides_are_checked():
    cfg = tiny("track.report_to=tensorboard,wandb")
    assert cfg.track.report_to == ["tensorboard", "wandb"]
    with pytest.raises(ValueError, match="track.report_to must be one of tensorboard, wandb"):
        apply_overrides(cfg, ["track.report_to=tensorbord"])


def test_a_missing_reporter_package_is_an_error_before_anything_is_written(tmp_path,
                                                                             monkeypatch):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "wandb" else real(name, *a))
    with pytest.raises(ImportError, match=r"pip install 'senslab\[wandb\]'"):
        fit(tiny("track.report_to=wandb"), tmp_path / "run", progress=False)
    assert not (tmp_path / "run").exists()
