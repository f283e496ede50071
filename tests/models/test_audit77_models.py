"""Audit 77 (models): edge cases of the zoo's small models and DenseNet that returned a number
for an input holding nothing, or refused with an error that named the wrong fix."""

from __future__ import annotations

import pytest
import torch

from senslab.models import create_model


@pytest.mark.parametrize("pool", ["mean", "sum"])
def test_sparse_attention_refuses_zero_length_sequences(pool: str) -> None:
    """A (B, 0, d) batch gave NaN logits (mean pooling) or 0 (sum pooling, a logit at the
    decision boundary) without a word; a length-1 batch still works."""
    model = create_model("sparse_attention", dim=4, pool=pool)
    with pytest.raises(ValueError, match="length 0"):
        model(torch.zeros(2, 0, 4))
    g = torch.Generator().manual_seed(0)
    out = model(torch.randn(2, 1, 4, generator=g))
    assert out.shape == (2,) and torch.isfinite(out).all()


def test_attention_model_refuses_zero_length_sequences_by_name() -> None:
    """It failed with a bare IndexError from reading token x₁ of an empty sequence."""
    model = create_model("attention_model", dim=4)
    with pytest.raises(ValueError, match="length 0"):
        model(torch.zeros(2, 0, 4))


@pytest.mark.parametrize("name", ["parity_transformer", "boolean_transformer"])
@pytest.mark.parametrize(
    ("shape", "fix"),
    [((8,), "unsqueeze"), ((2, 8, 1), "unsqueeze"), ((2, 0), "at least one bit")],
)
def test_bit_shape_errors_name_the_right_fix(name: str, shape: tuple[int, ...], fix: str) -> None:
    """A single unbatched string of 8 bits was told to 'build the model with n_bits=8' (which it
    already has), a (2, 8, 1) batch 'n_bits=1' and an empty one 'n_bits=0'."""
    model = create_model(name, n_bits=8, dim=16, heads=2)
    with pytest.raises(ValueError, match=fix) as err:
        model(torch.ones(shape, dtype=torch.long))
    assert "n_bits=" not in str(err.value)
    with pytest.raises(ValueError, match="n_bits=9"):  # too long: the larger table is the fix
        model(torch.ones(2, 9, dtype=torch.long))


def test_densenet_compression_that_leaves_no_channels_is_refused_at_build() -> None:
    """compression=0.05 on 12 channels kept int(0.6) = 0: the model built (torch only warned)
    and its first forward failed inside a convolution with a weight-shape message."""
    with pytest.raises(ValueError, match="compression 0.05 .*at least 1/12"):
        create_model("densenet121", growth_rate=4, blocks=(1, 1), compression=0.05,
                     image_size=8)
    model = create_model("densenet121", growth_rate=4, blocks=(1, 1), compression=1 / 12,
                         image_size=8).eval()
    assert model(torch.zeros(1, 3, 8, 8)).shape == (1, 10)
