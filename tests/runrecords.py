"""What a finished run logged, read as ``senslab measure --checkpoint`` would compare with it."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from senslab.train.rundir import RunDir, checkpoint_step


def write_run(path: Path, label: str, seed: int, rows: list[dict]) -> Path:
    """A finished run of ``label`` whose metrics.jsonl is ``rows`` and whose summary.json's
    final numbers are the last record's."""
    path.mkdir(parents=True)
    (path / "config.json").write_text(json.dumps({"name": path.name, "label": label,
                                                  "seed": seed}))
    (path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    final = {k: v for k, v in rows[-1].items() if k not in ("step", "epoch")}
    (path / "summary.json").write_text(json.dumps({"label": label, "final": final}))
    return path


def tracked_record(run: Path) -> dict[str, Any]:
    """The run's logged record (a metrics.jsonl line) at its newest checkpoint's step."""
    found = RunDir(run).load_latest()
    assert found is not None
    step = checkpoint_step(found[0])
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    (record,) = [r for r in records if r["step"] == step]
    return record
