"""Common corruptions generated locally, for robustness where no "-C" release exists.

``corrupt(images, name, severity, generator)`` corrupts a batch of [0, 1] images (N, C, H, W) with
one of ``list_corruptions()`` at severity 1..5; everything is plain torch (no PIL, OpenCV or
ImageMagick), vectorised over the batch, and all randomness comes from ``generator``. The dataset
wrapper ``create_dataset("corrupted", base="mnist", corruption=..., severity=..., split="test")``
loads ``base`` in [0, 1], corrupts it with ``torch.Generator().manual_seed(seed)`` and then
normalises like the base loaders (``normalize=``, default [−1, 1]).

Parameters per severity follow Hendrycks & Dietterich's CIFAR-10-C generator (ICLR 2019):

| corruption       | parameter                         | severity 1 … 5                        |
|------------------|-----------------------------------|---------------------------------------|
| gaussian_noise   | std σ of x + N(0, σ²)             | 0.04, 0.06, 0.08, 0.09, 0.10          |
| shot_noise       | photons λ: Poisson(λx)/λ          | 500, 250, 100, 75, 50                 |
| impulse_noise    | fraction of values set to 0 or 1  | 0.01, 0.02, 0.03, 0.05, 0.07          |
| speckle_noise    | std σ of x + x·N(0, σ²)           | 0.06, 0.10, 0.12, 0.16, 0.20          |
| gaussian_blur    | kernel std σ (pixels)             | 0.4, 0.6, 0.7, 0.8, 1.0               |
| defocus_blur     | (disk radius, anti-alias σ)       | (.3,.4) (.4,.5) (.5,.6) (1,.2) (1.5,.1) |
| motion_blur      | (radius, σ), angle ~ U(−45°, 45°) | (6,1) (6,1.5) (6,2) (8,2.5)* (9,3)*   |
| contrast         | factor c: (x − mean)·c + mean     | 0.75, 0.5, 0.4, 0.3, 0.15             |
| brightness       | HSV value shift v ↦ min(v + b, 1) | 0.05, 0.10, 0.15, 0.20, 0.30          |
| pixelate         | kept fraction of the side length  | 0.95, 0.90, 0.85, 0.75, 0.65          |
| jpeg_compression | JPEG quality (IJG scaling)        | 80, 65, 58, 50, 40                    |

Where we differ from that code, and why: blurs pad by repeating the edge pixel; motion blur is
ImageMagick's one-sided Gaussian streak (weights exp(−i²/2σ²), i = 0..2·radius, dropped once
below 10⁻³ of the first) with taps rounded to whole pixels; pixelate resamples down and back up
with PIL's BOX filter, reproduced exactly; JPEG is baseline JPEG written out — YCbCr, 4:2:0
chroma (bilinear up-sampling), 8×8 DCT, the standard Annex K tables scaled by quality, 8-bit
samples — without the entropy coding, which is lossless. It agrees with Pillow's JPEG up to about
a tenth of the distortion (libjpeg computes in fixed point). Glass blur, zoom blur, weather and
elastic corruptions are left out. Outputs are clipped to [0, 1] but not rounded to 8 bits (JPEG
excepted). Brightness and JPEG take grey or RGB images only (an alpha channel is refused: set it
aside and put it back); the other corruptions treat every channel alike.

Distance from the clean image grows with severity for every corruption; pixelate only roughly:
its severities differ by single pixels of resolution on small images (8×8 digits keep 7, 7, 6,
6, 5 px; 28×28 keeps 26, 25, 23, 21, 18) and its nearest-neighbour up-sampling aliases, so a
lower severity can be the farther one (digits' test split: 0.126, 0.126, 0.195, 0.195, 0.178 RMS
at severities 1..5; smooth 32×32 images: severity 2's 28 px nearer than severity 1's 30 px).
*Motion blur severities 4 and 5 use σ = 2.5, 3 instead of H&D's 2, 2.5: with ImageMagick's kernel
the radius barely matters beyond 3σ, which made their severities 3 and 4 the same blur.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from ._registry import create_dataset, register_dataset
from .base import ArrayDataset, check_severity
from .images import normalize_images
from .synthetic import _check_seed

CorruptFn = Callable[[Tensor, Any, torch.Generator], Tensor]


@dataclass(frozen=True)
class Corruption:
    """A corruption: its family, one parameter per severity 1..5, and the function applying it."""

    name: str
    family: str
    params: tuple[Any, ...]
    fn: CorruptFn


_CORRUPTIONS: dict[str, Corruption] = {}


def _corruption(family: str, *params: Any) -> Callable[[CorruptFn], CorruptFn]:
    def deco(fn: CorruptFn) -> CorruptFn:
        assert len(params) == 5, fn.__name__
        _CORRUPTIONS[fn.__name__] = Corruption(fn.__name__, family, params, fn)
        return fn

    return deco


def list_corruptions(family: str | None = None) -> list[str]:
    """Names of the corruptions, in table order; ``family`` is "noise", "blur" or "digital"
    (another is refused: a misspelt family listed nothing, and a loop over it measured
    nothing without a word)."""
    families = list(dict.fromkeys(c.family for c in _CORRUPTIONS.values()))
    if family is not None and family not in families:
        raise ValueError(f"unknown corruption family {family!r}; use one of "
                         f"{', '.join(map(repr, families))}, or None for all")
    return [c.name for c in _CORRUPTIONS.values() if family is None or c.family == family]


def corrupt(images: Tensor, name: str, severity: int, generator: torch.Generator) -> Tensor:
    """Corrupt [0, 1] images (N, C, H, W) with corruption ``name`` at ``severity`` ∈ {1..5}.

    Returns a new tensor of the same shape and dtype in [0, 1] (float16 and bfloat16 images are
    corrupted in float32, so the same seed gives them float32's output, rounded). Random draws
    (noise, blur angles) come from ``generator`` only, which must live on the images' device; the
    same seed gives the same output.
    """
    if name not in _CORRUPTIONS:
        raise ValueError(f"unknown corruption {name!r}; use one of {', '.join(_CORRUPTIONS)}")
    severity = check_severity(severity)
    if not isinstance(generator, torch.Generator):
        raise TypeError("pass generator=torch.Generator().manual_seed(seed): corruptions never "
                        "use the global random state")
    if not isinstance(images, Tensor):
        # a NumPy array (CIFAR-10-C's .npy) was told to add axes with unsqueeze, which it lacks
        shape = getattr(images, "shape", None)
        raise TypeError(f"corrupt expects a torch tensor (N, C, H, W), got "
                        f"{type(images).__module__}.{type(images).__name__}"
                        f"{f' of shape {tuple(shape)}' if shape is not None else ''}; convert it "
                        "with torch.as_tensor(x) (uint8 (N, H, W, C) arrays, as CIFAR-10-C's .npy "
                        "files: torch.from_numpy(x).permute(0, 3, 1, 2).float() / 255)")
    if images.dim() != 4:
        shape, dim = tuple(images.shape), images.dim()
        if dim == 2:
            # the (N, H, W) hint below, followed twice, made one grey image (H, W) H one-row
            # images (H, 1, 1, W), blurred and pixelated row by row without a word
            hint = "one grayscale image (H, W) becomes a batch of one with x[None, None]"
        elif dim > 4:
            hint = "for frames (N, T, C, H, W) pass x.flatten(0, 1)"
        else:
            # x.unsqueeze(1) alone made one RGB image (3, H, W) three grey ones: brightness and
            # JPEG then treated its channels apart, and each channel drew its own blur angle
            hint = ("add a channel axis with x.unsqueeze(1) for a batch of grayscale images "
                    "(N, H, W), or a batch axis with x.unsqueeze(0) for one image (C, H, W)")
        raise ValueError(f"corrupt expects a float tensor (N, C, H, W), got {shape}; {hint}")
    if images.shape[1] not in (1, 3, 4) and images.shape[-1] in (1, 3, 4):
        # (N, H, W, C), as CIFAR-10-C's .npy files, PIL and NumPy hold images, ran without a
        # word: rows were read as channels, so blurs mixed colours and brightness took the
        # brightest row
        raise ValueError(f"corrupt expects images (N, C, H, W), got {tuple(images.shape)}, "
                         "which is channels-last (N, H, W, C); pass images.permute(0, 3, 1, 2)")
    if not images.is_floating_point():  # the shape is right: the channel hint would mislead
        bool_hint = (" (bool images: images.float() alone, as / 255 would make them nearly "
                     "black)" if images.dtype == torch.bool else "")
        raise ValueError(f"corrupt expects float pixels in [0, 1], got {images.dtype} images; "
                         f"convert 8-bit pixels with images.float() / 255{bool_hint}")
    if images.numel() and not bool(images.isfinite().all()):  # NaN passes the range check
        # an inf pixel was told to load with normalize='none', as if the images were normalised
        raise ValueError("corrupt got images with NaN or infinite pixels, which every "
                         "corruption would spread (over a whole channel for contrast); replace "
                         "or drop them first, e.g. images.nan_to_num(0.0, posinf=1.0, "
                         "neginf=0.0)")
    if images.numel() and (images.min() < -1e-6 or images.max() > 1 + 1e-6):
        lo, hi = float(images.min()), float(images.max())
        if lo >= 0 and hi > 2:
            # 0..255 floats (CIFAR-10-C's uint8 .npy after .float()) were told to load with
            # normalize='none' or to denormalize: neither applies to them
            hint = ("these look like integer pixel values held as floats: divide by the "
                    "format's maximum, images / 255 for 8-bit pixels")
        else:
            # a bicubic or antialiased resize carries binary digits to about [-0.3, 1.35]
            hint = ("normalised images: load with normalize='none' or map them back with "
                    "senslab.data.images.denormalize(x, dataset.meta); values a bicubic or "
                    "antialiased resize carried past 0 or 1: images.clamp(0, 1)")
        raise ValueError(f"corrupt expects pixels in [0, 1], got values in [{lo:.4g}, "
                         f"{hi:.4g}]; {hint}")
    c = _CORRUPTIONS[name]
    x = images.clamp(0, 1)
    if x.dtype in (torch.float16, torch.bfloat16):
        # computed in float32, returned in the images' dtype: bfloat16's rand() comes in steps
        # of 2⁻⁸, so impulse noise hit 1.23% of the values at severity 1 instead of 1%
        x = x.float()
    return c.fn(x, c.params[severity - 1], generator).clamp_(0, 1).to(images.dtype)


def _check_grey_or_rgb(x: Tensor, name: str, what: str) -> None:
    """Refuse channels other than 1 (grey) or 3 (RGB), naming how to set an alpha channel aside."""
    c = x.shape[1]
    if c in (1, 3):
        return
    if c in (2, 4):
        keep = "images[:, :1]" if c == 2 else "images[:, :3]"
        fix = (f"for {'grey' if c == 2 else 'RGB'} + alpha images corrupt {keep} and put the "
               f"alpha back, torch.cat([corrupted, images[:, {c - 1}:]], 1)")
    else:
        fix = "pass the grey or RGB channels only"
    raise ValueError(f"{name} {what}, so it needs 1 (grey) or 3 (RGB) channels, got {c}; {fix}")


def _randn(x: Tensor, g: torch.Generator) -> Tensor:
    return torch.randn(x.shape, generator=g, device=x.device, dtype=x.dtype)


def _rand(x: Tensor, g: torch.Generator) -> Tensor:
    return torch.rand(x.shape, generator=g, device=x.device, dtype=x.dtype)


# ---------------------------------------------------------------- noise


@_corruption("noise", 0.04, 0.06, 0.08, 0.09, 0.10)
def gaussian_noise(x: Tensor, sigma: float, g: torch.Generator) -> Tensor:
    return x + sigma * _randn(x, g)


@_corruption("noise", 500, 250, 100, 75, 50)
def shot_noise(x: Tensor, lam: float, g: torch.Generator) -> Tensor:
    # photon counting: a pixel of intensity x collects Poisson(λx) photons
    return torch.poisson(x * lam, generator=g) / lam


@_corruption("noise", 0.01, 0.02, 0.03, 0.05, 0.07)
def impulse_noise(x: Tensor, amount: float, g: torch.Generator) -> Tensor:
    # salt-and-pepper on each value independently, half salt (1) and half pepper (0)
    hit, salt = _rand(x, g) < amount, _rand(x, g) < 0.5
    return torch.where(hit, salt.to(x.dtype), x)


@_corruption("noise", 0.06, 0.10, 0.12, 0.16, 0.20)
def speckle_noise(x: Tensor, sigma: float, g: torch.Generator) -> Tensor:
    return x + x * sigma * _randn(x, g)


# ---------------------------------------------------------------- blur


def _filter(x: Tensor, kernel: Tensor) -> Tensor:
    """Correlate every channel with the odd-sized 2-D ``kernel``, edges padded by replication."""
    kh, kw = kernel.shape
    c = x.shape[1]
    padded = F.pad(x, (kw // 2, kw // 2, kh // 2, kh // 2), mode="replicate")
    weight = kernel.to(x).expand(c, 1, kh, kw)
    return F.conv2d(padded, weight, groups=c)


def _gauss1d(sigma: float, radius: int) -> Tensor:
    i = torch.arange(-radius, radius + 1, dtype=torch.float64)
    w = torch.exp(-(i**2) / (2 * sigma**2))
    return w / w.sum()


@_corruption("blur", 0.4, 0.6, 0.7, 0.8, 1.0)
def gaussian_blur(x: Tensor, sigma: float, g: torch.Generator) -> Tensor:
    w = _gauss1d(sigma, int(4 * sigma + 0.5))  # truncated at 4σ, like scipy's gaussian_filter
    return _filter(_filter(x, w.view(1, -1)), w.view(-1, 1))


@_corruption("blur", (0.3, 0.4), (0.4, 0.5), (0.5, 0.6), (1.0, 0.2), (1.5, 0.1))
def defocus_blur(x: Tensor, p: tuple[float, float], g: torch.Generator) -> Tensor:
    radius, alias = p
    r = math.ceil(radius) + 1  # one spare ring so the anti-alias blur can spread into it
    i = torch.arange(-r, r + 1, dtype=torch.float64)
    disk = ((i.view(-1, 1) ** 2 + i.view(1, -1) ** 2) <= radius**2).to(torch.float64)
    w = _gauss1d(alias, 1)  # a 3×3 Gaussian smooths the disk's jagged rim
    kernel = F.conv2d(disk.view(1, 1, *disk.shape), (w.view(-1, 1) * w.view(1, -1))[None, None],
                      padding=1)[0, 0]
    return _filter(x, kernel / kernel.sum())


@_corruption("blur", (6, 1.0), (6, 1.5), (6, 2.0), (8, 2.5), (9, 3.0))
def motion_blur(x: Tensor, p: tuple[int, float], g: torch.Generator) -> Tensor:
    radius, sigma = p
    n, _, h, w = x.shape
    taps = torch.arange(2 * radius + 1, dtype=torch.float64)
    weight = torch.exp(-(taps**2) / (2 * sigma**2))
    keep = weight >= 1e-3  # the far tail adds nothing visible but costs a pass each
    taps, weight = taps[keep], (weight[keep] / weight[keep].sum()).to(x)
    angle = torch.rand(n, generator=g, device=x.device, dtype=torch.float64)
    angle = torch.deg2rad(angle * 90 - 45).cpu()
    dy = torch.round(taps.view(1, -1) * torch.sin(angle).view(-1, 1)).long()  # (N, taps)
    dx = torch.round(taps.view(1, -1) * torch.cos(angle).view(-1, 1)).long()
    pad = int(taps.max())
    xp = F.pad(x, (pad, pad, pad, pad), mode="replicate")
    rows = torch.arange(h).view(1, 1, h) + pad + dy.unsqueeze(-1)  # (N, taps, H)
    cols = torch.arange(w).view(1, 1, w) + pad + dx.unsqueeze(-1)  # (N, taps, W)
    batch = torch.arange(n).view(n, 1, 1)
    out = torch.zeros_like(x)
    for t in range(len(taps)):  # each tap: the image shifted along its own streak direction
        r, c = rows[:, t].to(x.device), cols[:, t].to(x.device)
        shifted = xp[batch.to(x.device), :, r.unsqueeze(-1), c.unsqueeze(1)]  # (N, H, W, C)
        out += weight[t] * shifted.permute(0, 3, 1, 2)
    return out


# ---------------------------------------------------------------- digital


@_corruption("digital", 0.75, 0.5, 0.4, 0.3, 0.15)
def contrast(x: Tensor, c: float, g: torch.Generator) -> Tensor:
    mean = x.mean(dim=(2, 3), keepdim=True)  # per image and channel
    return (x - mean) * c + mean


@_corruption("digital", 0.05, 0.10, 0.15, 0.20, 0.30)
def brightness(x: Tensor, b: float, g: torch.Generator) -> Tensor:
    # an alpha channel (RGBA, grey + alpha) is a channel too: an opaque one was the brightest,
    # so v = 1 and no severity brightened anything, without a word
    _check_grey_or_rgb(x, "brightness", "shifts HSV's value (the brightest of R, G and B)")
    # HSV value = max over channels; with hue and saturation fixed every channel is proportional
    # to it, so raising v to min(v + b, 1) scales the pixel by that ratio (black becomes grey b).
    v = x.amax(dim=1, keepdim=True)
    v_new = (v + b).clamp(max=1.0)
    # x / v (in [0, 1]) first: v_new / v overflowed float16 below v ≈ 5e-6 (a dark pixel came
    # out white, its zero channels NaN), and a clamp of v at 1e-12 darkened smaller values
    ratio = x / torch.where(v > 0, v, torch.ones_like(v))
    return torch.where(v > 0, ratio * v_new, v_new.expand_as(x))


def _box_matrix(n_in: int, n_out: int) -> Tensor:
    """PIL's BOX resampling as an (n_out, n_in) matrix: output pixel i averages the input pixels
    whose centres fall inside its footprint [i·s, (i+1)·s), s = n_in/n_out (when up-sampling,
    the one input pixel under its centre)."""
    scale = n_in / n_out
    width = max(scale, 1.0)
    centre = ((torch.arange(n_out, dtype=torch.float64) + 0.5) * scale).view(-1, 1)
    j = torch.arange(n_in, dtype=torch.float64).view(1, -1)
    lo = (centre - width / 2 + 0.5).floor().clamp(min=0)  # PIL's integer window bounds
    hi = (centre + width / 2 + 0.5).floor().clamp(max=n_in)
    arg = (j + 0.5 - centre) / width
    # (−½, ½], as PIL: with [−½, ½) a centre on a whole input coordinate lost its only pixel,
    # and the empty row divided 0 by 0 (NaN pixels on 7×7, 15×15, … images)
    w = ((arg > -0.5) & (arg <= 0.5) & (j >= lo) & (j < hi)).to(torch.float64)
    return w / w.sum(dim=1, keepdim=True)


@_corruption("digital", 0.95, 0.90, 0.85, 0.75, 0.65)
def pixelate(x: Tensor, c: float, g: torch.Generator) -> Tensor:
    h, w = x.shape[-2:]
    hs, ws = max(1, int(h * c)), max(1, int(w * c))
    down_h, down_w = _box_matrix(h, hs).to(x), _box_matrix(w, ws).to(x)
    up_h, up_w = _box_matrix(hs, h).to(x), _box_matrix(ws, w).to(x)
    return up_h @ (down_h @ x @ down_w.T) @ up_w.T


_LUMA = (16, 11, 10, 16, 24, 40, 51, 61, 12, 12, 14, 19, 26, 58, 60, 55,
         14, 13, 16, 24, 40, 57, 69, 56, 14, 17, 22, 29, 51, 87, 80, 62,
         18, 22, 37, 56, 68, 109, 103, 77, 24, 35, 55, 64, 81, 104, 113, 92,
         49, 64, 78, 87, 103, 121, 120, 101, 72, 92, 95, 98, 112, 100, 103, 99)
_CHROMA = (17, 18, 24, 47, 99, 99, 99, 99, 18, 21, 26, 66, 99, 99, 99, 99,
           24, 26, 56, 99, 99, 99, 99, 99, 47, 66, 99, 99, 99, 99, 99, 99) + (99,) * 32


def _quant_table(base: tuple[int, ...], quality: int) -> Tensor:
    """The IJG quality scaling of a JPEG Annex K table: 5000/q % below 50, 200 − 2q % above."""
    scale = 5000 / quality if quality < 50 else 200 - 2 * quality
    t = torch.tensor(base, dtype=torch.float64).view(8, 8)
    return torch.floor((t * scale + 50) / 100).clamp(1, 255)


def _dct8() -> Tensor:
    """Orthonormal 8-point DCT-II matrix D (coefficients = D · block · Dᵀ)."""
    k, n = torch.arange(8.0).view(-1, 1), torch.arange(8.0).view(1, -1)
    d = torch.cos(math.pi * (2 * n + 1) * k / 16) * math.sqrt(2 / 8)
    d[0] = math.sqrt(1 / 8)
    return d.to(torch.float64)


def _jpeg_plane(p: Tensor, table: Tensor) -> Tensor:
    """Quantise one plane (N, 1, H, W) of 0..255 values in 8×8 DCT blocks; decode to 8 bits."""
    h, w = p.shape[-2:]
    p = F.pad(p, (0, -w % 8, 0, -h % 8), mode="replicate")
    n, _, hp, wp = p.shape
    d, q = _dct8().to(p), table.to(p)
    blocks = (p - 128).view(n, hp // 8, 8, wp // 8, 8).transpose(2, 3)
    coef = torch.round((d @ blocks @ d.T) / q) * q
    out = (d.T @ coef @ d).transpose(2, 3).reshape(n, 1, hp, wp) + 128
    return torch.round(out[..., :h, :w]).clamp(0, 255)


@_corruption("digital", 80, 65, 58, 50, 40)
def jpeg_compression(x: Tensor, quality: int, g: torch.Generator) -> Tensor:
    c = x.shape[1]
    _check_grey_or_rgb(x, "jpeg_compression", "codes grey or YCbCr planes")
    v = torch.round(x.double() * 255)  # JPEG encodes 8-bit samples
    luma_q, chroma_q = _quant_table(_LUMA, quality), _quant_table(_CHROMA, quality)
    if c == 1:
        out = _jpeg_plane(v, luma_q)
    else:
        r, gr, b = v[:, 0:1], v[:, 1:2], v[:, 2:3]
        y = 0.299 * r + 0.587 * gr + 0.114 * b  # JFIF's full-range YCbCr
        cb = 128 - 0.168736 * r - 0.331264 * gr + 0.5 * b
        cr = 128 + 0.5 * r - 0.418688 * gr - 0.081312 * b
        y, cb, cr = (torch.round(t).clamp(0, 255) for t in (y, cb, cr))  # 8-bit samples
        h, w = v.shape[-2:]
        y = _jpeg_plane(y, luma_q)
        chroma = []
        for ch in (cb, cr):  # 4:2:0: chroma kept at half resolution, as common encoders do
            half = F.avg_pool2d(F.pad(ch, (0, w % 2, 0, h % 2), mode="replicate"), 2)
            up = F.interpolate(_jpeg_plane(torch.round(half), chroma_q), scale_factor=2,
                               mode="bilinear", align_corners=False)  # libjpeg's "fancy" filter
            chroma.append(torch.round(up[..., :h, :w]) - 128)
        cb, cr = chroma
        out = torch.cat([y + 1.402 * cr, y - 0.344136 * cb - 0.714136 * cr, y + 1.772 * cb], 1)
    return (torch.round(out).clamp(0, 255) / 255).to(x.dtype)


# ---------------------------------------------------------------- dataset wrapper


@register_dataset("corrupted")
def corrupted(split: str = "train", base: str | None = None, corruption: str | None = None,
              severity: int | None = None, seed: int = 0, normalize: str = "minus_one_one",
              base_seed: int | None = None, **base_options: Any) -> ArrayDataset:
    """Dataset ``base`` (e.g. "mnist", "digits", "fashion_mnist") with a corruption applied.

    The base split is loaded in [0, 1], corrupted as one batch with
    ``torch.Generator().manual_seed(seed)`` and normalised by ``normalize`` with the base dataset's
    statistics. Other keywords (``root``, ``download``, ``digits``…) go to the base loader.
    ``seed`` is the corruption's; a base whose split is drawn with a seed of its own (digits)
    takes that one as ``base_seed`` — the seed the model's training split was drawn with, or its
    test images are not the ones it never saw (default: the base loader's own default).
    """
    # torch's raw "manual_seed expected a long" named neither the option nor the fix
    seed = _check_seed(seed, name="corrupted")
    if base_seed is not None:
        base_options = dict(base_options, seed=base_seed)
    if base is None or base in ("corrupted", "cifar10c"):
        raise ValueError(f"pass base=<image dataset>, e.g. base='mnist' (got {base!r}); "
                         "CIFAR-10 has the official release: create_dataset('cifar10c', ...)")
    if corruption not in _CORRUPTIONS:  # checked before the (slow) load
        raise ValueError(f"unknown corruption {corruption!r}; use one of "
                         f"{', '.join(_CORRUPTIONS)}")
    # as the name: before a load (or a download) it would waste; recorded as an int, as
    # cifar10c records it (NumPy's int64 went into meta, where json.dumps failed on it)
    severity = check_severity(severity)
    ds = create_dataset(base, split=split, normalize="none", **base_options)
    if not isinstance(ds.inputs, Tensor) or ds.inputs.dim() != 4:
        raise ValueError(f"base {base!r} is not an image dataset (N, C, H, W)")
    g = torch.Generator().manual_seed(seed)
    x = corrupt(ds.inputs, corruption, severity, g)  # type: ignore[arg-type]
    stats = (tuple(ds.meta["pixel_mean"]), tuple(ds.meta["pixel_std"]))
    x, (mean, std) = normalize_images(x, normalize, stats)
    meta = dict(ds.meta, normalize=normalize, mean=mean, std=std, base=base,
                corruption=corruption, severity=severity, seed=seed)
    return ArrayDataset(x, ds.targets, ds.num_classes, f"{base}-{corruption}-{severity}", meta)
