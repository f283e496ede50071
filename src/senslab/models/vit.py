"""Vision transformers of the vision experiments (docs/definitions.md#vision-models): ViT-small
(Lee et al. 2021, "ViT for small datasets": shifted patch tokenization + locality self-attention)
and ViT-simple (Beyer et al. 2022: 2-D sin-cos positions, mean pooling).

Both map images (B, C, H, W) to logits and measure sensitivity on their own patches
(``default_tokens()`` is ``Patches(patch_size)``). Defaults marked *(paper code)* follow the
implementations the paper used (lucidrains' ``vit_for_small_dataset`` / ``simple_vit``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ._config import check_choice, check_divides, check_positive, make_config
from ._registry import register_model
from .vision import ImageClassifier, ImageConfig, patchify, seeded

#: ``torch.compiler.is_compiling`` is new in torch 2.3. On 2.1/2.2 "not compiling" is assumed:
#: under ``torch.compile`` there, reading the LSA temperature may cost a graph break, same numbers.
_is_compiling = getattr(torch.compiler, "is_compiling", lambda: False)

# ---------------------------------------------------------------- transformer parts


class Attention(nn.Module):
    """Multi-head self-attention, optionally with Lee et al.'s locality self-attention (LSA).

    Logits A = Q Kᵀ · s. Plain: s = 1/√d_head, fixed. LSA: s = exp(θ) with θ learnable and
    initialised to log(1/√d_head) (a learnable temperature τ = 1/s starting at √d_head; the log
    keeps it positive), and the diagonal of A masked so a token cannot attend to itself, which
    sharpens attention onto *other* tokens. ``kind="softmax"``: weights softmax(A) row-wise;
    ``kind="relu"``: relu(A), unnormalised (docs/definitions.md#vision-models), the diagonal then
    being 0.
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

    def _host_inference(self, q: Tensor) -> bool:
        """Evaluation without autograd on the host, outside ``torch.compile``: reading the
        temperature as a Python number is free there (on a GPU it would wait for the device;
        under compile it would break the graph)."""
        return (q.device.type == "cpu" and not self.training and not torch.is_grad_enabled()
                and not _is_compiling())

    def forward(self, x: Tensor) -> Tensor:
        q, k, v = self._split(x)
        if self.kind == "softmax":
            # the fused kernel avoids materialising the (B, heads, T, T) logits and the copies
            # of the split heads: ~2.7× faster attention on CPU (1 thread, ViT-small shapes).
            # The scale is folded into q so that a learnable LSA temperature still gets a
            # gradient; the boolean mask marks the keys a query may attend to.
            t = q.shape[-2]
            allowed = ~torch.eye(t, dtype=torch.bool, device=q.device) if self.locality else None
            if self._host_inference(q):
                # no gradient wanted: the kernel applies the scale itself, sparing a scaled
                # copy of q (~4% of ViT-small's forward on 2 CPU threads, same numbers)
                y = F.scaled_dot_product_attention(
                    q, k, v, attn_mask=allowed, scale=math.exp(float(self.log_scale)))
            else:
                y = F.scaled_dot_product_attention(
                    q * self.log_scale.exp(), k, v, attn_mask=allowed, scale=1.0,
                    dropout_p=self.drop.p if self.training else 0.0,
                )
        else:
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
    ``attention``: ``"softmax"`` or ``"relu"`` (unnormalised relu(QKᵀ·s),
    docs/definitions.md#vision-models).
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


@register_model("vit_small", config=ViTSmallConfig())
def vit_small(**overrides: Any) -> ViTSmall:
    """ViT for small datasets (Lee et al. 2021) with SPT and LSA; see :class:`ViTSmallConfig`."""
    return seeded(ViTSmall, make_config(ViTSmallConfig, overrides))


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


@register_model("vit_simple", config=ViTSimpleConfig())
def vit_simple(**overrides: Any) -> ViTSimple:
    """Simple ViT (Beyer et al. 2022); see :class:`ViTSimpleConfig`."""
    return seeded(ViTSimple, make_config(ViTSimpleConfig, overrides))


# ---------------------------------------------------------------- MLP and CNN (Fashion-MNIST)
