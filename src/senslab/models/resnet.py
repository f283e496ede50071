"""CIFAR-style CNNs of the vision experiments (SPEC §3): ResNet-18 and DenseNet-121.

Both use the small-image stem (one 3×3 convolution, stride 1, no max-pool), so a 32×32 image keeps
its resolution into the first stage, and end with global average pooling, which makes them work on
any image size. Sensitivity is measured on ``config.sens_patch``-sized patches (4 for CIFAR-10 and
SVHN in the paper). ResNet-18 follows kuangliu/pytorch-cifar and DenseNet-121 huyvnphan/
PyTorch_CIFAR10, the implementations the paper used.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ._config import check_divides, check_positive, make_config
from ._registry import register_model
from .vision import ImageClassifier, ImageConfig


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


@register_model("resnet18")
def resnet18(**overrides: Any) -> ResNet:
    """CIFAR ResNet-18 (≈11.17M parameters at width 1, 10 classes); see :class:`ResNetConfig`."""
    return ResNet(make_config(ResNetConfig, overrides))


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


@register_model("densenet121")
def densenet121(**overrides: Any) -> DenseNet:
    """CIFAR DenseNet-121 (≈6.96M parameters, 10 classes); see :class:`DenseNetConfig`."""
    return DenseNet(make_config(DenseNetConfig, overrides))
