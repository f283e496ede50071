"""``auto_tokens`` reads a model's patch size only where it is the image patch of the model's
tokens (a timm hybrid's token in pixels; a declared ``patch_size`` whose first convolution cuts
the image into those patches), and :func:`~senslab.tokens.auto.headless_reason` recognises a
classifier body without its head (timm ``num_classes=0``, HF ``num_labels=0``).

Every model is random-init from a small config (offline). The real timm models run where timm
imports (``make test-timm``); timm-shaped plain modules cover the same paths everywhere.
"""

from __future__ import annotations

import optional
import pytest
import torch
from torch import nn

from senslab import token_sensitivity
from senslab.tokens import DEFAULT_CNN_PATCH, Patches, auto_tokens

transformers = pytest.importorskip("transformers")

EXACT = dict(precision="float32", generator=3)


def seeded(make, seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)  # test-only: HF and timm initialise from the global RNG
    return make().eval()


# --------------------------------------------------------------------------- hybrid ViTs
class HybridShaped(nn.Module):
    """Not timm: the attributes of timm's ``HybridEmbed`` (a CNN ``backbone`` of stride 8, then
    a 1×1 ``proj`` on its feature map: ``patch_size`` (1, 1), ``grid_size`` (4, 4) for 32×32
    images) and a ``pretrained_cfg``; each of its 16 tokens covers 8×8 pixels."""

    def __init__(self) -> None:
        super().__init__()
        self.patch_embed = nn.Module()
        self.patch_embed.backbone = nn.Sequential(nn.Conv2d(3, 6, 4, stride=4), nn.Tanh(),
                                                  nn.Conv2d(6, 6, 2, stride=2), nn.Tanh())
        self.patch_embed.proj = nn.Conv2d(6, 8, 1)
        self.patch_embed.patch_size = (1, 1)  # type: ignore[assignment]
        self.patch_embed.img_size = (32, 32)  # type: ignore[assignment]
        self.patch_embed.grid_size = (4, 4)  # type: ignore[assignment]
        self.head = nn.Linear(8 * 16, 5)
        self.pretrained_cfg = {"mean": (0.5,) * 3, "std": (0.5,) * 3}

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        features = self.patch_embed.proj(self.patch_embed.backbone(x))
        return self.head(features.flatten(1))


def test_a_hybrid_vits_tokens_are_its_token_size_in_pixels():
    """A hybrid's ``patch_size`` (1) is a patch of the backbone's feature map: read as pixels it
    made every pixel a token (1024 per 32×32 image, as many forwards per example and draw).
    Its tokens are ``img_size // grid_size`` = 8 pixels wide: 16 per image."""
    model = seeded(HybridShaped)
    assert auto_tokens(model) == Patches(8)
    assert auto_tokens(model, patch_size=4) == Patches(4)  # the override still wins
    x = torch.randn(3, 3, 32, 32, generator=torch.Generator().manual_seed(0))
    r = token_sensitivity(model, x, sigma=1.0, repeats=2, compare="l2", **EXACT)
    assert r.num_forward == 3 * 16 * 2 + 3  # examples × tokens × draws + clean forwards


@pytest.mark.parametrize("name,patch", [("vit_small_r26_s32_224", 32),
                                        ("vit_tiny_r_s16_p8_224", 32)])
def test_real_timm_hybrids(name, patch):
    """timm's ResNet-ViT hybrids: r26_s32 (patch 1 on a stride-32 map) and r_s16_p8 (patch 8
    on a stride-4 stem) both cut 32×32-pixel tokens: a 2×2 grid on 64×64 images."""
    timm = optional.timm()
    model = timm.create_model(name, pretrained=False, img_size=64, num_classes=3)
    assert tuple(model.patch_embed.grid_size) == (2, 2)
    assert auto_tokens(model) == Patches(patch)


@pytest.mark.parametrize("name,kwargs,patch", [
    ("vit_tiny_patch16_224", dict(depth=1), 16),
    ("deit_tiny_distilled_patch16_224", dict(depth=1), 16),
    ("eva02_tiny_patch14_224", dict(depth=1), 14),
    ("vit_small_patch14_reg4_dinov2", dict(depth=1, img_size=56), 14),
    ("swin_tiny_patch4_window7_224", dict(depths=(1, 1, 1, 1)), 4),
    ("mixer_s16_224", {}, 16),
    ("convnext_atto", {}, DEFAULT_CNN_PATCH),
    ("focalnet_tiny_srf", {}, DEFAULT_CNN_PATCH),
])
def test_real_timm_plain_patch_sizes_are_kept(name, kwargs, patch):
    """ViTs and Swin keep their patch size; ConvNeXt and FocalNet (a 4×4 stem, then strided
    convolutions) keep the CNN default, which their HF versions now get too."""
    timm = optional.timm()
    model = timm.create_model(name, pretrained=False, num_classes=3, **kwargs)
    assert auto_tokens(model) == Patches(patch)


