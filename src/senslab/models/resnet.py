"""CIFAR-style CNNs of the vision experiments (docs/definitions.md#vision-models): ResNet-18 and
DenseNet-121.

Both use the small-image stem (one 3×3 convolution, stride 1, no max-pool), so a 32×32 image keeps
its resolution into the first stage, and end with global average pooling, which makes them work on
any square image size (``image_size``; a model is built for one and refuses others, as every zoo
image model does). Sensitivity is measured on ``config.sens_patch``-sized patches (4 for CIFAR-10
and SVHN in the paper). ResNet-18 follows kuangliu/pytorch-cifar and DenseNet-121 huyvnphan/
PyTorch_CIFAR10, the implementations the paper used.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .._autocast import autocast_on
from . import _winograd
from ._config import (
    TRAIN_MODE_REUSE,
    check_divides,
    check_eval,
    check_positive,
    make_config,
)
from ._registry import register_model
from .vision import ImageClassifier, ImageConfig, seeded
from .windows import Window, fold, local, out_size, read


def _conv_bn(c_in: int, c_out: int, k: int, stride: int = 1) -> nn.Sequential:
    # bias-free: the BatchNorm that follows has its own shift
    return nn.Sequential(
        nn.Conv2d(c_in, c_out, k, stride=stride, padding=k // 2, bias=False), nn.BatchNorm2d(c_out)
    )


# ---------------------------------------------------------------- ResNet-18


@dataclass(frozen=True)
class ResNetConfig(ImageConfig):
    """CIFAR ResNet with BasicBlocks. ``blocks`` per stage ((2, 2, 2, 2) = ResNet-18); stage
    widths 64·width·2^i, so ``width=0.25`` gives a CPU-sized 16-32-64-128 network."""

    blocks: tuple[int, ...] = (2, 2, 2, 2)
    width: float = 1.0
    sens_patch: int = 4

    def __post_init__(self) -> None:
        super().__post_init__()
        check_positive(self, "blocks", "sens_patch")
        check_positive(self, "width", integer=False)
        check_divides(self.sens_patch, self.image_size, "sens_patch")

    @property
    def widths(self) -> list[int]:
        return [max(1, round(64 * self.width * 2**i)) for i in range(len(self.blocks))]


class BasicBlock(nn.Module):
    """relu(BN(conv3(relu(BN(conv3(x))))) + shortcut(x)); the shortcut is a strided 1×1 conv
    + BN when the shape changes, the identity otherwise."""

    def __init__(self, c_in: int, c_out: int, stride: int) -> None:
        super().__init__()
        self.body = nn.Sequential(
            _conv_bn(c_in, c_out, 3, stride), nn.ReLU(), _conv_bn(c_out, c_out, 3)
        )
        same = stride == 1 and c_in == c_out
        self.shortcut = nn.Identity() if same else _conv_bn(c_in, c_out, 1, stride)

    def forward(self, x: Tensor) -> Tensor:
        return F.relu(self.body(x) + self.shortcut(x))


class ResNet(ImageClassifier):
    #: local reuse (:meth:`forward_local`) runs the 3×3 convolutions of the whole small maps by
    #: Winograd's F(4×4, 3×3) where :func:`senslab.models._winograd.applies` (float32 on the CPU,
    #: maps of at most 8×8 with 256+ channels: ResNet-18's last two stages on 32×32 images); set
    #: ``model.winograd = False`` for oneDNN's direct convolutions. The transformed filters are
    #: kept on the model (36/9 of those layers' weights) and remade when a weight changes, as
    #: are the convolutions with their BatchNorm folded in (:meth:`_fold`).
    winograd: bool = True

    def __init__(self, config: ResNetConfig | None = None) -> None:
        cfg = config or ResNetConfig()
        super().__init__(cfg, cfg.sens_patch)
        widths = cfg.widths
        layers: list[nn.Module] = [_conv_bn(cfg.in_channels, widths[0], 3), nn.ReLU()]
        c = widths[0]
        for i, (n, w) in enumerate(zip(cfg.blocks, widths, strict=True)):
            for j in range(n):
                # every stage but the first halves the resolution in its first block
                layers.append(BasicBlock(c, w, 2 if i > 0 and j == 0 else 1))
                c = w
        self.features = nn.Sequential(*layers, nn.AdaptiveAvgPool2d(1), nn.Flatten())
        self.head = nn.Linear(c, cfg.num_classes)

    def forward(self, x: Tensor) -> Tensor:
        self.check_input(x)
        return self.head(self.features(x))

    # -- local reuse (senslab.tokens.Patches): noise on one patch changes only a window of the
    # early feature maps, so a perturbed copy runs the stem and the first blocks on that window
    # (models.windows), pastes it into the clean map and runs the rest in full. ResNet-18 on
    # 32×32 with 4×4 patches: the stem and stages 1–2 windowed, 1.55× fewer FLOPs than full
    # forwards; stages 3–4 in full, their 3×3 convolutions by Winograd's F(4×4, 3×3) (winograd).

    def _blocks(self) -> list[BasicBlock]:
        return [m for m in self.features if isinstance(m, BasicBlock)]

    def _window_plan(self, patch: int, height: int, width: int) -> int:
        """How many blocks run on windows: those whose output window is still smaller than
        their output map (beyond, a window would cover the map and only cost the bookkeeping)."""
        (h, height), (w, width) = (out_size(self.features[0], patch, height),
                                   out_size(self.features[0], patch, width))
        count = 0
        for block in self._blocks():
            sizes = []
            for n, size in ((h, height), (w, width)):
                n, size = out_size(block.body[0], n, size)
                sizes.append(out_size(block.body[2], n, size))
            (h2, height2), (w2, width2) = sizes
            if h2 * w2 >= height2 * width2:
                break
            (h, height), (w, width), count = (h2, height2), (w2, width2), count + 1
        return count

    @torch.no_grad()
    def local_cache(self, x: Tensor, patch: int) -> dict[str, Any]:
        """Clean maps of images ``x`` that perturbed copies with ``patch``×``patch`` noise read:
        the input, the stem's output and, per windowed block, its first activation and output."""
        check_eval(self, "local", "Patches(p, reuse_local=False)")
        blocks = self._window_plan(patch, *x.shape[2:])
        h = self.features[1](self.features[0](x))
        maps, inner = [x, h], []
        for block in self._blocks()[:blocks]:
            inner.append(block.body[1](block.body[0](h)))
            h = block(h)
            maps.append(h)
        # each map's channels-last copies (models.windows.Window.store), made by the first chunk;
        # every convolution with its BatchNorm folded in (models.windows.fold), kept across calls
        stores = {"maps": [{} for _ in maps], "inner": [{} for _ in inner]}
        folded = {m: f for m in self.features.modules() if (f := self._fold(m)) is not None}
        return {"maps": maps, "inner": inner, "blocks": blocks, "stores": stores,
                "folded": folded}

    def _fold(self, layer: nn.Module) -> tuple[Tensor, Tensor] | None:
        """:func:`~senslab.models.windows.fold` of ``layer``, kept across calls (every chunk's
        cache) while none of its parameters and buffers has changed: the same data pointers
        and version counters (an optimizer step, ``load_state_dict``, an in-place edit and a
        train-mode forward, through ``num_batches_tracked``, each move one), the BatchNorm's
        mode and ``eps``, and the same values of the convolution's weights and the BatchNorm's
        affine and running statistics. The values are compared because some changes move no
        version counter: an edit through ``.data`` (PyTorch counts no version there; a fold
        kept past one gave every later measurement the old weights' flips) and a new tensor
        that happens to reuse a freed one's memory. Comparing them reads the layer's weights
        once per chunk, a small fraction of building the chunk's clean maps. A fold made in
        inference mode is reused in inference mode only (autograd cannot save it)."""
        if not (isinstance(layer, nn.Sequential) and len(layer) == 2
                and isinstance(layer[1], nn.modules.batchnorm._BatchNorm)):
            return fold(layer)
        norm = layer[1]
        try:
            key = (*((t.data_ptr(), t._version)
                     for t in (*layer.parameters(), *layer.buffers())),
                   norm.training, norm.eps)
        except RuntimeError:  # inference tensors have no version counter: nothing kept
            return fold(layer)
        stats = [t for t in (*layer[0].parameters(), norm.weight, norm.bias,
                             norm.running_mean, norm.running_var) if t is not None]
        kept = self.__dict__.setdefault("_folds", {})
        entry = kept.get(layer)
        if entry is not None and entry[0] == key and all(
                a.dtype == b.dtype and a.device == b.device and torch.equal(a, b)
                for a, b in zip(entry[1], stats, strict=True)) and (
                entry[2] is None or not entry[2][0].is_inference()
                or torch.is_inference_mode_enabled()):
            return entry[2]
        entry = kept[layer] = (key, [t.detach().clone() for t in stats], fold(layer))
        return entry[2]

    def _folded(self, layer: nn.Module, x: Tensor, folded: dict[nn.Module, Any]) -> Tensor:
        """``layer`` (a convolution and its BatchNorm) on full maps, folded when it can be (and
        by Winograd's algorithm where :attr:`winograd` and it pays)."""
        f = folded.get(layer)
        if f is None:
            return layer(x)
        conv = layer[0]
        if self.winograd and _winograd.applies(conv, x):
            # f[0]: the direct convolution's filter, run where the result is not finite
            return _winograd.conv3x3(x, self._winograd_filter(layer, f[0]), f[1], f[0])
        return F.conv2d(x, f[0], f[1], conv.stride, conv.padding, conv.dilation, conv.groups)

    def _winograd_filter(self, layer: nn.Module, weight: Tensor) -> Tensor:
        """The Winograd transform of ``layer``'s folded filter ``weight``, kept across calls
        while the fold is the same tensor (:meth:`_fold` makes a new one whenever the layer
        changed, or where it keeps none)."""
        kept = self.__dict__.setdefault("_winograd_filters", {})
        entry = kept.get(layer)
        if entry is None or entry[0] is not weight or (
                entry[1].is_inference() and not torch.is_inference_mode_enabled()):
            entry = kept[layer] = (weight, _winograd.transform_weight(weight))
        return entry[1]

    def _block(self, block: BasicBlock, x: Tensor, folded: dict[nn.Module, Any]) -> Tensor:
        """``block(x)`` with folded convolutions."""
        y = self._folded(block.body[2], torch.relu_(self._folded(block.body[0], x, folded)),
                         folded)
        short = x if isinstance(block.shortcut, nn.Identity) else self._folded(
            block.shortcut, x, folded)
        return torch.relu_(y.add_(short))

    def forward_local(self, cache: dict[str, Any], rows: Tensor, top: Tensor, left: Tensor,
                      patch: Tensor) -> Tensor:
        """Logits of copies of the cached images ``rows`` whose pixels at ``top``/``left``
        (a patch) are replaced by ``patch`` (n, C, p, p)."""
        if self.training:  # the cache's folds hold running statistics; train mode uses batch ones
            raise RuntimeError(TRAIN_MODE_REUSE)
        maps, inner, blocks = cache["maps"], cache["inner"], cache["blocks"]
        stores, inner_stores = cache["stores"]["maps"], cache["stores"]["inner"]
        folded = cache["folded"] if _fold_exact(self, maps[0]) else {}
        win = Window(maps[0], rows, patch, top, left, stores[0])
        y, t, lft = local(self.features[0], win, folded=folded.get(self.features[0]))
        win = win.like(maps[1], torch.relu_(y), t, lft, stores[1])
        for i, block in enumerate(self._blocks()[:blocks]):
            a, t, lft = local(block.body[0], win, folded=folded.get(block.body[0]))
            b, t, lft = local(block.body[2],
                              win.like(inner[i], torch.relu_(a), t, lft, inner_stores[i]),
                              folded=folded.get(block.body[2]))
            if isinstance(block.shortcut, nn.Identity):
                short = read(win, t, lft, b.shape[2], b.shape[3])
            else:
                short = local(block.shortcut, win, (t, lft, b.shape[2], b.shape[3]),
                              folded.get(block.shortcut))[0]
            win = win.like(maps[2 + i], torch.relu_(b.add_(short)), t, lft, stores[2 + i])
        zero = torch.zeros_like(top)
        h = read(win, zero, zero, *win.clean.shape[2:])
        for layer in list(self.features)[2 + blocks:]:
            h = self._block(layer, h, folded) if isinstance(layer, BasicBlock) else layer(h)
        return self.head(h)


