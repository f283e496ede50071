"""Audit 86, allocation: ``allocation="linear"``'s rounds (:func:`._alloc.linear_rounds`) stay
unbiased, with a calibrated standard error, on tokens of known flip probabilities that include
the edge cases: padding, an example of one token, tokens that never flip, tokens the tangent
calls safe (a flat tangent) that flip half the time."""

from __future__ import annotations

import math

import torch

from senslab.measure import _alloc


def _world():
    b, t = 6, 5
    valid = torch.ones(b, t, dtype=torch.bool)
    valid[1, 1:] = False  # one token
    valid[2, 3:] = False
    valid[4, 2:] = False
    g = torch.Generator().manual_seed(0)
    p = torch.rand(b, t, generator=g) * 0.4
    p[0, 0] = 0.0
    p[3, :] = 0.0
    p[3, 2] = 0.45
    p[5, 1] = 0.5
    x = torch.randn(b, t, generator=g).abs() * 2
    x[0, 1] = math.inf  # the tangent says never: it flips all the same
    x[5, 1] = math.inf
    x[2, 0] = 0.0
    p = p * valid
    k = valid.sum(1).double()
    return valid, p, x, k, ((p.double()).sum(1) / k).mean().item()


def test_linear_rounds_are_unbiased_on_known_flip_probabilities() -> None:
    """1,000 seeds of one round (budget 3, every real token drawn at least its floor): the mean
    within 4 of its standard errors of the exact rate, the reported standard error's root mean
    square within 20% of the spread (0.084 against 0.077 over 4,000 seeds when written)."""
    valid, p, x, k, truth = _world()
    b = valid.shape[0]
    est, var = [], []
    for seed in range(1000):
        gen = torch.Generator().manual_seed(seed)
        flips = torch.Generator().manual_seed(10**6 + seed)

        def evaluate(src: torch.Tensor, tok: torch.Tensor,
                     flips: torch.Generator = flips) -> torch.Tensor:
            return (torch.rand(len(src), generator=flips) < p[src, tok]).float()

        y, v, copies, _ = _alloc.linear_rounds(x, valid, 3.0, gen, evaluate)
        assert copies > 0 and torch.isfinite(y).all() and (v >= 0).all()
        est.append(((y * valid).sum(1) / k).mean().item())
        var.append(((v * valid).sum(1) / k**2).sum().item() / b**2)
    e = torch.tensor(est, dtype=torch.float64)
    sd = e.std().item()
    assert abs(e.mean().item() - truth) < 4 * sd / math.sqrt(len(e))
    rms = math.sqrt(sum(var) / len(var))
    assert 0.85 < rms / sd < 1.25
