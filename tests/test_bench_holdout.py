"""benchmarks/allocation_holdout.py: allocations judged on held-out draws — the judge is
unbiased, the allocations keep the budget and the floor, and a run on a tiny real text case
reports every design."""

from __future__ import annotations

import math
import sys

import benchscripts
import pytest
import torch


@pytest.fixture(scope="module")
def holdout():
    sys.path.insert(0, str(benchscripts.BENCHMARKS))
    try:
        yield benchscripts.load("allocation_holdout.py", "senslab_allocation_holdout")
    finally:
        sys.path.remove(str(benchscripts.BENCHMARKS))


def test_the_judge_is_unbiased_for_the_design_variance(holdout):
    """Averaged over held-out Bernoulli draws, V(e) equals the exact variance of the design:
    p(1 − p)/e at e ≥ 1, p/e − p² below one draw (drawn with probability e, weighted 1/e)."""
    g = torch.Generator().manual_seed(0)
    p = torch.tensor([0.0, 0.02, 0.3, 0.7, 0.5])
    e = torch.tensor([0.3, 0.5, 2.0, 1.0, 0.8], dtype=torch.float64)
    w2 = torch.tensor([1.0, 2.0, 0.5, 1.0, 3.0], dtype=torch.float64)
    cost = torch.tensor([3.0, 1.0, 2.0, 5.0, 1.0], dtype=torch.float64)
    m, reps = 6, 40_000
    hits = torch.bernoulli(p.expand(reps, m, -1), generator=g).sum(1).double()
    vs = [holdout.judge(e, h, m, w2, cost)[0] for h in hits[:2000]]
    v = torch.tensor(vs).mean().item()
    pd = p.double()
    exact = (w2 * torch.where(e >= 1, pd * (1 - pd) / e, pd / e - pd**2)).sum().item()
    assert v == pytest.approx(exact, rel=0.05)
    assert holdout.judge(e, hits[0], m, w2, cost)[1] == pytest.approx(float((e * cost).sum()))


def test_allocate_keeps_the_budget_and_the_floor(holdout):
    vhat = torch.tensor([0.0, 0.0, 0.01, 0.25, 0.1], dtype=torch.float64)
    s = torch.tensor([1.0, 2.0, 1.0, 1.0, 0.5], dtype=torch.float64)
    e = holdout.allocate(vhat, s, 0.5)
    assert e.mean().item() == pytest.approx(0.5, rel=1e-6)
    floor = holdout._alloc.FLOOR * 0.5 * s / s.mean()
    assert bool((e >= floor - 1e-12).all())
    assert e[3] > e[2] > e[0]  # more where flips are likelier
    flat = holdout.allocate(torch.zeros(5, dtype=torch.float64), s, 0.5)
    assert torch.allclose(flat, 0.5 * s / s.mean())


def test_gains_on_a_tiny_text_case(holdout):
    """Every design is judged and gains something; the best κ in hindsight is at least as good
    as each fixed κ; a length-only design on equal lengths is the equal design (gain 1)."""
    pytest.importorskip("transformers")
    from test_bench_real import tiny_text_case

    case = tiny_text_case(holdout.real_models, torch.float32)
    row = holdout.real_models.naive_loop(case, repeats=16)
    x = holdout.tangent_x(case)
    assert [len(v) for v in x] == case.lengths.tolist()
    out = holdout.gains(row["flips"], x, 1.0)
    assert {"length", "tangent κ=1", "tangent κ fitted", "tangent κ best",
            "token oracle from A", "plug-in oracle on B"} <= set(out)
    assert all(v > 0 for k, v in out.items() if not k.startswith("κ"))
    assert out["tangent κ best"] >= max(out[f"tangent κ={k:g}"] for k in holdout.KAPPAS) - 1e-9
    g = torch.Generator().manual_seed(1)
    same = [torch.rand(4, 16, generator=g) < 0.3 for _ in range(3)]
    flat = holdout.gains(same, [torch.full((4,), 1.0, dtype=torch.float64)] * 3, 1.0)
    assert flat["length"] == pytest.approx(1.0)


@pytest.mark.heavy
def test_simulated_rounds_run_senslabs_allocation(holdout):
    """senslab's own rounds on a synthetic world: unbiased, the spread near the reported s.e.,
    and a gain over equal draws where the tangent knows which tokens flip."""
    g = torch.Generator().manual_seed(3)
    counts, x = [], []
    for b in range(24):
        k = 3 + b % 5
        xb = 2.5 + torch.rand(k, generator=g, dtype=torch.float64) * 2  # mostly safe
        xb[0] = 0.2  # one token the tangent calls likely to flip
        counts.append((torch.special.ndtr(-xb) * 16).round())
        x.append(xb)
    sim = holdout.simulate(counts, 16, x, 0.25, 0.02, replicates=150)
    assert sim["world"] == "plug-in" and sim["mean_rounds"] >= 1
    assert abs(sim["bias_over_se"]) < 0.4  # stopping bias on a small world (0.24 here)
    assert 0.7 < sim["sd_over_se"] < 1.25 and 0.88 <= sim["coverage95"] <= 1.0
    assert sim["gain"] > 1.0
    jeff = holdout.simulate(counts, 16, x, 0.25, 0.02, replicates=20, world="jeffreys")
    assert jeff["truth"] > sim["truth"]  # every token gets some chance to flip
    post = holdout.simulate(counts, 16, x, 0.25, 0.02, replicates=20, world="posterior")
    assert post["world"] == "posterior" and post["mean_rounds"] >= 1