# --------------------------------------------------------------------------- Hugging Face
def _mobilevit() -> nn.Module:
    return transformers.MobileViTForImageClassification(transformers.MobileViTConfig(
        image_size=32, num_labels=3, hidden_sizes=[16, 16, 16], neck_hidden_sizes=[
            8, 8, 8, 8, 8, 8, 16]))


def _convnext(v2: bool = False) -> nn.Module:
    prefix = "ConvNextV2" if v2 else "ConvNext"
    config = getattr(transformers, f"{prefix}Config")(
        num_stages=2, hidden_sizes=[8, 16], depths=[1, 1], num_labels=3)
    return getattr(transformers, f"{prefix}ForImageClassification")(config)


def _focalnet() -> nn.Module:
    return transformers.FocalNetForImageClassification(transformers.FocalNetConfig(
        image_size=32, embed_dim=8, depths=[1, 1], num_labels=3))


@pytest.mark.parametrize("make,declared", [(_mobilevit, 2), (_convnext, 4),
                                           (lambda: _convnext(v2=True), 4), (_focalnet, 4)])
def test_hf_patch_sizes_that_are_no_token_grid_get_the_cnn_default(make, declared):
    """HF MobileViT's ``patch_size`` (2) is the unfold inside its blocks on maps already
    downsampled (its stem is a 3×3 stride-2 convolution): read as pixels it made 2×2-pixel
    tokens. HF ConvNeXt's and FocalNet's (4) is a patchify stem followed by strided
    convolutions, which the docs and timm's ConvNeXt give the CNN default."""
    model = seeded(make)
    assert model.config.patch_size == declared
    assert auto_tokens(model) == Patches(DEFAULT_CNN_PATCH)
    assert auto_tokens(model, patch_size=declared) == Patches(declared)


def test_hf_mobilevit_is_measured_on_16_pixel_tokens():
    model = seeded(_mobilevit)
    x = torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(1))
    r = token_sensitivity(model, x, sigma=1.0, compare="l2", **EXACT)
    assert r.num_forward == 2 * 4 + 2  # 2×2 tokens of 16×16 pixels, not 16×16 of 2×2


def _small(name: str, num_labels: int = 3, **extra) -> nn.Module:
    config = getattr(transformers, f"{name}Config")(
        hidden_size=16, num_hidden_layers=1, num_attention_heads=2, intermediate_size=24,
        num_labels=num_labels, **extra)
    return getattr(transformers, f"{name}ForImageClassification")(config)


@pytest.mark.parametrize("make,patch", [
    (lambda: _small("ViT", image_size=32, patch_size=4), 4),
    (lambda: _small("DeiT", image_size=32, patch_size=4), 4),
    (lambda: _small("Beit", image_size=32, patch_size=4), 4),
    (lambda: _small("Dinov2", image_size=28, patch_size=7), 7),
    (lambda: transformers.SwinForImageClassification(transformers.SwinConfig(
        image_size=32, embed_dim=8, depths=[1, 1], num_heads=[1, 1], window_size=2,
        num_labels=3)), 4),
    (lambda: transformers.DPTForDepthEstimation(transformers.DPTConfig(
        hidden_size=32, num_hidden_layers=4, num_attention_heads=2, intermediate_size=24,
        image_size=32, patch_size=4)), 4),
])
def test_hf_vits_keep_their_patch_size(make, patch):
    """Attention over p×p stride-p patches of the image: ``config.patch_size``, also beside a
    dense head's strided convolutions (DPT)."""
    assert auto_tokens(seeded(make)) == Patches(patch)


# --------------------------------------------------------------------------- headless models
class TimmShapedBody(nn.Module):
    """Not timm: a ``pretrained_cfg`` model with timm's classifier API; ``num_classes=0``
    leaves the pooled features (timm's ``reset_classifier(0)`` puts an ``nn.Identity``)."""

    def __init__(self, num_classes: int) -> None:
        super().__init__()
        self.stem = nn.Conv2d(3, 8, 4, stride=4)
        self.num_classes = num_classes
        self.head = nn.Linear(8, num_classes) if num_classes else nn.Identity()
        self.pretrained_cfg = {"mean": (0.5,) * 3, "std": (0.5,) * 3}

    def get_classifier(self) -> nn.Module:
        return self.head

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.stem(x).mean((2, 3)))


