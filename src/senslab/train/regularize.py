r"""Sensitivity regularization (main paper §7;
docs/definitions.md#regularization), for images and text, with any task loss.

Two ways to push a model towards low sensitivity:

* **Augmentation** — :func:`gaussian_noise_augment`: train on :math:`x + \varepsilon`,
  :math:`\varepsilon \sim \mathcal N(0, \sigma^2 I)`, with the labels of :math:`x`.
* **Regularizer** — :func:`sensitivity_regularized_loss`:

  .. math::

      \mathcal L = (1-\alpha)\,\ell\big(f(x), y\big)
                 + \alpha\,\mathrm{MSE}\big(f(\tilde x), f(x)\big),

  where :math:`\ell` is the task loss (cross-entropy unless ``loss_fn`` says otherwise) and
  :math:`\tilde x` is :math:`x` with Gaussian noise of std :math:`\sigma` added to **one** token
  per example, drawn uniformly and independently for every example:

  - images (``tokens=None`` or :class:`~senslab.tokens.Patches`): one contiguous
    :math:`p\times p` patch (all channels; :func:`random_patch_noise`) on the grid that
    :class:`~senslab.tokens.Patches` uses;
  - text (:class:`~senslab.tokens.Embedding`): one real (non-padding) position of the
    batch-first (B, T, D) output of the named submodule, e.g. the LayerNorm after the token
    embedding — the noise lands on the model's embeddings, never on integer token ids;
  - vector sequences (:class:`~senslab.tokens.Sequence`): one (B, T, D) input vector.

  :func:`sensitivity_penalty` is the MSE term alone with the clean output, for a training step
  that combines it with a loss of its own. Paper code: :math:`\sigma = 1`, :math:`\alpha = 0.5`,
  images. (The paper code shared one set of perturbed pixels across the whole batch — a defect
  not copied.)

The noise functions take a ``torch.Generator`` that the caller keeps across steps; an int seed is
refused because re-seeding every step would add the *same* noise at every step.
"""

from __future__ import annotations

import math
import sys
import threading
import warnings
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .._autocast import autocast_dtype, autocast_on
from .._exclusive import OwnForwards, exclusive
from .._stack import user_level
from ..measure.tokenwise import _own_forward
from ..tokens import Embedding, Patches, Sequence, Tokenization, find_module
from ..tokens._grid import LOW_PRECISION, GridCheck, autocast_grid
from ..tokens.base import (
    Inputs,
    OutputSelector,
    batch_size,
    call_model,
    real_tokens,
    valid_mask,
)
from ..tokens.embedding import (
    _refuse_added_positions,
    _refuse_unmasked_padding,
    _say_mask_over_padding,
    input_mask,
    unwrapped,
)
from ..tokens.patches import _looks_channels_last


def _check_generator(generator: object) -> torch.Generator:
    if not isinstance(generator, torch.Generator):
        raise TypeError(
            f"generator must be a torch.Generator kept across training steps, got "
            f"{type(generator).__name__}; an int seed would repeat the same noise every step — "
            "create one with torch.Generator(device=x.device).manual_seed(seed)"
        )
    return generator


