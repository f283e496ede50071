"""benchmarks/allocation_designs.py: the simulated sequential designs are unbiased and report a
calibrated standard error on a small synthetic record, and the command reads a --ceiling record."""

from __future__ import annotations

import json

import benchscripts
import numpy as np
import pytest


@pytest.fixture(scope="module")
def designs():
    return benchscripts.load("allocation_designs.py", "senslab_allocation_designs")


#: 20 examples of 10 tokens; half the tokens flip in 4 of 8 draws, in 4 examples all of them
COUNTS = [[0] * 5 + [4] * 5] * 16 + [[4] * 10] * 4


def test_spread_keeps_the_budget_and_the_floor(designs):
    q = np.array([0.0, 0.0, 0.5, 0.25])
    e = designs.spread(q, 1.0)
    assert e.mean() == pytest.approx(1.0)
    assert e.min() == pytest.approx(designs.FLOOR * 1.0)
    assert e[2] > e[3] > e[0]  # ∝ √(q(1 − q)) above the floor
    assert np.allclose(designs.spread(np.zeros(3), 0.5), 0.5)  # nothing to go by: equal


@pytest.mark.parametrize("design,budget", [("equal", 0.5), ("token", 0.5), ("example", 0.5)])
def test_every_design_is_unbiased_with_a_calibrated_standard_error(designs, design, budget):
    rows = designs.simulate(COUNTS, 8, 0.02, replicates=300, designs=((design, budget),))
    assert {r["truth"] for r in rows} == {"recorded", "never-flipped at 0.01"}
    for r in rows:
        assert abs(r["bias"]) < 4 * r["bias_se"], r
        assert r["mean_reported_se"] <= 0.02 + 1e-12  # the rounds stop at the target
        assert r["mean_reported_se"] == pytest.approx(r["true_sd"], rel=0.2), r


def test_learning_where_flips_are_pays_where_they_concentrate(designs):
    """With flips concentrated in a few examples' tokens, allocating by the rounds so far needs
    fewer draws than equal rounds of the same budget."""
    concentrated = [[0] * 10] * 16 + [[4] * 10] * 4  # 4 of 20 examples flip at all
    rows = designs.simulate(concentrated, 8, 0.015, replicates=40,
                            designs=(("equal", 0.5), ("example", 0.5)))
    got = {r["design"]: r["draws_per_token"] for r in rows if r["truth"] == "recorded"}
    assert got["example"] < 0.8 * got["equal"]


def test_the_command_reads_a_ceiling_record(designs, tmp_path):
    record = tmp_path / "ceiling.json"
    record.write_text(json.dumps({"cases": [{
        "case": "toy", "allocation_ceiling": {"draws": 8.0, "target_se": 0.02},
        "flip_counts": COUNTS}]}))
    out = tmp_path / "designs.json"
    result = designs.main([str(record), "--replicates", "20", "--out", str(out)])
    saved = json.loads(out.read_text())
    assert saved["cases"][0]["case"] == "toy" and saved == json.loads(json.dumps(result))
    assert len(saved["cases"][0]["rows"]) == 2 * len(designs.DESIGNS)
    record.write_text(json.dumps({"cases": [{"case": "timed", "rows": []}]}))
    with pytest.raises(SystemExit, match="no flip counts"):
        designs.main([str(record)])
    with pytest.raises(SystemExit, match="at least 2"):
        designs.main([str(record), "--replicates", "1"])
