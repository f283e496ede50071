"""Closed forms shared by the coverage tests of the estimator and of paired comparisons.

A linear logit :math:`z = \\sum_t w_t \\cdot x_t + b` on ``Sequence`` tokens flips when noise
:math:`\\varepsilon \\sim N(0, \\sigma^2 I)` on token t moves z across 0: z moves by
:math:`N(0, \\sigma^2 \\lVert w_t \\rVert^2)`, so the flip probability is
:math:`\\Phi(-|z| / (\\sigma \\lVert w_t \\rVert))`.
"""

from __future__ import annotations

import functools
import math
from types import SimpleNamespace

import pytest
import torch

from senslab.measure import _compiled

PHI = torch.special.ndtr


def flip_probs(x: torch.Tensor, w: torch.Tensor, bias: float, sigma: float) -> torch.Tensor:
    """(B, T) closed-form flip probabilities of one linear logit, one per (example, token)."""
    w = w.double()
    z = (x.double() * w).sum((-2, -1)) + bias
    return PHI(-z.abs()[:, None] / (sigma * w.norm(dim=1)[None]))


def population_truth(w: torch.Tensor, bias: float, sigma: float, mu: float) -> float:
    """E_x[mean_t Φ(−|z(x)|/(σ‖w_t‖))] for x with i.i.d. N(mu, 1) entries: z ~ N(m, s²) with
    m = mu·Σw + b and s = ‖w‖, so a 1-D integral (trapezoid on a fine grid with a node at the
    kink z = 0; error far below 1e-8)."""
    w = w.double()
    m, s = mu * w.sum().item() + bias, w.norm().item()
    z = torch.cat([torch.linspace(m - 14 * s, m + 14 * s, 400_001, dtype=torch.float64),
                   torch.zeros(1, dtype=torch.float64)]).sort().values
    density = torch.exp(-0.5 * ((z - m) / s) ** 2) / (s * math.sqrt(2 * math.pi))
    inner = PHI(-z.abs()[None] / (sigma * w.norm(dim=1)[:, None])).mean(0)
    return torch.trapezoid(inner * density, z).item()


@pytest.fixture
def linear() -> SimpleNamespace:
    """``linear.flip_probs(x, w, bias, sigma)`` and ``linear.population_truth(w, bias, sigma,
    mu)``: the closed forms of this module."""
    return SimpleNamespace(flip_probs=flip_probs, population_truth=population_truth)


@pytest.fixture
def eager_compile(monkeypatch):
    """torch.compile with the eager backend: Dynamo traces and guards for real, nothing is built
    by a C++ compiler (which takes minutes on 2 CPU cores)."""
    monkeypatch.setattr(_compiled.torch, "compile",
                        functools.partial(torch.compile, backend="eager"))
