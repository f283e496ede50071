"""Image patches and plain vector sequences as tokens."""

from __future__ import annotations

import math
import numbers
import warnings
from collections.abc import Iterator, Mapping
from collections.abc import Sequence as Seq
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Literal

import torch
from torch import Tensor, nn

from .._exclusive import forward_hooks
from .._stack import user_level
from ._grid import (
    AUTOCAST_FIX,
    LOW_PRECISION,
    MODEL_CAST_FIX,
    GridCheck,
    autocast_grid,
    first_layer_grid,
    model_grid,
)
from .base import (
    BoundTokens,
    DtypeClash,
    Inputs,
    OutputSelector,
    Tokenization,
    call_model,
    check_floating,
    clean_forward,
    model_dtype,
    per_example,
    real_tokens,
    select_output,
    valid_mask,
)

#: entries of a dict input that are targets, not model inputs: dropped (as the Hugging Face
#: callback drops them from a Trainer batch); the outputs are compared, not a loss
TARGETS = ("labels", "label", "label_ids")
#: a dict input's mask of real pixels (DETR-style padding: images padded to one size, the
#: entry (B, H, W) is 1 on the real pixels, 0 on the padding), which Hugging Face's detection
#: and segmentation models take
PIXEL_MASK = "pixel_mask"
#: local reuse makes the clean maps of at least this many examples in one call: a chunk's own
#: and, where it has fewer, the examples after its last (the copies come example-major, so the
#: next chunks read them). One image's maps at a time ran at batch-1 speed and repeated the
#: model's per-call work (BatchNorms folded into ResNet-18's convolutions: 23 ms an image
#: against 9 ms eight at a time)
LOCAL_AHEAD = 8


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def processor_normalization(processor: Any) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """(mean, std) that a Hugging Face image processor normalises [0, 1] pixels with: its
    ``image_mean``/``image_std`` (numbers or per-channel sequences), or (0,), (1,) where it does
    not normalise (``do_normalize=False``: its ``image_std`` is a default it never applies). A
    processor that rescales by another factor than 1/255 is refused: its inputs are no [0, 1]
    pixels."""
    name = type(processor).__name__
    if getattr(processor, "do_rescale", False) is True:
        factor = getattr(processor, "rescale_factor", 1 / 255)
        # numbers.Real: a NumPy float32 1/255 was said to be another factor than 1/255
        if not isinstance(factor, numbers.Real) or not math.isclose(factor, 1 / 255,
                                                                    rel_tol=1e-6):
            raise ValueError(
                f"image_processor {name} rescales pixels by {factor!r}, not 1/255, so its "
                "inputs are no [0, 1] pixels and σ in pixel space has no fixed scale: pass "
                "std= (and mean=) of the model's input per unit of the pixels you mean")
    if getattr(processor, "do_normalize", True) is False:
        return (0.0,), (1.0,)
    std = _channels(getattr(processor, "image_std", None), "image_std")
    if std is None:
        raise ValueError(
            f"image_processor {name} has no image_std; pass std= (the per-channel std the "
            "model's inputs were normalised with)")
    mean = _channels(getattr(processor, "image_mean", None), "image_mean") or (0.0,)
    return mean, std


def _channels(value: Any, what: str) -> tuple[float, ...] | None:
    """A per-channel constant (a number or a sequence of numbers) as a tuple of floats."""
    if value is None:
        return None
    if isinstance(value, Tensor):
        value = value.flatten().tolist()
    elif hasattr(value, "__array__") and hasattr(value, "reshape"):
        # a NumPy array or scalar (np.std over a dataset's channels): not a Sequence, and
        # refused as "no sequence of per-channel numbers"
        value = value.reshape(-1).tolist()
    items = [value] if isinstance(value, numbers.Real) else value
    if isinstance(items, (str, bytes)) or not isinstance(items, Seq) or not items:
        raise TypeError(f"{what} must be a number or a sequence of per-channel numbers, got "
                        f"{value!r}; e.g. {what}=(0.229, 0.224, 0.225)")
    out = tuple(float(v) for v in items)
    if not all(math.isfinite(v) for v in out):
        raise ValueError(f"{what} must be finite, got {value!r}")
    return out


def model_normalization(model: Any) -> tuple[tuple[float, ...], tuple[float, ...]] | None:
    """(mean, std) of a timm model's input normalisation, from its ``pretrained_cfg`` (or the
    older ``default_cfg``), or None when the model declares none."""
    for attr in ("pretrained_cfg", "default_cfg"):
        cfg = getattr(model, attr, None)
        if isinstance(cfg, dict) and cfg.get("std") is not None:
            mean = _channels(cfg.get("mean", 0.0), "mean")
            return mean or (0.0,), _channels(cfg["std"], "std")  # type: ignore[return-value]
    return None


def _main_input_name(model: Any) -> str | None:
    """A Hugging Face model's ``main_input_name`` (``pixel_values`` for image models), also
    through a ``DataParallel``-style ``.module``; None for other models."""
    for m in (model, getattr(model, "module", None)):
        name = getattr(m, "main_input_name", None)
        if isinstance(name, str):
            return name
    return None


#: ``sigma_space="pixel"``: normalised [0, 1] pixels, ``x = (p − mean) / std``, span at most
#: ``1 / std`` per channel; images whose span times ``std`` is above this (a quarter to a half
#: over, for a resize's overshoot) are no such pixels — raw 0–255 ones span about 255 / std
PIXEL_SPAN_MAX = 1.5


