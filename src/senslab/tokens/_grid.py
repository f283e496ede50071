"""Noise added to low-precision token vectors lands on their grid: is it still the noise drawn?

A bf16/fp16 tensor (images, or the output of a bf16 model's embedding) holds ``x + noise``
rounded to its own grid, whose spacing is about ``torch.finfo(dtype).eps · |x|``. When σ is not
large against that spacing the noise applied is not the noise drawn, and the flip rates describe
another noise. Two things go wrong: the noise is rounded away (most entries keep their clean
value), or — before its size changes at all — the threshold of a decision that hinges on a few
values moves by up to half the spacing, which shifts its flip rate even while the noise keeps its
root mean square. So the check measures the rounding itself, the root mean square of
(applied − drawn), against the noise drawn.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch
from torch import Tensor

from .._autocast import autocast_dtype, autocast_on
from .._exclusive import OwnForwards, held_modules
from .._stack import user_level

#: the noise applied (rounded to the tokens' grid) may differ from the noise drawn by this share
#: of the drawn noise's root mean square at most — the difference itself, not the two sizes (on a
#: grid of spacing Δ the noise keeps its root mean square within 1% up to Δ ≈ 0.5σ, yet a
#: one-value threshold moves by up to Δ/2: fp16 images near 3 at σ = 0.005, rounding 11% of the
#: noise, gave a one-pixel flip rate of 0.0437 against the exact 0.0530) — and at most
#: ``ROUNDING_MAX_UNCHANGED`` of the perturbed entries may keep their clean value. The share equals
#: ``ROUNDING_RTOL`` of :mod:`senslab.measure.sharpness` for low-precision weights, which compares
#: the sizes instead (a loss follows the noise's size, not a threshold's place).
ROUNDING_RTOL = 0.1
ROUNDING_MAX_UNCHANGED = 0.5
#: … and above this share (a spacing of about σ/10) the measurement goes on with a warning: a
#: decision that hinges on a few values can move by several percent (the one-pixel threshold
#: came out 8% low at 0.056, within its standard error at 0.028)
ROUNDING_WARN = 0.03
#: the dtypes whose grids are checked
LOW_PRECISION = (torch.bfloat16, torch.float16)
#: … judged once this many entries got noise (a few copies' worth would judge by chance)
ROUNDING_MIN_ENTRIES = 1024


class GridCheck:
    """Pooled over a measurement's calls: ``check(clean, noise)`` with ``clean`` the
    low-precision token vectors the noise is added to and ``noise`` the noise drawn (one shape).

    Refuses (``ValueError``) where the root mean square of (applied − drawn) is above
    :data:`ROUNDING_RTOL` of the drawn noise's, or more than :data:`ROUNDING_MAX_UNCHANGED` of
    the perturbed entries kept their clean value; warns once above :data:`ROUNDING_WARN`.
    Entries without noise (padding, a zero-noise check) are not counted. Calls are pooled until
    :data:`ROUNDING_MIN_ENTRIES` entries are perturbed, then judged, and whatever is pooled when
    the measurement ends is judged by :meth:`finish`; a call whose noise differs in size by more
    than 2x from the pool's starts a new pool. Every call is looked at (one host
    sync each), because the batch checks' copies carry noise of the token vectors' own size, not
    σ: the first chunk of σ-noise decides. Nothing is drawn (the stream is untouched).

    ``what`` names the tokens in the messages ("images"); ``fix`` is the advice, formatted with
    ``dtype`` and ``spacing``. ``cast``: float32 tokens that autocast rounds to this dtype before
    the model computes with them (:func:`autocast_grid`); ``clean`` is then the float32 tokens,
    judged on ``cast``'s grid. ``by``: what else rounds them to ``cast`` (the model itself, whose
    first layer gets them in its weights' dtype: :func:`first_layer_grid`), said in the messages
    instead of autocast."""

    def __init__(self, what: str, fix: str, cast: torch.dtype | None = None,
                 by: str | None = None) -> None:
        self.what, self.fix, self.cast, self.by = what, fix, cast, by
        self._source: torch.dtype | None = None  # the tokens' own dtype (before ``cast``)
        self._pool = [0.0, 0.0, 0.0, 0.0]  # Σ drawn², Σ (applied − drawn)², # unchanged, # moved
        #: the last call's noisy entries where they landed, and their dtype (for the message)
        self._last: tuple[Tensor, torch.dtype] | None = None
        self._warned = False

    def __call__(self, clean: Tensor, noise: Tensor) -> None:
        if self.cast is not None:
            self._source = clean.dtype
            clean = clean.to(self.cast)
        drawn = noise.float()
        moved = drawn != 0
        landed = clean + noise.to(clean.dtype)
        applied = (landed.float() - clean.float()) * moved
        stats = torch.stack([drawn.double().square().sum(),
                             (applied - drawn).double().square().sum(),
                             ((applied == 0) & moved).sum().double(), moved.sum().double()])
        now, pool = stats.tolist(), self._pool
        if now[3] == 0:
            return
        if pool[3] and not 0.5 < math.sqrt(now[0] / now[3] * pool[3] / pool[0]) < 2:
            # another noise size (a check's): pooled apart, the pool so far judged first
            self.finish()
            pool = [0.0, 0.0, 0.0, 0.0]
        pool = [a + b for a, b in zip(pool, now, strict=True)]
        self._pool, self._last = pool, (landed[moved], clean.dtype)
        if pool[3] >= ROUNDING_MIN_ENTRIES:
            self.finish()

    def finish(self) -> None:
        """Judge the calls pooled so far, however few their entries, and start a new pool: a
        measurement ends before :data:`ROUNDING_MIN_ENTRIES` perturbed entries (60 one-patch
        images of 4 pixels) was never judged, and returned a fifth of the flip rate of bf16
        images whose grid rounded the noise away without a word."""
        pool, last = self._pool, self._last
        self._pool, self._last = [0.0, 0.0, 0.0, 0.0], None
        if not pool[3] or last is None:
            return
        landed, dtype = last
        error, share = math.sqrt(pool[1] / pool[0]), pool[2] / pool[3]
        if error <= ROUNDING_WARN and share <= ROUNDING_MAX_UNCHANGED:
            return
        _, exponent = torch.frexp(landed.double())
        spacing = torch.finfo(dtype).eps * torch.exp2(exponent.double() - 1)
        rms = math.sqrt(float(spacing.square().mean()))
        size = math.sqrt(pool[0] / pool[3])
        dtype = str(dtype).removeprefix("torch.")
        fix = self.fix.format(dtype=dtype, spacing=f"{rms:.2g}")
        if self.cast is None:
            on, grid = f"{dtype} {self.what}", "their grid"
        elif self.by is not None:  # rounded by the model itself (:func:`first_layer_grid`)
            on = f"{str(self._source).removeprefix('torch.')} {self.what}"
            grid = f"the {dtype} grid {self.by}"
        else:  # float32 tokens, rounded by autocast's first convolution or linear layer
            on = f"float32 {self.what} under autocast=torch.{dtype}"
            grid = (f"the {dtype} grid by the model's first convolution or linear layer, which "
                    "autocast runs in that precision")
        where = (f"added to the {on} and rounded to {grid} (root-mean-square "
                 f"spacing {rms:.2g} where it lands), noise of root mean square {size:.2g} is "
                 f"moved by {error:.1%} of that and leaves {share:.0%} of the perturbed entries "
                 f"unchanged")
        if error <= ROUNDING_RTOL and share <= ROUNDING_MAX_UNCHANGED:
            if not self._warned:
                self._warned = True
                warnings.warn(
                    f"the noise is coarse on the {dtype} grid: {where}. A decision that hinges "
                    f"on a few values can change its flip rate by several percent (above "
                    f"{ROUNDING_RTOL:.0%} this is refused). {fix}",
                    UserWarning, stacklevel=user_level())
            return
        raise ValueError(
            f"the noise is too small for the {on}: {where}, so the result would "
            f"describe another noise (accepted: moved by at most {ROUNDING_RTOL:.0%}, at most "
            f"{ROUNDING_MAX_UNCHANGED:.0%} unchanged: a decision that hinges on one value has its "
            f"threshold moved by up to half the spacing). {fix}"
        )


#: the advice where autocast= rounds float32 tokens (``%`` the tokens' name)
AUTOCAST_FIX = ("Measure without autocast= (float32 arithmetic; precision='bf16-checked' keeps "
                "float32's class decisions at bf16's speed), or use a larger sigma, well above "
                "{spacing}: under autocast=torch.{dtype} the model's first convolution or linear "
                "layer rounds the float32 %s, noise included, to {dtype}")


def autocast_grid(x: Tensor) -> torch.dtype | None:
    """The bf16/fp16 grid that autocast rounds float32 tokens ``x`` to before the model computes
    with them — where autocast is on for ``x``'s device and casts to a low precision: its
    convolutions and linear layers cast their inputs, noise included — else None (float64 is
    not cast)."""
    if x.dtype != torch.float32 or not autocast_on(x.device.type):
        return None
    dtype = autocast_dtype(x.device.type)
    return dtype if dtype in LOW_PRECISION else None


#: the advice where the model itself rounds float32 tokens to its weights' dtype (``%`` the
#: tokens' name; :func:`first_layer_grid`)
MODEL_CAST_FIX = ("Measure a float32 copy of the model — model.float(), on which "
                  "precision='bf16-checked' keeps float32's class decisions at bf16's speed — or "
                  "use a larger sigma, well above {spacing}: the model converts the %s, noise "
                  "included, to {dtype} before its first layer")


@contextmanager
def first_layer_grid(model: Any) -> Iterator[list[tuple[str, torch.dtype]]]:
    """Around the clean forward: yields a list that then holds ``(name, dtype)`` of the first
    layer with floating weights of its own (a module without children: a convolution, a linear
    layer) that the forward ran on a floating tensor, and that tensor's dtype — ``[]`` where none
    ran (a parameter-free callable, a ScriptModule, which takes no hooks). A model with bf16 or
    fp16 weights that converts float32 (or float64) inputs to its weights' dtype itself (Hugging
    Face's ViT and CLIP do, as does a forward that calls ``x.to(self.weight.dtype)``) rounds them,
    noise included, to that grid before its first layer: its noise is checked there as
    autocast's is (:class:`GridCheck` with ``cast``). Without this a σ below the grid's spacing
    was rounded away without a word (a one-pixel flip rate of 0.0148 for the exact 0.0530)."""
    seen: list[tuple[str, torch.dtype]] = []
    own = OwnForwards(model)
    handles = []

    def watch(name: str) -> Any:
        def look(module: Any, args: tuple, kwargs: dict) -> None:
            if seen:
                return
            for a in (*args, *kwargs.values()):
                if isinstance(a, Tensor) and a.is_floating_point():
                    seen.append((name, a.dtype))
                    return
        return look

    for top in held_modules(model):
        for name, m in top.named_modules():
            if next(m.children(), None) is not None or not any(
                    p.is_floating_point() for p in m.parameters(recurse=False)):
                continue
            try:
                handles.append(m.register_forward_pre_hook(own.hook(watch(name or
                                                                          type(m).__name__)),
                                                           with_kwargs=True))
            except RuntimeError:  # a ScriptModule takes no hooks
                continue
    try:
        yield seen
    finally:
        for h in handles:
            h.remove()
        own.close()


def model_grid(seen: list[tuple[str, torch.dtype]], x: Tensor) -> tuple[torch.dtype, str] | None:
    """The bf16/fp16 grid that the model itself rounds float32/float64 tokens ``x`` to (what
    :func:`first_layer_grid` saw), and the words for it; None where it does not."""
    if not seen or x.dtype not in (torch.float32, torch.float64):
        return None
    name, dtype = seen[0]
    if dtype not in LOW_PRECISION:
        return None
    dtype_name = str(dtype).removeprefix("torch.")
    return dtype, (f"by the model itself: its first layer with weights, {name!r}, gets its input "
                   f"as {dtype_name} (the model converts its inputs to that dtype before it)")
