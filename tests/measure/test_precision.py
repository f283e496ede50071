"""Precision of the token-wise estimator: stratification, antithetic pairs, the linearised
control variate and adaptive stopping — unbiased against closed forms, calibrated standard errors,
and the forward passes they save against plain Monte Carlo."""

from __future__ import annotations

import functools
import math

import pytest
import torch
from torch import nn

from senslab.measure import token_sensitivity
from senslab.tokens import Patches, Sequence

SEEDS = 200
T, D, SIGMA = 6, 3, 0.8


def linear_problem(scale: float, seed: int = 0):
    """sign(w·x + b) on (B, T, D) inputs and its exact per-cell flip probabilities
    Φ(−|w·x+b| / (σ‖w_t‖))."""
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(T, D, generator=g)
    x = torch.randn(8, T, D, generator=g) * scale
    bias = 0.1

    def model(seq: torch.Tensor) -> torch.Tensor:
        return (seq * w).sum((1, 2)) + bias

    margin = (x * w).sum((1, 2)) + bias
    p = torch.special.ndtr(-margin.abs()[:, None] / (SIGMA * w.norm(dim=1)[None])).double()
    return model, x, p


@functools.cache
def replicate_linear(scale: float, **opts) -> tuple[torch.Tensor, torch.Tensor, float]:
    """:func:`replicate` on ``linear_problem(scale)`` (cached: several tests share runs)."""
    model, x, _ = linear_problem(scale)
    return replicate(model, x, **opts)


def replicate(model, x, **opts) -> tuple[torch.Tensor, torch.Tensor, float]:
    """Estimates and reported (subset) standard errors over SEEDS seeds; mean forwards."""
    ests, ses, fwd = [], [], []
    for seed in range(SEEDS):
        r = token_sensitivity(
            model, x, Sequence(), sigma=SIGMA, estimand="subset", generator=seed, **opts
        )
        ests.append(r.estimate)
        ses.append(r.stderr)
        fwd.append(r.num_forward - len(x) * (2 if opts.get("control_variate") else 1))
    return torch.tensor(ests, dtype=torch.float64), torch.tensor(ses), sum(fwd) / len(fwd)


@pytest.mark.parametrize(
    "opts",
    [
        {"repeats": 4},
        {"repeats": 4, "antithetic": True},
        {"repeats": 2, "antithetic": True, "target_stderr": 0.015},
    ],
    ids=["stratified", "antithetic", "adaptive"],
)
def test_unbiased_and_stderr_calibrated(opts):
    _, _, p = linear_problem(0.3)
    exact = p.mean().item()
    ests, ses, _ = replicate_linear(0.3, **opts)
    spread = ests.std().item()
    # unbiased: the mean of 200 independent estimates sits within 4 standard errors of the truth
    assert abs(ests.mean().item() - exact) < 4 * spread / math.sqrt(SEEDS)
    # calibrated: the reported variance matches the variance of the estimates across seeds
    ratio = (ses.double() ** 2).mean().item() / spread**2
    assert 0.7 < ratio < 1.4, ratio
    if "target_stderr" in opts:
        assert (ses <= opts["target_stderr"]).float().mean() > 0.95


def test_stratified_variance_matches_closed_form():
    """Var(m̂) = Σ_b K⁻² Σ_t p_bt(1−p_bt)/R / n², no between-cell term."""
    _, x, p = linear_problem(0.3)
    ests, _, _ = replicate_linear(0.3, repeats=4)
    exact_var = (p * (1 - p)).sum().item() / 4 / T**2 / len(x) ** 2
    assert ests.var().item() == pytest.approx(exact_var, rel=0.25)


def test_control_variate_exact_for_a_linear_classifier():
    model, x, p = linear_problem(0.3)
    r = token_sensitivity(model, x, Sequence(), sigma=SIGMA, repeats=2, estimand="subset",
                          control_variate="linear")
    assert r.estimate == pytest.approx(p.mean().item(), abs=1e-6)
    assert r.stderr == pytest.approx(0.0, abs=1e-6)
    assert torch.allclose(r.per_sample.double(), p.mean(1), atol=1e-6)
    assert r.num_forward == 2 * len(x) + len(x) * T * 2  # clean + gradient pass + copies


