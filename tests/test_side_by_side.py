"""reproduction/side_by_side.py: old and new experiment directories compared number by number,
wall-clock entries and measurement cache keys left out, every other difference listed."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("side_by_side",
                                               ROOT / "reproduction" / "side_by_side.py")
assert _spec is not None and _spec.loader is not None
sbs = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(sbs)


def _experiment(root: Path, loss: float, seconds: float, scale_key: str) -> Path:
    exp = root / "exp"
    (exp / "run").mkdir(parents=True)
    (exp / "verdict.json").write_text(json.dumps({"verdict": "holds", "reason": "r",
                                                  "runtime_s": seconds}))
    (exp / "experiment.json").write_text(json.dumps({"runs": ["run"]}))
    records = [{"step": 0, "train/loss": 1.0, "time": seconds},
               {"step": 5, "train/loss": loss, "time": 2 * seconds}]
    (exp / "run" / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    (exp / "run" / "summary.json").write_text(json.dumps(
        {"final": {"train/loss": loss, "time": seconds}, "seconds": seconds}))
    (exp / "run" / "final_measure.json").write_text(json.dumps(
        {"settings": {scale_key: 1}, "values": {"acc": 0.5}}))
    return exp


def test_equal_numbers_at_other_times_and_cache_keys_are_equal(tmp_path: Path) -> None:
    old = _experiment(tmp_path / "old", 0.25, 3.0, "scale")
    new = _experiment(tmp_path / "new", 0.25, 7.0, "other")
    result = sbs.compare(old, new)
    assert result["equal"] and result["runs"] == {"run": []}
    assert result["runtime_s"] == [3.0, 7.0]


def test_a_changed_number_is_listed_where_it_is(tmp_path: Path) -> None:
    old = _experiment(tmp_path / "old", 0.25, 3.0, "scale")
    new = _experiment(tmp_path / "new", 0.2500001, 3.0, "scale")
    result = sbs.compare(old, new)
    assert not result["equal"]
    assert result["runs"]["run"] == ["metrics.jsonl/1/train/loss: 0.25 → 0.2500001",
                                     "summary.json final/train/loss: 0.25 → 0.2500001"]


def test_nan_equals_nan_and_missing_keys_are_named() -> None:
    assert sbs.differences({"a": float("nan")}, {"a": float("nan")}) == []
    assert sbs.differences({"a": 1}, {"b": 1}) == ["/a: present → missing",
                                                   "/b: missing → present"]
