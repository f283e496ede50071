"""A share of every example's tokens, one draw each (``allocation="uniform"``,
senslab.measure._alloc.Sampled): unbiased, an unbiased variance estimate, and fewer forward
passes where one draw per token would overshoot the precision asked for."""

from __future__ import annotations

import math

import pytest
import torch

from senslab.measure import TokenSensitivity, _alloc, token_sensitivity
from senslab.models import create_model
from senslab.tokens import Patches, Sequence

from .test_allocation import SIGMA, linear_case, replicate


def test_share_of_tokens_unbiased_and_standard_error_calibrated():
    """Flips concentrated in three of eight tokens (what makes one draw per token overshoot):
    over 400 replicates the estimate centres on the exact rate, the reported standard error
    matches the spread of the estimates, and the 95% intervals cover."""
    model, x, truth = linear_case()
    est, se, r = replicate(model, x, 400, allocation="uniform", budget=0.5)
    sd = est.std().item()
    assert abs(est.mean().item() - truth) < 4 * sd / math.sqrt(len(est))
    assert 0.85 < se.mean().item() / sd < 1.15
    cover = ((est - truth).abs() <= 1.96 * se).double().mean().item()
    assert 0.92 <= cover <= 0.98
    # half of the 128 tokens, a quarter of those drawn twice, and the 16 clean forwards
    assert 16 + 64 <= r.num_forward <= 16 + 64 + 40


def test_without_the_paired_draws_the_variance_would_be_overstated():
    """The pairs are what makes the standard error an estimate rather than a bound: the share
    of the within-token variance they impute is what a one-draw design would have to bound by
    the flip rate itself. The reported s.e. is well below that bound on this model."""
    model, x, _ = linear_case()
    se, bound = [], []
    for seed in range(100):
        res = token_sensitivity(model, x, Sequence(), sigma=SIGMA, generator=seed,
                                estimand="subset", allocation="uniform", budget=0.5)
        se.append(res.stderr)
        # the bound one draw per token allows: each example's rate over its measured tokens
        measured = 0.5 * x.shape[1]
        bound.append(math.sqrt(res.per_sample.double().sum().item() / measured) / len(x))
    assert torch.tensor(se).mean().item() < 0.9 * torch.tensor(bound).mean().item()


def test_rounds_past_every_token_add_draws_and_stay_calibrated():
    """A target one draw per token cannot reach: the rounds go on past full coverage with one
    more draw for every token, and the estimate and its standard error stay honest."""
    model, x, truth = linear_case()
    est, se, r = replicate(model, x, 300, allocation="uniform", budget=0.5,
                           target_stderr=0.01)
    assert se.max().item() <= 0.01
    assert r.num_forward > 16 + 128 * 2  # past coverage, and at least one more full round
    sd = est.std().item()
    assert abs(est.mean().item() - truth) < 0.25 * se.mean().item() + 3 * sd / math.sqrt(300)
    cover = ((est - truth).abs() <= 1.96 * se).double().mean().item()
    assert 0.92 <= cover <= 0.985


def test_target_reached_with_fewer_forwards_than_one_draw_per_token():
    """Many examples (the regime the design is for: the share the pilot round predicts is
    pooled over them), and a target one draw per token would overshoot."""
    model, x, _ = linear_case(b=128)
    one = token_sensitivity(model, x, Sequence(), sigma=SIGMA, repeats=2, generator=0,
                            estimand="subset")
    # a target that one draw per token overshoots: 1.6× the s.e. one draw would give
    target = 1.6 * one.stderr * math.sqrt(2)
    ada = token_sensitivity(model, x, Sequence(), sigma=SIGMA, generator=0, estimand="subset",
                            allocation="uniform", budget=1 / 8, target_stderr=target)
    tokens = x.shape[0] * x.shape[1]
    assert ada.stderr <= target
    assert ada.num_forward - 128 < 0.8 * tokens


def test_every_token_in_and_no_within_token_variance_gives_the_exact_rate():
    """A model whose perturbed prediction does not depend on the noise (a token either always
    flips it or never does): with every token measured the estimate is exact and its variance
    0; with half of them, the spread of the tokens' rates is all the variance."""
    x0 = torch.randn(5, 2, generator=torch.Generator().manual_seed(0))
    x = x0.expand(6, 5, 2).clone()  # six copies of one example
    flips = torch.tensor([1.0, 0.0, 0.0, 1.0, 0.0])

    def model(inp: torch.Tensor) -> torch.Tensor:
        changed = (inp - x0).abs().sum(2) > 0  # (n, T): the perturbed token
        return torch.where((changed * flips).sum(1) > 0, -1.0, 1.0)

    def run(budget: float, seed: int = 0):
        return token_sensitivity(model, x, Sequence(), sigma=SIGMA, generator=seed,
                                 estimand="subset", allocation="uniform", budget=budget,
                                 chunk_size=len(x))

    full = run(1.0)
    assert full.estimate == pytest.approx(0.4) and full.stderr == 0.0
    est = torch.tensor([run(0.6, s).estimate for s in range(300)], dtype=torch.float64)
    assert est.mean().item() == pytest.approx(0.4, abs=4 * est.std().item() / math.sqrt(300))


