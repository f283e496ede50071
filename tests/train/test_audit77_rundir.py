"""Audit of the run directory's metric log and JSON files, and of what reporters receive: a
record appended after a crash tore the log's last line, NumPy/torch scalars in records and
summaries, and a tensor scalar sent live to TensorBoard."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from senslab.train.report_to import Reporters, scalars
from senslab.train.rundir import RunDir


def test_a_record_logged_after_a_torn_last_line_is_kept(tmp_path: Path) -> None:
    """A crash mid-write leaves a last line without its newline; the next record appended was
    glued onto it and dropped by ``metrics()`` as a crash's torn line (step 3 lost)."""
    rd = RunDir(tmp_path / "run")
    rd.path.mkdir()
    rd.log({"step": 1, "epoch": 0.1, "train/loss": 1.0})
    with open(rd.metrics_path, "a") as f:
        f.write('{"step": 2, "epo')  # torn by a crash
    rd.log({"step": 3, "epoch": 0.3, "train/loss": 0.5})
    assert [r["step"] for r in rd.metrics()] == [1, 3]
    rd.log({"step": 4, "epoch": 0.4, "train/loss": 0.25})  # no "damaged log" afterwards
    assert [r["step"] for r in rd.metrics()] == [1, 3, 4]


def test_a_whole_last_record_without_its_newline_is_kept(tmp_path: Path) -> None:
    rd = RunDir(tmp_path / "run")
    rd.path.mkdir()
    rd.metrics_path.write_text('{"step": 1, "epoch": 0.1}\n{"step": 2, "epoch": 0.2}')
    rd.log({"step": 3, "epoch": 0.3})
    assert [r["step"] for r in rd.metrics()] == [1, 2, 3]


def test_numpy_and_torch_scalars_are_written_as_numbers(tmp_path: Path) -> None:
    """summary.json held ``"0.25"`` and ``"tensor(0.7500)"`` (strings its check against the
    log let through), and metrics.jsonl a step ``1.0`` for ``np.int64(1)``."""
    rd = RunDir(tmp_path / "run")
    record = {"step": np.int64(1), "epoch": np.float32(0.5), "train/acc": np.float32(0.25),
              "train/loss": torch.tensor(0.75), "n": np.int64(7), "ok": np.bool_(True)}
    rd.path.mkdir()
    rd.log(record)
    logged = json.loads(rd.metrics_path.read_text())
    assert logged == {"step": 1, "epoch": 0.5, "train/acc": 0.25, "train/loss": 0.75, "n": 7,
                      "ok": True}
    assert type(logged["step"]) is int
    rd.write_json("summary.json", {"final": record, "where": tmp_path})
    final = rd.read_json("summary.json")["final"]
    assert final == logged
    assert all(type(final[k]) is type(logged[k]) for k in logged)
    assert rd.read_json("summary.json")["where"] == str(tmp_path)  # other objects: their text


def test_a_summary_scalar_that_disagrees_with_the_log_is_caught(tmp_path: Path) -> None:
    """Written as a string, a summary's tensor value escaped the check against the log."""
    rd = RunDir(tmp_path / "run")
    rd.path.mkdir()
    rd.log({"step": 1, "train/acc": 0.5})
    rd.write_json("summary.json", {"final": {"train/acc": torch.tensor(0.25)}})
    with pytest.raises(ValueError, match="final numbers are not those of the last record"):
        rd.read_json("summary.json")


def test_a_tensor_scalar_reaches_tensorboard_live(tmp_path: Path) -> None:
    """metrics.jsonl wrote ``torch.tensor(0.5)`` as 0.5, but the live TensorBoard reporter left
    it out (it appeared only when a resume rebuilt the event files)."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    assert scalars({"step": 1, "a": torch.tensor(0.5), "b": np.array(0.25), "c": np.bool_(True),
                    "d": torch.tensor([0.5, 1.0])}) == {"a": 0.5, "b": 0.25}
    rd = RunDir(tmp_path / "run")
    with rd.writing(), Reporters() as reporters:
        rd.log({"step": 1, "train/loss": torch.tensor(0.75)})
        reporters.open(["tensorboard"], rd, {}, "run")
        record = {"step": 2, "train/loss": torch.tensor(0.5)}
        rd.log(record)
        reporters.log(record)
    acc = EventAccumulator(str(rd.path / "tensorboard"), size_guidance={"scalars": 0})
    acc.Reload()
    assert [(e.step, e.value) for e in acc.Scalars("train/loss")] == [(1, 0.75), (2, 0.5)]
