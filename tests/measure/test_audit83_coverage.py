"""Audit 83, coverage: a calibration guard for ``token_sensitivity``'s adaptive designs.

On a fixed linear classifier the flip rate of every (example, token) cell is known in closed
form, p = Φ(−|margin| / (σ‖g_t‖)), so the truth of the fixed-subset estimand is exact. Over
many seeds (the full simulation: /work/audit83/coverage/sim.py, 400 seeds per design, see its
REPORT) every design's 95% interval covered it in 92–96% of runs at a flip rate of 0.2, and the
mean estimate was within 0.15 of the reported standard error of it. This guard replays 100
seeds of three adaptive designs and fails if an interval's coverage or the estimate's bias
drifts far from that (a rule change in :mod:`senslab.measure._alloc` or
:mod:`senslab.measure._stats` that stopped on too small a standard error, say)."""

from __future__ import annotations

import math
import warnings

import pytest
import torch

from senslab.measure import token_sensitivity
from senslab.tokens import Sequence

B, T, D, SIGMA = 12, 6, 4, 1.0


def _world() -> tuple[torch.nn.Module, torch.Tensor, float]:
    g = torch.Generator().manual_seed(1)
    x = torch.randn(B, T, D, generator=g, dtype=torch.float64)
    lin = torch.nn.Linear(T * D, 2).double()
    with torch.no_grad():
        lin.weight.copy_(0.5 * torch.randn(2, T * D, generator=g, dtype=torch.float64))
        lin.bias.zero_()
    model = torch.nn.Sequential(torch.nn.Flatten(), lin).eval()
    with torch.no_grad():
        z = model(x)
    margin = (z[:, 1] - z[:, 0]).abs()
    grad = (lin.weight[1] - lin.weight[0]).detach().view(T, D).norm(dim=1)
    p = torch.distributions.Normal(0.0, 1.0).cdf(-margin[:, None] / (SIGMA * grad[None, :]))
    return model, x, p.mean().item()


@pytest.mark.parametrize("options", [
    dict(repeats=2, target_stderr=0.02),
    dict(repeats=2, num_tokens=3, antithetic=True, target_stderr=0.02),
    dict(allocation="uniform", budget=0.5, target_stderr=0.02),
], ids=["repeats", "num_tokens_antithetic", "uniform"])
def test_adaptive_intervals_cover_a_closed_form_rate(options):
    model, x, truth = _world()
    assert 0.15 < truth < 0.25  # enough flips that the normal interval is meant to hold
    est, se, covered = [], [], 0
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for seed in range(100):
            r = token_sensitivity(model, x, Sequence(), sigma=SIGMA, estimand="subset",
                                  generator=5000 + seed, precision="float32", **options)
            est.append(r.estimate)
            se.append(r.stderr_subset)
            covered += r.ci95[0] <= truth <= r.ci95[1]
    rms = math.sqrt(sum(s * s for s in se) / len(se))
    bias = sum(est) / len(est) - truth
    spread = torch.tensor(est).std().item()
    assert covered >= 88, (covered, options)
    assert abs(bias) < 0.35 * rms, (bias, rms, options)
    assert 0.75 < spread / rms < 1.3, (spread, rms, options)