def test_same_seed_same_numbers_whatever_the_chunks():
    model, x, _ = linear_case()
    opts = {"sigma": SIGMA, "allocation": "uniform", "budget": 0.3, "target_stderr": 0.02}
    a = token_sensitivity(model, x, Sequence(), generator=3, **opts)
    b = token_sensitivity(model, x, Sequence(), generator=3, chunk_size=1, **opts)
    assert a.estimate == b.estimate and a.stderr_subset == b.stderr_subset
    assert torch.equal(a.per_sample, b.per_sample) and a.num_forward == b.num_forward
    c = token_sensitivity(model, x, Sequence(), generator=4, **opts)
    assert c.estimate != a.estimate


def test_local_reuse_gives_the_same_flips_on_a_share_of_the_patches():
    """The sampled copies (a subset of every image's patches, some drawn twice) run through a
    convolutional network's local reuse with the same numbers as full forwards."""
    model = create_model("resnet18", width=0.125, num_classes=4, image_size=16).eval()
    x = torch.randn(5, 3, 16, 16, generator=torch.Generator().manual_seed(1))
    opts = {"sigma": 2.0, "generator": 2, "estimand": "subset", "allocation": "uniform",
            "budget": 0.4}
    a = token_sensitivity(model, x, Patches(4), **opts)
    b = token_sensitivity(model, x, Patches(4, reuse_local=False), **opts)
    assert a.estimate > 0
    assert torch.allclose(a.per_sample, b.per_sample) and a.num_forward == b.num_forward


def test_batches_accumulate_and_the_forward_count():
    model, x, _ = linear_case()
    metric = TokenSensitivity(model, Sequence(), sigma=SIGMA, generator=0,
                              allocation="uniform", budget=0.25)
    metric.update(x[:8])
    metric.update(x[8:])
    r = metric.compute()
    assert r.num_examples == 16 and r.position_counts.eq(16).all()
    assert r.estimate == pytest.approx(r.per_sample.double().mean().item(), abs=1e-6)
    # 16 clean forwards, 2 of 8 tokens per example, a random quarter of those twice
    assert 16 + 32 <= r.num_forward <= 16 + 64


def test_the_predicted_share_is_the_one_whose_variance_meets_the_target():
    """After a pilot round, ``share_for`` solves the variance at share f for the target: the
    share it gives for the current standard error is the share measured (exactly, where no
    example's spread estimate is clamped at 0; clamping only raises it), and a smaller target
    asks for more."""
    valid = torch.ones(64, 8, dtype=torch.bool)
    plan = _alloc.Sampled(valid, torch.Generator().manual_seed(0), 0.5)
    src, tok = plan.next_plan()
    g = torch.Generator().manual_seed(1)
    p = torch.rand(8, generator=g)[tok] ** 3  # flip rates that differ by token
    plan.add((torch.rand(len(src), generator=g) < p).double(), src, tok)
    y, var = plan.values()
    se = math.sqrt(var.sum().item() / 8**2) / 64
    assert 0.5 - 1e-9 <= plan.share_for(se) < 0.65
    assert plan.share_for(se / 2) > 0.5 > plan.share_for(se * 2)


def test_plan_keeps_two_tokens_and_covers_every_token_once():
    valid = torch.ones(3, 9, dtype=torch.bool)
    valid[2, 4:] = False
    plan = _alloc.Sampled(valid, torch.Generator().manual_seed(0), 0.1)
    seen = torch.zeros(3, 9)
    while not plan.covered:
        src, tok = plan.next_plan()
        assert (plan.k >= 2).all()  # at least two tokens measured per example
        once = torch.zeros(3, 9).index_put_((src, tok), torch.ones(len(src)), accumulate=True)
        seen += once.clamp(max=1)
    assert torch.equal(seen.bool(), valid) and seen.max() == 1  # each real token exactly once
    src, tok = plan.next_plan()  # past coverage: one copy of every real token
    assert len(src) == int(valid.sum()) and plan.full == 1


@pytest.mark.parametrize("options, message", [
    ({"allocation": "uniform", "budget": 1.5}, "at most 1"),
    ({"allocation": "uniform", "mode": "whole"}, "needs mode='token'"),
    ({"allocation": "uniform", "antithetic": True, "repeats": 2}, "cannot be combined"),
    ({"allocation": "uniform", "control_variate": "linear"}, "cannot be combined"),
    ({"allocation": "uniform", "repeats": 3}, "share of every example's tokens"),
    ({"allocation": "uniform", "num_tokens": 2}, "drop num_tokens"),
])
def test_bad_uniform_options(options, message):
    model, _, _ = linear_case()
    with pytest.raises(ValueError, match=message):
        TokenSensitivity(model, Sequence(), sigma=SIGMA, **options)


def test_a_few_paired_tokens_are_no_ground_to_stop_on(monkeypatch):
    """On a small batch the pilot holds a handful of paired tokens, whose variance estimate is
    too noisy to stop on (in a scratch run on six short sentences, stopping on it left 60% of
    the intervals short of the truth): the rounds go on until every token has two draws.
    Without the guard the same call stops after the pilot."""
    model, x, _ = linear_case()  # 16 × 8 tokens: a pilot of 1/8 pairs about 8 of them
    opts = {"sigma": SIGMA, "generator": 0, "estimand": "subset", "allocation": "uniform",
            "budget": 1 / 8, "target_stderr": 0.2}
    guarded = token_sensitivity(model, x, Sequence(), **opts)
    assert guarded.num_forward >= 16 + 2 * 128
    monkeypatch.setattr(_alloc, "MIN_PAIRS", 0)
    monkeypatch.setattr(_alloc, "MIN_FLIPS", 0)  # the other guard: a handful of flips
    loose = token_sensitivity(model, x, Sequence(), **opts)
    assert loose.num_forward < 16 + 64
