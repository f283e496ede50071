"""Sensitivity regularization: patch noise geometry, statistics, the loss and its gradients."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from senslab.train.regularize import (
    gaussian_noise_augment,
    random_patch_noise,
    sensitivity_regularized_loss,
)


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _changed_patches(x: torch.Tensor, noisy: torch.Tensor, p: int) -> torch.Tensor:
    """(B, gh, gw) bool: which grid patches differ anywhere; also checks whole-patch coverage."""
    b, c, h, w = x.shape
    diff = (noisy != x).view(b, c, h // p, p, w // p, p).permute(0, 2, 4, 1, 3, 5)
    touched = diff.flatten(3).any(-1)
    full = diff.flatten(3).all(-1)
    assert torch.equal(touched, full), "a patch was changed only partly: not grid-aligned"
    return touched


@pytest.mark.parametrize(("size", "p"), [(8, 4), (8, 2), (6, 3)])
def test_exactly_one_grid_aligned_patch_per_sample(size: int, p: int) -> None:
    x = torch.randn(50, 3, size, size, generator=_gen(0))
    x0 = x.clone()
    noisy = random_patch_noise(x, p, 1.0, _gen(1))
    assert torch.equal(x, x0)  # the input is not modified
    touched = _changed_patches(x, noisy, p)
    assert (touched.flatten(1).sum(1) == 1).all()


def test_patch_positions_drawn_independently_per_sample() -> None:
    x = torch.zeros(400, 1, 8, 8)
    touched = _changed_patches(x, random_patch_noise(x, 2, 1.0, _gen(3)), 2)
    pos = touched.flatten(1).float().argmax(1)
    counts = torch.bincount(pos, minlength=16).float()
    # not shared across the batch (the paper code's defect), and every grid cell is reachable
    assert (counts > 0).all()
    # roughly uniform: chi-square with 15 d.o.f. has its 99.9% quantile at ≈ 37.7
    chi2 = ((counts - 25.0) ** 2 / 25.0).sum().item()
    assert chi2 < 37.7


def test_reproducible_by_seed() -> None:
    x = torch.randn(8, 3, 8, 8, generator=_gen(0))
    a = random_patch_noise(x, 4, 1.0, _gen(5))
    b = random_patch_noise(x, 4, 1.0, _gen(5))
    c = random_patch_noise(x, 4, 1.0, _gen(6))
    assert torch.equal(a, b) and not torch.equal(a, c)
    aug = gaussian_noise_augment(x, 0.3, _gen(5))
    assert torch.equal(aug, gaussian_noise_augment(x, 0.3, _gen(5)))
    # a kept generator moves on: two steps get different noise
    g = _gen(5)
    assert not torch.equal(random_patch_noise(x, 4, 1.0, g), random_patch_noise(x, 4, 1.0, g))


def test_noise_has_the_requested_std() -> None:
    x = torch.full((100, 3, 16, 16), 0.25)
    sigma = 0.7
    eps = gaussian_noise_augment(x, sigma, _gen(0)) - x
    n = eps.numel()  # 76,800: the s.e. of the sample std is σ/√(2n) ≈ 0.26% of σ
    assert eps.std().item() == pytest.approx(sigma, rel=0.02)
    assert abs(eps.mean().item()) < 4 * sigma / n**0.5
    patch_eps = random_patch_noise(x, 4, sigma, _gen(1)) - x
    inside = patch_eps[patch_eps != 0]
    assert inside.numel() == 100 * 3 * 16  # one 4×4 patch, 3 channels, per image
    assert inside.std().item() == pytest.approx(sigma, rel=0.05)


def test_errors_name_the_fix() -> None:
    x = torch.randn(2, 1, 10, 10)
    with pytest.raises(ValueError, match="does not divide image size 10x10; use one of 1, 2, 5"):
        random_patch_noise(x, 4, 1.0, _gen(0))
    with pytest.raises(TypeError, match="torch.Generator"):
        random_patch_noise(x, 5, 1.0, 0)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="channels"):
        random_patch_noise(torch.randn(2, 10, 10), 5, 1.0, _gen(0))
    with pytest.raises(ValueError, match="sigma"):
        gaussian_noise_augment(x, -1.0, _gen(0))
    with pytest.raises(ValueError, match="alpha"):
        sensitivity_regularized_loss(nn.Flatten(), x, torch.zeros(2), alpha=1.5, generator=_gen(0))


def _model() -> nn.Module:
    torch.manual_seed(0)  # default layer init only; the noise comes from explicit generators
    return nn.Sequential(nn.Flatten(), nn.Linear(3 * 8 * 8, 16), nn.Tanh(), nn.Linear(16, 5))


def test_alpha_zero_is_cross_entropy() -> None:
    model = _model()
    x = torch.randn(6, 3, 8, 8, generator=_gen(0))
    y = torch.tensor([0, 1, 2, 3, 4, 0])
    loss, parts = sensitivity_regularized_loss(model, x, y, alpha=0.0, generator=_gen(1))
    assert torch.equal(loss, F.cross_entropy(model(x), y))
    assert parts["mse"] > 0 and torch.equal(parts["ce"], loss.detach())


def test_loss_combines_parts_and_gradients_flow_through_both_branches() -> None:
    model = _model()
    x = torch.randn(6, 3, 8, 8, generator=_gen(0))
    y = torch.tensor([0, 1, 2, 3, 4, 0])
    loss, parts = sensitivity_regularized_loss(model, x, y, alpha=0.3, generator=_gen(2))
    assert loss.item() == pytest.approx(0.7 * parts["ce"].item() + 0.3 * parts["mse"].item())
    assert loss.requires_grad and not any(v.requires_grad for v in parts.values())
    loss.backward()
    got = [p.grad.clone() for p in model.parameters()]
    assert all(g.abs().sum() > 0 for g in got)

    # the same loss by hand (same noise from the same seed), both branches attached …
    model.zero_grad()
    noisy = random_patch_noise(x, 4, 1.0, _gen(2))
    clean = model(x)
    by_hand = 0.7 * F.cross_entropy(clean, y) + 0.3 * F.mse_loss(model(noisy), clean)
    by_hand.backward()
    for g, p in zip(got, model.parameters(), strict=True):
        torch.testing.assert_close(g, p.grad)
    # … which differs from stopping the gradient through the clean branch
    model.zero_grad()
    stopped = 0.7 * F.cross_entropy(model(x), y) + 0.3 * F.mse_loss(model(noisy), clean.detach())
    stopped.backward()
    assert not torch.allclose(got[-1], model[-1].bias.grad)
