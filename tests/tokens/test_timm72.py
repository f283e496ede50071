"""timm models as a researcher measures them: ``token_sensitivity(model, images,
auto_tokens(model), sigma=...)`` on random-init models (offline).

A convolutional patch embedding (XCiT) gets its declared patch size; σ in pixel space names
where a channel count that does not fit came from (a 1-channel model keeps its 3-channel
``pretrained_cfg``) and that a model normalising its own pixels needs no conversion; the
measurement agrees with a plain loop of hand-made perturbed copies. The timm-shaped modules
run everywhere; the real timm models run where timm imports (``make test-timm``) and skip
elsewhere.
"""

from __future__ import annotations

import math

import optional
import pytest
import torch
from torch import nn

from senslab import Patches, auto_tokens, token_sensitivity
from senslab.tokens import DEFAULT_CNN_PATCH

EXACT = dict(precision="float32", generator=3)
IMAGENET = {"mean": (0.485, 0.456, 0.406), "std": (0.229, 0.224, 0.225)}


def timm_model(name: str, **kwargs) -> nn.Module:
    timm = optional.timm()
    torch.manual_seed(0)  # test-only: timm initialises from the global RNG
    return timm.create_model(name, pretrained=False, num_classes=10, **kwargs).eval()


def images(n: int, size: int, channels: int = 3, seed: int = 1) -> torch.Tensor:
    return torch.randn(n, channels, size, size, generator=torch.Generator().manual_seed(seed))


# --------------------------------------------------------------------------- conv patch embed
class Attention(nn.Module):
    """Mixes the tokens (its name is what senslab reads as attention)."""

    def forward(self, t: torch.Tensor) -> torch.Tensor:
        return t + t.mean(1, keepdim=True)


class ConvEmbedShaped(nn.Module):
    """Not timm: the shape of XCiT's ``ConvPatchEmbed`` (three 3×3 stride-2 convolutions,
    ``patch_size`` 8), then attention over the 8×8-pixel cells; ``stride_after`` adds a
    strided convolution after the embedding, a pyramid whose tokens change size (PiT)."""

    def __init__(self, stride_after: bool = False) -> None:
        super().__init__()
        self.patch_embed = nn.Sequential(*(nn.Conv2d(c, 4, 3, stride=2, padding=1)
                                           for c in (3, 4, 4)))
        self.patch_embed.patch_size = 8  # type: ignore[assignment]
        self.patch_embed.img_size = (32, 32)  # type: ignore[assignment]
        self.after = nn.Conv2d(4, 4, 2, stride=2 if stride_after else 1)
        self.attn = Attention()
        self.head = nn.Linear(4, 5)
        self.pretrained_cfg = dict(IMAGENET)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        t = self.after(self.patch_embed(x)).flatten(2).transpose(1, 2)
        return self.head(self.attn(t).mean(1))


def test_a_convolutional_patch_embedding_gets_its_declared_patch_size():
    """Its first convolution cuts no patches (3×3, stride 2, padding 1), so the rule for a
    cutting stem gave the CNN default: 16×16 patches of four 8×8-pixel tokens each."""
    assert auto_tokens(ConvEmbedShaped()) == Patches(8)
    assert auto_tokens(ConvEmbedShaped(), patch_size=4) == Patches(4)  # the override wins
    assert auto_tokens(ConvEmbedShaped(stride_after=True)) == Patches(DEFAULT_CNN_PATCH)
    torch.manual_seed(0)
    r = token_sensitivity(ConvEmbedShaped().eval(), images(2, 32), auto_tokens(
        ConvEmbedShaped()), sigma=1.0, compare="l2", **EXACT)
    assert r.num_forward == 2 * 16 + 2  # 4×4 tokens of 8×8 pixels per 32×32 image


@pytest.mark.parametrize("name,patch", [("xcit_nano_12_p8_224", 8), ("xcit_nano_12_p16_224", 16),
                                        ("pit_ti_224", DEFAULT_CNN_PATCH)])
