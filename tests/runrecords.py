"""What a finished run logged, read as ``senslab measure --checkpoint`` would compare with it."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from senslab.train.rundir import RunDir, checkpoint_step


def tracked_record(run: Path) -> dict[str, Any]:
    """The run's logged record (a metrics.jsonl line) at its newest checkpoint's step."""
    found = RunDir(run).load_latest()
    assert found is not None
    step = checkpoint_step(found[0])
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    (record,) = [r for r in records if r["step"] == step]
    return record
