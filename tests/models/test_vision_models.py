"""Vision model zoo: shapes, gradients, parameter counts, configs and the ViT-small mechanisms."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch
from torch import nn

from senslab.models import create_model, list_models
from senslab.models.vit import ShiftedPatchTokenizer, sincos_2d
from senslab.tokens import Patches

MINE = {
    "vit_small", "vit_simple", "mlp", "mlp_sigmoid", "cnn", "convmixer", "resnet18", "densenet121"
}  # fmt: skip
# small versions of each model so the whole file runs in seconds on a CPU
SMALL: dict[str, dict] = {
    "vit_small": dict(image_size=16, dim=32, depth=2, heads=2, dim_head=8, mlp_dim=32),
    "vit_simple": dict(image_size=16, dim=32, depth=2, heads=2, dim_head=8, mlp_dim=32),
    "mlp": dict(image_size=16, widths=(32, 16)),
    "mlp_sigmoid": dict(image_size=16, widths=(32, 16)),
    "cnn": dict(image_size=16, channels=(4, 8), hidden=16),
    "convmixer": dict(image_size=16, dim=16, depth=2),
    "resnet18": dict(image_size=16, width=0.125),
    "densenet121": dict(image_size=16, growth_rate=4),
}
MODELS = [n for n in list_models() if n in MINE]
PATCHED = {"vit_small", "vit_simple", "convmixer"}  # token patch = the model's own patch_size


def build(name: str, seed: int = 0, **overrides) -> nn.Module:
    """Create a model with a fixed init without touching the caller's global RNG state."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return create_model(name, **{**SMALL[name], **overrides})


def images(model: nn.Module, batch: int = 2, seed: int = 0) -> torch.Tensor:
    cfg = model.config
    g = torch.Generator().manual_seed(seed)
    return torch.randn(batch, cfg.in_channels, cfg.image_size, cfg.image_size, generator=g)


def n_params(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters() if p.requires_grad)


def test_all_models_registered() -> None:
    assert set(MODELS) == MINE


@pytest.mark.parametrize("name", MODELS)
def test_forward_backward(name: str) -> None:
    model = build(name)
    x = images(model)
    out = model(x)
    assert out.shape == (2, model.config.num_classes)
    assert torch.isfinite(out).all()
    out.square().sum().backward()
    for pname, p in model.named_parameters():
        assert p.grad is not None, f"{name}: no gradient reaches {pname}"
        assert torch.isfinite(p.grad).all(), f"{name}: non-finite gradient in {pname}"
    # at least some gradient is non-zero (a detached graph would give all zeros)
    assert any(p.grad.abs().sum() > 0 for p in model.parameters())