def test_the_posterior_world_keeps_small_rates_for_tokens_that_never_flipped(holdout):
    """Drawn from the deconvolved posterior: a token that never flipped in 32 draws mostly gets
    a small rate above zero (its flips cannot exclude one), a token that flipped often a rate
    near its share; one seed, one world; an unknown world is refused."""
    g = torch.Generator().manual_seed(2)
    lengths = [10, 14, 6, 12] * 10
    rates = [torch.where(torch.rand(k, generator=g) < 0.7, 0.01, 0.4).double() for k in lengths]
    m = 32
    counts = [torch.binomial(torch.full_like(p, float(m)), p, generator=g) for p in rates]
    x = [torch.ones(k, dtype=torch.float64) for k in lengths]
    valid, p, _ = holdout.world_tensors(counts, m, x, "posterior", seed=0)
    h = torch.cat(counts)
    drawn = p[valid]
    never = drawn[h == 0]
    assert (never > 0).double().mean() > 0.5 and never.mean() < 0.05
    often = h >= 8
    assert (drawn[often] - h[often] / m).abs().mean() < 0.1
    again = holdout.world_tensors(counts, m, x, "posterior", seed=0)[1]
    other = holdout.world_tensors(counts, m, x, "posterior", seed=1)[1]
    assert torch.equal(again, p) and not torch.equal(other, p)
    plug = holdout.world_tensors(counts, m, x, "plug-in")[1]
    assert plug[valid][h == 0].abs().max() == 0
    with pytest.raises(ValueError, match="world must be one of"):
        holdout.world_tensors(counts, m, x, "oracle")


def test_a_record_is_judged_again_without_draws(holdout, tmp_path):
    half = [[[2, 0, 5], [1, 0, 6]], [[0, 8], [1, 7]]]
    record = {"case": "minilm", "draws": 16, "examples": 2, "seconds": 1.0, "sigma": 1.0,
              "estimate": 0.2, "flip_counts_halves": half,
              "tangent_x": [[1.0, None, 0.1], [2.0, 0.05]]}
    path = tmp_path / "r.json"
    path.write_text(__import__("json").dumps(record))
    row, x, old = holdout.from_record(path)
    assert [f.shape for f in row["flips"]] == [(3, 16), (2, 16)]
    assert row["flips"][0][:, :8].sum(1).tolist() == [2, 0, 5]
    assert row["flips"][0][:, 8:].sum(1).tolist() == [1, 0, 6]
    assert x[0][1] == float("inf") and old["draws"] == 16


def test_round_price_against_a_hand_count(holdout):
    """One example of two tokens: equal draws' variance × cost over the round's, by hand."""
    counts = [torch.tensor([8.0, 0.0])]  # p = 0.5 and 0 of 16 draws
    x = [torch.tensor([0.0, 10.0], dtype=torch.float64)]  # the tangent agrees
    out = holdout.round_price(counts, 16, x, 1.0, budgets=(1.0,))
    e = holdout._alloc.expected_units(torch.tensor([[0.5, 0.0]], dtype=torch.float64),
                                      torch.ones(1, 2, dtype=torch.bool), 1.0,
                                      torch.ones(1, dtype=torch.float64))
    hi, lo = float(e[0, 0]), float(e[0, 1])
    assert hi >= 1 > lo > 0  # the floor keeps the safe token in
    w2, c = 1 / 4, 2.0
    equal = w2 * 0.25 / 2 * (2 * 2 * c)
    whole, frac = math.floor(hi), hi - math.floor(hi)
    true = w2 * 0.25 * ((1 - frac) / whole + frac / (whole + 1)) * (hi + lo) * c
    assert out["1.0"]["true"] == pytest.approx(equal / true)
    assert out["1.0"]["reported"] <= out["1.0"]["true"]  # the report is conservative


def test_the_rate_oracle_recovers_the_gain_of_known_rates(holdout):
    """On a world of known rates (most tokens never flip, a few often), the deconvolved oracle
    comes near the gain of the exact rates, where the plug-in of a token that never flipped
    overstates it; where every token flips alike, no allocation gains."""
    g = torch.Generator().manual_seed(5)
    lengths = [12, 20, 8, 16] * 8
    rates = [torch.where(torch.rand(k, generator=g) < 0.6, 0.005,
                         torch.where(torch.rand(k, generator=g) < 0.5, 0.05, 0.3)).double()
             for k in lengths]
    m = 48
    counts = [torch.binomial(torch.full_like(p, float(m)), p, generator=g) for p in rates]
    out = holdout.rate_oracle(counts, m, replicates=100)
    p = torch.cat(rates)
    k = torch.cat([torch.full((n,), float(n), dtype=torch.float64) for n in lengths])
    w, v = 1.0 / (len(lengths) * k), p * (1 - p)
    exact = float((w**2 * v).sum() * k.sum() / ((w * (k * v).sqrt()).sum()) ** 2)
    assert out["gain_lo"] <= out["gain"] <= out["gain_hi"]
    assert out["gain"] == pytest.approx(exact, rel=0.15)
    assert out["plug_in_gain"] > out["gain"]
    assert 0.4 < out["tokens_never_flipped"] < 0.9
    alike = [torch.binomial(torch.full((8,), float(m)), torch.full((8,), 0.2), generator=g)
             for _ in range(40)]
    assert holdout.rate_oracle(alike, m, replicates=50)["gain"] == pytest.approx(1.0, abs=0.1)