def _check_pixels(x: Tensor, std: Tensor) -> None:
    """Judge ``sigma_space="pixel"`` images ``x`` (B, C, H, W): [0, 1] pixels normalised by
    ``std`` span at most ``1 / std`` per channel. A channel that spans more than
    :data:`PIXEL_SPAN_MAX` / std and holds no negative value is raw pixels (0–255: a model that
    normalises them itself), which got the noise ε/std in their own units, 255·std times too
    small in pixels, without a word (0.0006 for 0.0371): refused. Any other channel that spans
    more is normalised by another std than ``std`` (or holds no pixels): σ is then σ/std in the
    inputs' units, not on [0, 1] pixels, which a warning says."""
    lo, hi = x.detach().amin(dim=(0, 2, 3)).double(), x.detach().amax(dim=(0, 2, 3)).double()
    span = (hi - lo) * std.to(device=lo.device, dtype=torch.float64)
    wide = span > PIXEL_SPAN_MAX  # NaN pixels: not judged here
    if not bool(wide.any()):
        return
    raw = wide & (lo >= 0)
    c = int((raw if bool(raw.any()) else wide).nonzero()[0])
    said = (f"channel {c} of the images holds values from {float(lo[c]):.4g} to "
            f"{float(hi[c]):.4g}: at std {float(std[c]):.4g} a span of {float(span[c]):.3g} "
            "in pixels, where [0, 1] pixels span at most 1")
    if bool(raw.any()):
        raise ValueError(
            f"sigma_space='pixel' reads σ on [0, 1] pixels behind the normalisation x = "
            f"(pixels − mean) / std, but {said}, and none is negative: these look like raw "
            "(0–255) pixels, not normalised ones, and σ converted by std would be far too small "
            "in pixels. Pass the images normalised as the model takes them, (images / 255 − "
            "mean) / std; for a model that takes raw pixels and normalises them itself, drop "
            "sigma_space (σ is then in the images' own units: σ = 2.55 on 0–255 pixels is 0.01 "
            "of the [0, 1] range)")
    warnings.warn(
        f"sigma_space='pixel': the images cannot be [0, 1] pixels normalised by std "
        f"{tuple(round(float(v), 4) for v in std.tolist())}: {said}. σ is measured as σ/std "
        "in the images' units, which is σ on [0, 1] pixels only for images normalised by that "
        "std. Pass the std the images were normalised with, in [0, 1] pixel units: a std of "
        "0–255 pixels divided by 255 (ImageNet's 58.4 is 0.229)", UserWarning,
        stacklevel=user_level())


#: a last axis of at most this many entries looks like the channels of a channels-last image
#: (gray, gray + alpha, RGB, RGBA)
FEW_CHANNELS = 4


def _looks_channels_last(shape: Seq[int]) -> bool:
    """A (B, ·, ·, ·) shape that reads far better as channels-last (B, H, W, C) than as
    (B, C, H, W): a last axis of at most :data:`FEW_CHANNELS` entries, where the second and third
    axes both exceed it — (8, 32, 32, 3) is a 32×32 RGB batch, not 32 channels of 32×3 pixels.
    A 3-channel 3×3 image (·, 3, 3, 3), a 4-channel image 4 pixels wide (·, 4, H, 4) and a
    feature map of many channels at 4×4 (·, 256, 4, 4) are not flagged."""
    return shape[-1] <= FEW_CHANNELS < min(shape[1], shape[2])


#: Hugging Face's names of audio inputs (a spectrogram, a waveform's features)
AUDIO_KEYS = ("input_values", "input_features")


def _shape(v: Any) -> str:
    return str(tuple(v.shape)) if isinstance(v, Tensor) else type(v).__name__


def _image_hint(v: Any, where: str, last: bool = False, key: str | None = None) -> str:
    """Why ``v`` is no (B, C, H, W) image batch — (B, H, W, C) for ``channels_last=True`` — and
    the fix (for a 3-D tensor, where a channel axis is what is missing, the channel axis at the
    end for channels-last, where x.unsqueeze(1) made (B, 1, H, W) read as H×… images of W
    channels: rows measured as tokens, without a word). A 3-D tensor is also what a model that
    takes it as it is gets (a spectrogram, grayscale images without a channel axis): the
    channel axis alone, which the grayscale advice gave, made its forward fail (a Conv2d that
    adds its own got 5-D input), so the hint names the wrapper that takes it off again, and
    ``Sequence()`` or an ``Embedding`` for rows as tokens; and where the first axis looks like
    the channels of one image (3, 32, 32), the batch axis it lacks. ``key``: the dict entry
    that holds ``v``."""
    layout = "(batch, height, width, channels)" if last else "(batch, channels, height, width)"
    got = f"Patches expects images of shape {layout}{where}, got "
    if isinstance(v, Tensor) and v.dim() == 3:
        axis, dim = ("-1", "(batch, height, width, 1)") if last else ("1", "(batch, 1, height, "
                                                                       "width)")
        if key in AUDIO_KEYS:  # a spectrogram or frames: no grayscale image
            hint = f"{_shape(v)}, audio features, not images"
        else:
            hint = (f"{_shape(v)}; add a channel axis with x.unsqueeze({axis}) for grayscale "
                    f"images the model takes as {dim}")
            first, end = v.shape[0], v.shape[-1]
            if (end if last else first) in (3, 4) \
                    and FEW_CHANNELS < min(v.shape[:2] if last else v.shape[1:]):
                hint += (f"; if it is one image of {end if last else first} channels, add its "
                         "batch axis instead: x.unsqueeze(0)")
            elif not last and end in (3, 4) and FEW_CHANNELS < min(v.shape[:2]):
                hint += (f"; if it is one (height, width, channels) image of {end} channels, "
                         "x.permute(2, 0, 1).unsqueeze(0) makes it a batch of one")
        if key is None:
            return got + hint + (
                f". A model that takes the 3-D tensor as it is (a spectrogram (batch, mels, "
                f"frames), images without a channel axis) would fail on that: measure patches "
                f"of x.unsqueeze({axis}) on a wrapper whose forward(x) calls "
                f"model(x.squeeze({axis})); to perturb one row at a time (a spectrogram's "
                f"frames, patches already cut), pass Sequence() instead")
        return got + hint + (
            f". A model that takes {key!r} as a 3-D tensor (a spectrogram, patches already "
            f"cut) would fail on a channel axis: measure patches of {{'pixel_values': "
            f"x.unsqueeze({axis}), …the other entries}} on a wrapper whose "
            f"forward(pixel_values, **rest) calls model({key}=pixel_values.squeeze({axis}), "
            "**rest), or its tokens with Embedding('<module>') on the module whose output "
            "enters its first block")
    if isinstance(v, Tensor):
        return got + f"{_shape(v)}"
    if key is not None:  # a dict was passed: what its entry needs is to be a tensor
        return got + (f"a {type(v).__name__}, not a tensor; call the image processor with "
                      "return_tensors='pt', or convert the entry with torch.as_tensor (a list "
                      "of images: torch.stack)")
    return got + (f"a {type(v).__name__}; pass the image tensor itself, or a dict "
                  "{'pixel_values': images, …} whose other entries go to the model as keyword "
                  "arguments")


