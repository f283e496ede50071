"""Image classifiers of the vision experiments (docs/definitions.md#vision-models): an MLP, a CNN
and ConvMixer, and the base class every image model shares.

Every model maps images (B, C, H, W) to logits (B, num_classes), keeps its frozen dataclass in
``model.config`` and names the patches its sensitivity is measured on in ``default_tokens()``.
Factories are registered by name; ``create_model("cnn", channels=[16, 32], image_size=28)``
replaces config fields, and an unknown or mistyped field is an error that lists the valid ones.
The vision transformers live in :mod:`senslab.models.vit`, CIFAR-scale CNNs (ResNet-18,
DenseNet-121) in :mod:`senslab.models.resnet`.

Defaults marked *(paper code)* follow the implementations the paper used (locuslab ConvMixer);
*(ours)* where the paper's numbers were lost from our copy of the text.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, fields
from typing import Any, TypeVar

import torch
from torch import Tensor, nn

from .._autocast import autocast_on
from .._seeds import check_cpu_seed
from ..tokens import Patches
from ._config import check_choice, check_divides, check_positive, make_config
from ._registry import register_model
from .windows import Window, local, read


@dataclass(frozen=True)
class ImageConfig:
    """Fields every image classifier has. Images are square: ``image_size`` × ``image_size``.
    ``seed`` fixes the weights :func:`create_model` draws (see :func:`seeded`)."""

    image_size: int = 32
    in_channels: int = 3
    num_classes: int = 10
    seed: int = 0

    def __post_init__(self) -> None:
        check_positive(self, "image_size", "in_channels", "num_classes")
        check_seed(self)
        # every family's dropout rates (ViTSmallConfig's dropout, emb_dropout), checked here as
        # the text and boolean configs check theirs: 1.0 zeroed every activation in train mode,
        # so each image gave the same logits and training learnt nothing, unsaid; NaN passed
        for f in fields(self):
            rate = getattr(self, f.name)
            if f.name.endswith("dropout") and not 0.0 <= rate < 1.0:
                raise ValueError(f"{type(self).__name__}.{f.name} must be a probability in "
                                 f"[0, 1) (1.0 drops every activation in training), got "
                                 f"{rate!r}; e.g. use {f.name}=0.1, or 0.0 for none")


def check_seed(cfg: Any) -> None:
    """Error unless ``cfg.seed`` is an ``int`` in [0, 2**32) (:func:`.._seeds.check_cpu_seed`):
    -1 drew the weights of 2**64 - 1 and seed 2**32 + 3 those of seed 3, unsaid, and a config
    built directly took a bool or a float, failing only in ``manual_seed``."""
    check_cpu_seed(cfg.seed, f"{type(cfg).__name__}.seed", "weights")


M = TypeVar("M", bound=nn.Module)


def seeded(cls: type[M], config: Any) -> M:
    """``cls(config)`` with the weights drawn from ``config.seed``: torch's CPU generator is
    reseeded inside ``torch.random.fork_rng``, so the global RNG is neither read nor advanced.
    (The training loop seeds the global RNG with the run's seed before building a model and
    passes the same seed here, so its runs draw exactly the weights they drew before.) Only the
    CPU generator: ``torch.manual_seed`` also seeds CUDA's, which ``fork_rng(devices=[])`` does
    not restore, and before CUDA starts it queues that seeding for when it does, so building a
    model set the caller's CUDA stream to the model's seed. The model is built on the CPU (under
    ``torch.set_default_device("cuda")`` too), so the seed decides its weights everywhere.

    Builds take turns (:data:`_SEEDING`): the CPU generator is one for the process, and models
    built in two threads at once drew from each other's reseeded generator, so neither got its
    seed's weights (ResNet-18 built with seeds 0–3 in four threads: all four differed from the
    same seeds built one at a time) and the generator put back at the end could be another
    build's. A thread that draws random numbers without building a model takes no turn: keep
    such draws on a ``torch.Generator`` of its own while models are built in other threads."""
    with _SEEDING, torch.random.fork_rng(devices=[]), torch.device("cpu"):
        torch.default_generator.manual_seed(config.seed)
        return cls(config)


#: held while :func:`seeded` builds a model on the reseeded global CPU generator (re-entrant: a
#: model whose construction builds another seeded one)
_SEEDING = threading.RLock()


class ImageClassifier(nn.Module):
    """Base: holds ``config``, checks input shapes, names its sensitivity tokens."""

    #: outputs are logits (with ``num_classes=1`` one logit whose sign is the class)
    output_kind = "logits"

    def __init__(self, config: ImageConfig, token_patch: int) -> None:
        super().__init__()
        self.config = config
        self.token_patch = token_patch

    def default_tokens(self) -> Patches:
        """The p×p patches sensitivity perturbs by default (the model's own patch size for
        patch-based models, ``config.sens_patch`` for the others)."""
        return Patches(self.token_patch)

    def check_input(self, x: Tensor) -> None:
        if isinstance(x, torch.fx.Proxy):  # traced (FX): shapes are checked when it runs
            return
        c, s = self.config.in_channels, self.config.image_size
        if x.dim() != 4 or tuple(x.shape[1:]) != (c, s, s):
            # images the model was built for, in another layout: rebuilding the model (the
            # general advice) would not take them either
            if tuple(x.shape) == (c, s, s):
                fix = "a single image without its batch axis: pass images.unsqueeze(0)"
            elif x.dim() == 4 and tuple(x.shape[1:]) == (s, s, c):
                fix = ("channels-last (batch, height, width, channels) images: pass "
                       "images.permute(0, 3, 1, 2)")
            else:
                fix = ("build the model for your data, e.g. create_model(name, "
                       "in_channels=..., image_size=...)")
            raise ValueError(
                f"{type(self).__name__} expects images of shape (batch, {c}, {s}, {s}), got "
                f"{tuple(x.shape)}; {fix}"
            )
        self._check_dtype(x)

    def _check_dtype(self, x: Tensor) -> None:
        """Refuse images whose dtype the weights cannot take: integer images (raw bytes) and
        floats of another dtype than the weights' outside autocast reached torch's own errors
        ("mixed dtype (CPU)", "expected scalar type Byte but found Float"), which name neither
        the images nor the fix. Images in the weights' dtype (a model built or moved to bf16 or
        float64 included) pass, and under autocast any dtype it casts (not float64)."""
        w = next((p.dtype for p in self.parameters() if p.is_floating_point()), None)
        if w is None or x.dtype == w:
            return
        name = type(self).__name__
        if not x.is_floating_point():
            raise TypeError(
                f"{name} expects floating-point images ({w}, the dtype of its weights), got "
                f"{x.dtype}: convert them with images.float() (bytes 0..255: images.float() / "
                f"255, then normalise as the model's data was) or use a dataset of senslab.data, "
                f"whose images are float32 already")
        on = autocast_on(x.device.type)
        if on and x.dtype != torch.float64:
            return
        # under autocast already, "run it under torch.autocast" was no fix: it leaves float64 be
        also = ("; torch.autocast, which is on, casts no float64 tensors" if on else
                " (or run it under torch.autocast for mixed precision)")
        raise TypeError(
            f"{name} has {w} weights but got {x.dtype} images: convert the images with "
            f"images.to({w}), or the model with model.to({x.dtype}){also}")


def patchify(x: Tensor, p: int) -> Tensor:
    """(B, C, H, W) → (B, (H/p)·(W/p), p·p·C), patches in row-major order (as ``Patches``)."""
    b, c, h, w = x.shape
    x = x.reshape(b, c, h // p, p, w // p, p).permute(0, 2, 4, 3, 5, 1)
    return x.reshape(b, (h // p) * (w // p), p * p * c)


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


@register_model("mlp", config=MLPConfig())
def mlp(**overrides: Any) -> MLP:
    """MLP on flattened pixels, LeakyReLU by default; see :class:`MLPConfig`."""
    return seeded(MLP, make_config(MLPConfig, overrides))


@register_model("mlp_sigmoid", config=MLPConfig(activation="sigmoid"))
def mlp_sigmoid(**overrides: Any) -> MLP:
    """The Fashion-MNIST MLP with sigmoid activations (``mlp`` with ``activation="sigmoid"``)."""
    return seeded(MLP, make_config(MLPConfig, {"activation": "sigmoid", **overrides}))


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

    # -- local reuse (senslab.tokens.Patches): noise on one patch changes only a window of the
    # two convolutions' and the pool's maps; a perturbed copy computes those windows
    # (models.windows), pastes the pooled one into the clean pooled map and runs the classifier.
    # On 28×28 with 4×4 patches the second convolution (~87% of the FLOPs) shrinks to 8×8 of 24×24.

    @torch.no_grad()
    def local_cache(self, x: Tensor, patch: int) -> dict[str, Any]:
        """Clean maps of images ``x``: the input and the outputs of the two activations and
        the pool."""
        maps = [x]
        for layer in self.net[:5]:
            x = layer(x)
            maps.append(x)
        # each map's channels-last copies (models.windows.Window.store), made by the first chunk
        return {"maps": [maps[0], maps[2], maps[4], maps[5]], "stores": [{}, {}, {}, {}]}

    def forward_local(self, cache: dict[str, Any], rows: Tensor, top: Tensor, left: Tensor,
                      patch: Tensor) -> Tensor:
        """Logits of copies of the cached images ``rows`` whose pixels at ``top``/``left``
        (a patch) are replaced by ``patch`` (n, C, p, p)."""
        x, a1, a2, pooled = cache["maps"]
        stores = cache["stores"]
        net = self.net
        win = Window(x, rows, patch, top, left, stores[0])
        y, t, lft = local(net[0], win)
        win = win.like(a1, net[1](y), t, lft, stores[1])
        y, t, lft = local(net[2], win)
        win = win.like(a2, net[3](y), t, lft, stores[2])
        y, t, lft = local(net[4], win)
        win = win.like(pooled, y, t, lft, stores[3])
        zero = torch.zeros_like(top)
        return net[5:](read(win, zero, zero, *pooled.shape[2:]))


@register_model("cnn", config=CNNConfig())
def cnn(**overrides: Any) -> CNN:
    """The Fashion-MNIST CNN; see :class:`CNNConfig`."""
    return seeded(CNN, make_config(CNNConfig, overrides))


# ---------------------------------------------------------------- ConvMixer (Trockman & Kolter)


@dataclass(frozen=True)
class ConvMixerConfig(ImageConfig):
    """ConvMixer with kernel 3 and patch 4 *(paper)*; dim 256, depth 8 *(ours: the paper text's
    values were lost from our copy; the paper code's defaults, ``cifar_sens.py``, are dim 64,
    depth 8, and its commands are not published; docs/fidelity.md)*."""

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


@register_model("convmixer", config=ConvMixerConfig())
def convmixer(**overrides: Any) -> ConvMixer:
    """ConvMixer (Trockman & Kolter 2022); see :class:`ConvMixerConfig`."""
    return seeded(ConvMixer, make_config(ConvMixerConfig, overrides))
