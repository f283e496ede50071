"""Weight noise is a function of the generator alone: a float64 copy of a float32 model
(``copy.deepcopy(model).double()``) gets the float32 model's draws, so the two differ by the
precision, not by the sample."""

from __future__ import annotations

import copy
import warnings

import torch
import torch.nn.functional as F
from torch import nn

from senslab.measure.sharpness import loss_sharpness, output_sharpness


def _mlp() -> tuple[nn.Module, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 48), nn.Tanh(), nn.Linear(48, 5))
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * 0.3)
    return model, torch.randn(12, 16, generator=g), torch.randn(12, 5, generator=g)


def _reference_shop(model: nn.Module, x: torch.Tensor, sigma: float, seed: int,
                    repeats: int) -> torch.Tensor:
    """Per-draw ShOp of ``model`` perturbed by N(0, σ²) noise drawn in float32 from the seed,
    parameter after parameter in order, and cast to the model's dtype."""
    gen = torch.Generator().manual_seed(seed)
    params = list(model.parameters())
    clean = [p.detach().clone() for p in params]
    with torch.no_grad():
        base = model(x)
        per_draw = []
        for _ in range(repeats):
            for p, p0 in zip(params, clean, strict=True):
                eps = torch.randn(p.shape, generator=gen, dtype=torch.float32)
                p.copy_(p0 + sigma * eps.to(p.dtype))
            per_draw.append((model(x).double() - base.double()).abs().sum(1).mean())
        for p, p0 in zip(params, clean, strict=True):
            p.copy_(p0)
    return torch.stack(per_draw)


def test_float64_copy_gets_the_float32_draws_in_output_sharpness() -> None:
    model, x, _ = _mlp()
    exact = copy.deepcopy(model).double()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # few flipped predictions
        single = output_sharpness(model, x, sigma_w=0.01, repeats=3, generator=4).shop
        double = output_sharpness(exact, x.double(), sigma_w=0.01, repeats=3,
                                  generator=4).shop
    # the float64 copy measures the float32 model's own draws (drawn in float64 they were
    # another sample: per-draw values several percent apart)
    ref = _reference_shop(copy.deepcopy(exact), x.double(), 0.01, 4, 3)
    torch.testing.assert_close(double.per_draw, ref, rtol=1e-12, atol=0)
    torch.testing.assert_close(double.per_draw, single.per_draw, rtol=1e-4, atol=0)


def test_float64_copy_gets_the_float32_draws_in_loss_sharpness() -> None:
    model, x, y = _mlp()
    exact = copy.deepcopy(model).double()
    single = loss_sharpness(model, F.mse_loss, x, y, sigma=0.05, draws=4, generator=2)
    double = loss_sharpness(exact, F.mse_loss, x.double(), y.double(), sigma=0.05, draws=4,
                            generator=2)
    torch.testing.assert_close(double.per_draw, single.per_draw.double(), rtol=1e-4, atol=0)
