"""A mask of real patches given as the grid (batch, rows, columns): refused as before, with its
flattened form named."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from senslab import token_sensitivity
from senslab.tokens import Patches


def test_a_grid_mask_is_told_to_flatten():
    torch.manual_seed(0)  # test-only: nn.Linear initialises from the global RNG
    model = nn.Sequential(nn.Flatten(), nn.Linear(3 * 8 * 8, 4)).eval()
    x = torch.randn(2, 3, 8, 8, generator=torch.Generator().manual_seed(1))
    grid = torch.ones(2, 2, 2, dtype=torch.bool)
    with pytest.raises(ValueError, match=r"grid of 2×2 patches: mask\.flatten\(1\)"):
        token_sensitivity(model, x, Patches(4), mask=grid, sigma=1.0, repeats=1, generator=0)
    r = token_sensitivity(model, x, Patches(4), mask=grid.flatten(1), sigma=1.0, repeats=1,
                          generator=0)
    assert r.per_position.shape[0] == 4