def image_entry(model: Any, inputs: Mapping) -> str:
    """The key of a dict input's images: the model's ``main_input_name`` where that entry is a
    4-D tensor, else ``pixel_values``. A dict with neither, or with both as different 4-D
    tensors, is refused, naming its keys and what to pass."""
    main = _main_input_name(model)
    fours = [k for k, v in inputs.items() if isinstance(v, Tensor) and v.dim() == 4]
    keys = ", ".join(f"{k!r}: {_shape(v)}" for k, v in inputs.items())
    if main is not None and main != "pixel_values" and main in fours and "pixel_values" in fours:
        raise ValueError(
            f"Patches got a dict with images under both 'pixel_values' and the model's "
            f"main input {main!r} ({{{keys}}}), so which to perturb is not clear; drop the "
            "other entry, or pass a wrapper whose forward(images) calls the model with it"
        )
    if main is not None and main in fours:
        return main
    if "pixel_values" in inputs:
        return "pixel_values"
    if main is not None and main in inputs:
        return main
    near = f" (4-D: {', '.join(map(repr, fours))})" if fours else ""
    raise ValueError(
        f"Patches got a dict with keys {{{keys}}} but no 'pixel_values' entry"
        + (f" nor the model's main input {main!r}" if main and main != "pixel_values" else "")
        + f", so which entry holds the images is not known{near}; put the images under "
        "'pixel_values' (the model is then called as model(pixel_values=images, **the other "
        "entries)), or pass the image tensor itself (called as model(images))"
    )


