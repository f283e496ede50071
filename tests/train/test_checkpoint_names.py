"""Only the checkpoint names senslab writes are the run's checkpoints: a file of another name in
the folder (a backup of one's own) was listed as the oldest, so pruning deleted it."""

from __future__ import annotations

from pathlib import Path

import torch

from senslab.train.rundir import RunDir


def test_a_file_of_another_name_is_neither_pruned_nor_resumed_from(tmp_path: Path) -> None:
    rd = RunDir(tmp_path / "run")
    with rd.writing():
        first = rd.save_checkpoint({"model": {"w": torch.zeros(2)}}, step=10)
        assert first is not None
        backup = first.with_name("step-00000010-backup.safetensors")
        backup.write_bytes(first.read_bytes())
        for step in (20, 30, 40):
            rd.save_checkpoint({"model": {"w": torch.full((2,), float(step))}}, step=step, keep=2)
        assert [p.name for p in rd.checkpoints()] == ["step-00000030.safetensors",
                                                      "step-00000040.safetensors"]
        assert backup.is_file(), "a file senslab did not write was deleted"
        found = rd.load_latest(resume=True)
    assert found is not None and found[0].name == "step-00000040.safetensors"
