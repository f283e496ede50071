"""Local reuse for convolutional networks (``senslab.tokens.Patches``): noise on one patch changes
only a window of each early feature map, so a perturbed copy is computed on that window — read
from the clean maps where it borders unchanged positions — instead of on the whole map.

A perturbed map is a :class:`Window`: the clean maps of the examples, and per copy the values of a
window (same size for every copy) holding every position that differs from the clean map. A
convolution or a pooling (:func:`local`) maps it to the window of its output that holds every
changed output position; the window is clamped into the map, so near a border it also covers
unchanged positions, which come out equal to the clean ones. Only eval-mode layers whose output
at a position depends on a bounded neighbourhood of the input (convolutions, pooling, BatchNorm
with running statistics, pointwise functions) may be evaluated this way.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import Tensor, nn


@dataclass
class Window:
    """``clean``: (E, C, H, W) clean maps; ``rows``: (n,) each copy's row of ``clean``;
    ``data``: (n, C, h, w) the copies' values on rows ``top``..``top + h`` and columns
    ``left``..``left + w`` ((n,) each); outside it every copy equals its clean map.

    ``store`` keeps ``clean`` zero-padded and laid out one position per row (channels last), per
    padding width, so that reads gather whole rows; share one store per clean map across calls
    (a model's ``local_cache``) and the layout is made once, not once per chunk."""

    clean: Tensor
    rows: Tensor
    data: Tensor
    top: Tensor
    left: Tensor
    store: dict[int, Tensor] = field(default_factory=dict)

    def like(self, clean: Tensor, data: Tensor, top: Tensor, left: Tensor,
             store: dict[int, Tensor] | None = None) -> Window:
        """Another map of the same copies (``store``: that map's, as in :class:`Window`)."""
        return Window(clean, self.rows, data, top, left, {} if store is None else store)

    def source(self, pad: int) -> Tensor:
        """(E·(H + 2·pad)·(W + 2·pad), C): ``clean`` zero-padded by ``pad``, a row per position."""
        src = self.store.get(pad)
        if src is None:
            clean = F.pad(self.clean, (pad, pad, pad, pad)) if pad else self.clean
            src = clean.permute(0, 2, 3, 1).reshape(-1, clean.shape[1])
            self.store[pad] = src
        return src


def read(win: Window, top: Tensor, left: Tensor, h: int, w: int, pad: int = 0) -> Tensor:
    """(n, C, h, w), channels-last in memory: each copy's perturbed map on rows
    ``top``..``top + h``, columns ``left``..``left + w``; the region may reach ``pad`` positions
    beyond the map (zeros there, as a convolution's zero padding)."""
    src = win.source(pad)
    n, dev = len(win.rows), win.data.device
    channels, (height, width) = win.clean.shape[1], win.clean.shape[2:]
    r = (top + pad)[:, None] + torch.arange(h, device=dev)
    c = (left + pad)[:, None] + torch.arange(w, device=dev)
    at = (win.rows[:, None, None] * (height + 2 * pad) + r[:, :, None]) * (width + 2 * pad)
    # one row per region position, and a spare last row that takes the window's positions
    # outside the region (dropped afterwards)
    out = torch.empty(n * h * w + 1, channels, dtype=src.dtype, device=dev)
    torch.index_select(src, 0, (at + c[:, None, :]).reshape(-1), out=out[:-1])
    wh, ww = win.data.shape[2:]
    dr = (win.top - top)[:, None] + torch.arange(wh, device=dev)
    dc = (win.left - left)[:, None] + torch.arange(ww, device=dev)
    inside = ((dr >= 0) & (dr < h))[:, :, None] & ((dc >= 0) & (dc < w))[:, None, :]
    to = (torch.arange(n, device=dev)[:, None, None] * h + dr[:, :, None]) * w + dc[:, None, :]
    to = torch.where(inside, to, n * h * w)
    out[to.reshape(-1)] = win.data.permute(0, 2, 3, 1).reshape(-1, channels).to(out.dtype)
    return out[:-1].view(n, h, w, channels).permute(0, 3, 1, 2)


def _square(v: int | tuple[int, ...]) -> int | None:
    """A per-axis setting (an int or an (h, w) pair) as one int, None if the axes differ."""
    if isinstance(v, int):
        return v
    return int(v[0]) if len(v) == 2 and v[0] == v[1] else None


def _parts(layer: nn.Module) -> tuple[nn.Module, nn.Module | None, int, int, int]:
    """(operation, BatchNorm or None, kernel, stride, padding) of a square-kernel ``nn.Conv2d``,
    a Sequential of one and a BatchNorm, or an unpadded ``nn.MaxPool2d``/``nn.AvgPool2d``.

    Anything else is refused rather than windowed as one of these: a window of it would hold
    another layer's values (a third layer of a Sequential, or a norm over the whole map, simply
    skipped or computed over the window alone; a non-zero padding mode read as zeros; one axis
    of a non-square pooling used for both)."""
    norm = None
    if isinstance(layer, nn.Sequential):
        if len(layer) != 2 or not isinstance(layer[1], nn.BatchNorm2d):
            raise ValueError(
                f"local reuse windows a Sequential only as (nn.Conv2d, nn.BatchNorm2d), got "
                f"{layer}; any other layer in it would be skipped or computed on the window "
                f"alone. Window the convolution by itself with local(seq[0], win) and apply the "
                f"pointwise layers that follow (activations, an eval-mode BatchNorm2d) to the "
                f"window it returns")
        layer, norm = layer[0], layer[1]
    if isinstance(layer, nn.Conv2d):
        k, s, p = (_square(v) if not isinstance(v, str) else None
                   for v in (layer.kernel_size, layer.stride, layer.padding))
        if k is None or s is None or p is None or _square(layer.dilation) != 1:
            raise ValueError(f"local reuse needs square, undilated convolutions with numeric "
                             f"padding, got {layer}")
        if p and layer.padding_mode != "zeros":
            raise ValueError(
                f"local reuse reads a convolution's padding as zeros, but {layer} pads with "
                f"padding_mode={layer.padding_mode!r}: its border outputs would be wrong. "
                f"Measure with Patches(p, reuse_local=False)")
        if type(layer).forward is not nn.Conv2d.forward:
            raise ValueError(
                f"local reuse runs a convolution as F.conv2d with its weight, but "
                f"{type(layer).__name__} has a forward of its own (a weight standardisation, "
                f"say) that the window would skip. Measure with Patches(p, reuse_local=False)")
        return layer, norm, k, s, p
    if isinstance(layer, (nn.MaxPool2d, nn.AvgPool2d)):
        k, s, p = (_square(v) for v in (layer.kernel_size, layer.stride or layer.kernel_size,
                                        layer.padding))
        if k is None or s is None or p is None:
            raise ValueError(f"local reuse needs square pooling (the same kernel, stride and "
                             f"padding on both axes), got {layer}")
        if p or layer.ceil_mode or _square(getattr(layer, "dilation", 1)) != 1:
            raise ValueError(f"local reuse needs unpadded pooling without ceil_mode, got {layer}")
        return layer, norm, k, s, 0
    raise TypeError(f"local reuse cannot window a {type(layer).__name__}")


def out_size(layer: nn.Module, h: int, size: int) -> tuple[int, int]:
    """(window, map) sizes along one axis of ``layer``'s output, for an input window of ``h``
    on a map of ``size``."""
    _, _, k, s, p = _parts(layer)
    full = (size + 2 * p - k) // s + 1
    return min(full, (h + k - 2) // s + 1), full


def fold(layer: nn.Module) -> tuple[Tensor, Tensor] | None:
    """(weight, bias) of one convolution equal to ``layer`` = Sequential(``nn.Conv2d``,
    ``nn.BatchNorm2d`` in eval mode with running statistics): the BatchNorm's scale and shift
    folded into the convolution, so a window costs one pass instead of two (equal up to float
    rounding). None for any other layer, or a BatchNorm that would use batch statistics."""
    if not (isinstance(layer, nn.Sequential) and len(layer) == 2
            and isinstance(layer[0], nn.Conv2d) and isinstance(layer[1], nn.BatchNorm2d)):
        return None
    conv, norm = layer[0], layer[1]
    if norm.training or norm.running_mean is None or norm.running_var is None:
        return None
    with torch.no_grad():
        scale = torch.rsqrt(norm.running_var + norm.eps)
        if norm.weight is not None:
            scale = scale * norm.weight
        shift = -norm.running_mean * scale
        if norm.bias is not None:
            shift = shift + norm.bias
        if conv.bias is not None:
            shift = shift + conv.bias * scale
        weight = conv.weight * scale.to(conv.weight.dtype).view(-1, 1, 1, 1)
    return weight, shift.to(conv.weight.dtype)


def local(layer: nn.Module, win: Window,
          at: tuple[Tensor, Tensor, int, int] | None = None,
          folded: tuple[Tensor, Tensor] | None = None) -> tuple[Tensor, Tensor, Tensor]:
    """``layer`` (a square-kernel ``nn.Conv2d``, a Sequential of one and a BatchNorm, or an
    unpadded max/average pool) on the perturbed maps ``win``: the values, top and left of its
    output window — the smallest holding every changed output position, clamped into the map —
    or of the window ``at`` = (top, left, h, w) given. ``folded``: :func:`fold`'s convolution
    for ``layer``, run in its place."""
    op, norm, k, s, p = _parts(layer)
    size_h, size_w = win.clean.shape[2:]
    if at is None:
        (ho, full_h), (wo, full_w) = (out_size(layer, win.data.shape[2], size_h),
                                      out_size(layer, win.data.shape[3], size_w))

        def first(start: Tensor, span: int, full: int) -> Tensor:
            # first output whose receptive field reaches the window: ⌈(start + p − k + 1) / s⌉
            lo = -torch.div(-(start + p - k + 1), s, rounding_mode="floor")
            return lo.clamp(min=0).clamp(max=full - span)

        top, left = first(win.top, ho, full_h), first(win.left, wo, full_w)
    else:
        top, left, ho, wo = at
    crop = read(win, top * s - p, left * s - p, (ho - 1) * s + k, (wo - 1) * s + k, p)
    if folded is not None:
        return F.conv2d(crop, folded[0], folded[1], s, 0, 1, op.groups), top, left
    if norm is not None and (norm.training or norm.running_mean is None
                             or norm.running_var is None):
        # a BatchNorm that normalises by batch statistics would take them over the windows,
        # not the whole maps of the batch: another layer's numbers
        raise ValueError(
            f"local reuse needs a BatchNorm2d that normalises by running statistics (eval "
            f"mode, track_running_stats=True), got {norm} in {'train' if norm.training else 'eval'}"
            f" mode: a window's batch statistics are not the full map's. Call model.eval(), or "
            f"measure with Patches(p, reuse_local=False)")
    if isinstance(op, nn.Conv2d):
        y = F.conv2d(crop, op.weight, op.bias, s, 0, 1, op.groups)
    else:  # the crop holds whole pooling cells, so pooling it is pooling the map
        y = op(crop)
    return (norm(y) if norm is not None else y), top, left
