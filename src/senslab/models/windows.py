"""Local reuse for convolutional networks (``senslab.tokens.Patches``): noise on one patch changes
only a window of each early feature map, so a perturbed copy is computed on that window — read
from the clean maps where it borders unchanged positions — instead of on the whole map.

A perturbed map is a :class:`Window`: the clean maps of the examples, and per copy the values of a
window (same size for every copy) holding every position that differs from the clean map. A
convolution maps it to the window of its output that holds every changed output position; the
window is clamped into the map, so near a border it also covers unchanged positions, which come out
equal to the clean ones. Only eval-mode layers whose output at a position depends on a bounded
neighbourhood of the input (convolutions, BatchNorm with running statistics, pointwise functions)
may be evaluated this way.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn


@dataclass
class Window:
    """``clean``: (E, C, H, W) clean maps; ``rows``: (n,) each copy's row of ``clean``;
    ``data``: (n, C, h, w) the copies' values on rows ``top``..``top + h`` and columns
    ``left``..``left + w`` ((n,) each); outside it every copy equals its clean map."""

    clean: Tensor
    rows: Tensor
    data: Tensor
    top: Tensor
    left: Tensor

    def like(self, clean: Tensor, data: Tensor, top: Tensor, left: Tensor) -> Window:
        """Another map of the same copies."""
        return Window(clean, self.rows, data, top, left)


def read(win: Window, top: Tensor, left: Tensor, h: int, w: int, pad: int = 0) -> Tensor:
    """(n, C, h, w): each copy's perturbed map on rows ``top``..``top + h``, columns
    ``left``..``left + w``; the region may reach ``pad`` positions beyond the map (zeros there, as
    a convolution's zero padding)."""
    clean = F.pad(win.clean, (pad, pad, pad, pad)) if pad else win.clean
    n, dev = len(win.rows), win.data.device
    r = (top + pad)[:, None] + torch.arange(h, device=dev)
    c = (left + pad)[:, None] + torch.arange(w, device=dev)
    out = clean[win.rows[:, None, None], :, r[:, :, None], c[:, None, :]]  # (n, h, w, C)
    # paste the window where it overlaps the region; its rows and columns outside the region go
    # to a spare row and column, dropped afterwards
    out = F.pad(out, (0, 0, 0, 1, 0, 1))
    wh, ww = win.data.shape[2:]
    dr = (win.top - top)[:, None] + torch.arange(wh, device=dev)
    dc = (win.left - left)[:, None] + torch.arange(ww, device=dev)
    dr = torch.where((dr >= 0) & (dr < h), dr, h)
    dc = torch.where((dc >= 0) & (dc < w), dc, w)
    out[torch.arange(n, device=dev)[:, None, None], dr[:, :, None], dc[:, None, :]] = (
        win.data.permute(0, 2, 3, 1).to(out.dtype))
    return out[:, :h, :w].permute(0, 3, 1, 2)


def _conv(layer: nn.Module) -> tuple[nn.Conv2d, nn.Module | None]:
    """A convolution, or a Sequential of a convolution and a BatchNorm."""
    if isinstance(layer, nn.Conv2d):
        return layer, None
    conv, norm = layer[0], layer[1]  # type: ignore[index]
    return conv, norm


def out_size(layer: nn.Module, h: int, size: int) -> tuple[int, int]:
    """(window, map) sizes along one axis of ``layer``'s output, for an input window of ``h``
    on a map of ``size``."""
    conv, _ = _conv(layer)
    k, s, p = conv.kernel_size[0], conv.stride[0], conv.padding[0]  # type: ignore[index]
    full = (size + 2 * p - k) // s + 1
    return min(full, (h + k - 2) // s + 1), full


def conv(layer: nn.Module, win: Window,
         at: tuple[Tensor, Tensor, int, int] | None = None) -> tuple[Tensor, Tensor, Tensor]:
    """``layer`` (a square-kernel ``nn.Conv2d``, or a Sequential of one and a BatchNorm) on the
    perturbed maps ``win``: the values, top and left of its output window — the smallest holding
    every changed output position, clamped into the map — or of the window ``at`` = (top, left,
    h, w) given."""
    c, norm = _conv(layer)
    k, s, p = c.kernel_size[0], c.stride[0], c.padding[0]  # type: ignore[index]
    if c.kernel_size[0] != c.kernel_size[1] or c.stride[0] != c.stride[1] or c.dilation != (1, 1):
        raise ValueError(f"local reuse needs square, undilated convolutions, got {c}")
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
    y = F.conv2d(crop, c.weight, c.bias, s, 0, 1, c.groups)
    return (norm(y) if norm is not None else y), top, left
