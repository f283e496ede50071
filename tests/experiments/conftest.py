"""Shared checks of a finished experiment directory."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from senslab.verdicts import WORDS

VERDICTS = set(WORDS)  # supported, contradicted, inconclusive, not comparable
Run = tuple[str, list[dict[str, Any]], dict[str, Any]]


@pytest.fixture
def finished_runs() -> Callable[[Path, dict[str, Any]], list[Run]]:
    """``check(out, verdict)``: the verdict is one of the four words and is what ``verdict.json``
    holds; every run listed in ``experiment.json`` has its config, environment, summary and
    metrics, and its summary's final record is the last metrics line. Returns
    ``(name, metric records, summary)`` per run for the test's own checks."""

    def check(out: Path, verdict: dict[str, Any]) -> list[Run]:
        exp = json.loads((out / "experiment.json").read_text())
        assert verdict["verdict"] in VERDICTS and verdict["reason"]
        assert json.loads((out / "verdict.json").read_text()) == verdict
        runs = []
        for name in exp["runs"]:
            run = out / name
            for f in ("config.json", "env.json", "summary.json", "metrics.jsonl"):
                assert (run / f).exists(), f"{name}/{f} missing"
            lines = (run / "metrics.jsonl").read_text().splitlines()
            records = [json.loads(line) for line in lines]
            summary = json.loads((run / "summary.json").read_text())
            assert summary["final"] == records[-1] and summary["name"] == name
            runs.append((name, records, summary))
        return runs

    return check
