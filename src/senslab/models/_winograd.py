"""Winograd's minimal filtering F(4×4, 3×3) (Lavin & Gray, 2016) for the 3×3 convolutions that
local reuse runs on whole small maps (:meth:`senslab.models.resnet.ResNet.forward_local`).

A 3×3 convolution (stride 1, zero padding 1) computes each 4×4 tile of its output from a 6×6 tile
of its input. Winograd's algorithm writes that as ``Aᵀ [(G w Gᵀ) ⊙ (Bᵀ d B)] A``: the input tile
``d`` and the filter ``w`` are transformed into 6×6 arrays, multiplied position by position
(summed over input channels, a matrix product per position), and the product is transformed back.
In exact arithmetic the result is the convolution; the multiply count falls from 9 to 36/16 =
2.25 per output and channel pair, 4× fewer, at the cost of the transforms, which are linear in the
channels where the products are quadratic. In float32 the rounding differs from a direct
convolution's (the transforms hold constants up to 8 and fractions down to 1/15): the test suite
bounds the error against a float64 convolution and a direct float32 one.

Where it pays was measured on 2-core CPUs: maps of at most 8×8 with 256 or more input channels
(ResNet-18's last two stages on 32×32 images); on 12×12 and 16×16 maps with 128 channels it ran
no faster than oneDNN's direct convolution. :func:`applies` holds that rule; on GPUs (cuDNN
chooses its own algorithms), under autocast and in other dtypes the direct convolution runs.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .._autocast import autocast_on

TILE = 4  #: output tile (4×4); input tiles are 6×6
MIN_CHANNELS = 256  #: fewer input channels: the transforms cost more than the products save
MAX_PIXELS = 64  #: larger maps: oneDNN's direct convolution was as fast

# F(4, 3) at the points 0, 1, −1, 2, −1/2 and ∞ (Toom–Cook): input transform Bᵀ, filter
# transform G, output transform Aᵀ. Against Lavin's points (0, ±1, ±2, ∞) the pair 2, −1/2 keeps
# the transforms' constants smaller where it matters: the float32 error came out at a direct
# convolution's on an AVX2 EPYC (1.4e-5 against 1.6e-5 largest, 8×8 maps of 256 channels)
# instead of 2.6× it; oneDNN's direct kernels on an AVX-512 EPYC came out 10× more precise
# (1.4e-6), so the test bounds it against the outputs' size.
_BT = ((1, 3 / 2, -2, -3 / 2, 1, 0), (0, -1, -5 / 2, -1 / 2, 1, 0), (0, 1, 1 / 2, -5 / 2, 1, 0),
       (0, -1 / 2, -1, 1 / 2, 1, 0), (0, 2, -1, -2, 1, 0), (0, 1, 3 / 2, -2, -3 / 2, 1))
_G = ((1, 0, 0), (-1 / 3, -1 / 3, -1 / 3), (1 / 3, -1 / 3, 1 / 3), (1 / 15, 2 / 15, 4 / 15),
      (-16 / 15, 8 / 15, -4 / 15), (0, 0, 1))
_AT = ((1, 1, 1, 1, 1, 0), (0, 1, -1, 2, -1 / 2, 0), (0, 1, 1, 4, 1 / 4, 0),
       (0, 1, -1, 8, -1 / 8, 1))
# both sides of a transform at once: Bᵀ d B is (Bᵀ ⊗ Bᵀ) applied to the tile as a 36-vector
# (one product with 36 terms runs far faster than two with 6), likewise Aᵀ y A
_KB = torch.kron(torch.tensor(_BT, dtype=torch.float64), torch.tensor(_BT, dtype=torch.float64))
_KA = torch.kron(torch.tensor(_AT, dtype=torch.float64), torch.tensor(_AT, dtype=torch.float64))


def applies(conv: nn.Conv2d, x: Tensor) -> bool:
    """Whether ``conv`` on ``x`` (N, C, H, W) runs by :func:`conv3x3`: a plain 3×3 convolution
    (stride 1, zero padding 1, no dilation or groups) on a float32 CPU map of at most
    :data:`MAX_PIXELS` positions, sides multiples of :data:`TILE`, with at least
    :data:`MIN_CHANNELS` channels, autocast off."""
    return (x.device.type == "cpu" and x.dtype == torch.float32 and x.dim() == 4
            and not autocast_on("cpu")
            and conv.kernel_size == (3, 3) and conv.stride == (1, 1) and conv.padding == (1, 1)
            and conv.dilation == (1, 1) and conv.groups == 1 and conv.padding_mode == "zeros"
            and x.shape[1] >= MIN_CHANNELS and x.shape[2] % TILE == 0 and x.shape[3] % TILE == 0
            and x.shape[2] * x.shape[3] <= MAX_PIXELS)


def transform_weight(weight: Tensor) -> Tensor:
    """(36, C, K): ``G w Gᵀ`` of a (K, C, 3, 3) filter per input/output channel pair, position-major
    (computed in float64, returned in the weight's dtype)."""
    if weight.dim() != 4 or weight.shape[2:] != (3, 3):
        raise ValueError(f"expected a (K, C, 3, 3) filter, got shape {tuple(weight.shape)}")
    g = torch.tensor(_G, dtype=torch.float64, device=weight.device)
    u = torch.einsum("ai,kcij,bj->abck", g, weight.detach().double(), g)
    return u.reshape(36, weight.shape[1], weight.shape[0]).to(weight.dtype).contiguous()


def conv3x3(x: Tensor, u: Tensor, bias: Tensor | None = None,
            weight: Tensor | None = None) -> Tensor:
    """``F.conv2d(x, w, bias, padding=1)`` for ``u = transform_weight(w)``, up to rounding.

    ``x``: (N, C, H, W) with H and W multiples of :data:`TILE`; the result is (N, K, H, W),
    channels-last in memory.

    Where the inputs are not finite or near float32's limit, the transforms (which add up to 36
    inputs with factors up to 5/2) overflow where a direct convolution does not: an inf input
    made its whole 4×4 output tile NaN in every channel (a direct convolution: ±inf on the 3×3
    outputs it touches), and inputs of 1e38 gave NaN where a direct convolution's outputs were
    finite. So with ``weight`` (the filter ``w``) a result that is not all finite is computed
    again as ``F.conv2d(x, weight, bias, padding=1)``, the direct convolution's own numbers.
    The check is one sum over the output (its NaN or inf shows any element's), about 0.5% of
    the convolution's time; a finite sum that overflows only costs the direct convolution."""
    n, c, h, w = x.shape
    if u.shape[:2] != (36, c) or h % TILE or w % TILE:
        raise ValueError(f"conv3x3 needs (N, {u.shape[1]}, H, W) maps with H and W multiples of "
                         f"{TILE} for this filter, got {tuple(x.shape)}")
    k, a, m = u.shape[2], TILE + 2, TILE
    th, tw = h // m, w // m
    kb, ka = _KB.to(x.device, x.dtype), _KA.to(x.device, x.dtype)  # (36, 36), (16, 36)
    # 6×6 input tiles at stride 4 of the zero-padded map, channels last: (tiles, 36, C)
    padded = F.pad(x.permute(0, 2, 3, 1), (0, 0, 1, 1, 1, 1))
    d = padded.unfold(1, a, m).unfold(2, a, m).permute(0, 1, 2, 4, 5, 3)
    v = torch.matmul(kb, d.reshape(n * th * tw, a * a, c))
    # the products, summed over input channels, one matrix product per tile position
    prod = torch.bmm(v.transpose(0, 1), u)  # (36, tiles, K)
    y = (ka @ prod.view(a * a, -1)).view(m, m, n, th, tw, k).permute(2, 3, 0, 4, 1, 5)
    # laid back into the map, the bias added (in one pass, where no gradient is recorded)
    if torch.is_grad_enabled() and (y.requires_grad or (bias is not None and bias.requires_grad)):
        out = y.contiguous() if bias is None else y.contiguous() + bias
    else:
        out = x.new_empty(n, th, m, tw, m, k)
        if bias is None:
            out.copy_(y)
        else:
            torch.add(y, bias, out=out)
    out = out.view(n, h, w, k).permute(0, 3, 1, 2)
    if weight is not None and not bool(out.detach().sum().isfinite()):
        return F.conv2d(x, weight, bias, padding=1)
    return out
