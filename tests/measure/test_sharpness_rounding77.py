"""Weight noise too small for float32: the sharpness measures checked only bf16/fp16 weights on
their grid, so a σ near float32's spacing was rounded away, or left the outputs unchanged, with a
number and no word."""

from __future__ import annotations

import warnings

import pytest
import torch
import torch.nn.functional as F

from senslab.measure.sharpness import loss_sharpness, output_sharpness


def _ones() -> torch.nn.Linear:
    m = torch.nn.Linear(64, 1)
    with torch.no_grad():
        m.weight.fill_(1.0)
        m.bias.fill_(0.0)
    return m


def test_noise_below_the_float32_weights_spacing_is_refused() -> None:
    """σ = 3e-8 on weights of 1 (float32 spacing 1.2e-7): most of the noise rounds away."""
    with pytest.raises(ValueError, match=r"sigma_w=3e-08 is too small for the float32 weights"
                                         r".*measure in float64: copy\.deepcopy\(model\)\.double"):
        output_sharpness(_ones(), torch.ones(8, 64), sigma_w=3e-8, repeats=4, generator=0)
    with pytest.raises(ValueError, match=r"sigma=3e-08 is too small for the float32 weights"):
        loss_sharpness(_ones(), F.mse_loss, torch.ones(8, 64), torch.zeros(8, 1), sigma=3e-8,
                       draws=4, generator=0)


def test_the_same_noise_on_a_float64_model_is_measured() -> None:
    m = _ones().double()
    res = output_sharpness(m, torch.ones(8, 64, dtype=torch.float64), sigma_w=3e-8, repeats=64,
                           generator=0)
    # E|Σ of 64 N(0, σ²)| = 8σ·sqrt(2/π)
    expected = 8 * 3e-8 * (2 / torch.pi) ** 0.5
    assert abs(res.shop.estimate - expected) < 4 * res.shop.stderr + 1e-12


def test_an_output_no_draw_changed_is_said() -> None:
    """σ = 1e-7 survives the weights' grid but not the output's (spacing 7.6e-6 at 64)."""
    with pytest.warns(UserWarning, match=r"no draw changed any output \(ShOp exactly 0 at "
                                         r"sigma_w=1e-07\).*spacing up to 7\.6e-06"):
        res = output_sharpness(_ones(), torch.ones(8, 64), sigma_w=1e-7, repeats=4, generator=0)
    assert res.shop.estimate == 0


def test_a_float32_sigma_well_above_the_spacing_passes_silently() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        res = output_sharpness(_ones(), torch.ones(8, 64), sigma_w=1e-3, repeats=4, generator=0)
    assert res.shop.estimate > 0
    m = _ones()
    before = [p.detach().clone() for p in m.parameters()]
    output_sharpness(m, torch.ones(8, 64), sigma_w=1e-3, repeats=2, generator=0)
    # the check reads the perturbed weights without writing them: the clean ones come back
    assert all(torch.equal(a, b) for a, b in zip(before, m.parameters(), strict=True))