def test_control_variate_unbiased_for_a_nonlinear_model():
    """Tanh MLP: the CV estimate agrees with a long plain run; the CV's own spread is smaller."""
    torch.manual_seed(0)  # test-only: model init
    model = nn.Sequential(nn.Flatten(), nn.Linear(T * D, 16), nn.Tanh(), nn.Linear(16, 3))
    x = torch.randn(6, T, D, generator=torch.Generator().manual_seed(3)) * 0.5
    opts = {"sigma": 1.0, "estimand": "subset"}
    truth = token_sensitivity(model, x, Sequence(), repeats=2000, **opts)
    cv = [token_sensitivity(model, x, Sequence(), repeats=8, control_variate="linear",
                            generator=s, **opts) for s in range(40)]
    plain = [token_sensitivity(model, x, Sequence(), repeats=8, generator=s, **opts)
             for s in range(40)]
    est = torch.tensor([r.estimate for r in cv], dtype=torch.float64)
    se_mean = est.std().item() / math.sqrt(len(est))
    assert abs(est.mean().item() - truth.estimate) < 4 * math.hypot(se_mean, truth.stderr)
    assert 0.1 < truth.estimate < 0.9  # informative: flips neither rare nor sure
    plain_sd = torch.tensor([r.estimate for r in plain]).std().item()
    assert est.std().item() < plain_sd
    # the reported standard error matches the spread across seeds (40 seeds: loose bounds)
    reported = torch.tensor([r.stderr**2 for r in cv], dtype=torch.float64).mean().item()
    assert 0.5 < reported / est.var().item() < 2.0


def test_saving_over_plain_monte_carlo():
    """Near the decision boundary (flip rates of 0.3–0.5) antithetic pairs need ≥ 4× fewer
    perturbed forwards than plain Monte Carlo over (example, token, noise) triples, whose
    variance per forward is p̄(1−p̄) exactly; the control variate needs far fewer still."""
    _, _, p = linear_problem(0.1)
    plain_per_forward = p.mean().item() * (1 - p.mean().item())
    ests, _, fwd = replicate_linear(0.1, repeats=4, antithetic=True)
    anti_per_forward = ests.var().item() * fwd
    assert plain_per_forward / anti_per_forward > 3.0  # closed form: 3.4×
    # stratification + antithetic pairs + the control variate: exact here, so the saving is
    # bounded only by the gradient pass
    ests_cv, _, _ = replicate_linear(0.1, repeats=2, control_variate="linear")
    assert ests_cv.var().item() < 1e-12


@pytest.mark.parametrize("opts", [
    {"repeats": 4, "antithetic": True},
    {"repeats": 2, "antithetic": True, "target_stderr": 0.05},
    {"repeats": 2, "control_variate": "linear"},
])
def test_chunking_never_changes_the_numbers(opts):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(1, 4, 3, padding=1), nn.ReLU(), nn.Flatten(),
                          nn.Linear(256, 3))
    images = torch.randn(5, 1, 8, 8, generator=torch.Generator().manual_seed(1))
    runs = [token_sensitivity(model, images, Patches(2), sigma=1.0, chunk_size=c, **opts)
            for c in (1, 7, 10_000, "auto")]
    for r in runs[1:]:
        assert torch.equal(r.per_sample, runs[0].per_sample)
        assert r.num_forward == runs[0].num_forward


def test_adaptive_stopping_respects_the_forward_budget():
    model, x, _ = linear_problem(0.3)
    r = token_sensitivity(model, x, Sequence(), sigma=SIGMA, repeats=2, estimand="subset",
                          target_stderr=1e-6, max_forward=500)
    assert r.num_forward <= 500 and r.stderr > 1e-6
    r = token_sensitivity(model, x, Sequence(), sigma=SIGMA, repeats=2, estimand="subset",
                          target_stderr=0.5)
    assert r.num_forward == len(x) + len(x) * T * 2  # one round reaches a loose target


@pytest.mark.parametrize("kwargs, message", [
    ({"antithetic": True, "repeats": 3}, "even number of repeats"),
    ({"control_variate": "linear", "compare": "l2"}, "compare='class'"),
    ({"control_variate": "quadratic"}, "control_variate"),
    ({"target_stderr": 0.0}, "target_stderr"),
    ({"target_stderr": 0.1, "shard": (0, 2)}, "shard"),
    ({"memory_budget": 0}, "memory_budget"),
])
def test_bad_precision_options(kwargs, message):
    model, x, _ = linear_problem(0.3)
    with pytest.raises(ValueError, match=message):
        token_sensitivity(model, x, Sequence(), sigma=SIGMA, **kwargs)
