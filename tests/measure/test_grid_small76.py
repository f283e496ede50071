"""The low-precision grid check judges a measurement however few entries it perturbs (audit of
session 76): calls were pooled until 1,024 perturbed entries, and a measurement that ended
before was never judged — a one-pixel classifier of exact flip rate 0.0530 measured 0.0125 on
60 bf16 images (a fifth of it; 64 images were refused), and float32 images under autocast gave
2.2× float32's distance, without a word."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from senslab import token_sensitivity
from senslab.tokens import Patches


class OnePixel(nn.Module):
    """Class 1 where pixel (0, 0) of the image passes 3 + 0.8 σ."""

    def __init__(self, sigma: float) -> None:
        super().__init__()
        self.at = 3.0 + 0.8 * sigma

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        v = x[:, 0, 0, 0].float() - self.at
        return torch.stack([-v, v], dim=1)


@pytest.mark.parametrize("examples", [60, 15])
def test_a_small_measurement_on_bf16_images_is_refused(examples):
    sigma = 0.005
    images = torch.full((examples, 1, 4, 4), 3.0, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="the noise is too small for the bfloat16 images"):
        token_sensitivity(OnePixel(sigma), images, Patches(2), sigma=sigma, generator=0)
    # float32 images measure as before
    token_sensitivity(OnePixel(sigma), images.float(), Patches(2), sigma=sigma, generator=0)


def test_a_small_measurement_under_autocast_is_refused():
    torch.manual_seed(0)  # test-only: init
    model = nn.Sequential(nn.Flatten(), nn.Linear(16, 3)).eval()
    images = torch.rand(60, 1, 4, 4, generator=torch.Generator().manual_seed(0)) * 2 + 2
    with pytest.raises(ValueError, match="under autocast=torch.bfloat16"):
        token_sensitivity(model, images, Patches(2), sigma=0.003, autocast=torch.bfloat16,
                          compare="l2")
    token_sensitivity(model, images, Patches(2), sigma=0.3, autocast=torch.bfloat16,
                      compare="l2")  # noise well above the grid: measured