@dataclass(frozen=True)
class Patches(Tokenization):
    """Contiguous, non-overlapping ``size``×``size`` patches of a (B, C, H, W) image, all channels.

    Token ``t`` is the patch at row ``t // (W/size)``, column ``t % (W/size)``; its vector has
    ``C·size²`` entries. Noise is added to the raw input tensor, so an MLP, a CNN and a ViT are
    measured on the same tokens whatever their own patching. The images must be floating point
    (integer pixels would turn the noise into integers): convert uint8 images with
    ``images.float()`` (σ in pixel units) or ``images.float() / 255`` (σ in [0, 1] units).
    The noise is added in the images' dtype: σ far below the spacing of their values (about
    6e-8 of a value's size in float32) rounds away there, as it would in the model, and
    values near float32's largest (3.4e38) plus noise overflow to infinity (refused where the
    model's output turns non-finite); bf16/fp16 images are checked for the rounding of their
    noise.

    **Padding.** A dict input's ``pixel_mask`` entry ((B, H, W), 1 on real pixels: images
    padded to one size, as DETR-style processors do) says which patches are real: a patch
    without a real pixel is padding, not a token (never perturbed, never counted), and a patch
    that holds both gets noise on its real pixels alone. ``mask=`` may narrow the real patches
    further; one that marks a patch of padding alone is refused.

    ``replace_with`` rows are token vectors: a patch's ``C·size²`` entries in (C, size, size)
    order, for ``channels_last=True`` images too (a (size, size, C) patch ``q`` cut from them is
    the row ``q.permute(2, 0, 1).reshape(-1)``); in pixel space (``sigma_space="pixel"``) their
    values are pixels.

    Local reuse: a model may implement ``local_cache(images, size)`` and
    ``forward_local(cache, rows, top, left, patch)``; then, in eval mode, a copy with one noisy
    patch is computed on the window of each early feature map that the patch can change instead
    of by a full forward (the zoo's ``resnet18`` and ``cnn`` do; ``vit_small`` recomputes the
    tokens the patch reaches and the CLS row of its last block; same predictions up to float
    rounding). The clean maps are kept only for the examples of the current chunk (and the
    next ones, up to :data:`LOCAL_AHEAD` examples, made in the same call); a cache
    dict's ``"scratch"`` entry (memory the model's ``forward_local`` keeps from call to call)
    passes on to the next chunk's cache, and a model's ``local_copy_bytes(cache)`` reports that
    memory per copy, which the automatic chunk size counts (``vit_small`` does both). A model
    that holds forward hooks or pre-hooks of the user's (on any of its modules, or for all
    modules) runs full forwards: ``forward_local`` would skip them.
    ``reuse_local=False`` always runs full forwards.

    **σ in pixel space.** A pretrained model sees normalised inputs, ``x = (p − mean) / std``
    with pixels ``p ∈ [0, 1]`` and the model's own per-channel ``mean``/``std`` (ImageNet's std
    is about 0.226), so σ on ``x`` is not comparable with σ on the zoo's [−1, 1] inputs or
    across models. ``sigma_space="pixel"`` reads σ on the [0, 1] pixels instead: the inputs are
    still the normalised ``x`` the model takes, and the noise of channel ``c`` is divided by
    ``std[c]`` before it is added — exactly a measurement on pixels behind the model's
    normalisation. ``std`` is given (a number or one per channel), else read from a timm
    model's ``pretrained_cfg``; :func:`~senslab.tokens.auto_tokens` also reads a Hugging Face
    image processor's ``image_std``. ``mean`` matters only for ``replace_with`` (whose rows are
    then pixel values; default 0). ``sigma_space="input"`` (default) adds σ to ``x`` as it is.
    Images that cannot be [0, 1] pixels behind ``std`` (a channel spanning more than
    :data:`PIXEL_SPAN_MAX` / std) are refused where they look like raw 0–255 pixels (none
    negative: a model that normalises them itself takes σ in their own units, without
    ``sigma_space``), and said in a warning otherwise.

    **Layout.** ``channels_last=True`` takes channels-last images (B, H, W, C), for a model that
    takes them so (it permutes inside): the tokens are the same patches of all C channels, and
    the model is called with (B, H, W, C) copies (token vectors keep the (C, size, size) order,
    and the same noise lands on the same pixel as for the images in (B, C, H, W)). ``None``
    (default) reads (B, C, H, W) but refuses a shape that reads far better as channels-last — a
    last axis of at most 4 entries after two larger ones, e.g. (8, 32, 32, 3) — since read as
    (B, C, H, W) its "patches" would cut across rows and channels and measure another number;
    ``channels_last=False`` states (B, C, H, W) and measures such a shape as it is. Local reuse
    needs (B, C, H, W).
    """

    size: int
    align: str = "left"
    reuse_local: bool = True
    sigma_space: Literal["input", "pixel"] = "input"
    std: float | tuple[float, ...] | None = None
    mean: float | tuple[float, ...] | None = None
    channels_last: bool | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.size, int) or isinstance(self.size, bool) or self.size < 1:
            raise ValueError(f"patch size must be a positive integer, got {self.size!r}")
        if self.reuse_local not in (True, False):  # "no" and the like were read as True
            raise TypeError(f"reuse_local must be True or False, got {self.reuse_local!r}")
        if self.channels_last not in (None, True, False):
            raise ValueError(
                f"channels_last must be True ((batch, height, width, channels) images), False "
                f"((batch, channels, height, width)) or None (the latter, refusing a shape that "
                f"looks channels-last), got {self.channels_last!r}"
            )
        if self.sigma_space not in ("input", "pixel"):
            raise ValueError(
                f"sigma_space must be 'input' (σ on the model's inputs as they are) or 'pixel' "
                f"(σ on [0, 1] pixels, through the model's normalisation), got "
                f"{self.sigma_space!r}"
            )
        std, mean = _channels(self.std, "std"), _channels(self.mean, "mean")
        if std is not None and not all(v > 0 for v in std):
            raise ValueError(f"std must be positive, got {self.std!r}")
        if self.sigma_space == "input" and (std is not None or mean is not None):
            raise ValueError(
                "std=/mean= convert σ from pixel space and need sigma_space='pixel'; drop them "
                "to add σ to the inputs as they are"
            )
        object.__setattr__(self, "std", std)
        object.__setattr__(self, "mean", mean)

    def normalization(self, model: Any, channels: int) -> tuple[Tensor, Tensor] | None:
        """(mean, std) as (C,) float tensors for ``sigma_space="pixel"`` (None for "input"):
        ``std``/``mean`` as given, else the model's timm ``pretrained_cfg``."""
        if self.sigma_space == "input":
            return None
        std, mean = self.std, self.mean
        given = {"std": std is not None, "mean": mean is not None}
        if std is None:
            found = model_normalization(model)
            if found is None:
                raise ValueError(
                    f"sigma_space='pixel' needs the model's input std: {type(model).__name__} "
                    "has no timm pretrained_cfg; pass Patches(..., std=...) (e.g. ImageNet's "
                    "(0.229, 0.224, 0.225)), or auto_tokens(model, sigma_space='pixel', "
                    "image_processor=AutoImageProcessor.from_pretrained(name)) for a Hugging "
                    "Face model. A model that takes [0, 1] pixels and normalises them itself "
                    "needs no conversion (its inputs are the pixels): drop sigma_space"
                )
            mean, std = (mean or found[0]), found[1]
        out = []
        for what, vals in (("mean", mean or (0.0,)), ("std", std)):
            assert vals is not None
            if len(vals) not in (1, channels):
                if not given[what]:  # read from the model's pretrained_cfg, not passed
                    per = "one value" if channels == 1 else f"one value or {channels}"
                    raise ValueError(
                        f"{type(model).__name__}'s timm pretrained_cfg normalises "
                        f"{len(vals)} channels ({what} {tuple(vals)}) but the images have "
                        f"{channels} channel{'s' if channels != 1 else ''} (a model built "
                        f"with in_chans={channels} keeps the cfg of its {len(vals)}-channel "
                        "weights), so the pixel units of σ are not known; pass the "
                        f"normalisation the images were given: Patches({self.size}, "
                        f"sigma_space='pixel', std=..., mean=...), {per} each (mean matters "
                        "only for replace_with)"
                    )
                raise ValueError(
                    f"{what} has {len(vals)} values but the images have {channels} channels; "
                    f"give one value or one per channel"
                )
            out.append(torch.tensor(vals, dtype=torch.float32).expand(channels).clone())
        return out[0], out[1]

    def grid(self, height: int, width: int) -> tuple[int, int]:
        """Patches per column and per row; an error if ``size`` does not divide the image."""
        p = self.size
        if height % p or width % p:
            ok = ", ".join(map(str, sorted(set(_divisors(height)) & set(_divisors(width)))))
            chosen = getattr(self, "_chosen", None)  # set by auto_tokens (or tokens=None)
            if chosen is not None:
                raise ValueError(
                    f"patch size {p} ({chosen}) does not divide image size "
                    f"{height}x{width}; choose a size that does with "
                    f"tokens=auto_tokens(model, patch_size=q) or tokens=Patches(q), q one of "
                    f"{ok}, or resize the images"
                )
            raise ValueError(
                f"patch size {p} does not divide image size {height}x{width}; use one of {ok}"
            )
        return height // p, width // p

    @contextmanager
    def bind(
        self, model: nn.Module | Any, inputs: Inputs, mask: Tensor | None = None,
        output: OutputSelector = None,
    ) -> Iterator[BoundTokens]:
        key, rest = None, {}
        if isinstance(inputs, Mapping):  # {"pixel_values": x, …}: an image processor's output
            key = image_entry(model, inputs)
            rest = {k: v for k, v in inputs.items() if k != key and k not in TARGETS}
            inputs = inputs[key]
        if not isinstance(inputs, Tensor) or inputs.dim() != 4:
            raise ValueError(_image_hint(inputs, "" if key is None else f" under {key!r}",
                                         bool(self.channels_last), key))
        check_floating(
            inputs, "the images", "images.float() (σ is then in pixel units, e.g. 0–255) or "
            "images.float() / 255 (σ in units of the [0, 1] range)"
        )
        if self.channels_last is None and _looks_channels_last(inputs.shape):
            b, h, w, c = inputs.shape
            where = "" if key is None else f" under {key!r}"
            raise ValueError(
                f"Patches got images of shape {_shape(inputs)}{where}, read as (batch, channels, "
                f"height, width): {h} channels of {w}x{c} pixels. A last axis of {c} looks like "
                f"the channels of channels-last (batch, height, width, channels) images, which "
                f"read that way would be cut into patches across rows and channels: a wrong "
                f"number. For channels-last images pass Patches({self.size}, "
                f"channels_last=True) (the model is still called with (batch, height, width, "
                f"channels) copies); if the second axis does hold the channels, pass "
                f"Patches({self.size}, channels_last=False)"
            )
        last = bool(self.channels_last)
        norm = self.normalization(model, inputs.shape[-1] if last else inputs.shape[1])
        bound = _BoundPatches(self, model, inputs, mask, output, norm, key=key, rest=rest)
        # forward_local takes the images alone (not with a dict's other entries), in
        # (B, C, H, W)
        # (and forward_local runs the model's layers without its call: not where a hook of the
        # user's would be skipped)
        bound.reuse = (self.reuse_local and isinstance(model, nn.Module) and not model.training
                       and hasattr(model, "forward_local") and not rest and not last
                       and not forward_hooks(model, foreign=True))
        yield bound