@pytest.mark.parametrize("name", MODELS)
def test_eval_is_deterministic(name: str) -> None:
    model = build(name)
    x = images(model, batch=3)
    model.train()
    model(x)  # updates BatchNorm running stats; eval must not depend on the batch afterwards
    model.eval()
    with torch.no_grad():
        a, b = model(x), model(x)
        single = model(x[:1])
    assert torch.equal(a, b)
    # eval output of an example does not depend on the rest of the batch
    torch.testing.assert_close(single, a[:1], rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("name", MODELS)
@pytest.mark.parametrize(("channels", "size", "patch"), [(1, 28, 7), (3, 32, 4)])
def test_any_image_size_and_channels(name: str, channels: int, size: int, patch: int) -> None:
    field = "patch_size" if name in PATCHED else "sens_patch"
    model = build(name, in_channels=channels, image_size=size, num_classes=3, **{field: patch})
    out = model(torch.zeros(2, channels, size, size))
    assert out.shape == (2, 3)
    tokens = model.default_tokens()
    assert isinstance(tokens, Patches) and tokens.size == patch
    assert tokens.grid(size, size) == (size // patch, size // patch)


@pytest.mark.parametrize("name", MODELS)
def test_default_tokens_divide_default_image(name: str) -> None:
    model = create_model(name) if name not in {"resnet18", "densenet121"} else build(name)
    tokens = model.default_tokens()
    s = model.config.image_size
    assert isinstance(tokens, Patches)
    assert s % tokens.size == 0
    expected = model.config.patch_size if name in PATCHED else model.config.sens_patch
    assert tokens.size == expected


@pytest.mark.parametrize("name", MODELS)
def test_wrong_input_shape_is_a_clear_error(name: str) -> None:
    model = build(name)
    s = model.config.image_size
    with pytest.raises(ValueError, match=r"expects images of shape .*image_size"):
        model(torch.zeros(2, model.config.in_channels, s + 4, s + 4))
    with pytest.raises(ValueError, match="expects images of shape"):
        model(torch.zeros(2, model.config.in_channels + 1, s, s))
    with pytest.raises(ValueError, match="expects images of shape"):
        model(torch.zeros(model.config.in_channels, s, s))  # batch axis missing


@pytest.mark.parametrize("name", MODELS)
def test_patch_not_dividing_image_is_a_clear_error(name: str) -> None:
    field = "patch_size" if name in PATCHED else "sens_patch"
    with pytest.raises(ValueError, match=rf"{field}: patch size 5 does not divide .* 1, 2, 4, 8"):
        build(name, image_size=32, **{field: 5})


@pytest.mark.parametrize("name", MODELS)
def test_unknown_or_mistyped_override(name: str) -> None:
    with pytest.raises(TypeError, match=r"'image_sise'.*'image_size'.*Valid options"):
        create_model(name, image_sise=16)
    with pytest.raises(TypeError, match=r"'num_classes' of .* expects int"):
        create_model(name, num_classes="10")
    with pytest.raises(TypeError, match=r"'num_classes' of .* expects int"):
        create_model(name, num_classes=True)
    with pytest.raises(ValueError, match="num_classes must be a positive"):
        create_model(name, num_classes=0)


def test_config_is_frozen_and_lists_become_tuples() -> None:
    model = create_model("mlp", widths=[8, 4], image_size=8)
    assert model.config.widths == (8, 4)
    with pytest.raises(dataclasses.FrozenInstanceError):
        model.config.image_size = 4  # type: ignore[misc]
    assert create_model("mlp_sigmoid", widths=[4], image_size=8).config.activation == "sigmoid"
    with pytest.raises(ValueError, match="activation must be one of"):
        create_model("mlp", activation="tanh")


# ---------------------------------------------------------------- parameter counts


def test_mlp_parameter_count_formula() -> None:
    for widths, c, s, k in [((512, 256), 1, 28, 10), ((100,), 1, 28, 2), ((7, 5, 3), 3, 8, 4)]:
        model = create_model("mlp", widths=widths, in_channels=c, image_size=s, num_classes=k)
        sizes = [c * s * s, *widths, k]
        expected = sum(a * b + b for a, b in zip(sizes[:-1], sizes[1:], strict=True))
        assert n_params(model) == expected


def test_cnn_parameter_count_by_hand() -> None:
    # 28×28: conv 3×3 → 26, conv 3×3 → 24, pool → 12, so fc1 sees 64·12·12 = 9216 inputs
    by_hand = (1 * 32 * 9 + 32) + (32 * 64 * 9 + 64) + (9216 * 128 + 128) + (128 * 10 + 10)
    assert by_hand == 1_199_882
    assert n_params(create_model("cnn")) == by_hand
    # 32×32×3, channels (8, 16), fc 20: 32 → 30 → 28 → 14
    small = create_model("cnn", image_size=32, in_channels=3, channels=(8, 16), hidden=20)
    by_hand = (3 * 8 * 9 + 8) + (8 * 16 * 9 + 16) + (16 * 14 * 14 * 20 + 20) + (20 * 10 + 10)
    assert n_params(small) == by_hand


def test_vit_small_default_parameter_count() -> None:
    model = create_model("vit_small")
    cfg = model.config
    assert (cfg.dim, cfg.depth, cfg.heads, cfg.dim_head, cfg.mlp_dim) == (64, 8, 32, 64, 512)
    d, inner, n = cfg.dim, cfg.heads * cfg.dim_head, (32 // 4) ** 2
    patch_dim = 5 * 3 * 4 * 4  # SPT: image + 4 shifted copies
    spt = 2 * patch_dim + patch_dim * d + d
    block = 4 * d + d * 3 * inner + inner * d + d + 1 + d * 512 + 512 + 512 * d + d
    expected = spt + d + (n + 1) * d + cfg.depth * block + 2 * d + d * 10 + 10
    assert n_params(model) == expected
    assert 4.5e6 < expected < 5.0e6


def test_cifar_cnn_parameter_counts() -> None:
    # the published CIFAR ResNet-18 / DenseNet-121 sizes (10 classes)
    assert n_params(create_model("resnet18")) == 11_173_962
    assert abs(n_params(create_model("densenet121")) - 6.96e6) < 0.01e6
    # width multiplier scales every stage: 0.25 → 16-32-64-128
    assert create_model("resnet18", width=0.25).config.widths == [16, 32, 64, 128]


# ---------------------------------------------------------------- ViT-small mechanisms


def _tokens(seed: int, b: int = 2, t: int = 6, d: int = 32) -> torch.Tensor:
    return torch.randn(b, t, d, generator=torch.Generator().manual_seed(seed))


def test_lsa_masks_the_diagonal_and_starts_at_sqrt_dim_head_temperature() -> None:
    model = build("vit_small")
    attn = model.blocks[0].attn
    assert isinstance(attn.log_scale, nn.Parameter)  # the temperature is learnable
    torch.testing.assert_close(attn.log_scale.exp(), torch.tensor(8**-0.5))  # τ₀ = √dim_head
    w = attn.attention_weights(_tokens(1))
    assert w.shape == (2, 2, 6, 6)
    assert torch.all(w.diagonal(dim1=-2, dim2=-1) == 0)
    torch.testing.assert_close(w.sum(-1), torch.ones(2, 2, 6))
    # without locality the same weights attend to themselves
    plain = build("vit_small", locality=False).blocks[0].attn
    assert "log_scale" not in dict(plain.named_parameters())
    assert torch.all(plain.attention_weights(_tokens(1)).diagonal(dim1=-2, dim2=-1) > 0)


def test_relu_attention_is_unnormalised_and_changes_outputs() -> None:
    soft = build("vit_small", seed=3).eval()
    relu = build("vit_small", seed=3, attention="relu").eval()
    relu.load_state_dict(soft.state_dict())  # identical weights: only the attention differs
    w = relu.blocks[0].attn.attention_weights(_tokens(2))
    assert torch.all(w >= 0) and torch.all(w.diagonal(dim1=-2, dim2=-1) == 0)
    assert not torch.allclose(w.sum(-1), torch.ones_like(w.sum(-1)))
    x = images(soft)
    with torch.no_grad():
        assert not torch.allclose(soft(x), relu(x))
    simple = build("vit_simple", attention="relu").blocks[0].attn.attention_weights(_tokens(2))
    assert torch.all(simple >= 0) and torch.any(simple == 0)  # negative logits are cut to 0


@pytest.mark.parametrize(
    ("shift", "pixel", "token"), [("axis", (0, 3), 1), ("diagonal", (3, 3), 5)]
)
def test_spt_lets_a_pixel_reach_its_neighbour_patch(shift: str, pixel: tuple, token: int) -> None:
    # 16×16 image, patch 4 → a 4×4 grid; token 1 is right of token 0, token 5 diagonally below
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        spt = ShiftedPatchTokenizer(in_channels=1, patch=4, dim=8, shift=shift)
        none = ShiftedPatchTokenizer(in_channels=1, patch=4, dim=8, shift="none")
    x = torch.randn(1, 1, 16, 16, generator=torch.Generator().manual_seed(0))
    y = x.clone()
    y[0, 0, pixel[0], pixel[1]] += 1.0  # a pixel of patch 0 at its right / lower-right border
    with torch.no_grad():
        changed = (spt(x) - spt(y)).abs().sum(-1)[0] > 1e-6
        changed_none = (none(x) - none(y)).abs().sum(-1)[0] > 1e-6
    assert changed[0] and changed[token]
    assert changed_none.tolist() == [i == 0 for i in range(16)]


def test_sincos_positions() -> None:
    pe = sincos_2d(3, 4, 16)
    assert pe.shape == (12, 16)
    assert pe.abs().max() <= 1
    assert torch.cdist(pe, pe).add(torch.eye(12)).min() > 0  # every position distinct
    # token (r, c) = (1, 2): first quarter is sin(2·ω) with ω₀ = 1
    assert math.isclose(pe[1 * 4 + 2, 0].item(), math.sin(2.0), rel_tol=1e-6)
    with pytest.raises(ValueError, match="multiple of 4"):
        create_model("vit_simple", dim=30)
    assert "pos" not in dict(create_model("vit_simple", **SMALL["vit_simple"]).named_parameters())


@pytest.mark.parametrize("locality", [False, True])
def test_fused_attention_matches_explicit_weights(locality: bool) -> None:
    """The softmax path runs through scaled_dot_product_attention; it must equal the explicit
    softmax(Q Kᵀ · s) V of ``attention_weights`` and pass a gradient to the LSA temperature."""
    from senslab.models.vit import Attention

    torch.manual_seed(0)
    attn = Attention(dim=16, heads=2, dim_head=8, dropout=0.0, kind="softmax", locality=locality)
    x = torch.randn(3, 5, 16)
    _, _, v = attn._split(x)
    explicit = attn.out((attn.attention_weights(x) @ v).transpose(1, 2).flatten(2))
    fused = attn(x)
    torch.testing.assert_close(fused, explicit, rtol=1e-5, atol=1e-6)
    fused.square().sum().backward()
    if locality:
        assert attn.log_scale.grad is not None and attn.log_scale.grad.abs() > 0


def test_host_inference_attention_matches_the_training_path() -> None:
    """In eval mode without autograd on the host the kernel applies the (learned) temperature
    itself; the logits must equal the autograd path's, with a temperature moved off its init."""
    model = create_model("vit_small", **SMALL["vit_small"]).eval()
    with torch.no_grad():
        for block in model.blocks:
            block.attn.log_scale.add_(0.7)
    x = torch.randn(4, 3, 16, 16, generator=torch.Generator().manual_seed(1))
    with_grad = model(x)
    with torch.inference_mode():
        assert model.blocks[0].attn._host_inference(torch.zeros(1))
        fast = model(x)
    torch.testing.assert_close(fast, with_grad.detach(), rtol=1e-5, atol=1e-5)
    model.train()
    assert not model.blocks[0].attn._host_inference(torch.zeros(1))


@pytest.mark.parametrize("name", MODELS)
def test_seed_fixes_weights_without_touching_the_global_rng(name: str) -> None:
    """``seed`` alone fixes the weights; the global RNG is neither read nor advanced; and the
    weights are those the model drew after ``torch.manual_seed(seed)`` (what the training loop
    does), so earlier runs keep their initialisation."""
    torch.manual_seed(123)
    state = torch.random.get_rng_state()
    a, b, c = (create_model(name, **SMALL[name], seed=s) for s in (3, 3, 4))
    assert torch.equal(torch.random.get_rng_state(), state)
    flat = [torch.cat([p.flatten() for p in m.parameters()]) for m in (a, b, c)]
    assert torch.equal(flat[0], flat[1]) and not torch.equal(flat[0], flat[2])
    torch.manual_seed(3)
    direct = type(a)(a.config)
    assert torch.equal(torch.cat([p.flatten() for p in direct.parameters()]), flat[0])
