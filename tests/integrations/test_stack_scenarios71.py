"""The regularizer in a training loop of one's own under ``torch.autocast``: float32 images
(or embeddings) under a bf16 autocast reach the model's first convolution or linear layer
rounded to bf16, noise included. A noise far below that grid's spacing was rounded away or
into whole spacings, and the penalty described the rounding, not σ (σ = 0.001 on images near 3:
180× the float32 penalty), without a word; now refused as bf16 images are. Real tiny models,
CPU, no mocks."""

from __future__ import annotations

import warnings

import pytest
import torch
from torch import nn

from senslab.tokens import Embedding, Patches
from senslab.train.regularize import sensitivity_penalty


def _cnn() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.ReLU(), nn.Flatten(),
                         nn.Linear(4 * 8 * 8, 3)).eval()


class _Text(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.emb, self.head = nn.Embedding(50, 32), nn.Linear(32, 2)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        h = self.emb(input_ids) * 40.0  # token vectors of size ~40: a bf16 spacing of 0.25
        m = attention_mask.unsqueeze(-1).to(h.dtype)
        return self.head(h).mul(m).sum(1) / m.sum(1)


def _images() -> torch.Tensor:
    return 3 * torch.randn(32, 3, 8, 8, generator=torch.Generator().manual_seed(1))


def test_noise_below_autocasts_grid_is_refused_on_images():
    """Before: σ = 0.001 under autocast gave a penalty of 1.3e-6 against float32's 7e-9."""
    model, x = _cnn(), _images()
    g = torch.Generator().manual_seed(1)
    float32, _ = sensitivity_penalty(model, x, patch=4, sigma=1e-3, generator=g)
    assert float32.item() < 1e-7  # outside autocast: float32 tokens pass unlooked at
    with torch.autocast("cpu", dtype=torch.bfloat16):
        g = torch.Generator().manual_seed(1)
        with pytest.raises(ValueError, match=r"too small for the bfloat16 images \(as "
                                             r"torch.autocast rounds them\).*outside "
                                             r"torch.autocast"):
            sensitivity_penalty(model, x, patch=4, sigma=1e-3, generator=g)


def test_noise_below_autocasts_grid_is_refused_on_embeddings():
    model = _Text()
    ids = torch.randint(1, 50, (48, 6), generator=torch.Generator().manual_seed(2))
    batch = {"input_ids": ids, "attention_mask": torch.ones_like(ids)}
    with torch.autocast("cpu", dtype=torch.bfloat16):
        g = torch.Generator().manual_seed(1)
        with pytest.raises(ValueError, match=r"token vectors of 'emb' \(as torch.autocast"):
            sensitivity_penalty(model, batch, tokens=Embedding("emb"), sigma=1e-3, generator=g)


def test_a_noise_the_grid_keeps_passes_under_autocast_and_trains():
    """σ = 1 (the paper's) under autocast: no refusal, no warning, a gradient."""
    model, x = _cnn(), _images()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with torch.autocast("cpu", dtype=torch.bfloat16):
            g = torch.Generator().manual_seed(1)
            penalty, _ = sensitivity_penalty(model, x, tokens=Patches(4), sigma=1.0,
                                             generator=g)
    penalty.backward()
    assert penalty.item() > 0 and model[0].weight.grad.abs().sum() > 0
