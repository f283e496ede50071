"""Audit 86, models: Winograd's convolution agrees with the direct one on inputs that are not
finite or near float32's limit; model seeds outside [0, 2**32) and of other types are refused;
token vectors of another dtype than the weights' get an error naming the fix."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from senslab.models import _winograd as winograd
from senslab.models import create_model
from senslab.models.resnet import ResNetConfig
from senslab.models.small import (
    AttentionModelConfig,
    BooleanConfig,
    ModAddConfig,
    ParityConfig,
    SparseAttentionConfig,
)
from senslab.models.text import RobertaConfig, TextConfig
from senslab.models.vision import CNNConfig, MLPConfig
from senslab.models.vit import ViTSimpleConfig

# ------------------------------------------------------------------ Winograd, non-finite maps


@pytest.mark.parametrize("value", [float("inf"), float("-inf"), float("nan"), 1e38, 3e38])
def test_winograd_conv3x3_gives_the_direct_convolutions_numbers_on_extreme_inputs(value):
    # old: an inf input made its whole 4×4 output tile NaN in every channel (256 NaN outputs
    # where the direct convolution had 144 ±inf), and 1e38 gave 256 NaN where it had none
    g = torch.Generator().manual_seed(0)
    x = torch.randn(2, 256, 8, 8, generator=g)
    x[0, 3, 2, 5] = value
    weight = torch.randn(16, 256, 3, 3, generator=g) / 48
    bias = torch.randn(16, generator=g)
    out = winograd.conv3x3(x, winograd.transform_weight(weight), bias, weight)
    ref = F.conv2d(x, weight, bias, padding=1)
    assert torch.equal(out.isnan(), ref.isnan()) and torch.equal(out.isinf(), ref.isinf())
    assert torch.equal(out.nan_to_num(0.0, 1.0, -1.0), ref.nan_to_num(0.0, 1.0, -1.0))
    # finite, ordinary inputs still run by Winograd's algorithm (another rounding)
    fine = torch.randn(2, 256, 8, 8, generator=g)
    wino = winograd.conv3x3(fine, winograd.transform_weight(weight), bias, weight)
    direct = F.conv2d(fine, weight, bias, padding=1)
    assert not torch.equal(wino, direct)
    torch.testing.assert_close(wino, direct, rtol=1e-4, atol=1e-5)


def _wide_resnet() -> nn.Module:
    """ResNet-18 layout with stages of 32-64-128-256 channels: on 32×32 images the last stage's
    4×4 maps have 256 channels, so its 3×3 convolutions run by Winograd's algorithm. He-normal
    weights from a seeded generator."""
    g = torch.Generator().manual_seed(0)
    model = create_model("resnet18", image_size=32, blocks=(1, 1, 1, 2), sens_patch=4,
                         width=0.5)
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, (nn.Conv2d, nn.Linear)):
                fan_in = m.weight[0].numel()
                m.weight.copy_(torch.randn(m.weight.shape, generator=g) * (2 / fan_in) ** 0.5)
    return model.eval()


def test_resnet_local_reuse_by_winograd_agrees_with_the_direct_path_on_huge_noise():
    # old: noise of 1e38 on one pixel gave 33 of 64 copies NaN logits by Winograd where the
    # direct convolutions gave finite ones for all 64
    model = _wide_resnet()
    g = torch.Generator().manual_seed(0)
    x = torch.randn(1, 3, 32, 32, generator=g)
    tok = torch.arange(64)
    rows, top, left = torch.zeros(64, dtype=torch.long), tok // 8 * 4, tok % 8 * 4
    noisy = torch.randn(64, 3, 4, 4, generator=g)
    noisy[:, 0, 1, 1] = 1e38
    with torch.no_grad():
        fast = model.forward_local(model.local_cache(x, 4), rows, top, left, noisy)
        assert model.__dict__.get("_winograd_filters")  # the algorithm was chosen
        model.winograd = False
        direct = model.forward_local(model.local_cache(x, 4), rows, top, left, noisy)
    assert direct.isfinite().all()
    assert torch.equal(fast.isnan(), direct.isnan())
    torch.testing.assert_close(fast, direct, rtol=1e-4, atol=1e-5 * float(direct.abs().max()))


# ------------------------------------------------------------------------------- model seeds

CONFIGS = [MLPConfig, CNNConfig, ResNetConfig, ViTSimpleConfig, TextConfig, RobertaConfig,
           SparseAttentionConfig, ModAddConfig, ParityConfig, BooleanConfig,
           AttentionModelConfig]


@pytest.mark.parametrize("cls", CONFIGS, ids=lambda c: c.__name__)
@pytest.mark.parametrize("seed", [-1, 2**32, 2**32 + 3, True, 1.0])
def test_configs_refuse_seeds_that_draw_another_seeds_weights(cls, seed):
    # old: -1 drew the weights of 2**64 - 1 and 2**32 + 3 those of 3, unsaid; True and 1.0
    # failed only in manual_seed ("expected a long, but got bool")
    with pytest.raises(ValueError, match=r"seed must be an int in \[0, 2\*\*32\)"):
        cls(seed=seed)
    assert cls(seed=2**32 - 1).seed == 2**32 - 1


def test_create_model_refuses_a_negative_seed():
    with pytest.raises(ValueError, match=r"MLPConfig\.seed must be an int in \[0, 2\*\*32\), "
                                         r"got -1"):
        create_model("mlp", widths=(4,), seed=-1)
    a = create_model("mlp", widths=(4,), seed=7)
    b = create_model("mlp", widths=(4,), seed=7)
    assert torch.equal(a.net[1].weight, b.net[1].weight)


# ------------------------------------------------------------------ token vectors' dtype


@pytest.mark.parametrize("name, dim", [("sparse_attention", 32), ("attention_model", 16)])
def test_vector_models_name_a_dtype_mismatch(name, dim):
    # old: torch's "expected scalar type Float but found Double"
    model = create_model(name).eval()
    x = torch.randn(2, 4, dim, generator=torch.Generator().manual_seed(0))
    with pytest.raises(TypeError, match=r"torch\.float64 token vectors .* torch\.float32 "
                                        r"weights: convert the vectors with x\.to"):
        model(x.double())
    assert model.double()(x.double()).shape == (2,)  # both in float64: fine
