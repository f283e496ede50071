"""Noise on bf16/fp16 token vectors lands on their grid: refused where rounding moves it by more
than 10% of its size, a warning above 3%, silent below — for a bf16 model's embedding output
(hooked, and added by prefix reuse inside the zoo's GPT-2) and for bf16 sequences; images in
``test_patches_inputs.py``."""

from __future__ import annotations

import dataclasses
import warnings

import pytest
import torch
from torch import nn

from senslab import token_sensitivity
from senslab.models import create_model
from senslab.tokens import Embedding, Sequence


class Tiny(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        g = torch.Generator().manual_seed(0)
        self.embed = nn.Embedding(50, 32)
        self.ln = nn.LayerNorm(32)
        self.head = nn.Linear(32, 3)
        with torch.no_grad():
            for p in self.parameters():
                p.copy_(torch.randn(p.shape, generator=g) * (1 if p.dim() < 2 else 0.5))

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.head(self.ln(self.embed(ids)).mean(1))


IDS = torch.randint(2, 50, (16, 12), generator=torch.Generator().manual_seed(0))


@pytest.mark.parametrize("mode", ["token", "whole"])
def test_a_bf16_models_embedding_refuses_noise_its_grid_moves(mode: str) -> None:
    model = Tiny().bfloat16().eval()
    with pytest.raises(ValueError) as err:
        token_sensitivity(model, IDS, Embedding("ln"), sigma=0.01, repeats=4, mode=mode)
    text = str(err.value)
    assert "too small for the bfloat16 token vectors of 'ln'" in text
    assert "copy.deepcopy(model).float()" in text and "without autocast=" in text
    with pytest.warns(UserWarning, match="coarse on the bfloat16 grid") as seen:
        token_sensitivity(model, IDS, Embedding("ln"), sigma=0.05, repeats=4, mode=mode)
    assert all(w.filename == __file__ for w in seen)  # pointed at the caller


def test_ordinary_sigma_on_a_bf16_model_is_measured_silently() -> None:
    """σ = 0.3 on LayerNorm outputs (spacing up to 0.016): no word, and the flip rate is the
    float32 model's within their standard errors (same seed, same draws)."""
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        low = token_sensitivity(Tiny().bfloat16().eval(), IDS, Embedding("ln"), sigma=0.3,
                                repeats=16, generator=0)
    full = token_sensitivity(Tiny().eval(), IDS, Embedding("ln"), sigma=0.3, repeats=16,
                             generator=0)
    assert low.estimate > 0.02
    assert abs(low.estimate - full.estimate) < 3 * (low.stderr_subset + full.stderr_subset)


@pytest.mark.parametrize("reuse", [True, False])
def test_the_zoo_gpt2_in_bf16_is_checked_with_and_without_prefix_reuse(reuse: bool) -> None:
    """With prefix reuse the model adds the noise to its own cache (``forward_suffix``), not
    through the hook: the check runs there too."""
    model = create_model("gpt2", vocab_size=50, max_len=16, seed=0).eval().bfloat16()
    tokens = dataclasses.replace(model.default_tokens(), reuse_prefix=reuse)
    with pytest.raises(ValueError, match="too small for the bfloat16 token vectors of 'embed_ln'"):
        token_sensitivity(model, IDS, tokens, sigma=0.001, repeats=2)
    r = token_sensitivity(model, IDS, tokens, sigma=1.0, repeats=2, generator=0)
    assert 0 <= r.estimate <= 1


def test_bf16_sequences_are_checked() -> None:
    model = nn.Sequential(nn.Flatten(), nn.Linear(12 * 32, 3)).bfloat16().eval()
    x = torch.randn(16, 12, 32, generator=torch.Generator().manual_seed(1)).bfloat16()
    with pytest.raises(ValueError, match=r"too small for the bfloat16 token vectors: .*"
                                         r"x\.float\(\)"):
        token_sensitivity(model, x, Sequence(), sigma=0.005, repeats=4)
    r = token_sensitivity(model, x, Sequence(), sigma=0.5, repeats=4, generator=0)
    assert 0 < r.estimate < 1