def _check_number(value: object, name: str, what: str) -> None:
    """Refuse a setting that is no Python number: a bool (``alpha=True`` trained on the MSE term
    alone, ``sigma=True`` added σ = 1, without a word) or a tensor/NumPy scalar (refused before
    as out of range: true of no such value, and no fix named)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{name} is {what} and must be a number, got {value!r} "
                        f"({type(value).__name__}); pass float({name}) for a tensor or NumPy "
                        f"scalar")


def _check_sigma(sigma: float) -> None:
    _check_number(sigma, "sigma", "a noise standard deviation")
    if not (math.isfinite(sigma) and sigma >= 0):
        raise ValueError(f"sigma is a noise standard deviation and must be >= 0, got {sigma!r}")


#: where the noise goes for text, in the errors that refuse token ids
_TEXT_FIX = ("for text, put the noise on the model's embeddings: sensitivity_regularized_loss"
             "(..., tokens=Embedding(name)), name the token embedding or the LayerNorm after it")


def _check_float(x: Any, what: str) -> None:
    """Refuse inputs the noise cannot be added to. Token ids (an integer tensor, a dict of model
    inputs) are named as such: ``.float()`` would turn ids into numbers whose noisy values name
    no token, so the error points to ``tokens=Embedding(...)`` instead."""
    if isinstance(x, Tensor) and x.is_floating_point():
        return
    if isinstance(x, Tensor) and not x.is_complex() and x.dtype != torch.bool:
        raise TypeError(
            f"{what} holds {x.dtype} values (token ids or class indices): Gaussian noise "
            f"added to an id names no token, and .float() would not change that; {_TEXT_FIX}; "
            "for real-valued data held as integers (e.g. uint8 pixels), convert to float "
            "(and scale) first")
    if isinstance(x, (dict, tuple, list)):
        raise TypeError(
            f"{what} is a {type(x).__name__} of model inputs (e.g. input_ids and "
            f"attention_mask), not one floating-point tensor the noise could be added to; "
            f"{_TEXT_FIX}")
    kind = x.dtype if isinstance(x, Tensor) else type(x).__name__
    raise TypeError(f"{what} must be a floating-point tensor, got {kind}; convert with .float()")


#: what to do where the noise is too small for the low-precision tokens it lands on
_ROUNDING_FIX = ("Use a larger sigma, well above {spacing}, or float32 %s and a float32 model "
                 "(outside torch.autocast, whose first matrix product would round them to "
                 "{dtype} again)")
#: noise added to bf16/fp16 tokens is checked against the noise drawn (tokens._grid), each
#: call on its own noise: the images or inputs, the vector sequences, each hooked embedding stage
_ROUNDING = {"images": GridCheck("images", _ROUNDING_FIX % "images"),
             "inputs": GridCheck("inputs", _ROUNDING_FIX % "inputs"),
             "vectors": GridCheck("token vectors", _ROUNDING_FIX % "token vectors")}


#: … and where float32 tokens meet a matrix product under torch.autocast, which rounds them
#: to autocast's dtype before the model computes with them (the noise lands on that grid)
_AUTOCAST_FIX = ("Use a larger sigma, well above {spacing}, or compute the regularizer's two "
                 "forwards outside torch.autocast (in float32): under autocast the model's first "
                 "matrix product rounds the float32 %s, noise included, to {dtype}")


def _grid_dtype(clean: Tensor) -> torch.dtype | None:
    """The low-precision grid the noisy tokens land on before the model computes with them:
    their own dtype (bf16/fp16), or autocast's where it is on for their device and they are
    float32 (its convolutions and linear layers cast their inputs); None: no such grid."""
    return clean.dtype if clean.dtype in LOW_PRECISION else autocast_grid(clean)


def _check_rounding(kind: str, clean: Tensor, noise: Tensor) -> None:
    """Refuse noise that ``clean``'s low-precision grid rounds into another noise (above 10%
    of its root mean square moved, or over half the entries unchanged; a warning from 3%):
    bf16/fp16 tokens, and float32 tokens under a bf16/fp16 ``torch.autocast`` (whose first
    matrix product rounds them; a σ = 0.001 penalty on images near 3 came out 180× the float32
    one, the rounding's own change, without a word); float32 and float64 tokens outside
    autocast pass unlooked at. ``kind``: a key of :data:`_ROUNDING`, or an embedding stage's
    name.

    Every call is judged on its own noise (:meth:`GridCheck.finish`): each returns a loss of
    its own, and pooled with earlier calls until 1024 entries, a batch of 4 bf16 images at
    σ = 0.001 returned a penalty of 0.0 (float32: 8.6e-8) without a word, and the refusal came
    calls later — on a sound σ = 1 call, naming the earlier noise."""
    dtype = _grid_dtype(clean)
    if dtype is None:
        return
    # a NaN or inf token stays so with any noise: judged, it read as noise rounded away ("the
    # noise is too small … use a larger sigma" for one NaN pixel at σ = 1), where float32
    # tokens give a NaN penalty; its entries are left out (no noise: not counted), no host sync
    finite = clean.isfinite()
    clean, noise = torch.where(finite, clean, 0), torch.where(finite, noise, 0)
    if dtype != clean.dtype:  # autocast's grid: checked apart, its own advice
        what = {"images": "images", "inputs": "inputs", "vectors": "token vectors"}.get(
            kind, f"token vectors of {kind!r}")
        key = f"autocast:{kind}"
        if key not in _ROUNDING:
            _ROUNDING[key] = GridCheck(f"{what} (as torch.autocast rounds them)",
                                       _AUTOCAST_FIX % what)
        _ROUNDING[key](clean.to(dtype), noise)
        _ROUNDING[key].finish()
        return
    if kind not in _ROUNDING:
        fix = _ROUNDING_FIX % f"token vectors at {kind!r}"
        _ROUNDING[kind] = GridCheck(f"token vectors of {kind!r}", fix)
    _ROUNDING[kind](clean, noise)
    _ROUNDING[kind].finish()


#: where more than this share of the penalty (of Σ (f(x̃) − f(x))²) comes from bf16/fp16 output
#: entries moved by at most one step of their grid, the penalty is mostly the outputs' rounding:
#: a bf16 MLP whose logits sit near 3 gave at share 0.31 a penalty 13% above the float32 one, at
#: 1.0 twice to 180 times it (logits near 3 to 100, σ = 0.1 on [−1, 1] images)
_OUTPUT_GRID_SHARE = 0.25
#: the output dtypes and cases (coarse, zero) already warned of: said once per process
_OUTPUT_GRID_SAID: set[str] = set()


def _low_precision_params(model: Any) -> torch.dtype | None:
    """The bf16/fp16 dtype of ``model``'s first such parameter, or None (no host sync)."""
    if isinstance(model, nn.Module):
        for p in model.parameters():
            if p.dtype in LOW_PRECISION:
                return p.dtype
    return None


def _output_grid(clean: Tensor, noisy: Tensor, model: Any) -> torch.dtype | None:
    """The low-precision grid the outputs lie on: their own dtype (bf16/fp16), or — for float32
    outputs of a model that holds bf16/fp16 parameters — that dtype where every clean and noisy
    entry lies on its grid (the model's logits cast with ``.float()`` at the end: still rounded
    to bf16, though their dtype says float32); None: no such grid."""
    if clean.dtype in LOW_PRECISION:
        return clean.dtype
    if clean.dtype != torch.float32:
        return None
    low = _low_precision_params(model)
    if low is None:
        return None
    with torch.no_grad():
        both = torch.stack([clean.detach(), noisy.detach()])
        on = bool((both.to(low).float() == both).all())
    return low if on else None


def _check_output_grid(clean: Tensor, noisy: Tensor, sigma: float, model: Any = None) -> bool:
    """Warn where bf16/fp16 outputs (a bf16 model's, or a linear head's under autocast) are
    too coarse for the change the noise makes: the difference of two outputs on the grid
    moves in whole steps of it (about ``eps · |f(x)|``), so a change below a step is rounded
    to none or to a whole step, and the penalty — and its gradient — measure that rounding.
    Computing the MSE in float32 would not help: the outputs are rounded already. Judged on
    this call's outputs: the share of the penalty that comes from entries moved by one step or
    less (entries the noise leaves alone, as in a causal model's earlier positions, do not
    count), or a penalty of exactly 0 at σ > 0. Float32 outputs of a bf16/fp16 ``model`` that
    lie on its grid (``.float()`` on its logits) are judged on that grid: their dtype hid a
    penalty 15× the float32 model's. Other float32 and float64 outputs pass unlooked at here
    (under autocast, :func:`_check_autocast_outputs` looks); each case is said once per dtype.
    Returns whether this call's outputs are too coarse (said now or before)."""
    if sigma == 0 or noisy.shape != clean.shape:
        return False
    grid = _output_grid(clean, noisy, model)
    if grid is None:
        return False
    with torch.no_grad():
        c, n = clean.detach().float(), noisy.detach().float()
        diff = (n - c).abs()
        _, exponent = torch.frexp(torch.maximum(c.abs(), n.abs()))
        step = torch.finfo(grid).eps * torch.exp2(exponent.float() - 1)
        square = diff.square()
        total, coarse = torch.stack([square.sum(), (square * (diff <= step)).sum()]).tolist()
        spacing = math.sqrt(float(step.square().mean()))
    dtype = str(grid).removeprefix("torch.")
    outputs = (f"{dtype} outputs" if grid == clean.dtype else
               f"float32 outputs (on the {dtype} grid: the {dtype} model's outputs cast to "
               "float32, rounded all the same)")
    if total == 0:
        case, what = "zero", (
            f"the penalty is exactly 0 at sigma={sigma}: no entry of the {outputs} "
            "changed, so this step is not regularized. Either the model ignores the noised "
            f"token, or its change is below the outputs' grid (root-mean-square spacing "
            f"{spacing:.2g})")
    elif coarse > _OUTPUT_GRID_SHARE * total:
        case, what = "coarse", (
            f"{coarse / total:.0%} of the penalty comes from entries of the {outputs} moved by "
            f"one step of their grid or less (root-mean-square spacing {spacing:.2g}): the "
            "noise's change of the outputs is below their precision, so the penalty and its "
            "gradient measure the rounding")
    else:
        return False
    if f"{dtype}:{case}" in _OUTPUT_GRID_SAID:
        return True
    _OUTPUT_GRID_SAID.add(f"{dtype}:{case}")
    warnings.warn(
        f"sensitivity_penalty: {what}. Compute the outputs in float32 (a float32 model, or "
        "its last layer in float32 outside torch.autocast), or use a larger sigma; said once",
        UserWarning, stacklevel=user_level())
    return True


#: under a bf16/fp16 torch.autocast, the outputs can be float32 (a last LayerNorm or softmax that
#: autocast keeps in float32, ``.float()`` on the logits, a float32 head outside autocast) or
#: bf16 far from the grid that rounded them (a last LayerNorm rescales bf16 steps upstream), and
#: still carry the bf16 rounding of every matrix product before: no look at the outputs alone
#: sees it. So the noise's change of the outputs is computed again without autocast (float32)
#: and compared, on the first such call and every ``_AUTOCAST_EVERY``-th after (4 forwards
#: without gradients each; none outside autocast). Above this root-mean-square share of the
#: float32 change, the rounding's change is warned about: at 0.75 (logits near 100, σ = 1) the
#: penalty came out 1.6× the float32 one, at 3.7 (σ = 0.1) 15×, its gradient at cosine 0.48
_AUTOCAST_SHARE = 0.25
_AUTOCAST_EVERY = 100
#: calls under a low-precision autocast or with a model holding bf16/fp16 parameters so far
#: (every rank of a distributed run counts alike, so all of them run the checks' forwards at
#: the same steps, warned or not)
_AUTOCAST_CALLS = [0]
#: a model holding bf16/fp16 parameters has no float32 model to compare with (a float32 copy
#: would double its memory), so the noise is replayed at −½, ½ (and 0, 1) of its size: the
#: third difference f(x+ε) − 3 f(x+ε/2) + 3 f(x) − f(x−ε/2) is 0 for a change that is linear
#: or quadratic in the noise, and holds the forwards' rounding (rounding errors independent
#: across the four, it has 10 times the mean square of the rounding in f(x̃) − f(x)). Above
#: this estimated share of the penalty, the rounding is warned about. Bf16 models (σ = 0.1–1,
#: [−1, 1] images) with a last LayerNorm, softmax or log_softmax after logits near 100, whose
#: penalty came out 1.5 to 15 times the float32 model's: 0.28–0.41; logits near 0, a
#: Conv+BatchNorm+Dropout CNN and a tanh/GELU MLP (penalty within 1% of float32's): ≤ 0.06
#: at σ ≤ 1, ≤ 0.15 at σ = 3 (there the change's cubic part, not rounding)
_SCALING_SHARE = 0.2
_SCALES = (-0.5, 0.5)


def _eval_reruns(model: Any, rerun: Callable[[float], Tensor], scales: tuple[float, ...],
                 clean: Tensor, noisy: Tensor,
                 exact: tuple[float, ...] = ()) -> list[Tensor] | None:
    """``rerun(s)`` for each of ``scales`` (0: the clean forward, 1: the noisy one, else the
    same noise times s), then for each of ``exact`` with autocast off, without gradients, in
    eval mode (every module's flag put back after): dropout would draw other masks for each,
    and a train-mode BatchNorm would update its running statistics again. A model already in
    eval mode reuses this call's ``clean`` and ``noisy`` for 0 and 1 of ``scales`` (the
    forwards ran as these would). None where the model refuses ``eval()`` (torch.export's
    module)."""
    modules = list(model.modules()) if isinstance(model, nn.Module) else []
    # a thread measuring the model switches its modes too: the two take turns
    with exclusive(model), torch.no_grad():
        modes = [m.training for m in modules]
        try:
            mine = {} if any(modes) else {0: clean.detach(), 1: noisy.detach()}
            if any(modes):
                model.eval()
            runs = [mine[s] if s in mine else rerun(s) for s in scales]
            if exact:
                with torch.autocast(clean.device.type, enabled=False):
                    runs += [rerun(s) for s in exact]
            return runs
        except NotImplementedError:  # torch.export's module: "Calling eval() is not supported"
            return None
        finally:
            for m, training in zip(modules, modes, strict=True):
                m.training = training


def _check_output_scaling(model: Any, rerun: Callable[[float], Tensor], clean: Tensor,
                          noisy: Tensor, sigma: float, said: bool, low: torch.dtype) -> None:
    """Warn where the forwards of a model holding bf16/fp16 parameters round the noise's change
    of the outputs more than :data:`_SCALING_SHARE` of the penalty, estimated from the noise
    replayed scaled (:data:`_SCALES`; 2 forwards without gradients, 4 for a model in train
    mode): a last LayerNorm or softmax spreads the rounding of the bf16 logits before it over
    many steps of the outputs' own grid (a penalty 11.7× the float32 model's at σ = 0.1, which
    :func:`_check_output_grid` cannot see), and there is no float32 model to compare with."""
    runs = _eval_reruns(model, rerun, (0, 1, *_SCALES), clean, noisy)
    if runs is None or any(r.shape != clean.shape for r in runs):
        return
    c, n, minus, half = (r.float() for r in runs)
    third = n - 3 * half + 3 * c - minus
    pen, err = torch.stack([(n - c).square().mean(), third.square().mean() / 10]).tolist()
    if said or not (math.isfinite(pen) and math.isfinite(err) and pen > 0):
        return
    if err <= _SCALING_SHARE * pen:
        return
    name = str(low).removeprefix("torch.")
    if f"scaling:{name}" in _OUTPUT_GRID_SAID:
        return
    _OUTPUT_GRID_SAID.add(f"scaling:{name}")
    warnings.warn(
        f"sensitivity_penalty: about {err / pen:.0%} or more of the penalty ({pen:.3g} in eval "
        f"mode) is the rounding of the {name} model's forwards, not the noise's change: "
        "replayed at -1/2 and 1/2 of its size, the noise's change of the outputs is not the "
        f"smooth function of it a float model gives (sigma={sigma}). The {name} products "
        "before the outputs round that change, and a last LayerNorm or softmax spreads the "
        "rounding over many steps of the outputs' own grid, so the penalty and its gradient "
        "measure it. Train with float32 parameters (bf16 under torch.autocast if needed), "
        "compute the outputs' last layers in float32, or use a larger sigma; said once",
        UserWarning, stacklevel=user_level())


def _check_autocast_outputs(model: Any, rerun: Callable[[float], Tensor], clean: Tensor,
                            noisy: Tensor, sigma: float, said: bool = False) -> None:
    """Warn where, under a bf16/fp16 ``torch.autocast`` on the outputs' device, the noise's
    change of the outputs differs from the float32 model's by more than
    :data:`_AUTOCAST_SHARE` of the latter (root mean square): the penalty and its gradient
    then measure autocast's rounding, whatever the outputs' dtype. ``rerun(noisy)`` runs the
    clean or noisy forward again on the same inputs and noise. Both pairs of forwards run in
    eval mode (every module's flag put back after): dropout would make the two pairs differ
    by its masks, and a train-mode BatchNorm would update its running statistics again. A
    model that holds bf16/fp16 parameters (under autocast or not) has no float32 to compare
    with: it gets :func:`_check_output_scaling` instead, on the same schedule; float32 and
    float64 models outside autocast get no extra forwards. ``said``: :func:`_check_output_grid`
    warned of this call already (the forwards run all the same, so that every rank runs them
    at the same steps)."""
    device = clean.device.type
    if sigma == 0 or noisy.shape != clean.shape:
        return
    dtype = autocast_dtype(device) if autocast_on(device) else None
    params = _low_precision_params(model)
    if params is None and dtype not in LOW_PRECISION:
        return
    calls = _AUTOCAST_CALLS[0]
    _AUTOCAST_CALLS[0] += 1
    if calls % _AUTOCAST_EVERY:
        return
    if params is not None:
        _check_output_scaling(model, rerun, clean, noisy, sigma, said, params)
        return
    runs = _eval_reruns(model, rerun, (0, 1), clean, noisy, exact=(0, 1))
    if runs is None:
        return
    with torch.no_grad():
        change = runs[3].float() - runs[2].float()
        moved = runs[1].float() - runs[0].float()
        ref, err, pen = torch.stack([change.square().mean(), (moved - change).square().mean(),
                                     moved.square().mean()]).tolist()
    if (said or not (math.isfinite(ref) and math.isfinite(err))
            or err <= _AUTOCAST_SHARE**2 * ref):
        return
    name = str(dtype).removeprefix("torch.")
    if f"autocast:{name}" in _OUTPUT_GRID_SAID:
        return
    _OUTPUT_GRID_SAID.add(f"autocast:{name}")
    share = "all" if ref == 0 else f"{math.sqrt(err / ref):.0%}"
    warnings.warn(
        f"sensitivity_penalty: under torch.autocast(dtype=torch.{name}) the noise's change of "
        f"the outputs differs from the float32 model's by {share} of the latter (root mean "
        f"square; penalty {pen:.3g} against {ref:.3g} in float32, both in eval mode): the "
        f"change is below the "
        f"precision of the {name} matrix products before the outputs, so the penalty and "
        "its gradient measure their rounding — whatever the outputs' dtype (a float32 "
        "LayerNorm, softmax or .float() at the end does not undo it). Compute the "
        "regularizer's two forwards outside torch.autocast (in float32), or use a larger "
        "sigma; said once",
        UserWarning, stacklevel=user_level())


def _randn_like(x: Tensor, shape: tuple[int, ...], generator: torch.Generator) -> Tensor:
    """Standard normals drawn on the generator's device, returned on x's device and dtype."""
    noise = torch.randn(shape, generator=generator, device=generator.device, dtype=torch.float32)
    return noise.to(device=x.device, dtype=x.dtype)


def gaussian_noise_augment(x: Tensor, sigma: float, generator: torch.Generator) -> Tensor:
    r""":math:`x + \varepsilon`, :math:`\varepsilon \sim \mathcal N(0, \sigma^2 I)` on every entry;
    the labels of ``x`` stay as they are. ``sigma`` is a standard deviation in the units of ``x``
    (senslab's images are normalised to [−1, 1]). ``x`` itself is not modified."""
    _check_float(x, "x")
    _check_sigma(sigma)
    gen = _check_generator(generator)
    noise = sigma * _randn_like(x, tuple(x.shape), gen)
    _check_rounding("inputs", x, noise)
    return x + noise


def random_patch_noise(x: Tensor, patch: int, sigma: float, generator: torch.Generator,
                       channel_scale: Tensor | None = None) -> Tensor:
    r"""``x`` (B, C, H, W) with :math:`\mathcal N(0, \sigma^2)` noise added to one random
    ``patch``×``patch`` patch per example (all channels), everything else untouched.

    Patch positions lie on the non-overlapping grid of :class:`senslab.tokens.Patches` (patch
    ``t`` at row ``t // (W/p)``, column ``t % (W/p)``) and are drawn uniformly and independently
    per example. Vectorised: one ``randint`` for the positions, one ``randn`` of shape
    (B, C, p, p) for the noise, one indexed add. ``x`` itself is not modified.
    ``channel_scale`` (C,) multiplies channel ``c``'s noise (``1/std``: σ given in pixel units
    behind the model's normalisation).
    """
    _check_float(x, "x")
    if x.dim() != 4:
        raise ValueError(
            f"random_patch_noise expects images of shape (batch, channels, height, width), got "
            f"{tuple(x.shape)}; add a channel axis with x.unsqueeze(1) for grayscale images "
            "(batch, height, width). Inputs that are no images take their noise elsewhere: "
            "tokens=Sequence() on one vector of (batch, tokens, dim) sequences, "
            "tokens=Embedding(name) on a text model's embeddings"
        )
    _check_sigma(sigma)
    gen = _check_generator(generator)
    b, c, h, w = x.shape
    gh, gw = Patches(patch).grid(h, w)  # checks that the patch size divides the image
    tok = torch.randint(gh * gw, (b,), generator=gen, device=gen.device).to(x.device)
    noise = sigma * _randn_like(x, (b, c, patch, patch), gen)
    if channel_scale is not None:
        noise = noise * channel_scale.to(device=x.device, dtype=x.dtype).view(1, c, 1, 1)
    out = x.clone(memory_format=torch.contiguous_format)  # the view below needs this layout
    grid = out.view(b, c, gh, patch, gw, patch)
    rows = torch.arange(b, device=x.device)
    # advanced indices (rows, tok // gw, tok % gw) select a (B, C, p, p) block, one per example
    if _grid_dtype(x) is not None:
        _check_rounding("images", grid[rows, :, tok // gw, :, tok % gw, :], noise)
    grid[rows, :, tok // gw, :, tok % gw, :] += noise
    return out


@contextmanager
def _untraced(model: Any) -> Iterator[None]:
    """A forward that leaves no trace in the training: without gradients, and with the model's
    buffers (a train-mode BatchNorm's running statistics and batch count) and the global random
    streams (a train-mode dropout's masks) put back after it. The noisy forward at
    ``alpha=0`` runs so, for the MSE it logs: run as at ``alpha > 0``, it updated the
    running statistics with the noisy batch (``num_batches_tracked`` twice per step) and
    advanced the dropout stream, so that training at ``alpha=0`` left the unregularized one
    (last-layer weights 0.046 apart after 3 SGD steps)."""
    modules = list(model.modules()) if isinstance(model, nn.Module) else []
    saved = [(m, k, b, b.detach().clone()) for m in modules for k, b in m._buffers.items()
             if b is not None]
    kinds: dict[str, set[int]] = {}
    for m in modules:
        for t in [*m.parameters(recurse=False), *m.buffers(recurse=False)]:
            if t.device.type not in ("cpu", "meta"):
                kinds.setdefault(t.device.type, set()).add(t.device.index or 0)
    with ExitStack() as stack, torch.no_grad():
        stack.enter_context(torch.random.fork_rng(devices=[]))  # the CPU stream
        for kind, indices in kinds.items():
            stack.enter_context(torch.random.fork_rng(devices=sorted(indices), device_type=kind))
        try:
            yield
        finally:
            for m, k, b, copy in saved:
                # the values the clean forward's graph saw; through .data, since a version
                # bump made the backward of a BatchNorm (which saves its running statistics)
                # refuse the step
                b.data.copy_(copy)
                m._buffers[k] = b  # a buffer the forward replaced


@contextmanager
def _clean_statistics(model: Any) -> Iterator[None]:
    """A training forward (gradients, dropout and batch statistics as ever) that leaves the
    running statistics of train-mode BatchNorm (and InstanceNorm with
    ``track_running_stats``) layers, and their batch counts, as it found them. The noisy
    forward runs so: running statistics estimate the clean data the model is evaluated on,
    and a noisy forward taken in counted each step twice, half of it the noisy batch — a CNN
    regularized on Fashion-MNIST (σ = 3, 7×7 patches) kept a first-layer running variance
    1.42× (up to 2.2×) its clean data's, and its eval loss was 6% above the same weights' with
    clean statistics, without a word. Only these layers' buffers are saved (a few numbers per
    channel); put back through ``.data``, as :func:`_untraced` does."""
    saved = [(t, t.detach().clone()) for m in (model.modules() if isinstance(model, nn.Module)
                                                else ())
             if isinstance(m, nn.modules.batchnorm._NormBase) and m.training
             and m.track_running_stats
             for t in (m.running_mean, m.running_var, m.num_batches_tracked)
             if isinstance(t, Tensor) and not isinstance(t, nn.parameter.UninitializedBuffer)]
    try:
        yield
    finally:
        for t, copy in saved:
            t.data.copy_(copy)


def _second(model: Any, untraced: bool, forward: Callable[[], Tensor]) -> Tensor:
    """``forward()`` (the noisy forward), inside :func:`_untraced` where ``untraced``, else
    inside :func:`_clean_statistics`."""
    with (_untraced if untraced else _clean_statistics)(model):
        return forward()


def _embedding_target(model: nn.Module, tokens: Embedding) -> nn.Module:
    """The hooked module: ``tokens.module`` itself, or the submodule it names — in ``model``, or
    in the model a DDP/DataParallel/``torch.compile`` wrapper holds (names as measurements
    take them: ``"bert.embeddings.LayerNorm"``, not ``"module.bert…"``)."""
    module: Any = tokens.module
    if isinstance(module, nn.Module):
        return module
    inner = unwrapped(model)
    if type(model).__name__ == "_FabricModule" and isinstance(getattr(model, "module", None),
                                                              nn.Module):
        inner = unwrapped(model.module)  # Lightning Fabric's: "ln", not "_forward_module.ln"
    if inner is not model and module not in dict(model.named_modules()):
        return find_module(inner, module)
    return find_module(model, module)


def _real_tokens(inputs: Inputs, mask: Tensor | None, b: int, t: int,
                 device: torch.device, model: Any = None, name: str = "") -> Tensor:
    """(B, T) bool: the positions that may get the noise — ``mask``, else the input's
    attention mask (the keys :class:`~senslab.tokens.Embedding` reads; of a tuple input, the
    argument of ``model``'s forward it binds to), else all. Without either, ``model``'s token
    ids (the stage ``name`` puts out T positions) are refused, as a measurement refuses them,
    where they end with the pad id ``model`` declares or count other than T positions: the
    noise would land on padding. A ``mask`` that marks positions the attention mask calls
    padding is warned about, as a measurement warns (``mask=ids != bos_id``, true on the
    padding too, put the noise there without a word: a penalty 5× too small)."""
    given = mask is not None
    key, found = input_mask(inputs, b, t, given, model)
    if not given:
        if isinstance(found, Tensor):  # of another shape it is refused, as the measurement does
            mask = found
        elif model is not None:
            _refuse_unmasked_padding(model, inputs, b, t)
            _refuse_added_positions(inputs, b, t, name)
    valid = valid_mask(mask, b, t, device)
    if given and isinstance(found, Tensor) and tuple(found.shape) == (b, t):
        try:
            padding = real_tokens(found, f"the input's {key!r} entry")
        except ValueError:  # an additive mask: mask= says which tokens are real, as measured
            padding = None
        if padding is not None:
            _say_mask_over_padding(valid, padding.to(device), key)
    empty = (~valid.any(dim=1)).nonzero().flatten()
    if len(empty):
        raise ValueError(f"example(s) {empty.tolist()} of the batch have no real token to add "
                         "noise to (their mask is all false); drop them from the batch")
    return valid


#: the code of ``torch.autograd.Function.apply`` where it is Python (a C function in newer
#: torch, whose frames then show only the Function's own ``forward``)
_APPLY_CODE = getattr(getattr(torch.autograd.Function.apply, "__func__", None), "__code__", None)


def _function_forward(frame: Any) -> bool:
    """Whether ``frame`` runs a custom autograd Function's ``forward``: its first argument is
    the Function's context, or its qualified name names a subclass of ``autograd.Function``."""
    code = frame.f_code
    if code.co_name != "forward":
        return False
    if code.co_argcount and isinstance(frame.f_locals.get(code.co_varnames[0]),
                                       torch.autograd.function.FunctionCtx):
        return True
    path = getattr(code, "co_qualname", "").split(".")[:-1]  # the class, outside functions
    owner: Any = frame.f_globals.get(path[0]) if path and "<locals>" not in path else None
    for name in path[1:]:
        owner = getattr(owner, name, None)
    return isinstance(owner, type) and issubclass(owner, torch.autograd.Function)


def _recomputed() -> str | None:
    """What recomputes the caller's forward in the backward pass without this module's hooks,
    or None: ``torch.utils.checkpoint`` (its frames on this thread's stack, or its saved-tensor
    hooks active: the composable ``checkpoint(module)`` too), or a custom autograd Function
    whose forward runs the module (the activation checkpointing of DeepSpeed, fairscale,
    Megatron: recomputed in its backward; such a forward runs with gradients off)."""
    top = getattr(torch._C._autograd, "_top_saved_tensors_default_hooks", None)
    hooks = top(False) if top is not None else None
    if hooks is not None and str(getattr(hooks[0], "__module__", "")).startswith(
            "torch.utils.checkpoint"):
        return "an activation checkpoint (torch.utils.checkpoint)"
    custom = not torch.is_grad_enabled()
    frame = sys._getframe(1)
    while frame is not None:
        if frame.f_globals.get("__name__") == "torch.utils.checkpoint":
            return "an activation checkpoint (torch.utils.checkpoint)"
        if frame.f_code is _APPLY_CODE or (custom and _function_forward(frame)):
            return "a custom autograd Function's forward (activation checkpointing recomputes it)"
        frame = frame.f_back
    return None


def _pick_tokens(valid: Tensor, generator: torch.Generator) -> Tensor:
    """One position per row of ``valid`` (B, T), uniform over its true entries."""
    weights = valid.to(device=generator.device, dtype=torch.float32)
    return torch.multinomial(weights, 1, generator=generator).squeeze(1).to(valid.device)


def _embedding_branches(model: nn.Module, inputs: Inputs, tokens: Embedding, sigma: float,
                        generator: torch.Generator, mask: Tensor | None,
                        output: OutputSelector,
                        replay: list[Callable[[float], Tensor]] | None = None,
                        untraced: bool = False) -> tuple[Tensor, Tensor]:
    """(clean, noisy) outputs, the noisy forward with N(0, σ²I) added to one real position of
    the ``tokens.module`` output per example (a forward hook that exists only here).
    ``replay``, where given, receives a function that runs the forward again with the same
    noise times a scale (0: clean, 1: noisy); ``untraced``: the noisy forward leaves no trace
    (:func:`_untraced`)."""
    target = _embedding_target(model, tokens)
    seen: list[Tensor] = []
    delta: list[Tensor] = []  # empty: the clean pass
    landing: list[Tensor] = []  # (rows, tok, noise) of the noisy pass
    name = tokens.module if isinstance(tokens.module, str) else type(tokens.module).__name__
    own = OwnForwards(model)  # another thread's forwards of the model pass through

    training = torch.is_grad_enabled()

    def hook(module: nn.Module, args: Any, out: Any) -> Any:
        where = _recomputed() if training else None
        if where is not None:
            raise ValueError(
                f"Embedding({tokens.module!r}) runs inside {where}; a Hugging Face model's "
                "activation_checkpointing_enable() or gradient_checkpointing_enable() makes "
                "one: the backward pass would recompute it without the regularizer's noise, so "
                "the penalty's gradient would be wrong. Name a module outside the checkpointed "
                "blocks (a model's token embedding, or the LayerNorm after it, usually is), or "
                "turn checkpointing off for the regularized steps")
        if not isinstance(out, Tensor) or out.dim() != 3 or not out.is_floating_point():
            got = tuple(out.shape) if isinstance(out, Tensor) else type(out).__name__
            raise ValueError(
                f"Embedding({tokens.module!r}) returned {got}; the regularizer needs a floating "
                "(batch, tokens, dim) output — name the embedding or the LayerNorm after it")
        seen.append(out)
        if not delta:
            return None
        if _grid_dtype(out) is not None:
            rows, tok, noise = landing
            _check_rounding(name, out[rows, tok], noise)
        return out + delta[0].to(out.dtype)

    def run() -> Tensor:
        seen.clear()
        out = call_model(model, inputs, output)
        if len(seen) != 1:
            raise ValueError(
                f"submodule {tokens.module!r} ran {len(seen)} times in one forward pass; the "
                "regularizer adds its noise where it runs exactly once — name the token "
                "embedding or the LayerNorm after it")
        return out

    handle = target.register_forward_hook(own.hook(hook))
    try:
        clean = run()
        b, t, d = seen[0].shape
        if b != batch_size(inputs):
            raise ValueError(
                f"Embedding({tokens.module!r}) returned {tuple(seen[0].shape)} for a batch of "
                f"{batch_size(inputs)} examples: not batch-first, so the noise would go to one "
                f"position of each of {b} rows, not to one token of each example. Name a stage "
                "whose output is (batch, tokens, dim), e.g. the token embedding or the "
                "LayerNorm after it, before the model transposes to (tokens, batch, dim)")
        if isinstance(tokens.position, int) and clean.dim() == 3 and clean.shape[1] == t:
            k = tokens.position
            raise ValueError(
                f"Embedding(position={k}) reads a measurement's per-position output "
                f"{tuple(clean.shape)} at position {k}; the regularizer compares the whole "
                "output it is given, so it would compare every position. Select the position "
                f"with output=lambda out: out[:, {k}] (a Hugging Face model's: "
                f"lambda out: out.logits[:, {k}]), or position=None to compare all positions")
        valid = _real_tokens(inputs, mask, b, t, seen[0].device, model, name)
        tok = _pick_tokens(valid, generator)
        noise = sigma * _randn_like(seen[0], (b, d), generator)
        rows = torch.arange(b, device=noise.device)
        landing.extend((rows, tok, noise))
        # out of place: the noise enters as a constant, the gradient reaches every parameter
        delta.append(torch.zeros_like(seen[0]).index_put((rows, tok), noise))
        noisy = _second(model, untraced, run)
    finally:
        handle.remove()
        own.close()
    if replay is not None:
        replay.append(lambda scale: _rerun_embedding(model, inputs, output, target, delta[0],
                                                     scale))
    return clean, noisy


def _rerun_embedding(model: nn.Module, inputs: Inputs, output: OutputSelector,
                     target: nn.Module, delta: Tensor, scale: float) -> Tensor:
    """The model's output on ``inputs`` again, with ``delta`` (the noise an earlier call drew)
    times ``scale`` added to ``target``'s output (0: the clean forward, 1: the noisy one), for
    the checks' re-evaluations (:func:`_check_autocast_outputs`)."""
    if scale == 0:
        return call_model(model, inputs, output)
    own = OwnForwards(model)
    handle = target.register_forward_hook(own.hook(
        lambda module, args, out: out + (delta if scale == 1 else delta * scale).to(out.dtype)))
    try:
        return call_model(model, inputs, output)
    finally:
        handle.remove()
        own.close()


def _scaled(x: Tensor, x_noisy: Tensor, scale: float) -> Tensor:
    """``x`` with ``scale`` times the noise that ``x_noisy`` holds (0: ``x``, 1: ``x_noisy``),
    computed in float32 at least and rounded to ``x``'s dtype."""
    if scale == 0:
        return x
    if scale == 1:
        return x_noisy
    wide = torch.promote_types(x.dtype, torch.float32)
    return (x.to(wide) + scale * (x_noisy.to(wide) - x.to(wide))).to(x.dtype)


def _branches(model: nn.Module, x: Inputs, tokens: Tokenization, sigma: float,
              generator: torch.Generator, mask: Tensor | None,
              output: OutputSelector,
              replay: list[Callable[[float], Tensor]] | None = None,
              untraced: bool = False) -> tuple[Tensor, Tensor]:
    """(f(x), f(x̃)), both attached to the graph; x̃ has noise on one token per example.
    ``replay``, where given, receives a function that runs the forward again on the same
    inputs with the same noise times a scale (0: clean, 1: noisy; nothing drawn).
    ``untraced``: f(x̃) is computed without gradients and leaves no trace (:func:`_untraced`)."""
    if isinstance(tokens, Embedding):
        if not isinstance(model, nn.Module):
            raise TypeError("Embedding tokens need an nn.Module to hook into")
        return _embedding_branches(model, x, tokens, sigma, generator, mask, output, replay,
                                   untraced)
    if isinstance(tokens, Patches):
        if isinstance(x, dict) and isinstance(x.get("pixel_values"), Tensor):
            # an image model's own batch: the text advice below sent it to Embedding
            raise TypeError(
                f"Patches tokens need the image tensor itself, got a dict of model inputs "
                f"(keys {sorted(x)}); pass its images: x=batch['pixel_values'] (a Hugging Face "
                "image model takes them as its first argument)")
        if not isinstance(x, Tensor):
            raise TypeError(f"Patches tokens need an image tensor, got {type(x).__name__} (model "
                            f"inputs such as input_ids and attention_mask); {_TEXT_FIX}")
        if mask is not None:
            raise ValueError("mask= marks real text tokens; every patch of an image is real")
        # channels-last images (Patches(p, channels_last=True)) get their noise in their
        # (B, C, H, W) view and go to the model in their own layout; read as they are, the
        # patch would cut across rows and channels
        last = getattr(tokens, "channels_last", None) is True
        if (getattr(tokens, "channels_last", False) is None and x.dim() == 4
                and _looks_channels_last(x.shape)):
            b, h, w, c = x.shape
            raise ValueError(
                f"the regularizer got images of shape {tuple(x.shape)}, read as (batch, "
                f"channels, height, width): {h} channels of {w}x{c} pixels. A last axis of {c} "
                "looks like the channels of channels-last (batch, height, width, channels) "
                "images, whose noise would then cut across rows and channels. Pass "
                f"tokens=Patches({tokens.size}, channels_last=True) for channels-last images "
                f"(the model still gets them in that layout), or Patches({tokens.size}, "
                "channels_last=False) if the second axis does hold the channels")
        if last and x.dim() != 4:
            raise ValueError(f"Patches(channels_last=True) expects images of shape (batch, "
                             f"height, width, channels), got {tuple(x.shape)}")
        view = x.permute(0, 3, 1, 2) if last else x
        norm = tokens.normalization(model, view.shape[1]) if hasattr(tokens, "normalization") \
            else None
        scale = None if norm is None else 1.0 / norm[1]  # σ on pixels: noise / std per channel
        # drawn before the forwards, as the paper code does (keeps the recorded numbers)
        x_noisy = random_patch_noise(view, tokens.size, sigma, generator, channel_scale=scale)
        if last:
            x_noisy = x_noisy.permute(0, 2, 3, 1)
        if replay is not None:
            replay.append(lambda scale: call_model(model, _scaled(x, x_noisy, scale), output))
        clean = call_model(model, x, output)
        return clean, _second(model, untraced, lambda: call_model(model, x_noisy, output))
    if isinstance(tokens, Sequence):
        if not isinstance(x, Tensor) or x.dim() != 3:
            got = tuple(x.shape) if isinstance(x, Tensor) else type(x).__name__
            raise ValueError(f"Sequence tokens need (batch, tokens, dim) inputs, got {got}")
        _check_float(x, "x")
        b, t, d = x.shape
        tok = _pick_tokens(_real_tokens(x, mask, b, t, x.device), generator)
        noise = sigma * _randn_like(x, (b, d), generator)
        rows = torch.arange(b, device=x.device)
        _check_rounding("vectors", x[rows, tok], noise)
        x_noisy = x.index_put((rows, tok), noise, accumulate=True)
        if replay is not None:
            replay.append(lambda scale: call_model(model, _scaled(x, x_noisy, scale), output))
        clean = call_model(model, x, output)
        return clean, _second(model, untraced, lambda: call_model(model, x_noisy, output))
    raise TypeError(f"tokens must be Patches, Embedding or Sequence, got {type(tokens).__name__}")


def sensitivity_penalty(
    model: nn.Module,
    x: Inputs,
    *,
    tokens: Tokenization | None = None,
    patch: int | None = None,
    sigma: float = 1.0,
    generator: torch.Generator,
    mask: Tensor | None = None,
    output: OutputSelector = None,
) -> tuple[Tensor, Tensor]:
    r"""The regularizer's term :math:`\mathrm{MSE}\big(f(\tilde x), f(x)\big)` and the clean
    output :math:`f(x)`, both attached to the graph, for a training step with a loss of its own::

        penalty, logits = sensitivity_penalty(model, batch, tokens=Embedding("embed_ln"),
                                              generator=g)
        loss = my_loss(logits, labels) + lam * penalty

    ``x`` is what the model takes: an image tensor, a tensor of token ids, a dict of keyword
    arguments (``input_ids``, ``attention_mask``...) or a tuple of positional ones; ``output``
    selects the logits of a model that returns more (:func:`~senslab.tokens.base.select_output`:
    a Hugging Face ``ModelOutput``'s ``.logits`` is found by itself). ``tokens`` says where the
    noise goes (module docstring; None: ``Patches(patch)``, ``patch`` 4 unless given; beside
    ``tokens`` a ``patch`` is refused, not ignored); ``mask`` (B, T) marks the real text
    positions (default: a dict input's ``attention_mask``, else every position; token ids that
    end with the model's declared pad id are then refused, as a measurement refuses them; a
    ``mask`` true where that attention mask marks padding is warned about, as there). The
    MSE is the mean over all output entries of the batch; gradients flow through both branches
    (the clean output is pulled towards the noisy one as well as the reverse), as in the paper
    code. Noise that the grid of bf16/fp16 tokens would round into another noise is refused,
    as is noise on float32 tokens that a bf16/fp16 ``torch.autocast`` rounds so; bf16/fp16
    outputs whose change is mostly below their own grid, or a penalty of exactly 0 there, are
    warned about (the penalty would measure the outputs' rounding), as are — under a bf16/fp16
    ``torch.autocast``, whatever the outputs' dtype — changes more than 25% off the float32
    model's (checked on the first such call and every 100th, four forwards without gradients
    in eval mode; :func:`_check_autocast_outputs`). A model holding bf16/fp16 parameters has
    no float32 model to compare with: on the same schedule its noise is replayed at −½ and ½
    of its size (two to four forwards), and a change that is not the smooth function of the
    noise a float model gives is warned about (:func:`_check_output_scaling`).
    """
    return _penalty(model, x, tokens, patch, sigma, generator, mask, output)


def _own_autocast(model: Any) -> tuple[nn.Module, torch.autocast] | None:
    """``(module, autocast)`` where Hugging Face accelerate's mixed precision
    (``Trainer(bf16=True)``, ``Accelerator(mixed_precision=...)``) replaced the forward of
    ``model`` (or of the model a DDP or ``torch.compile`` wrapper holds) with one that enters
    ``autocast`` and casts the outputs to float32: a new ``torch.autocast`` of the same
    device and dtype, entered around the regularizer's forwards with the model's own forward
    (``measure.tokenwise._own_forward``), runs them as that forward does, where the checks see it
    (without the weight cache, so that each forward casts the weights anew, as each patched
    forward does: one cast shared by the two forwards summed their gradients in bf16).
    Without, autocast was entered out of their sight: a σ = 0.001 penalty on images near 3 came
    out 100× the float32 one without a word (refused under ``torch.autocast``). None: no such
    forward, or none whose autocast is found (looked for in its wrappers and closures)."""
    for module in dict.fromkeys((model, unwrapped(model))):
        patched = vars(module).get("forward") if isinstance(module, nn.Module) else None
        if patched is None or not callable(getattr(module, "_original_forward", None)):
            continue
        todo, seen = [patched], set()
        while todo and len(seen) < 64:
            f = todo.pop()
            if id(f) in seen:
                continue
            seen.add(id(f))
            if isinstance(f, torch.autocast):
                if not getattr(f, "_enabled", False):
                    return None
                return module, torch.autocast(f.device, dtype=f.fast_dtype, cache_enabled=False)
            todo += [getattr(f, k) for k in ("__func__", "__wrapped__", "model_forward")
                     if getattr(f, k, None) is not None]
            for cell in getattr(f, "__closure__", None) or ():
                try:
                    inner = cell.cell_contents
                except ValueError:  # an empty cell
                    continue
                if callable(inner) or isinstance(inner, torch.autocast):
                    todo.append(inner)
    return None


def _fabric_autocast(model: Any) -> torch.autocast | None:
    """A new ``torch.autocast`` (without the weight cache, as :func:`_own_autocast`) of the
    device and dtype that Lightning Fabric's mixed precision (``Fabric(precision="bf16-mixed")``,
    ``"16-mixed"``) enters in the forward of the ``_FabricModule`` ``model`` — after casting
    its float inputs to that dtype, out of the checks' sight: a σ = 0.001 penalty on images near
    3 came out 128× the float32 one without a word (refused under ``torch.autocast``). None:
    no such module, or a precision that enters no autocast."""
    if type(model).__name__ != "_FabricModule" or not hasattr(model, "_forward_module"):
        return None
    precision = getattr(getattr(model, "_strategy", None), "precision", None)
    context = getattr(precision, "forward_context", None)
    cast = context() if callable(context) else None
    if not isinstance(cast, torch.autocast) or not getattr(cast, "_enabled", False):
        return None
    return torch.autocast(cast.device, dtype=cast.fast_dtype, cache_enabled=False)


def _fabric_inputs(model: Any, x: Inputs) -> Inputs:
    """``x`` as Lightning Fabric's bf16/fp16 precision (``Fabric(precision="bf16-true")``,
    ``"16-true"``: the weights too) casts it at the start of the ``_FabricModule``'s forward,
    so that the noise is added to, and judged on, the bf16/fp16 inputs the model gets: cast
    there, out of the checks' sight, σ = 0.001 on images near 3 gave a penalty 128× the
    float32 one, the noise rounded away without a word. Else ``x`` itself."""
    if type(model).__name__ != "_FabricModule" or _fabric_autocast(model) is not None:
        return x
    convert = getattr(getattr(getattr(model, "_strategy", None), "precision", None),
                      "convert_input", None)
    if not callable(convert) or convert(torch.zeros(())).dtype not in LOW_PRECISION:
        return x
    return convert(x)


@contextmanager
def _fabric_forward(model: nn.Module, device: str) -> Iterator[None]:
    """``model`` (a ``_FabricModule`` under :func:`_fabric_autocast`'s autocast) runs Fabric's
    own forward (input cast, autocast, output cast, backward checks), its weight casts dropped
    after each forward as Fabric's outermost autocast drops them (shared by the clean and the
    noisy forward, their gradients were summed in bf16); with autocast off (the checks' float32
    forwards) the module inside runs on the inputs as given, in float32 — Fabric's forward
    would cast them to bf16 again."""
    mine = threading.get_ident()

    def forward(*args: Any, **kwargs: Any) -> Any:
        if threading.get_ident() != mine:  # another thread's forward: Fabric's own
            return type(model).forward(model, *args, **kwargs)
        if not autocast_on(device):
            return model._forward_module(*args, **kwargs)
        try:
            return type(model).forward(model, *args, **kwargs)
        finally:
            torch.clear_autocast_cache()

    saved = vars(model).get("forward")
    vars(model)["forward"] = forward  # not setattr: Fabric's sets the wrapped module's too
    try:
        yield
    finally:
        if saved is None:
            vars(model).pop("forward", None)
        else:
            vars(model)["forward"] = saved


def _penalty(model: nn.Module, x: Inputs, tokens: Tokenization | None, patch: int | None,
             sigma: float, generator: torch.Generator, mask: Tensor | None,
             output: OutputSelector, untraced: bool = False) -> tuple[Tensor, Tensor]:
    """:func:`sensitivity_penalty`; ``untraced``: the noisy forward runs without gradients and
    leaves the model's buffers and the random streams as they were (:func:`_untraced`), the
    penalty then a number to log (``alpha=0``)."""
    _check_sigma(sigma)
    gen = _check_generator(generator)
    if tokens is None:
        tokens = Patches(4 if patch is None else patch)
    elif patch is not None and not (isinstance(tokens, Patches) and tokens.size == patch):
        raise ValueError(
            f"patch={patch} sets the patch size where tokens is None, but tokens={tokens!r} "
            "already says where the noise goes, so it would be ignored; drop patch= (or "
            "give the size to Patches)")
    replay: list[Callable[[float], Tensor]] = []
    own = _own_autocast(model)
    fabric = _fabric_autocast(model) if own is None else None
    x = _fabric_inputs(model, x)
    with ExitStack() as stack:
        if own is not None:  # the checks see the autocast the model's forward would enter
            module, cast = own
            stack.enter_context(_own_forward(module))
            stack.enter_context(cast)
        if fabric is not None:  # … and so for Lightning Fabric's
            stack.enter_context(_fabric_forward(model, fabric.device))
            stack.enter_context(fabric)
        clean, noisy = _branches(model, x, tokens, sigma, gen, mask, output, replay, untraced)
        if clean.numel() == 0:
            # the mean over no entries is NaN: a NaN loss would reach the optimizer and the logs
            raise ValueError(
                f"empty batch: the model's output has shape {tuple(clean.shape)}, so the "
                "penalty would be the mean over no examples (NaN); skip empty batches (e.g. "
                "DataLoader(drop_last=True), or `if len(x): ...` before the step)")
        said = _check_output_grid(clean, noisy, sigma, model)
        _check_autocast_outputs(model, replay[0], clean, noisy, sigma, said)
    if own is not None:  # as accelerate's forward returns them: bf16/fp16 outputs in float32
        clean, noisy = (t.float() if t.dtype in LOW_PRECISION else t for t in (clean, noisy))
    return F.mse_loss(noisy, clean), clean


def sensitivity_regularized_loss(
    model: nn.Module,
    x: Inputs,
    y: Tensor,
    *,
    alpha: float = 0.5,
    patch: int | None = None,
    sigma: float = 1.0,
    generator: torch.Generator,
    tokens: Tokenization | None = None,
    loss_fn: Callable[[Tensor, Tensor], Tensor] | None = None,
    mask: Tensor | None = None,
    output: OutputSelector = None,
) -> tuple[Tensor, dict[str, Tensor]]:
    r"""The regularized training loss :math:`(1-\alpha)\,\ell(f(x), y) + \alpha\,
    \mathrm{MSE}(f(\tilde x), f(x))` (module docstring), a plain function for any training step.

    ``loss_fn(logits, y)`` is the task loss :math:`\ell` (default ``F.cross_entropy``; e.g.
    ``F.binary_cross_entropy_with_logits`` or ``F.mse_loss``); a 3-axis output needs one, since
    the default would read per-token (B, T, C) logits as (B, C, T) (refused). ``tokens`` says
    where the noise goes: None or :class:`~senslab.tokens.Patches` for images (``patch`` is the
    patch size when ``tokens`` is None, default 4), :class:`~senslab.tokens.Embedding` for
    text, :class:`~senslab.tokens.Sequence` for vector sequences; ``x``, ``mask`` and ``output``
    as in :func:`sensitivity_penalty`.

    Gradients flow through **both** branches, :math:`f(\tilde x)` and :math:`f(x)`, as in the
    paper code (the MSE pulls the clean output towards the noisy one as well as the reverse).
    The two branches are separate forward passes, so a BatchNorm model normalises clean and noisy
    images with their own batch statistics (as the paper code did), not with a mixed batch —
    but only the clean batch updates the running statistics (the noisy forward leaves them and
    ``num_batches_tracked`` as it found them: the model is evaluated on clean data) — and a
    model in train mode draws its dropout masks for each branch anew, so with dropout the term
    also counts the dropout's own change of the output (it is not 0 at σ = 0; measured with
    ``eval()`` it is). The MSE is the mean over all logits of the batch (``F.mse_loss`` with
    ``reduction="mean"``): for per-token outputs (B, T, C) that mean includes padding positions,
    so the term shrinks with the batch's share of padding — select per-example logits with
    ``output=`` (or pool over real tokens in the model) to keep α's weight fixed.

    At ``alpha=0`` the loss is the task loss and the training exactly the unregularized one:
    the noisy forward, run only for ``parts["mse"]``, runs without gradients and leaves the
    model's buffers (BatchNorm running statistics) and the global random streams (dropout)
    as it found them. ``loss_fn`` returns the batch's loss as one number; a per-example loss
    (``reduction="none"``) is refused.

    Returns:
        ``(loss, parts)``: the scalar loss to back-propagate and, for logging, detached scalars
        ``parts = {"loss", "task", "mse"}`` (tensors, so logging needs no device sync until
        read); with the default cross-entropy, ``"ce"`` holds the task loss too.

    Example:
        >>> import torch
        >>> model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(16, 3))
        >>> x, y = torch.randn(4, 1, 4, 4), torch.tensor([0, 1, 2, 0])
        >>> g = torch.Generator().manual_seed(0)
        >>> loss, parts = sensitivity_regularized_loss(model, x, y, patch=2, generator=g)
        >>> loss.backward(); sorted(parts)
        ['ce', 'loss', 'mse', 'task']
    """
    _check_number(alpha, "alpha", "the weight of the MSE term")
    if not 0.0 <= alpha <= 1.0:
        raise ValueError(f"alpha weighs the task loss against the MSE term and must be in "
                         f"[0, 1], got {alpha}")
    # at alpha = 0 the noisy forward only logs the MSE: run as a training forward it fed the
    # noisy batch to a BatchNorm's running statistics and drew dropout masks, so the training
    # left the unregularized one
    mse, clean = _penalty(model, x, tokens, patch, sigma, generator, mask, output,
                          untraced=alpha == 0)
    if loss_fn is None and clean.dim() == 3:
        # F.cross_entropy reads the classes on axis 1: per-token (B, T, C) logits were read as
        # (B, C, T), a wrong loss without an error wherever T == C
        raise ValueError(
            f"the model's output has shape {tuple(clean.shape)}, and the default task loss "
            f"F.cross_entropy reads its classes on axis 1 ({clean.shape[1]}), so per-token "
            "logits (batch, tokens, classes) would be read as (batch, classes, tokens) — a "
            "wrong loss, without an error where tokens == classes. Pass loss_fn: for "
            "(batch, tokens, classes) logits "
            "loss_fn=lambda out, y: F.cross_entropy(out.transpose(1, 2), y), for (batch, "
            "classes, length) outputs loss_fn=F.cross_entropy; or select per-example logits "
            "with output=")
    task = (F.cross_entropy if loss_fn is None else loss_fn)(clean, y)
    if not isinstance(task, Tensor):
        raise TypeError(
            f"loss_fn returned a {type(task).__name__}, not a tensor: no gradient would reach "
            "the model through it (.item() or float() cuts the graph); return the loss tensor")
    if task.numel() != 1:
        raise ValueError(
            f"loss_fn returned a loss of shape {tuple(task.shape)}, not one number: with a "
            "per-example loss "
            "(reduction='none') the loss would be one per example, each with the whole "
            "batch's MSE term added (its .sum() weighs that term once per example against "
            "the summed task loss), and parts['task'] no number to log. Return the batch's "
            "loss as one tensor number: reduction='mean' (weigh examples inside loss_fn, e.g. "
            "lambda out, y: (F.cross_entropy(out, y, reduction='none') * w).mean())")
    # a term of weight 0 is left out, not multiplied by 0: 0 × an inf or NaN term (an MSE
    # of overflowed noisy outputs at alpha = 0) made the loss and every gradient NaN
    loss = (task if alpha == 0 else mse if alpha == 1
            else (1.0 - alpha) * task + alpha * mse)
    parts = {"loss": loss.detach(), "task": task.detach(), "mse": mse.detach()}
    if loss_fn is None:
        parts["ce"] = parts["task"]
    return loss, parts
