"""Float32 tokens measured with ``autocast=torch.bfloat16``: the model's first convolution or
linear layer rounds them, noise included, to bf16's grid, so at a σ near that grid's spacing the
result describes the rounding, not the noise drawn. Refused above 10% of the noise moved (a
warning from 3%), as for bf16 tokens; float32 without autocast is not looked at."""

from __future__ import annotations

import dataclasses
import math
import warnings

import pytest
import torch
from torch import nn

from senslab import token_sensitivity
from senslab.models import create_model
from senslab.tokens import Embedding, Patches, Sequence


def _conv() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv2d(3, 16, 4, 4), nn.ReLU(), nn.Flatten(),
                         nn.Linear(16 * 4 * 4, 10)).eval()


IMAGES = torch.randn(32, 3, 16, 16, generator=torch.Generator().manual_seed(1)) * 2


@pytest.mark.parametrize("mode", ["token", "whole"])
def test_output_distances_under_autocast_at_a_small_sigma_are_refused(mode: str) -> None:
    """Images of spread 2 (bf16 spacing about 0.012): at σ = 0.003 the l2 distance under bf16
    autocast came out several times float32's (the rounding's own change) without a word; it is
    refused, naming autocast and the fix. Float32 at the same σ is measured."""
    with pytest.raises(ValueError) as err:
        token_sensitivity(_conv(), IMAGES, Patches(4), sigma=0.003, repeats=2, compare="l2",
                          autocast=torch.bfloat16, mode=mode)
    text = str(err.value)
    assert "too small for the float32 images under autocast=torch.bfloat16" in text
    assert "Measure without autocast=" in text and "larger sigma" in text
    full = token_sensitivity(_conv(), IMAGES, Patches(4), sigma=0.003, repeats=2, compare="l2",
                             mode=mode, generator=0)
    assert full.estimate > 0


def test_what_the_refusal_keeps_from_being_reported(monkeypatch: pytest.MonkeyPatch) -> None:
    """With the check lifted, the case above is the wrong number it guards against: the l2
    distance under bf16 autocast at σ = 0.003 is over three times float32's (same draws); at
    σ = 0.3 the two agree (the test below)."""
    from senslab.tokens import _grid
    monkeypatch.setattr(_grid, "ROUNDING_RTOL", math.inf)
    monkeypatch.setattr(_grid, "ROUNDING_WARN", math.inf)
    monkeypatch.setattr(_grid, "ROUNDING_MAX_UNCHANGED", 1.0)
    low = token_sensitivity(_conv(), IMAGES, Patches(4), sigma=0.003, repeats=2, compare="l2",
                            autocast=torch.bfloat16, generator=0)
    full = token_sensitivity(_conv(), IMAGES, Patches(4), sigma=0.003, repeats=2, compare="l2",
                             generator=0)
    assert low.estimate > 3 * full.estimate


def test_an_ordinary_sigma_under_autocast_is_measured_silently_and_agrees() -> None:
    """σ = 0.3 (25 times the spacing): no word, and the l2 distance is float32's within 2%."""
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)
        low = token_sensitivity(_conv(), IMAGES, Patches(4), sigma=0.3, repeats=2,
                                compare="l2", autocast=torch.bfloat16, generator=0)
    full = token_sensitivity(_conv(), IMAGES, Patches(4), sigma=0.3, repeats=2, compare="l2",
                             generator=0)
    assert abs(low.estimate / full.estimate - 1) < 0.02


class OnePixel(nn.Module):
    """Class 1 iff pixel (0, 0) of channel 0, through a 1×1 linear layer (which autocast runs in
    bf16), exceeds 3 − d: the flip probability under N(0, σ²) noise on it is known."""

    def __init__(self, d: float) -> None:
        super().__init__()
        self.d = d
        self.lin = nn.Linear(1, 1, bias=False)
        with torch.no_grad():
            self.lin.weight.fill_(1.0)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        z = self.lin(x[:, 0, 0, :1]).float()[:, 0] - 3.0 + self.d
        return torch.stack([torch.zeros_like(z), z], 1)