def test_headless_reason_names_a_timm_shaped_body_and_the_fix():
    from senslab.tokens.auto import headless_reason

    reason = headless_reason(TimmShapedBody(0))
    assert reason is not None
    for words in ("TimmShapedBody", "num_classes=0", "pooled features, not class scores",
                  "a model with a head", "compare='l2'"):
        assert words in reason
    assert headless_reason(TimmShapedBody(5)) is None
    reset = TimmShapedBody(5)
    reset.head = nn.Identity()  # reset_classifier(0) without updating num_classes
    assert headless_reason(reset) is not None
    # a wrapper that puts its own head on the body returns class scores
    assert headless_reason(nn.Sequential(TimmShapedBody(0), nn.Linear(8, 3))) is None
    assert headless_reason(nn.Linear(4, 2)) is None and headless_reason("model") is None


def test_headless_reason_real_timm():
    timm = optional.timm()
    from senslab.tokens.auto import headless_reason

    body = timm.create_model("vit_tiny_patch16_224", pretrained=False, patch_size=8,
                             img_size=32, depth=1, num_classes=0)
    assert body(torch.randn(2, 3, 32, 32)).shape == (2, 192)  # pooled features
    assert "num_classes=0" in headless_reason(body)
    resnet = timm.create_model("resnet18", pretrained=False, num_classes=5)
    assert headless_reason(resnet) is None
    resnet.reset_classifier(0)
    assert "pooled features" in headless_reason(resnet)
    distilled = timm.create_model("deit_tiny_distilled_patch16_224", pretrained=False, depth=1,
                                  num_classes=3)  # get_classifier() is a pair of heads
    assert headless_reason(distilled) is None


def test_headless_reason_hf_classifier_without_labels():
    from senslab.tokens.auto import headless_reason

    body = seeded(lambda: _small("ViT", image_size=8, patch_size=2, num_labels=0))
    assert isinstance(body.classifier, nn.Identity)
    assert body(torch.randn(2, 3, 8, 8)).logits.shape == (2, 16)  # features as "logits"
    reason = headless_reason(body)
    assert reason is not None and "num_labels=0" in reason and "compare='l2'" in reason
    assert headless_reason(seeded(lambda: _small("ViT", image_size=8, patch_size=2))) is None
    # a base model returns no logits at all (refused where its output is read)
    assert headless_reason(transformers.ViTModel(transformers.ViTConfig(
        hidden_size=16, num_hidden_layers=1, num_attention_heads=2, intermediate_size=24,
        image_size=8, patch_size=2))) is None


def test_a_headless_body_is_refused_before_any_forward_and_a_head_is_measured():
    """A timm model built with num_classes=0 returns pooled features; compare="class" measured
    flips of their argmax over feature dimensions (0.1406 ± 0.0696 on a tiny ViT) without a
    word. It is refused, naming the fix; the same body with a head is measured."""
    x = torch.randn(4, 3, 8, 8, generator=torch.Generator().manual_seed(0))
    with pytest.raises(ValueError, match="num_classes=0.*compare='l2'"):
        token_sensitivity(seeded(lambda: TimmShapedBody(0)), x, Patches(4), sigma=1.0, **EXACT)
    token_sensitivity(seeded(lambda: TimmShapedBody(0)), x, Patches(4), sigma=1.0,
                      compare="l2", **EXACT)
    assert token_sensitivity(seeded(lambda: TimmShapedBody(3)), x, Patches(4), sigma=1.0,
                             **EXACT).num_forward > 0


def test_an_hf_image_classifier_with_one_output_and_no_problem_type_is_refused():
    """Hugging Face trains a one-output image classifier without a problem_type as a
    regression, like a sequence classifier; read as a binary logit it measured sign changes
    of a regression value without a word. It is refused; output_kind='logits' says it is one."""
    model = seeded(lambda: _small("ViT", num_labels=1, image_size=8, patch_size=4))
    assert model.config.problem_type is None
    x = torch.randn(4, 3, 8, 8, generator=torch.Generator().manual_seed(0))
    with pytest.raises(ValueError, match="num_labels=1.*output_kind='logits'"):
        token_sensitivity(model, x, sigma=1.0, **EXACT)
    assert token_sensitivity(model, x, sigma=1.0, output_kind="logits",
                             **EXACT).num_forward > 0