def _fold_exact(model: nn.Module, x: Tensor) -> bool:
    """Whether convolutions with their BatchNorm folded in (:meth:`ResNet._fold`) compute what
    the model's forward does up to float rounding: in float32 or float64, without autocast.
    Under autocast, or with bf16/fp16 weights or images, the folded weights are rounded to the
    low precision after the BatchNorm's scale is applied, where the forward rounds them before:
    a zero-noise copy of a trained ResNet then came out up to 23% (bf16) and 3.4% (fp16) of its
    largest logit away from the clean forward, so a near-tie could flip without noise, and the
    measurement was refused for whole batches. There the BatchNorms run as they are (the same
    operations as the forward: no gap in bf16)."""
    exact = (torch.float32, torch.float64)
    weight = next(model.parameters(), None)
    return (x.dtype in exact and (weight is None or weight.dtype in exact)
            and not autocast_on(x.device.type))


@register_model("resnet18", config=ResNetConfig())
def resnet18(**overrides: Any) -> ResNet:
    """CIFAR ResNet-18 (≈11.17M parameters at width 1, 10 classes); see :class:`ResNetConfig`."""
    return seeded(ResNet, make_config(ResNetConfig, overrides))


# ---------------------------------------------------------------- DenseNet-121


@dataclass(frozen=True)
class DenseNetConfig(ImageConfig):
    """CIFAR DenseNet-BC. ``blocks`` layers per dense block ((6, 12, 24, 16) = DenseNet-121);
    each layer adds ``growth_rate`` channels through a 1×1 bottleneck of ``bn_size``·growth
    channels; transitions keep ``compression`` of the channels and halve the resolution.
    ``stem_channels`` defaults to 2·growth (64 for DenseNet-121)."""

    growth_rate: int = 32
    blocks: tuple[int, ...] = (6, 12, 24, 16)
    bn_size: int = 4
    compression: float = 0.5
    stem_channels: int | None = None
    sens_patch: int = 4

    def __post_init__(self) -> None:
        super().__post_init__()
        check_positive(self, "growth_rate", "blocks", "bn_size", "sens_patch")
        if self.stem_channels is not None:
            check_positive(self, "stem_channels")
        if not 0 < self.compression <= 1:
            raise ValueError(
                f"DenseNetConfig.compression must be in (0, 1], got {self.compression}"
            )
        check_divides(self.sens_patch, self.image_size, "sens_patch")
        # a transition that keeps int(c · compression) = 0 channels builds (torch only warns),
        # but its first forward fails in a convolution with a weight-shape message
        c = self.stem_channels or 2 * self.growth_rate
        for i, n in enumerate(self.blocks[:-1]):
            c += n * self.growth_rate
            if int(c * self.compression) < 1:
                raise ValueError(
                    f"DenseNetConfig.compression {self.compression} leaves transition {i + 1} "
                    f"int({c} * {self.compression}) = 0 of its {c} channels; use a compression "
                    f"of at least 1/{c}, or a larger growth_rate or stem_channels"
                )
            c = int(c * self.compression)
        need = 2 ** (len(self.blocks) - 1)
        if self.image_size < need:
            raise ValueError(
                f"image_size {self.image_size} is too small for {len(self.blocks) - 1} "
                f"transitions that each halve it; use image_size >= {need} or fewer blocks"
            )