def test_real_timm_conv_patch_embeddings(name, patch):
    """XCiT's tokens are ``patch_size`` cells; PiT's overlapping 16×16 stride-8 embedding,
    followed by strided pooling, keeps the CNN default."""
    assert auto_tokens(timm_model(name, depth=1) if "xcit" in name else timm_model(name)) \
        == Patches(patch)


# --------------------------------------------------------------------------- pixel space
class OneChannelShaped(nn.Module):
    """Not timm: a 1-channel model with a 3-channel ``pretrained_cfg``, as timm keeps it for
    ``create_model(..., in_chans=1)``."""

    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Conv2d(1, 4, 3, padding=1)
        self.head = nn.Linear(4, 5)
        self.pretrained_cfg = dict(IMAGENET)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.stem(x).mean((2, 3)))


def test_pixel_space_on_a_one_channel_model_names_the_cfg_and_the_fix():
    """The refusal said "mean has 3 values ...; give one value or one per channel" of values
    the user never gave."""
    model = OneChannelShaped().eval()
    x = images(2, 16, channels=1)
    with pytest.raises(ValueError) as err:
        token_sensitivity(model, x, auto_tokens(model, sigma_space="pixel"), sigma=0.1, **EXACT)
    for words in ("OneChannelShaped's timm pretrained_cfg normalises 3 channels",
                  "1 channel", "in_chans=1",
                  "Patches(16, sigma_space='pixel', std=..., mean=...)", "one value each"):
        assert words in str(err.value), (words, str(err.value))
    ok = token_sensitivity(model, x, auto_tokens(model, sigma_space="pixel", std=0.25),
                           sigma=0.1, compare="l2", **EXACT)
    plain = token_sensitivity(model, x, Patches(16), sigma=0.1 / 0.25, compare="l2", **EXACT)
    assert ok.estimate == pytest.approx(plain.estimate, rel=1e-5)
    with pytest.raises(ValueError, match=r"^std has 3 values.*one per channel"):
        token_sensitivity(model, x, Patches(16, sigma_space="pixel", std=(0.2, 0.2, 0.2)),
                          sigma=0.1, **EXACT)


def test_real_timm_one_channel_model_in_pixel_space():
    model = timm_model("resnet10t", in_chans=1)
    assert len(model.pretrained_cfg["std"]) == 3
    with pytest.raises(ValueError, match="ResNet's timm pretrained_cfg normalises 3 channels"):
        token_sensitivity(model, images(2, 32, channels=1), auto_tokens(
            model, sigma_space="pixel"), sigma=0.1, **EXACT)