class _BoundPatches(BoundTokens):
    def __init__(self, spec: Patches, model: Any, x: Tensor, mask: Tensor | None,
                 output: OutputSelector = None,
                 norm: tuple[Tensor, Tensor] | None = None, *, key: str | None = None,
                 rest: dict[str, Any] | None = None) -> None:
        # no gradient flows to the images, nor to a dict's other entries (the control
        # variate's is the noise's): images that require one (a generator's output) failed its
        # backward with a raw "Inference tensors cannot be saved for backward"
        x = x.detach()
        #: channels-last images: ``x`` is their (B, C, H, W) view, and the model gets copies
        #: in the user's (B, H, W, C) layout (``_call``)
        self.last = bool(spec.channels_last)
        if self.last:
            x = x.permute(0, 3, 1, 2)
        b, c, h, w = x.shape
        #: a dict input: the images' key, and the other entries (keyword arguments, their
        #: batch-shaped tensors picked per copy)
        self.key = key
        self.rest = {k: v.detach() if isinstance(v, Tensor) else v for k, v in (rest or {}).items()}
        #: low-precision images: the rounding of the noise is checked (:class:`GridCheck`)
        #: … and float32 images under autocast=, which the model's first convolution or linear
        #: layer rounds to autocast's grid, noise included
        cast = autocast_grid(x)
        self.low = cast is not None or (
            x.is_floating_point() and x.dtype not in (torch.float32, torch.float64))
        self._check_rounding = GridCheck("images", AUTOCAST_FIX % "images" if cast else (
            "Measure on float32 images — images.float(), with model.float() on a copy for a "
            "{dtype} model — without autocast= (whose first convolution or linear layer would "
            "round them to {dtype} again; precision='bf16-checked' keeps float32's class "
            "decisions at bf16's speed), or use a larger sigma, well above {spacing}"), cast)
        #: (mean, std) per channel for σ in pixel space (None: noise added as it is)
        self.norm = None if norm is None else (norm[0].to(x.device), norm[1].to(x.device))
        if self.norm is not None:
            _check_pixels(x, self.norm[1])
        try:
            self.gh, self.gw = spec.grid(h, w)
        except ValueError as err:
            if spec.channels_last is not None or w > FEW_CHANNELS:
                raise
            raise ValueError(
                f"{err}. (If the images are channels-last, (batch, height, width, channels) with "
                f"{w} channels, pass Patches(p, channels_last=True): read as (batch, channels, "
                "height, width) their patches would cut across rows and channels)"
            ) from None
        self.p = spec.size
        self.model, self.x, self.output = model, x, output
        self.dim = c * self.p * self.p
        self.valid = valid_mask(mask, b, self.gh * self.gw, x.device)
        #: (B, 1, H, W) real pixels of a dict's ``pixel_mask`` where some patch holds both real
        #: and padding pixels (the noise is kept off its padding), else None
        self.pixels: Tensor | None = None
        self._pixel_padding(mask is not None)
        # on a copy: a model that edits its input in place (an in-place ReLU or clamp_ first)
        # would change the caller's images and the base of every perturbed copy
        with first_layer_grid(model) as seen:
            self.clean_output = self._clean(x.clone())
        rounds = None if self.low else model_grid(seen, x)
        if rounds is not None:  # float32 images that a bf16/fp16 model rounds itself
            self.low = True
            self._check_rounding = GridCheck("images", MODEL_CAST_FIX % "images", *rounds)
        self.reuse = False  # local reuse (see Patches)
        self._cached: Tensor | None = None  # the examples whose clean maps are cached
        self._cache: Any = None

    def _pixel_padding(self, given: bool) -> None:
        """Read a dict input's ``pixel_mask`` (:data:`PIXEL_MASK`): patches without a real pixel
        are padding, not tokens (as text padding is not), and the noise of a patch that holds
        both stays on its real pixels. The entry was passed to the model and otherwise
        ignored: the padding patches were measured as tokens that never flip (0.078 for 0.266
        where three quarters of each image were padding). ``given``: the user's ``mask=``,
        which says which patches are measured; one that marks a patch of padding alone is
        refused (its noise would land on padding only)."""
        pm = self.rest.get(PIXEL_MASK)
        if pm is None:
            return
        b, _, h, w = self.x.shape
        t = self.gh * self.gw
        if not isinstance(pm, Tensor) or tuple(pm.shape) != (b, h, w):
            if given:  # mask= says which patches are real
                return
            raise ValueError(
                f"the input's {PIXEL_MASK!r} entry is {_shape(pm)}, but the images are {b} of "
                f"{h}x{w} pixels: it is no (batch, height, width) mask of real pixels, so which "
                f"patches are padding is not known. Pass it as a ({b}, {h}, {w}) tensor, 1 on "
                f"real pixels, or say which of the {t} patches are real with mask= of shape "
                f"({b}, {t})")
        pixels = real_tokens(pm, f"the input's {PIXEL_MASK!r} entry").to(self.x.device)
        blocks = pixels.reshape(b, self.gh, self.p, self.gw, self.p)
        real = blocks.any(dim=4).any(dim=2).flatten(1)  # (B, T): a patch with a real pixel
        if given:
            over = self.valid & ~real
            if bool(over.any()):
                rows = over.any(dim=1).nonzero().flatten().tolist()
                raise ValueError(
                    f"mask= marks {int(over.sum())} patches real (examples {rows[:5]}"
                    f"{' …' if len(rows) > 5 else ''}) that hold no real pixel by the input's "
                    f"{PIXEL_MASK!r} entry: their noise would land on padding alone and they "
                    "would measure about 0, pulling the mean down. Drop mask= (the patches "
                    "with a real pixel are then the tokens), or pass mask & real, with real = "
                    f"inputs[{PIXEL_MASK!r}].bool().unflatten(1, ({self.gh}, {self.p}))"
                    f".unflatten(3, ({self.gw}, {self.p})).any(4).any(2).flatten(1)")
        else:
            self.valid = real
        if not bool((blocks.all(dim=4).all(dim=2).flatten(1) == real).all()):
            # patches that hold real pixels and padding: their noise is masked (a copy each)
            self.pixels = pixels.unsqueeze(1).contiguous()

    def _clean(self, x: Tensor) -> Tensor:
        """The clean output (:func:`~.base.clean_forward`; a dict input with its entries)."""
        if self.key is None:
            return clean_forward(self.model, x.permute(0, 2, 3, 1) if self.last else x,
                                 self.output)
        try:
            return self._call(x, None)
        except RuntimeError as err:
            own = model_dtype(self.model)
            if own is None or own == x.dtype:
                raise
            raise DtypeClash(
                f"the images are {x.dtype} but the model's weights are {own}, and the model "
                f"failed on them ({str(err).splitlines()[0]}); convert them with "
                f"inputs[{self.key!r}].to({own}) (or the model with model.to({x.dtype}))"
            ) from err

    def _call(self, images: Tensor, src: Tensor | None) -> Tensor:
        """The model's logits on ``images``: copies of examples ``src`` (None: the batch); a
        dict input's other entries go along as keyword arguments, rows ``src`` of those with
        the batch's leading size. Channels-last images go in their own layout."""
        if self.last:
            images = images.permute(0, 2, 3, 1)
        if self.key is None:
            return call_model(self.model, images, self.output)
        b = self.x.shape[0]
        kwargs = {k: v.index_select(0, src.to(v.device))
                  if src is not None and isinstance(v, Tensor) and v.dim() > 0
                  and v.shape[0] == b and per_example(k) else v for k, v in self.rest.items()}
        kwargs[self.key] = images
        return call_model(self.model, kwargs, self.output)

    def _local(self, src: Tensor) -> tuple[Any, Tensor]:
        """The model's clean-map cache holding the examples ``src`` (rebuilt for a chunk that
        needs others: only one chunk's examples are ever held, with the examples after them up
        to :data:`LOCAL_AHEAD` in all), and their rows in it."""
        if self._cached is None or not bool(torch.isin(src, self._cached).all()):
            need = torch.unique(src)  # sorted
            after = int(need[-1]) + 1
            end = max(after, min(after + LOCAL_AHEAD - len(need), self.x.shape[0]))
            ahead = torch.arange(after, end, device=need.device)
            self._cached = torch.cat([need, ahead])  # still sorted (searchsorted below)
            old = self._cache
            self._cache = self.model.local_cache(self.x.index_select(0, self._cached), self.p)
            if isinstance(old, dict) and isinstance(self._cache, dict) and "scratch" in old:
                # memory the model keeps from call to call (Patches: local reuse) outlives the
                # chunk's examples: the next chunk writes into it instead of mapping it afresh
                self._cache.setdefault("scratch", old["scratch"])
        return self._cache, torch.searchsorted(self._cached, src)

    def kept_bytes(self) -> int:
        """Bytes per copy of the memory the model's ``forward_local`` keeps across calls
        (``local_copy_bytes(cache)``, where it reports it), which the probe does not see: the
        chunk sizing counts it against the memory budget."""
        report = getattr(self.model, "local_copy_bytes", None)
        if not self.reuse or report is None or self._cache is None:
            return 0
        return int(report(self._cache))

    def _view(self, imgs: Tensor) -> Tensor:
        n, c = imgs.shape[:2]
        return imgs.view(n, c, self.gh, self.p, self.gw, self.p)

    def _per_channel(self, v: Tensor, scale: Tensor, shift: Tensor | None = None) -> Tensor:
        """``v`` (…, D) token vectors times ``scale[c]`` (plus ``shift[c]``) per channel."""
        c = self.x.shape[1]
        w = v.reshape(*v.shape[:-1], c, self.p * self.p) * scale.to(v.dtype)[:, None]
        if shift is not None:
            w = w + shift.to(v.dtype)[:, None]
        return w.reshape(v.shape)

    def _raw(self, src: Tensor, tok: Tensor) -> Tensor:
        v = self._view(self.x)
        n = len(src)
        return v[src, :, tok // self.gw, :, tok % self.gw, :].reshape(n, self.dim)

    def tokens(self, src: Tensor, tok: Tensor) -> Tensor:
        """Clean token vectors; in pixel space the pixels ``x·std + mean``."""
        raw = self._raw(src, tok)
        return raw if self.norm is None else self._per_channel(raw, self.norm[1], self.norm[0])

    def forward_perturbed(self, src: Tensor, tok: Tensor | None, noise: Tensor) -> Tensor:
        if self.norm is not None:  # pixel-space noise → the model's input units: ε_c / std_c
            noise = self._per_channel(noise, 1.0 / self.norm[1])
        # a stand-in model may ask for whole copies (checked int8's static pass)
        if self.reuse and tok is not None and not getattr(self.model, "full_copies", False):
            n, c = len(src), self.x.shape[1]
            if self.low:
                self._check_rounding(self._raw(src, tok), noise)
            patch = self._raw(src, tok).view(n, c, self.p, self.p) + noise.view(
                n, c, self.p, self.p).to(self.x.dtype)
            cache, rows = self._local(src)
            return select_output(self.model.forward_local(
                cache, rows, tok // self.gw * self.p, tok % self.gw * self.p, patch), self.output)
        if self.last:  # copied in (B, H, W, C) memory order: the model gets them contiguous
            copies = self.x.permute(0, 2, 3, 1).index_select(0, src).permute(0, 3, 1, 2)
        else:
            copies = self.x.index_select(0, src)
        n, c = copies.shape[:2]
        v = self._view(copies)
        if tok is None:  # whole input: noise (N, T, D) → image layout, padding tokens zeroed
            noise = noise * self.valid.index_select(0, src).unsqueeze(-1).to(noise.dtype)
            grid = noise.view(n, self.gh, self.gw, c, self.p, self.p).permute(0, 3, 1, 4, 2, 5)
            if self.pixels is not None:  # a pixel_mask's padding pixels get no noise
                grid = grid * self._view(self.pixels.index_select(0, src)).to(grid.dtype)
            if self.low:
                self._check_rounding(v, grid)
            v.add_(grid.to(copies.dtype))
        else:
            rows, cols = tok // self.gw, tok % self.gw
            idx = torch.arange(n, device=copies.device)
            if self.pixels is not None:  # a pixel_mask's padding pixels get no noise
                real = self._view(self.pixels)[src, :, rows, :, cols, :]  # (N, 1, p, p)
                noise = (noise.view(n, c, self.p, self.p) * real.to(noise.dtype)).view(n, -1)
            if self.low:
                self._check_rounding(self._raw(src, tok), noise)
            # advanced indices (n, rows, cols) → a (N, C, p, p) block, one patch per copy
            v[idx, :, rows, :, cols, :] += noise.view(n, c, self.p, self.p).to(copies.dtype)
        return self._call(copies, src)


@dataclass(frozen=True)
class Sequence(Tokenization):
    """Inputs that already are sequences of token vectors, shape (B, T, D), floating point
    (the noise is added to them; token ids go through :class:`~senslab.tokens.Embedding`)."""

    align: str = "left"

    @contextmanager
    def bind(
        self, model: nn.Module | Any, inputs: Inputs, mask: Tensor | None = None,
        output: OutputSelector = None,
    ) -> Iterator[BoundTokens]:
        if isinstance(inputs, Mapping):
            keys = ", ".join(f"{k!r}: {_shape(v)}" for k, v in inputs.items())
            raise ValueError(
                f"Sequence takes one (batch, tokens, dim) tensor, passed to the model "
                f"positionally, but got a dict {{{keys}}}. For a model called with keyword "
                "arguments (a Hugging Face model's inputs_embeds and attention_mask), measure "
                "the dict with Embedding('<module>') on the module whose output enters the "
                "first block (auto_tokens(model) names it): it reads the attention mask, "
                "which Sequence would not. Or pass the tensor to a wrapper whose "
                "forward(x) calls the model with it"
            )
        if not isinstance(inputs, Tensor) or inputs.dim() != 3:
            shape = tuple(inputs.shape) if isinstance(inputs, Tensor) else type(inputs).__name__
            raise ValueError(
                f"Sequence expects inputs of shape (batch, tokens, dim), got {shape}; "
                "for token ids use Embedding('<module name>') instead"
            )
        check_floating(
            inputs, "the token vectors", "inputs.float() (σ is then in the units of the "
            "vectors); for integer token ids use Embedding('<embedding module>') instead"
        )
        yield _BoundSequence(model, inputs, mask, output)


class _BoundSequence(BoundTokens):
    def __init__(self, model: Any, x: Tensor, mask: Tensor | None,
                 output: OutputSelector = None) -> None:
        x = x.detach()  # as images (_BoundPatches): the control variate's gradient is the noise's
        self.model, self.x, self.output = model, x, output
        self.dim = x.shape[2]
        self.valid = valid_mask(mask, x.shape[0], x.shape[1], x.device)
        # on a copy: a forward that edits its input in place must not change the caller's
        # tensor, nor the base of the perturbed copies
        with first_layer_grid(model) as seen:
            self.clean_output = clean_forward(model, x.clone(), output)
        if self.clean_output.dim() and self.clean_output.shape[0] == x.shape[1] != x.shape[0]:
            self._refuse_rows(self.clean_output, x.shape[0], "examples")
        cast = autocast_grid(x)  # float32 vectors under autocast=: rounded by its first layer
        self.low = cast is not None or x.dtype in LOW_PRECISION
        self._check_rounding = GridCheck(
            "token vectors", AUTOCAST_FIX % "token vectors" if cast else (
                "Pass float32 token vectors — x.float(), with model.float() on a copy for a "
                "{dtype} model — without autocast= (whose first linear layer would round them "
                "to {dtype} again), or use a larger sigma, well above {spacing}"), cast)
        rounds = None if self.low else model_grid(seen, x)
        if rounds is not None:  # float32 vectors that a bf16/fp16 model rounds itself
            self.low = True
            self._check_rounding = GridCheck("token vectors", MODEL_CAST_FIX % "token vectors",
                                             *rounds)

    def tokens(self, src: Tensor, tok: Tensor) -> Tensor:
        return self.x[src, tok]

    def forward_perturbed(self, src: Tensor, tok: Tensor | None, noise: Tensor) -> Tensor:
        copies = self.x.index_select(0, src)
        valid = self.valid.index_select(0, src)
        if tok is None:
            noise = noise * valid.unsqueeze(-1).to(noise.dtype)
            if self.low:
                self._check_rounding(copies, noise)
            copies = copies + noise.to(copies.dtype)
        else:
            rows = torch.arange(len(src), device=copies.device)
            if self.low:
                self._check_rounding(copies[rows, tok], noise)
            copies[rows, tok] += noise.to(copies.dtype)
        out = call_model(self.model, copies, self.output)
        if out.dim() and out.shape[0] != len(src):
            self._refuse_rows(out, len(src), "copies")
        return out

    def _refuse_rows(self, out: Tensor, n: int, what: str) -> None:
        """Refuse an output whose rows are not the inputs' first axis: a sequence-first model
        (its batch on the second axis) fed as (batch, tokens, dim). Where the two axes have
        one size, its copies would otherwise fail deep in the runner, and its examples would
        be read as token positions."""
        raise ValueError(
            f"the model returned {out.shape[0]} rows (output shape {tuple(out.shape)}) for {n} "
            f"{what if n != 1 else what.replace('ies', 'y').rstrip('s')} of inputs of shape "
            f"{tuple(self.x.shape)}: Sequence reads (batch, tokens, dim) and "
            "feeds the copies batch-first, but the model's batch axis is another. A "
            "sequence-first model (nn.GRU, nn.LSTM or nn.Transformer with batch_first=False) "
            "takes (tokens, batch, dim), and its examples would be read as token positions "
            "(or the model reduces over the batch: return one row per example). "
            "Pass the inputs batch-first, x.transpose(0, 1), to a wrapper whose forward "
            "transposes them back: model(x.transpose(0, 1))"
        )
