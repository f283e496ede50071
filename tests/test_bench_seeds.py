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
    case = SimpleNamespace(n=256, kind="text", repeats=3, tokens=Sequence(), model=object(),
                           device=torch.device("cpu"))
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


def test_split_variance_is_the_reported_variance(seeds):
    """The recorded rounds, combined as the allocation combines them, give back the standard
    error the run reported; with two or more rounds the single-unit excess is a share of it."""
    case = linear_case(1.0, 0.05, 0.05, 0.8, 0.02, 0.6)
    out = seeds.run_seeds(case, {**OPTIONS, "target_stderr": 0.02}, 3, log=lambda *_: None)
    for run in out["runs"]:
        assert run["reported_variance"] == pytest.approx(run["se"] ** 2, rel=1e-9)
        assert len(run["round_sizes"]) >= 2 and run["round_sizes"][0] == pytest.approx(0.5)
        assert 0.0 <= run["single_excess_share"] < 1.0
    s = out["summary"]
    assert s["sd_over_reported_if_only_excess"] == pytest.approx(
        (1 - s["mean_single_excess_share"]) ** 0.5)


@pytest.mark.heavy
def test_single_excess_is_unbiased(seeds):
    """Over many runs of the rounds on tokens with known flip rates, the excess estimated from
    the first two rounds' values averages to the excess the rates give, Σ w² c p² (a target
    the pilot never reaches, as on the real cases; 1,280 tokens, so that one token's values
    barely move the later rounds' design)."""
    from senslab.measure import _alloc

    b, t = 128, 10
    gen = torch.Generator().manual_seed(0)
    p = torch.rand(b, t, generator=gen, dtype=torch.float64) ** 2
    valid = torch.ones(b, t, dtype=torch.bool)
    valid[::3, 4:] = False  # shorter examples: weights 1/K differ
    x = -torch.special.ndtri(p.clamp(1e-3, 1 - 1e-3)) * 1.3  # a tangent off by a scale
    k = valid.sum(1).double()
    w2 = (1.0 / (b * k) ** 2)[:, None] * valid
    estimated, true = [], []
    for seed in range(200):
        g = torch.Generator().manual_seed(seed)

        def evaluate(src, tok, g=g):
            return (torch.rand(len(src), generator=g, dtype=torch.float64) < p[src, tok]).double()

        with seeds.recorded_rounds() as batches:
            _alloc.linear_rounds(x, valid, 0.5, g, evaluate, target=0.006)
        rounds = batches[0]["rounds"]
        assert len(rounds) >= 2
        _, exc = seeds.single_excess(valid, rounds)
        sizes = [float(e[valid].mean()) for _, _, e in rounds]
        spent = sum(sizes)
        truth = 0.0
        for size, (_, _, e) in zip(sizes, rounds, strict=True):
            frac = e - e.floor()
            c = torch.where(e < 1, 1.0, torch.where(e < 2, 1 - frac, 0.0).double())
            truth += (size / spent) ** 2 * float((w2 * c * p * p).sum())
        estimated.append(exc)
        true.append(truth)
    diff = [a - b for a, b in zip(estimated, true, strict=True)]
    se = statistics.stdev(diff) / len(diff) ** 0.5
    assert abs(statistics.mean(diff)) < 3 * se
    assert statistics.mean(true) > 10 * se  # the excess is there to be found
