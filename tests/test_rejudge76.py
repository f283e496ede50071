"""Committed verdicts follow the current rule (audit of session 76): two ladder rungs, demo's and
fashion_mnist's on all 60,000 images, were recorded *contradicted* on 3 seeds whose spread was
below their own measurement error (s.e. 0.00072 against 0.0022), which the rule of
``over_seeds`` has since floored; judged again from their stored numbers they are
*inconclusive*. ``refloor`` does that judging, ``reproduction/rejudge.py`` applies it to every
record, and REPRODUCTION.md says which verdicts it changed."""

from __future__ import annotations

import copy
import json
import math
from pathlib import Path

import pytest

from senslab.reproduction import refloor, rejudged, render_ladders
from senslab.verdicts import Effect, describe, judge, over_seeds, verdict

ROOT = Path(__file__).resolve().parent.parent / "reproduction"


def test_a_part_below_its_floor_is_judged_again_as_over_seeds_judges_it_now():
    """Three seeds 0.001 apart around −0.0064 with a measurement error of 0.0038 each: today's
    rule floors the s.e. at 0.0022 (inconclusive). A record of the older rule stored the
    seeds' own s.e.; refloor gives it today's verdict, interval and sentence."""
    values, ses = [-0.0074, -0.0064, -0.0054], [0.0038] * 3
    today = verdict({"a − b": over_seeds(values, ses, "a − b")}, claim="b is lowest")
    mean = sum(values) / 3
    spread = math.sqrt(sum((v - mean) ** 2 for v in values) / 2) / math.sqrt(3)
    old = copy.deepcopy(today)
    part = old["effects"]["a − b"]
    assert part["se"] == pytest.approx(0.0038 * math.sqrt(3) / 3)
    # the older rule: the seeds' own spread, a far narrower interval
    stale = judge({"a − b": Effect(mean, spread, 2, 3, part["se_measure"], 0.0, "a − b",
                                   "mean over 3 seeds (t)")})
    old.update(verdict=stale["verdict"], effects=stale["parts"],
               reason=f"b is lowest: {describe('a − b', stale['parts']['a − b'])}")
    assert old["verdict"] == "contradicted"
    said = refloor(old)
    assert "contradicted → inconclusive" in said
    assert old["verdict"] == today["verdict"] == "inconclusive"
    assert old["effects"]["a − b"]["interval"] == pytest.approx(
        today["effects"]["a − b"]["interval"])
    assert old["reason"] == today["reason"]
    assert refloor(old) == ""  # judged under the current rule: left as it is


def test_a_record_the_parts_do_not_explain_is_refused():
    part = over_seeds([-0.0074, -0.0064, -0.0054], [0.0038] * 3, "a − b")
    rec = verdict({"a − b": part}, claim="b is lowest")
    rec["effects"]["a − b"]["se"] = 1e-4  # below its floor
    rec["verdict"] = "supported"  # but not what its parts judge
    with pytest.raises(ValueError, match="not re-derivable"):
        refloor(rec)


def test_every_committed_record_follows_the_current_floor():
    """No committed record or ladder rung keeps a part below its measurement error."""
    paths = sorted(ROOT.glob("*.json"))
    entries = [(p.name, json.loads(p.read_text())) for p in paths]
    for p in sorted((ROOT / "ladders").glob("*.json")):
        entries += [(f"{p.name} {r['rung']}", r) for r in json.loads(p.read_text())["rungs"]
                    if r.get("status") == "done"]
    assert len(entries) > 20
    for name, entry in entries:
        assert refloor(copy.deepcopy(entry)) == "", name


def test_a_changed_verdict_is_said_in_reproduction_md():
    lad = json.loads((ROOT / "ladders" / "demo.json").read_text())
    full = next(r for r in lad["rungs"] if r["rung"] == "full-data")
    assert full["verdict"] == "inconclusive"
    assert rejudged(full) == " (re-judged 2026-12-06: was contradicted)"
    rows = [line for line in render_ladders({"demo": lad}) if line.startswith("| full-data")]
    assert rows and rows[0].endswith("**inconclusive** (re-judged 2026-12-06: was contradicted) |")
    same = {"verdict": "inconclusive", "rejudged": [{"date": "d", "verdict_before":
                                                     "inconclusive", "what": "x"}]}
    assert rejudged(same) == ""
