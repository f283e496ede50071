"""Audit 77, reproduction: REPRODUCTION.md's summary against its rows, re-judging under the
standard-error floor without losing what a part said, and a record's reason checked against
its runs."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from senslab.experiments import get_experiment
from senslab.reproduction import load_records, record, refloor, render
from senslab.verdicts import UNPAIRED, Effect, plain, verdict

REPO = Path(__file__).resolve().parents[1]


def _copy_records(tmp_path: Path) -> Path:
    out = tmp_path / "rec"
    out.mkdir()
    for p in (REPO / "reproduction").glob("*.json"):
        shutil.copy(p, out)
    return out


@pytest.mark.parametrize("stem, name", [("gone", "gone"), ("demo_old", "demo")])
def test_a_record_without_a_row_is_not_counted_in_the_summary(tmp_path: Path, stem: str,
                                                               name: str) -> None:
    """A record of an experiment no longer registered, or a copy of one under another file
    name, had no row but was counted: the summary said 6 supported (or 3 contradicted) over
    rows that show 5 (2)."""
    rec_dir = _copy_records(tmp_path)
    rec = json.loads((rec_dir / "demo.json").read_text())
    (rec_dir / f"{stem}.json").write_text(json.dumps({**rec, "name": name,
                                                      "verdict": "supported"}))
    with pytest.raises(ValueError, match=rf"record {stem}\.json .*'{name}'"):
        render(load_records(rec_dir))


def _entry(parts: dict[str, Effect]) -> dict:
    v = plain(verdict(parts, claim="claim"))
    return {"verdict": v["verdict"], "reason": v["reason"], "effects": v["effects"],
            "correction": v["correction"]}


def test_refloor_keeps_the_seeds_left_out_of_a_pair() -> None:
    """A paired part whose seeds without a pair were left out lost that note when its s.e. was
    floored: the reason then read as a mean over every seed run."""
    note = f"{UNPAIRED}4 (high only)"
    entry = _entry({"a": Effect(0.02, 0.004, 2, 3, 0.006, 0.0, "a − b",
                                f"mean over 3 seeds (t); {note}"),
                    "b": Effect(0.05, 0.01, 2, 3, 0.002, 0.0098, "c − d",
                                "mean over 3 seeds (t)")})
    assert note in entry["reason"]
    assert refloor(entry)
    assert entry["effects"]["a"]["se"] == 0.006
    assert note in entry["effects"]["a"]["method"]
    assert f"({note})" in entry["reason"]


def test_refloor_keeps_a_bootstrap_part_counted_in_runs() -> None:
    """A bootstrap part stored before parts carried ``unit`` is counted in runs (as describe()
    reads it); judged again beside a floored part, its "12 runs" became "12 seeds"."""
    entry = _entry({"a": Effect(0.02, 0.004, 2, 3, 0.006, 0.0, "a − b",
                                "mean over 3 seeds (t)"),
                    "c": Effect(0.3, 0.1, 11, 12, None, None, "slope",
                                "bootstrap over 12 runs", "run")})
    for part in entry["effects"].values():
        part.pop("unit")
    assert "(97.5%, 12 runs)" in entry["reason"]
    assert refloor(entry)
    assert "(97.5%, 12 runs)" in entry["reason"] and "12 seeds" not in entry["reason"]
    assert entry["effects"]["c"]["unit"] == "run"


SETS = ["steps=20", "seeds=2", "batch_size=4", "data.num_samples=8", "data.seq_len=4",
        "data.dim=8"]


def _ib_joint(root: Path) -> Path:
    """An ib_joint directory at SETS whose summaries are written here (no training), with the
    verdict.json those summaries give."""
    exp = get_experiment("ib_joint")
    _, built = exp.resolve("cpu", SETS)
    d = root / "joint"
    d.mkdir()
    runs = [r.name for r in built]
    (d / "experiment.json").write_text(json.dumps({"name": "ib_joint", "scale": "cpu",
                                                   "runs": runs}))
    summaries = []
    for i, r in enumerate(built):
        k = 1 + 0.1 * i
        s = {"name": r.name, "label": r.name.split("-")[0], "seed": r.info.get("seed", 0),
             "steps": 20, "final": {"train/loss": 0.6 / k, "attn/alignment": 0.5 * k,
                                    "attn/sparsity": 0.3 * k, "attn/v_alignment": 0.7 * k,
                                    "train/acc": 1.0}}
        (d / r.name).mkdir()
        (d / r.name / "summary.json").write_text(json.dumps(s))
        summaries.append({**s, **r.info})
    v = plain(exp.verdict(summaries))
    (d / "verdict.json").write_text(json.dumps({**v, "scale": "cpu", "overrides": SETS}))
    return d


def test_a_reason_its_runs_no_longer_give_is_stale(tmp_path: Path) -> None:
    """The reason (REPRODUCTION.md's result column) states numbers beyond the effects: Adam's
    loss among the means. A run's summary edited so that only such a number moved (Adam's
    loss 0.533 → 1.03 in the reproduction) was recorded, under the old number."""
    d = _ib_joint(tmp_path)
    assert record(d, tmp_path / "rec").is_file()  # as the summaries give it: recorded
    path = d / "adam-s0" / "summary.json"
    summary = json.loads(path.read_text())
    summary["final"]["train/loss"] += 1.0
    path.write_text(json.dumps(summary))
    with pytest.raises(ValueError, match=r"verdict.json is stale: .*reason: recorded"):
        record(d, tmp_path / "rec2")
    assert not (tmp_path / "rec2").exists()