def test_a_class_threshold_under_autocast_is_refused_where_the_grid_moves_it() -> None:
    """Float32 images at 3 (bf16 spacing 2⁻⁶) at σ = 0.005: under autocast the noise is rounded
    before the threshold is read; refused. At σ = 0.2 it is measured, and the rate is the exact
    one."""
    x = torch.full((64, 1, 4, 4), 3.0)
    with pytest.raises(ValueError, match="float32 images under autocast=torch.bfloat16"):
        token_sensitivity(OnePixel(0.004), x, Patches(2), sigma=0.005, repeats=8,
                          autocast=torch.bfloat16)
    r = token_sensitivity(OnePixel(0.1), x, Patches(2), sigma=0.2, repeats=32, generator=0,
                          autocast=torch.bfloat16)
    exact = 0.25 * 0.5 * math.erfc(0.5 / math.sqrt(2))  # Φ(−0.1/0.2) on one patch of four
    assert abs(r.estimate - exact) < 4 * r.stderr_subset


def _per_token() -> nn.Module:
    """Embedding, LayerNorm, then a linear layer on every token (which autocast runs in bf16),
    averaged over the tokens."""
    torch.manual_seed(0)  # test-only: the model's init
    layers = nn.Sequential(nn.Embedding(50, 32), nn.LayerNorm(32), nn.Linear(32, 3))

    class PerToken(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.layers = layers

        def forward(self, ids: torch.Tensor) -> torch.Tensor:
            return self.layers(ids).mean(1)

    return PerToken().eval()


IDS = torch.randint(2, 50, (16, 12), generator=torch.Generator().manual_seed(0))


@pytest.mark.parametrize("mode", ["token", "whole"])
def test_hooked_float32_token_vectors_under_autocast_are_checked(mode: str) -> None:
    with pytest.raises(ValueError, match="float32 token vectors of 'layers.1' under autocast="):
        token_sensitivity(_per_token(), IDS, Embedding("layers.1"), sigma=0.001, repeats=4,
                          mode=mode, autocast=torch.bfloat16)
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)
        r = token_sensitivity(_per_token(), IDS, Embedding("layers.1"), sigma=0.5, repeats=4,
                              mode=mode, autocast=torch.bfloat16, generator=0)
    assert 0 <= r.estimate <= 1


@pytest.mark.parametrize("reuse", [True, False])
def test_the_zoo_gpt2_under_autocast_is_checked_with_and_without_prefix_reuse(reuse: bool) -> None:
    """With prefix reuse the model adds the noise to its own cache: checked there too."""
    model = create_model("gpt2", vocab_size=50, max_len=16, seed=0).eval()
    tokens = dataclasses.replace(model.default_tokens(), reuse_prefix=reuse)
    with pytest.raises(ValueError, match="float32 token vectors of 'embed_ln' under autocast"):
        token_sensitivity(model, IDS, tokens, sigma=0.001, repeats=2, autocast=torch.bfloat16)
    r = token_sensitivity(model, IDS, tokens, sigma=1.0, repeats=2, generator=0,
                          autocast=torch.bfloat16)
    assert 0 <= r.estimate <= 1


def test_float32_sequences_under_autocast_are_checked_and_without_it_are_not() -> None:
    model = nn.Sequential(nn.Flatten(), nn.Linear(12 * 32, 3)).eval()
    x = torch.randn(16, 12, 32, generator=torch.Generator().manual_seed(1))
    with pytest.raises(ValueError, match="float32 token vectors under autocast=torch.bfloat16"):
        token_sensitivity(model, x, Sequence(), sigma=0.001, repeats=4, autocast=torch.bfloat16)
    r = token_sensitivity(model, x, Sequence(), sigma=0.001, repeats=4, compare="l2",
                          generator=0)
    assert r.estimate > 0
