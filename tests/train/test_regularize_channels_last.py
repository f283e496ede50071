"""The sensitivity regularizer on channels-last images: `Patches(p, channels_last=True)` puts the
noise on one patch of all channels, exactly as on the same images in (B, C, H, W) behind a
permuting wrapper; a shape that looks channels-last is refused unless the layout is stated (read
as (B, C, H, W), the noise cut across rows and channels without a word)."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from senslab.tokens import Patches
from senslab.train.regularize import sensitivity_penalty


class TakesChannelsLast(nn.Module):
    """A model of (B, H, W, C) images: it permutes inside."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)  # test-only: the layer's initialisation
        self.body = nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.Flatten(),
                                  nn.Linear(4 * 8 * 8, 2))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.body(x.permute(0, 3, 1, 2))


class Permuted(nn.Module):
    def __init__(self, inner: nn.Module) -> None:
        super().__init__()
        self.inner = inner

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (B, C, H, W) in
        return self.inner(x.permute(0, 2, 3, 1))


def test_channels_last_noise_is_the_channels_first_noise_of_the_same_images():
    model = TakesChannelsLast()
    x = torch.rand(5, 8, 8, 3, generator=torch.Generator().manual_seed(1))
    last, clean_last = sensitivity_penalty(model, x, tokens=Patches(4, channels_last=True),
                                           sigma=0.5, generator=torch.Generator().manual_seed(2))
    first, clean_first = sensitivity_penalty(Permuted(model), x.permute(0, 3, 1, 2).contiguous(),
                                             tokens=Patches(4), sigma=0.5,
                                             generator=torch.Generator().manual_seed(2))
    assert last.item() > 0
    torch.testing.assert_close(clean_last, clean_first)
    torch.testing.assert_close(last, first)


def test_a_shape_that_looks_channels_last_is_refused_unless_the_layout_is_stated():
    model = TakesChannelsLast()
    x = torch.rand(5, 8, 8, 3, generator=torch.Generator().manual_seed(1))
    with pytest.raises(ValueError, match=r"8 channels of 8x3 pixels.*channels_last=True"):
        sensitivity_penalty(model, x, tokens=Patches(1), sigma=0.5,
                            generator=torch.Generator().manual_seed(2))
    with pytest.raises(ValueError, match=r"channels_last=True"):
        sensitivity_penalty(model, x, patch=1, sigma=0.5,
                            generator=torch.Generator().manual_seed(2))
