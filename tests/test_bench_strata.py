"""benchmarks/noise_strata.py: the stratification gain of a feature of the noise — large for a
feature that decides the flip, none for one unrelated to it — and its draws are the naive loop's."""

from __future__ import annotations

import sys

import benchscripts
import pytest
import torch


@pytest.fixture(scope="module")
def strata():
    sys.path.insert(0, str(benchscripts.BENCHMARKS))
    try:
        yield benchscripts.load("noise_strata.py", "senslab_noise_strata")
    finally:
        sys.path.remove(str(benchscripts.BENCHMARKS))


def test_a_deciding_feature_gains_and_an_unrelated_one_does_not(strata):
    g = torch.Generator().manual_seed(0)
    feature = [torch.randn(k, 64, generator=g, dtype=torch.float64) for k in (5, 9, 7) * 20]
    cut = [torch.randn(f.shape[0], 1, generator=g, dtype=torch.float64) for f in feature]
    decided = [f > c for f, c in zip(feature, cut, strict=True)]
    # one stratum of R holds the threshold: (1/R²)·p_s(1 − p_s) against p(1 − p)/R
    assert strata.strata_gain(decided, feature, 4) > 3
    assert strata.strata_gain(decided, feature, 16) > strata.strata_gain(decided, feature, 4)
    unrelated = [torch.rand(f.shape, generator=g) < 0.3 for f in feature]
    assert strata.strata_gain(unrelated, feature, 4) == pytest.approx(1.0, abs=0.1)
    with pytest.raises(ValueError, match="cannot be cut into 16 groups"):
        strata.strata_gain([f[:, :24] for f in decided], [f[:, :24] for f in feature], 16)


def test_the_draws_are_the_naive_loops(strata):
    """Same seed, same noise order: the flips equal the naive loop's, and the tangent feature
    is a standard normal projection (its draws have unit spread)."""
    pytest.importorskip("transformers")
    from test_bench_real import tiny_text_case

    case = tiny_text_case(strata.real_models, torch.float32)
    d = strata.draws(case, 8, seed=3)
    row = strata.real_models.naive_loop(case, seed=3, repeats=8)
    assert [torch.equal(a, b) for a, b in zip(d["flips"], row["flips"], strict=True)] == \
        [True] * case.n
    t = torch.cat([v.flatten() for v in d["features"]["tangent"]])
    assert t.std().item() == pytest.approx(1.0, abs=0.25)
    assert set(d["features"]) == {"tangent", "norm", "token", "|token|"}


def test_two_phase_sampling_gains_where_the_surrogate_knows_the_flip(strata):
    """A score whose sign decides the flip sends only the flipping draws to whole forwards: a
    large gain, less once the prefix costs something; a score unrelated to the flip gains
    nothing once its prefix costs anything."""
    g = torch.Generator().manual_seed(4)
    score = [torch.randn(k, 32, generator=g, dtype=torch.float64) + 2.0 for k in (5, 9, 7) * 10]
    decided = [s < 0 for s in score]
    free = strata.two_phase(decided, score, 0.0)
    assert free["two_phase"] > 5 and free["free"] == free["two_phase"]
    costly = strata.two_phase(decided, score, 0.3)
    assert 1 < costly["two_phase"] < free["two_phase"]
    assert costly["free"] > costly["two_phase"]
    unrelated = [torch.rand(s.shape, generator=g) < 0.1 for s in score]
    assert strata.two_phase(unrelated, score, 0.2)["two_phase"] < 1.0
    with pytest.raises(ValueError, match="at least 2 draws"):
        strata.two_phase([d[:, :1] for d in decided], [s[:, :1] for s in score], 0.0)


def test_a_surrogate_through_the_heads_input_is_the_margin_itself(strata):
    """The head is linear: exact up to its input and linear after, the surrogate's margin is
    the model's own, so its sign gives every flip of the naive loop's draws."""
    pytest.importorskip("transformers")
    from test_bench_real import tiny_text_case

    case = tiny_text_case(strata.real_models)
    d = strata.draws(case, 8, seed=3, through=("head:in", "bert.encoder.layer.0"))
    row = strata.real_models.naive_loop(case, seed=3, repeats=8)
    flips = row["flips"]
    assert sum(int(f.sum()) for f in flips) > 0
    margins = d["features"]["through head:in"]
    assert [m.shape for m in margins] == [f.shape for f in flips]
    assert all(torch.equal(m < 0, f) for m, f in zip(margins, flips, strict=True))
    first = d["features"]["through bert.encoder.layer.0"]
    assert not all(torch.equal(m < 0, f) for m, f in zip(first, flips, strict=True))
    assert 0.9 < strata.prefix_share(case, "head:in") <= 1.0
    assert 0.1 < strata.prefix_share(case, "bert.encoder.layer.0") < 0.9
    with pytest.raises(ValueError, match="name:in"):
        strata.prefix_share(case, "head:out")
