"""benchmarks/allocation_seeds.py: one real_models row run over seeds, summarised so a reader
can see bias (the mean over seeds against its own standard error) and calibration (the spread
against the mean reported standard error)."""

from __future__ import annotations

import statistics
import sys
from types import SimpleNamespace

import benchscripts
import pytest
import torch

from senslab.tokens import Sequence


@pytest.fixture(scope="module")
def seeds():
    sys.path.insert(0, str(benchscripts.BENCHMARKS))
    try:
        yield benchscripts.load("allocation_seeds.py", "senslab_allocation_seeds")
    finally:
        sys.path.remove(str(benchscripts.BENCHMARKS))


#: the adaptive allocation's options for the small linear cases below
OPTIONS = {"repeats": 1, "allocation": "linear", "budget": 0.5, "target_stderr": 0.05}


def linear_case(*weights: float) -> SimpleNamespace:
    """A linear logit over 6 examples of one-number tokens with these ``weights``."""
    w = torch.tensor(weights)[:, None]

    def model(x: torch.Tensor) -> torch.Tensor:
        return (x * w).sum((1, 2)) + 0.3

    inputs = torch.randn(6, len(weights), 1, generator=torch.Generator().manual_seed(0))
    return SimpleNamespace(model=model, tokens=Sequence(), sigma=1.0, inputs=inputs)


def test_run_seeds_summarises_every_run(seeds):
    case, options = linear_case(1.0, 0.05, 0.05, 0.8), OPTIONS
    out = seeds.run_seeds(case, options, 3, log=lambda *_: None)
    runs, s = out["runs"], out["summary"]
    assert [r["seed"] for r in runs] == [1, 2, 3]
    assert len({r["estimate"] for r in runs}) > 1  # other seeds, other draws
    assert s["mean_estimate"] == pytest.approx(statistics.mean(r["estimate"] for r in runs))
    assert s["sd_estimates"] == pytest.approx(statistics.stdev(r["estimate"] for r in runs))
    assert all(r["se"] <= 0.05 for r in runs) and s["mean_forwards"] > 6
    assert all(r["tangent_scale"] is not None for r in runs)


def test_row_options_are_the_benchmark_rows(seeds):
    case = SimpleNamespace(n=256, kind="text", repeats=3, tokens=Sequence(), model=object())
    opts = seeds.row_options(case, "senslab adaptive allocation")
    assert opts["allocation"] == "linear" and opts["target_stderr"] == pytest.approx(0.002)
    with pytest.raises(SystemExit, match="no row"):
        seeds.row_options(case, "senslab nothing")


def test_seeds_extend_an_earlier_record(seeds):
    """--first-seed runs later seeds; the summary of merged runs is that of all of them, with
    the spread over the reported standard error and its interval."""
    case, options = linear_case(1.0, 0.05, 0.8), OPTIONS
    first = seeds.run_seeds(case, options, 2, log=lambda *_: None)
    later = seeds.run_seeds(case, options, 2, log=lambda *_: None, first=3)
    assert [r["seed"] for r in later["runs"]] == [3, 4]
    both = seeds.summarise(first["runs"] + later["runs"])
    allr = first["runs"] + later["runs"]
    assert both["mean_estimate"] == pytest.approx(statistics.mean(r["estimate"] for r in allr))
    ratio = both["sd_estimates"] / both["mean_reported_se"]
    assert both["sd_over_reported"] == pytest.approx(ratio)
    lo, hi = both["sd_over_reported_ci95"]
    assert lo < ratio < hi and hi - lo == pytest.approx(2 * 1.96 * ratio / 6**0.5)  # 4 runs: √(2·3)