def test_pixel_space_refusal_says_a_self_normalising_wrapper_needs_no_conversion():
    """A wrapper that normalises [0, 1] pixels itself has no pretrained_cfg of its own; the
    refusal offered ImageNet's std, which divided the noise a second time."""

    class Normalising(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.model = OneChannelShaped()

        def forward(self, pixels: torch.Tensor) -> torch.Tensor:
            return self.model((pixels - 0.45) / 0.226)

    wrapper = Normalising().eval()
    with pytest.raises(ValueError, match="normalises them itself needs no conversion.*drop "
                                         "sigma_space"):
        token_sensitivity(wrapper, images(2, 16, channels=1).sigmoid(), Patches(
            16, sigma_space="pixel"), sigma=0.1, **EXACT)


# --------------------------------------------------------------------------- real timm models
@pytest.mark.filterwarnings("ignore:the standard error rests on")
@pytest.mark.parametrize("name,kwargs,size,patch", [
    ("vit_tiny_patch16_224", dict(img_size=64, depth=1), 64, 16),
    ("deit_tiny_distilled_patch16_224", dict(img_size=64, depth=1), 64, 16),
    ("vit_small_patch14_reg4_dinov2", dict(img_size=56, depth=1), 56, 14),
    ("eva02_tiny_patch14_224", dict(img_size=56, depth=1), 56, 14),
    ("swin_tiny_patch4_window7_224", dict(img_size=56, depths=(1, 1, 1, 1)), 56, 4),
    ("levit_128s", dict(img_size=64), 64, DEFAULT_CNN_PATCH),
    ("efficientnet_b0", {}, 64, DEFAULT_CNN_PATCH),
    ("mobilenetv3_small_050", {}, 64, DEFAULT_CNN_PATCH),
    ("regnetx_002", {}, 64, DEFAULT_CNN_PATCH),
    ("resnet10t", {}, 64, DEFAULT_CNN_PATCH),
])
def test_real_timm_three_lines(name, kwargs, size, patch):
    """The three lines run on each family with its own tokens: a flip rate in [0, 1], one
    forward per sampled token and draw plus one clean forward per image."""
    model = timm_model(name, **kwargs)
    tokens = auto_tokens(model)
    assert tokens == Patches(patch)
    r = token_sensitivity(model, images(2, size), tokens, sigma=1.0, num_tokens=3, repeats=2,
                          **EXACT)
    assert 0.0 <= r.estimate <= 1.0
    assert r.num_forward == 2 * 3 * 2 + 2


def hand_loop(model: nn.Module, x: torch.Tensor, p: int, sigma: float, draws: int,
              seed: int) -> tuple[float, float]:
    """The flip rate by hand: every patch of every image, ``draws`` noisy copies each, the
    noise N(0, σ²) on that patch's pixels of all channels; (rate, its standard error)."""
    g = torch.Generator().manual_seed(seed)
    b, c, h, w = x.shape
    flips, n = 0, 0
    with torch.no_grad():
        clean = model(x).argmax(1)
        for i in range(b):
            for r in range(h // p):
                for col in range(w // p):
                    copies = x[i:i + 1].repeat(draws, 1, 1, 1)
                    copies[:, :, r * p:(r + 1) * p, col * p:(col + 1) * p] += sigma * torch.randn(
                        draws, c, p, p, generator=g)
                    flips += int((model(copies).argmax(1) != clean[i]).sum())
                    n += draws
    rate = flips / n
    return rate, math.sqrt(max(rate * (1 - rate), 1 / n) / n)


def test_real_timm_agrees_with_a_hand_loop_and_the_full_forward_path():
    """EfficientNet-B0 (BatchNorm in eval mode, SiLU): the measured flip rate is the one a plain
    loop of hand-perturbed copies finds (independent noise: within four joint standard
    errors), and ``reuse_local=False`` (timm models have no forward_local) gives the same
    number."""
    model = timm_model("efficientnet_b0")
    x = images(2, 64)
    opts = dict(sigma=0.5, repeats=16, estimand="subset", **EXACT)
    r = token_sensitivity(model, x, auto_tokens(model), **opts)
    rate, se = hand_loop(model, x, 16, 0.5, 16, seed=11)
    assert 0.02 < rate < 0.98, rate  # a flip rate that can disagree
    assert abs(r.estimate - rate) < 4 * math.hypot(r.stderr, se), (r.estimate, rate)
    full = token_sensitivity(model, x, Patches(16, reuse_local=False), **opts)
    assert full.estimate == r.estimate


@pytest.mark.parametrize("name,kwargs", [("resnet10t", {}), ("convnext_atto", {}),
                                         ("vit_tiny_patch16_224", dict(img_size=64, depth=1))])
def test_real_timm_channels_last_memory_format(name, kwargs):
    """``model.to(memory_format=torch.channels_last)`` with channels-last images (still shaped
    (B, C, H, W)) measures what the contiguous model does on contiguous images."""
    model = timm_model(name, **kwargs)
    x = images(2, 64)
    opts = dict(sigma=1.0, repeats=2, compare="l2", **EXACT)
    a = token_sensitivity(model, x, auto_tokens(model), **opts)
    model = model.to(memory_format=torch.channels_last)
    b = token_sensitivity(model, x.contiguous(memory_format=torch.channels_last),
                          auto_tokens(model), **opts)
    assert a.estimate > 0
    assert b.estimate == pytest.approx(a.estimate, rel=1e-4)