class DenseLayer(nn.Module):
    """BN-ReLU-Conv1×1 (bottleneck) → BN-ReLU-Conv3×3 (growth channels), concatenated to x."""

    def __init__(self, c_in: int, growth: int, bn_size: int) -> None:
        super().__init__()
        mid = bn_size * growth
        self.body = nn.Sequential(
            nn.BatchNorm2d(c_in), nn.ReLU(), nn.Conv2d(c_in, mid, 1, bias=False),
            nn.BatchNorm2d(mid), nn.ReLU(), nn.Conv2d(mid, growth, 3, padding=1, bias=False),
        )  # fmt: skip

    def forward(self, x: Tensor) -> Tensor:
        return torch.cat([x, self.body(x)], dim=1)


def _transition(c_in: int, c_out: int) -> nn.Sequential:
    return nn.Sequential(
        nn.BatchNorm2d(c_in), nn.ReLU(), nn.Conv2d(c_in, c_out, 1, bias=False), nn.AvgPool2d(2)
    )


class DenseNet(ImageClassifier):
    def __init__(self, config: DenseNetConfig | None = None) -> None:
        cfg = config or DenseNetConfig()
        super().__init__(cfg, cfg.sens_patch)
        g = cfg.growth_rate
        c = cfg.stem_channels or 2 * g
        layers: list[nn.Module] = [_conv_bn(cfg.in_channels, c, 3), nn.ReLU()]
        for i, n in enumerate(cfg.blocks):
            for _ in range(n):
                layers.append(DenseLayer(c, g, cfg.bn_size))
                c += g
            if i < len(cfg.blocks) - 1:
                c_out = int(c * cfg.compression)
                layers.append(_transition(c, c_out))
                c = c_out
        layers += [nn.BatchNorm2d(c), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten()]
        self.features = nn.Sequential(*layers)
        self.head = nn.Linear(c, cfg.num_classes)

    def forward(self, x: Tensor) -> Tensor:
        self.check_input(x)
        return self.head(self.features(x))


@register_model("densenet121", config=DenseNetConfig())
def densenet121(**overrides: Any) -> DenseNet:
    """CIFAR DenseNet-121 (≈6.96M parameters, 10 classes); see :class:`DenseNetConfig`."""
    return seeded(DenseNet, make_config(DenseNetConfig, overrides))
