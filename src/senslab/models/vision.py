"""Image classifiers of the vision experiments (SPEC §3): two ViTs, an MLP, a CNN and ConvMixer.

Every model maps images (B, C, H, W) to logits (B, num_classes), keeps its frozen dataclass in
``model.config`` and names the patches its sensitivity is measured on in ``default_tokens()``.
Factories are registered by name; ``create_model("vit_small", depth=2, image_size=28)`` replaces
config fields, and an unknown or mistyped field is an error that lists the valid ones.
CIFAR-scale CNNs (ResNet-18, DenseNet-121) live in :mod:`senslab.models.resnet`.

Defaults marked *(paper code)* follow the implementations the paper used (lucidrains'
``vit_for_small_dataset`` / ``simple_vit``, locuslab ConvMixer); *(ours)* where the paper's
numbers were lost from our copy of the text.
"""

from __future__ import annotations

import dataclasses
import difflib
import math
from dataclasses import dataclass
from typing import Any, TypeVar

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..tokens import Patches
from ._registry import register_model

C = TypeVar("C")

# ---------------------------------------------------------------- shared helpers (also resnet.py)


def make_config(cls: type[C], overrides: dict[str, Any]) -> C:
    """``cls(**overrides)``, with an error naming the closest valid field for an unknown key and a
    type check against each field's default (lists are accepted for tuple fields)."""
    fields = {f.name: f for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
    overrides = dict(overrides)  # never mutate the caller's dict
    for key, value in list(overrides.items()):
        if key not in fields:
            close = difflib.get_close_matches(key, list(fields), n=1)
            hint = f" Did you mean {close[0]!r}?" if close else ""
            raise TypeError(
                f"{cls.__name__} has no field {key!r}.{hint} Valid fields: {', '.join(fields)}"
            )
        default = fields[key].default
        if isinstance(value, list) and isinstance(default, tuple):
            value = overrides[key] = tuple(value)
        if default is None or default is dataclasses.MISSING:
            continue
        # bool is an int subclass but never a valid number here; an int is fine for a float
        want = (int, float) if type(default) is float else type(default)
        if isinstance(value, bool) != isinstance(default, bool) or not isinstance(value, want):
            raise TypeError(
                f"{cls.__name__}.{key} must be {type(default).__name__} "
                f"(default {default!r}), got {value!r}"
            )
    return cls(**overrides)


def check_divides(patch: int, image_size: int, name: str) -> None:
    """Error (naming the config field and the valid choices) unless ``patch`` divides the image."""
    try:
        Patches(patch).grid(image_size, image_size)
    except ValueError as e:
        raise ValueError(f"{name}: {e}") from None


def check_positive(cfg: Any, *names: str, integer: bool = True) -> None:
    """Error unless each named field (or every entry of a tuple field) is a positive number,
    an ``int`` when ``integer``."""
    kinds = (int,) if integer else (int, float)
    for n in names:
        v = getattr(cfg, n)
        values = v if isinstance(v, tuple) else (v,)
        bad = [x for x in values if isinstance(x, bool) or not isinstance(x, kinds) or x <= 0]
        if not values or bad:
            kind = "integer" if integer else "number"
            raise ValueError(f"{type(cfg).__name__}.{n} must be a positive {kind}, got {v!r}")


def check_choice(cfg: Any, name: str, choices: tuple[str, ...]) -> None:
    """Error listing ``choices`` unless the named string field is one of them."""
    if getattr(cfg, name) not in choices:
        raise ValueError(
            f"{type(cfg).__name__}.{name} must be one of {', '.join(map(repr, choices))}, "
            f"got {getattr(cfg, name)!r}"
        )


@dataclass(frozen=True)
class ImageConfig:
    """Fields every image classifier has. Images are square: ``image_size`` × ``image_size``."""

    image_size: int = 32
    in_channels: int = 3
    num_classes: int = 10

    def __post_init__(self) -> None:
        check_positive(self, "image_size", "in_channels", "num_classes")


class ImageClassifier(nn.Module):
    """Base: holds ``config``, checks input shapes, names its sensitivity tokens."""

    def __init__(self, config: ImageConfig, token_patch: int) -> None:
        super().__init__()
        self.config = config
        self.token_patch = token_patch

    def default_tokens(self) -> Patches:
        """The p×p patches sensitivity perturbs by default (the model's own patch size for
        patch-based models, ``config.sens_patch`` for the others)."""
        return Patches(self.token_patch)

    def check_input(self, x: Tensor) -> None:
        c, s = self.config.in_channels, self.config.image_size
        if x.dim() != 4 or tuple(x.shape[1:]) != (c, s, s):
            raise ValueError(
                f"{type(self).__name__} expects images of shape (batch, {c}, {s}, {s}), got "
                f"{tuple(x.shape)}; build the model for your data, e.g. "
                f"create_model(name, in_channels=..., image_size=...)"
            )


def patchify(x: Tensor, p: int) -> Tensor:
    """(B, C, H, W) → (B, (H/p)·(W/p), p·p·C), patches in row-major order (as ``Patches``)."""
    b, c, h, w = x.shape
    x = x.reshape(b, c, h // p, p, w // p, p).permute(0, 2, 4, 3, 5, 1)
    return x.reshape(b, (h // p) * (w // p), p * p * c)


# ---------------------------------------------------------------- transformer parts


class Attention(nn.Module):
    """Multi-head self-attention, optionally with Lee et al.'s locality self-attention (LSA).

    Logits A = Q Kᵀ · s. Plain: s = 1/√d_head, fixed. LSA: s = exp(θ) with θ learnable and
    initialised to log(1/√d_head) (a learnable temperature τ = 1/s starting at √d_head; the log
    keeps it positive), and the diagonal of A masked so a token cannot attend to itself, which
    sharpens attention onto *other* tokens. ``kind="softmax"``: weights softmax(A) row-wise;
    ``kind="relu"``: relu(A), unnormalised (SPEC §4), the diagonal then being 0.
    """

    def __init__(
        self, dim: int, heads: int, dim_head: int, dropout: float, kind: str, locality: bool
    ) -> None:
        super().__init__()
        self.heads, self.kind, self.locality = heads, kind, locality
        self.qkv = nn.Linear(dim, 3 * heads * dim_head, bias=False)
        self.out = nn.Sequential(nn.Linear(heads * dim_head, dim), nn.Dropout(dropout))
        self.drop = nn.Dropout(dropout)
        log_scale = torch.tensor(math.log(dim_head**-0.5))
        if locality:
            self.log_scale = nn.Parameter(log_scale)
        else:
            self.register_buffer("log_scale", log_scale)

    def _split(self, x: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        b, t, _ = x.shape
        q, k, v = self.qkv(x).view(b, t, 3, self.heads, -1).permute(2, 0, 3, 1, 4)
        return q, k, v  # each (B, heads, T, d_head)

    def _weights(self, q: Tensor, k: Tensor) -> Tensor:
        logits = q @ k.transpose(-1, -2) * self.log_scale.exp()
        if self.locality:
            eye = torch.eye(logits.shape[-1], dtype=torch.bool, device=logits.device)
            logits = logits.masked_fill(eye, float("-inf"))  # relu(-inf) = 0 as well
        return logits.softmax(-1) if self.kind == "softmax" else F.relu(logits)

    def attention_weights(self, x: Tensor) -> Tensor:
        """Attention matrix (B, heads, T, T) on (already normalised) tokens ``x`` (B, T, dim)."""
        q, k, _ = self._split(x)
        return self._weights(q, k)

    def forward(self, x: Tensor) -> Tensor:
        q, k, v = self._split(x)
        y = self.drop(self._weights(q, k)) @ v
        return self.out(y.transpose(1, 2).flatten(2))


class Block(nn.Module):
    """Pre-LN transformer block: x + Attn(LN x), then x + MLP(LN x) with a GELU MLP."""

    def __init__(
        self,
        dim: int,
        heads: int,
        dim_head: int,
        mlp_dim: int,
        dropout: float,
        kind: str,
        locality: bool,
    ) -> None:
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.attn = Attention(dim, heads, dim_head, dropout, kind, locality)
        self.mlp = nn.Sequential(
            nn.Linear(dim, mlp_dim), nn.GELU(), nn.Dropout(dropout),
            nn.Linear(mlp_dim, dim), nn.Dropout(dropout),
        )  # fmt: skip

    def forward(self, x: Tensor) -> Tensor:
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


# ---------------------------------------------------------------- ViT-small (Lee et al. 2021)


@dataclass(frozen=True)
class ViTSmallConfig(ImageConfig):
    """ViT for small datasets. Defaults *(paper code)*: dim 64, depth 8, heads 32, dim_head 64,
    mlp 512, dropout 0.1, patch 4.

    ``shift``: the shifted copies of Shifted Patch Tokenization. ``"axis"`` (default) shifts by
    one pixel left/right/up/down, as the public port the paper code used; ``"diagonal"`` shifts
    by half a patch towards the four corners, as Lee et al. describe; ``"none"`` disables SPT.
    ``locality``: LSA (learnable temperature + diagonal mask) on, or plain scaled attention.
    ``attention``: ``"softmax"`` or ``"relu"`` (unnormalised relu(QKᵀ·s), SPEC §4).
    """

    patch_size: int = 4
    dim: int = 64
    depth: int = 8
    heads: int = 32
    dim_head: int = 64
    mlp_dim: int = 512
    dropout: float = 0.1
    emb_dropout: float = 0.1
    shift: str = "axis"
    locality: bool = True
    attention: str = "softmax"

    def __post_init__(self) -> None:
        super().__post_init__()
        check_positive(self, "patch_size", "dim", "depth", "heads", "dim_head", "mlp_dim")
        check_divides(self.patch_size, self.image_size, "patch_size")
        check_choice(self, "shift", ("axis", "diagonal", "none"))
        check_choice(self, "attention", ("softmax", "relu"))


class ShiftedPatchTokenizer(nn.Module):
    """SPT: concatenate the image with 4 shifted copies (zero fill) → 5·C channels, cut p×p
    patches, LayerNorm + Linear to ``dim``. Shifted copies let each patch see its neighbours'
    border pixels, widening the receptive field of one token on small images."""

    def __init__(self, in_channels: int, patch: int, dim: int, shift: str) -> None:
        super().__init__()
        s = 1 if shift == "axis" else max(1, patch // 2)
        # F.pad(x, (left, right, top, bottom)); a negative pad crops, so (s, -s, ...) moves the
        # content s pixels right while keeping the size
        axis = [(s, -s, 0, 0), (-s, s, 0, 0), (0, 0, s, -s), (0, 0, -s, s)]
        diagonal = [(s, -s, s, -s), (-s, s, s, -s), (s, -s, -s, s), (-s, s, -s, s)]
        self.pads = {"axis": axis, "diagonal": diagonal, "none": []}[shift]
        self.patch = patch
        patch_dim = (1 + len(self.pads)) * in_channels * patch * patch
        self.norm, self.proj = nn.LayerNorm(patch_dim), nn.Linear(patch_dim, dim)

    def forward(self, x: Tensor) -> Tensor:
        x = torch.cat([x, *(F.pad(x, pad) for pad in self.pads)], dim=1)
        return self.proj(self.norm(patchify(x, self.patch)))


class ViTSmall(ImageClassifier):
    """SPT tokens + CLS token + learned positions → pre-LN LSA blocks → LN + Linear on CLS."""

    def __init__(self, config: ViTSmallConfig | None = None) -> None:
        cfg = config or ViTSmallConfig()
        super().__init__(cfg, cfg.patch_size)
        n = (cfg.image_size // cfg.patch_size) ** 2
        self.tokenizer = ShiftedPatchTokenizer(cfg.in_channels, cfg.patch_size, cfg.dim, cfg.shift)
        # N(0, 1) init of CLS and positions, as the paper code
        self.cls = nn.Parameter(torch.randn(1, 1, cfg.dim))
        self.pos = nn.Parameter(torch.randn(1, n + 1, cfg.dim))
        self.drop = nn.Dropout(cfg.emb_dropout)
        self.blocks = nn.ModuleList(
            Block(cfg.dim, cfg.heads, cfg.dim_head, cfg.mlp_dim, cfg.dropout, cfg.attention,
                  cfg.locality)
            for _ in range(cfg.depth)
        )  # fmt: skip
        self.head = nn.Sequential(nn.LayerNorm(cfg.dim), nn.Linear(cfg.dim, cfg.num_classes))

    def forward(self, x: Tensor) -> Tensor:
        self.check_input(x)
        t = self.tokenizer(x)
        t = torch.cat([self.cls.expand(len(t), -1, -1), t], dim=1) + self.pos
        t = self.drop(t)
        for blk in self.blocks:
            t = blk(t)
        return self.head(t[:, 0])


@register_model("vit_small")
def vit_small(**overrides: Any) -> ViTSmall:
    """ViT for small datasets (Lee et al. 2021) with SPT and LSA; see :class:`ViTSmallConfig`."""
    return ViTSmall(make_config(ViTSmallConfig, overrides))


# ---------------------------------------------------------------- ViT-simple (Beyer et al. 2022)


@dataclass(frozen=True)
class ViTSimpleConfig(ImageConfig):
    """Simple ViT: fixed 2-D sin-cos positions, mean pooling, no dropout, no CLS. Sizes *(ours)*
    (the paper's were lost from our copy): dim 256, depth 6, heads 8, dim_head 32, mlp 512."""

    patch_size: int = 4
    dim: int = 256
    depth: int = 6
    heads: int = 8
    dim_head: int = 32
    mlp_dim: int = 512
    attention: str = "softmax"

    def __post_init__(self) -> None:
        super().__post_init__()
        check_positive(self, "patch_size", "dim", "depth", "heads", "dim_head", "mlp_dim")
        check_divides(self.patch_size, self.image_size, "patch_size")
        check_choice(self, "attention", ("softmax", "relu"))
        if self.dim % 4:
            raise ValueError(
                f"ViTSimpleConfig.dim must be a multiple of 4 (2-D sin-cos positions use dim/4 "
                f"frequencies per axis and function), got {self.dim}"
            )


def sincos_2d(rows: int, cols: int, dim: int, temperature: float = 10_000.0) -> Tensor:
    """Fixed positions (rows·cols, dim): for token (r, c) and frequencies ω_j = T^(−j/(dim/4−1)),
    j < dim/4, the concatenation [sin(c ω), cos(c ω), sin(r ω), cos(r ω)]."""
    q = dim // 4
    omega = temperature ** -(torch.arange(q, dtype=torch.float32) / max(q - 1, 1))
    r, c = torch.meshgrid(torch.arange(rows), torch.arange(cols), indexing="ij")
    r = r.flatten().float()[:, None] * omega
    c = c.flatten().float()[:, None] * omega
    return torch.cat([c.sin(), c.cos(), r.sin(), r.cos()], dim=1)


class ViTSimple(ImageClassifier):
    """Patch embedding LN → Linear → LN (as the public simple ViT), plus sin-cos positions →
    pre-LN blocks → mean over tokens → LN + Linear."""

    def __init__(self, config: ViTSimpleConfig | None = None) -> None:
        cfg = config or ViTSimpleConfig()
        super().__init__(cfg, cfg.patch_size)
        g, patch_dim = cfg.image_size // cfg.patch_size, cfg.in_channels * cfg.patch_size**2
        self.embed = nn.Sequential(
            nn.LayerNorm(patch_dim), nn.Linear(patch_dim, cfg.dim), nn.LayerNorm(cfg.dim)
        )
        self.register_buffer("pos", sincos_2d(g, g, cfg.dim), persistent=False)
        self.blocks = nn.ModuleList(
            Block(cfg.dim, cfg.heads, cfg.dim_head, cfg.mlp_dim, 0.0, cfg.attention, False)
            for _ in range(cfg.depth)
        )
        self.head = nn.Sequential(nn.LayerNorm(cfg.dim), nn.Linear(cfg.dim, cfg.num_classes))

    def forward(self, x: Tensor) -> Tensor:
        self.check_input(x)
        t = self.embed(patchify(x, self.config.patch_size)) + self.pos.to(x.dtype)
        for blk in self.blocks:
            t = blk(t)
        return self.head(t.mean(dim=1))


@register_model("vit_simple")
def vit_simple(**overrides: Any) -> ViTSimple:
    """Simple ViT (Beyer et al. 2022); see :class:`ViTSimpleConfig`."""
    return ViTSimple(make_config(ViTSimpleConfig, overrides))


# ---------------------------------------------------------------- MLP and CNN (Fashion-MNIST)

_ACTIVATIONS = {"leaky_relu": nn.LeakyReLU, "relu": nn.ReLU, "sigmoid": nn.Sigmoid}


@dataclass(frozen=True)
class MLPConfig(ImageConfig):
    """Flatten → hidden layers of ``widths`` with ``activation`` → Linear. Default: the
    Fashion-MNIST MLP (2 hidden layers; widths *(ours)*, lost from our copy of the paper). The
    MNIST experiment's 1-hidden-layer MLP is ``widths=(h,)``. ``sens_patch``: token patch size
    (7 for MNIST in the paper, 4 elsewhere)."""

    image_size: int = 28
    in_channels: int = 1
    widths: tuple[int, ...] = (512, 256)
    activation: str = "leaky_relu"
    sens_patch: int = 4

    def __post_init__(self) -> None:
        super().__post_init__()
        check_positive(self, "widths", "sens_patch")
        check_choice(self, "activation", tuple(_ACTIVATIONS))
        check_divides(self.sens_patch, self.image_size, "sens_patch")


class MLP(ImageClassifier):
    def __init__(self, config: MLPConfig | None = None) -> None:
        cfg = config or MLPConfig()
        super().__init__(cfg, cfg.sens_patch)
        sizes = [cfg.in_channels * cfg.image_size**2, *cfg.widths]
        layers: list[nn.Module] = [nn.Flatten()]
        for a, b in zip(sizes[:-1], sizes[1:], strict=True):
            layers += [nn.Linear(a, b), _ACTIVATIONS[cfg.activation]()]
        self.net = nn.Sequential(*layers, nn.Linear(sizes[-1], cfg.num_classes))

    def forward(self, x: Tensor) -> Tensor:
        self.check_input(x)
        return self.net(x)


@register_model("mlp")
def mlp(**overrides: Any) -> MLP:
    """MLP on flattened pixels, LeakyReLU by default; see :class:`MLPConfig`."""
    return MLP(make_config(MLPConfig, overrides))


@register_model("mlp_sigmoid")
def mlp_sigmoid(**overrides: Any) -> MLP:
    """The Fashion-MNIST MLP with sigmoid activations (``mlp`` with ``activation="sigmoid"``)."""
    return MLP(make_config(MLPConfig, {"activation": "sigmoid", **overrides}))


@dataclass(frozen=True)
class CNNConfig(ImageConfig):
    """Fashion-MNIST CNN: conv(k) → act → conv(k) → act → 2×2 max-pool → fc → act → fc, with
    LeakyReLU *(paper)*. Channels, kernel and fc width *(ours)*: 32, 64, 3×3 (no padding), 128,
    which is the classic PyTorch MNIST network (1.2M parameters on 28×28)."""

    image_size: int = 28
    in_channels: int = 1
    channels: tuple[int, int] = (32, 64)
    kernel_size: int = 3
    hidden: int = 128
    sens_patch: int = 4

    def __post_init__(self) -> None:
        super().__post_init__()
        check_positive(self, "channels", "kernel_size", "hidden", "sens_patch")
        if len(self.channels) != 2:
            raise ValueError(f"CNNConfig.channels must hold 2 values, got {self.channels!r}")
        check_divides(self.sens_patch, self.image_size, "sens_patch")
        if self.pooled_size < 1:
            raise ValueError(
                f"image_size {self.image_size} is too small for two {self.kernel_size}x"
                f"{self.kernel_size} convolutions and a 2x2 pool; use image_size >= "
                f"{2 * self.kernel_size}"
            )

    @property
    def pooled_size(self) -> int:
        """Side after two unpadded convs (each removes k−1 pixels) and the 2×2 pool."""
        return (self.image_size - 2 * (self.kernel_size - 1)) // 2


class CNN(ImageClassifier):
    def __init__(self, config: CNNConfig | None = None) -> None:
        cfg = config or CNNConfig()
        super().__init__(cfg, cfg.sens_patch)
        (c1, c2), k = cfg.channels, cfg.kernel_size
        self.net = nn.Sequential(
            nn.Conv2d(cfg.in_channels, c1, k), nn.LeakyReLU(),
            nn.Conv2d(c1, c2, k), nn.LeakyReLU(),
            nn.MaxPool2d(2), nn.Flatten(),
            nn.Linear(c2 * cfg.pooled_size**2, cfg.hidden), nn.LeakyReLU(),
            nn.Linear(cfg.hidden, cfg.num_classes),
        )  # fmt: skip

    def forward(self, x: Tensor) -> Tensor:
        self.check_input(x)
        return self.net(x)


@register_model("cnn")
def cnn(**overrides: Any) -> CNN:
    """The Fashion-MNIST CNN; see :class:`CNNConfig`."""
    return CNN(make_config(CNNConfig, overrides))


# ---------------------------------------------------------------- ConvMixer (Trockman & Kolter)


@dataclass(frozen=True)
class ConvMixerConfig(ImageConfig):
    """ConvMixer with kernel 3 and patch 4 *(paper)*; dim 256, depth 8 *(ours: CPU-friendly,
    the paper's values were lost from our copy)*."""

    patch_size: int = 4
    kernel_size: int = 3
    dim: int = 256
    depth: int = 8

    def __post_init__(self) -> None:
        super().__post_init__()
        check_positive(self, "patch_size", "kernel_size", "dim", "depth")
        check_divides(self.patch_size, self.image_size, "patch_size")
        if self.kernel_size % 2 == 0:
            raise ValueError(
                f"ConvMixerConfig.kernel_size must be odd (for 'same' padding), "
                f"got {self.kernel_size}"
            )


def _conv_act_bn(conv: nn.Conv2d) -> nn.Sequential:
    return nn.Sequential(conv, nn.GELU(), nn.BatchNorm2d(conv.out_channels))


class _Residual(nn.Sequential):
    def forward(self, x: Tensor) -> Tensor:
        return x + super().forward(x)


class ConvMixer(ImageClassifier):
    """Patch embedding conv (stride p) → depth × [x + DWConv(x), then PWConv], each conv
    followed by GELU and BatchNorm → global average pool → Linear. Mixing is spatial in the
    depthwise conv and across channels in the pointwise conv — patches without attention."""

    def __init__(self, config: ConvMixerConfig | None = None) -> None:
        cfg = config or ConvMixerConfig()
        super().__init__(cfg, cfg.patch_size)
        d, k, p = cfg.dim, cfg.kernel_size, cfg.patch_size
        layers = [_conv_act_bn(nn.Conv2d(cfg.in_channels, d, p, stride=p))]
        for _ in range(cfg.depth):
            layers += [
                _Residual(_conv_act_bn(nn.Conv2d(d, d, k, groups=d, padding=k // 2))),
                _conv_act_bn(nn.Conv2d(d, d, 1)),
            ]
        self.net = nn.Sequential(*layers, nn.AdaptiveAvgPool2d(1), nn.Flatten())
        self.head = nn.Linear(d, cfg.num_classes)

    def forward(self, x: Tensor) -> Tensor:
        self.check_input(x)
        return self.head(self.net(x))


@register_model("convmixer")
def convmixer(**overrides: Any) -> ConvMixer:
    """ConvMixer (Trockman & Kolter 2022); see :class:`ConvMixerConfig`."""
    return ConvMixer(make_config(ConvMixerConfig, overrides))
