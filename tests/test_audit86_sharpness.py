"""Audit 86, sharpness: closed forms, nested-tensor encoders, numpy scale, exclude=None."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from senslab.measure.sharpness import (
    layernorm_factors,
    loss_sharpness,
    output_sharpness,
    parameter_norm,
)


# ------------------------------------------------------------------------------ closed forms
def test_loss_sharpness_of_a_linear_mse_matches_its_closed_form() -> None:
    """MSE of a linear model is quadratic in θ: E L(θ+Δ) − L(θ) = σ² · mean_b (‖x_b‖² + 1)
    (weights and bias perturbed; the gradient term has mean 0), whatever the outputs."""
    g = torch.Generator().manual_seed(3)
    x = torch.randn(32, 16, generator=g, dtype=torch.float64)
    y = torch.randn(32, 3, generator=g, dtype=torch.float64)
    model = nn.Linear(16, 3).double()
    sigma = 0.05
    res = loss_sharpness(model, F.mse_loss, x, y, sigma=sigma, draws=300, exclude=(),
                         generator=1, scale=4)
    truth = 4 * sigma**2 * float((x.square().sum(1) + 1).mean())
    assert abs(res.estimate - truth) < 4 * res.stderr
    assert res.stderr < 0.15 * truth  # the check above has teeth


def test_shop_of_a_linear_unit_matches_its_closed_form() -> None:
    """Linear(d, 1) without bias: f changes by Δ·x ~ N(0, σ²‖x‖²), so ShOp = σ √(2/π) mean‖x‖."""
    g = torch.Generator().manual_seed(4)
    x = torch.randn(32, 16, generator=g, dtype=torch.float64)
    model = nn.Linear(16, 1, bias=False).double()
    sigma = 0.05
    res = output_sharpness(model, x, sigma_w=sigma, repeats=400, generator=1,
                           output_kind="logits")
    truth = sigma * math.sqrt(2 / math.pi) * float(x.norm(dim=1).mean())
    assert abs(res.shop.estimate - truth) < 4 * res.shop.stderr
    assert res.shop.stderr < 0.05 * truth


# ------------------------------------------------------------- nested tensors in the blow-up
class _Encoder(nn.Module):
    """nn.TransformerEncoder (batch-first) over dict inputs with an attention_mask."""

    def __init__(self, nested: bool) -> None:
        super().__init__()
        torch.manual_seed(0)
        layer = nn.TransformerEncoderLayer(16, 2, 32, dropout=0.0, batch_first=True)
        self.enc = nn.TransformerEncoder(layer, 2, norm=nn.LayerNorm(16),
                                         enable_nested_tensor=nested)

    def forward(self, x: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        return self.enc(x, src_key_padding_mask=attention_mask == 0)


def _padded_batch() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(5)
    x = torch.randn(4, 5, 16, generator=g)
    mask = torch.ones(4, 5, dtype=torch.long)
    mask[0, 3:] = 0
    mask[2, 4:] = 0
    return {"x": x, "attention_mask": mask}


@pytest.mark.filterwarnings("ignore:The PyTorch API of nested tensors")
@pytest.mark.filterwarnings("ignore:enable_nested_tensor is True")
def test_blowup_of_a_padded_transformer_encoder_is_read_with_the_padded_layout() -> None:
    """nn.TransformerEncoder's default enable_nested_tensor=True turned a padded batch into a
    nested tensor in eval mode, and every LayerNorm hook failed on it ("Internal error:
    NestedTensorImpl doesn't support sizes"). Now read as with enable_nested_tensor=False,
    the same weights, and the encoder's own setting is put back."""
    inputs = _padded_batch()
    nested, plain = _Encoder(True), _Encoder(False)
    plain.load_state_dict(nested.state_dict())
    got = layernorm_factors(nested, inputs)
    want = layernorm_factors(plain, inputs)
    assert list(got) == list(want) == ["enc.layers.0.norm1", "enc.layers.0.norm2",
                                       "enc.layers.1.norm1", "enc.layers.1.norm2", "enc.norm"]
    for name in want:
        torch.testing.assert_close(got[name], want[name])
    assert nested.enc.use_nested_tensor is True and nested.training is True
    # the first LayerNorm's input, x + self-attention(x), by hand: the maximum over real positions
    x, real = inputs["x"], inputs["attention_mask"].bool()
    with torch.no_grad():
        plain.eval()
        h = x + plain.enc.layers[0].self_attn(x, x, x, key_padding_mask=~real,
                                              need_weights=False)[0]
    inv = (h.double().var(-1, unbiased=False) + 1e-5).rsqrt().masked_fill(~real, -math.inf)
    inv = inv.amax(1)
    torch.testing.assert_close(got["enc.layers.0.norm1"], inv)


def test_a_nested_tensor_reaching_a_layernorm_is_refused_with_a_message() -> None:
    class Nested(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.ln = nn.LayerNorm(8)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            parts = torch.nested.nested_tensor([x[0, :2], x[1]])
            return self.ln(parts).to_padded_tensor(0.0)

    x = torch.randn(2, 3, 8, generator=torch.Generator().manual_seed(0))
    with pytest.raises(ValueError, match="got a nested tensor"):
        layernorm_factors(Nested(), x)


# -------------------------------------------------------------------------- argument types
def test_loss_sharpness_takes_a_numpy_scale() -> None:
    """scale=np.float32(4) (read from an array or a config) was refused as "must be a finite
    number > 0, got float32 4.0"; it now gives scale=4's result, as plain floats."""
    g = torch.Generator().manual_seed(6)
    x, y = torch.randn(16, 4, generator=g), torch.randn(16, 1, generator=g)
    model = nn.Linear(4, 1)
    want = loss_sharpness(model, F.mse_loss, x, y, exclude=(), generator=0, scale=4)
    for scale in (np.float32(4), np.int64(4), np.float64(4)):
        got = loss_sharpness(model, F.mse_loss, x, y, exclude=(), generator=0, scale=scale)
        assert got.estimate == want.estimate and got.reference == want.reference
        assert type(got.scale) is float and type(got.reference) is float
    with pytest.raises(ValueError, match="finite number > 0"):
        loss_sharpness(model, F.mse_loss, x, y, exclude=(), scale=np.float32(-4))


def test_exclude_none_or_a_non_string_entry_is_refused_naming_the_fix() -> None:
    """exclude=None failed with "'NoneType' object is not iterable", exclude=[1] with "'in
    <string>' requires string as left operand": neither named the argument."""
    model = nn.Linear(4, 3)
    x, y = torch.randn(8, 4), torch.randn(8, 3)
    calls = [lambda e: output_sharpness(model, x, exclude=e),
             lambda e: loss_sharpness(model, F.mse_loss, x, y, exclude=e),
             lambda e: parameter_norm(model, exclude=e)]
    for call in calls:
        with pytest.raises(TypeError, match=r"exclude=None: pass exclude=\(\)"):
            call(None)
        with pytest.raises(TypeError, match="substrings of parameter names"):
            call([1])
    assert parameter_norm(model, exclude=["bias"]) == pytest.approx(
        float(model.weight.detach().double().norm()))
