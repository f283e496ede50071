r"""Flatness of the loss / output landscape around the weights, LayerNorm blow-up, parameter norm.

Two notions of sharpness are measured by perturbing *every* weight with isotropic Gaussian noise
:math:`\Delta \sim \mathcal N(0, \sigma^2 I)` (parameters whose name contains one of the
``exclude`` substrings are left alone; :data:`POSITIONAL`, the default, stands for the
positional embeddings, matched on whole components of the name: ``pos``, ``pos_embed``,
``position_embeddings``, ``embed_positions``, GPT-2's ``wpe`` — not ``post_attention_…``).
Frozen parameters (``requires_grad=False``: a frozen backbone, fixed sin-cos embeddings held as
parameters) are perturbed like the others: θ is every weight of the function, and a measure
that followed ``requires_grad`` would change with a fine-tuning setup, not with the model. To
perturb the trainable ones alone, exclude the frozen ones by name (``exclude=("backbone.",)``;
entries are substrings of the names). The two notions:

* **Output sharpness** (main paper §7.2; docs/definitions.md#shop-and-shpred). On inputs
  :math:`x` of a batch,

  .. math::

      \mathrm{ShOp} = \mathbb E_{x,\Delta}\,\lVert f_{\theta+\Delta}(x) - f_\theta(x)\rVert_1,
      \qquad
      \mathrm{ShPred} = \mathbb E_{x,\Delta}\,
      \mathbf 1\big[\hat y_{\theta+\Delta}(x) \ne \hat y_\theta(x)\big].

* **Loss sharpness** (Hahn & Rofin; docs/definitions.md#loss-sharpness):
  :math:`\mathbb E_\Delta L(\theta+\Delta) - L(\theta)` for the loss :math:`L` on a batch,
  positional embeddings excluded by default.

**Uncertainty.** The weight draws are the sampling unit: every draw perturbs the model once and is
evaluated on the whole batch, so the batch means of different draws are i.i.d. given the batch,
while the examples of one draw share their :math:`\Delta` and are *not* independent. The standard
error is therefore the standard deviation of the per-draw means over :math:`\sqrt{R}` (R draws),
and the 95% interval uses Student's t with R − 1 degrees of freedom (R is small: 5 in the paper
code). It describes the noise over :math:`\Delta` for *this* batch, not sampling of the data.
A ShPred whose standard error rests on no flipped prediction or on few is said in a warning
(with no flip: ShPred is below :math:`1 - 0.05^{1/R}` with 95% confidence, the bound of R draws;
:func:`_warn_few_flips`).

**Side effects: none.** The model is evaluated in eval mode — the paper code left BatchNorm and
dropout in train mode, so its numbers depended on batch composition and dropout noise — and every
module's training flag, every parameter and every buffer are restored bit-exactly afterwards,
also when the forward pass raises. The perturbed weights live in tensors of their own, swapped
in for the parameters' data and swapped out again: the parameters' own values are never
written, and a buffer is written back only if the forward changed it (or put back by module and
name if the forward reassigned it), so a loss computed before the call still backpropagates,
with the same gradients.

**A forward that is random in eval mode is refused.** The clean forward runs twice; outputs
that differ (beyond float rounding) mean dropout that ``eval()`` does not switch off
(``F.dropout(..., training=True)``, MC dropout), a sampling layer or noise in the forward, or a
forward that keeps state from call to call: that randomness would be reported as weight
sensitivity (MC dropout at σ = 0: ShOp 0.54 where the truth is 0).

**Also refused:** floating inputs of another dtype than the weights that the model fails on
(:class:`~senslab.tokens.base.DtypeClash`, naming the conversion: they are not cast, as in the
token-wise measures); a call inside ``torch.autocast`` on the model's device (autocast caches each
weight's low-precision copy on the first forward, and every perturbed forward reused the clean
one: ShOp 0), or inside ``torch.nn.utils.parametrize.cached()`` on a parametrized model (the
cached clean weight served every draw); a perturbed parameter that is not real floating point
(integer noise is rounded away) or is float8/float4 (torch has no arithmetic for it: exclude it,
or cast a copy to bf16/float32); a complex output (its real part alone was measured); an
excluded parameter on the same memory as a perturbed one (the noise reaches it); a forward
that changes its own weights, also through ``.data`` (seen by their content, not only their
version counters); a σ that the forward's *own* autocast rounds away, checked on the grid it
casts the float32 weights to, as for bf16/fp16 weights; and, for loss sharpness, a loss whose
precision cannot carry the result (:func:`loss_sharpness`).

**Ties.** An example whose clean class is a tie (two equal columns, or closer than the output
dtype's spacing) flips about half the time at any σ_w > 0, however small: ShPred counts it, and
says so in a warning naming the tied examples (:func:`_warn_ties`).

**Parametrized weights** (``weight_norm``, ``spectral_norm``, any
``torch.nn.utils.parametrize``) are perturbed through their parametrization's own parameters
(weight_norm's g and v), so the result is the sharpness in that parametrization, not that of
the weight the layer uses: said in a warning naming them, with how to measure the other.

The other two measures of Hahn & Rofin (docs/definitions.md#layernorm-blow-up,
docs/definitions.md#parameter-norm):

* :func:`layernorm_blowup`: per LayerNorm the inverse standard deviation of its input over the
  normalised dimensions, :math:`1/\sqrt{\operatorname{Var}(h) + \epsilon}` (maximum over positions),
  multiplied over all LayerNorms, per example.
* :func:`parameter_norm`: :math:`\lVert\theta\rVert_2` over all parameters but the excluded ones.
"""

from __future__ import annotations

import difflib
import functools
import math
import re
import warnings
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from numbers import Integral, Real
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.overrides import TorchFunctionMode

from .._autocast import autocast_dtype, autocast_on
from .._exclusive import OwnForwards, modes_kept, one_at_a_time, perturbing
from .._stack import user_level
from ..tokens.base import (
    DtypeClash,
    Inputs,
    OutputSelector,
    _tensors,
    batch_size,
    call_model,
    check_device,
    forward,
    model_dtype,
)
from ._alloc import MIN_FLIPS
from ._chunks import tree_leaves  # guarded there for older torch (docs/compatibility.md)
from ._noise import DRAW_DTYPE
from ._options import _kept_buffers, _seeded
from .outputs import (
    check_head,
    check_kind,
    check_perturbed_kind,
    check_rows,
    declared_kind,
    inferred_from_zero_one,
    margins,
    predictions,
    resolve_kind,
    tie_breaks,
    tie_warning,
    tied,
)
from .outputs import spacing as _spacing

Seed = torch.Generator | int | None


@dataclass(frozen=True)
class SharpnessResult:
    """One sharpness estimate.

    ``estimate`` is the mean over ``draws`` weight perturbations of noise std ``sigma``;
    ``stderr`` and ``ci95`` (Student's t) treat the draws as the sampling unit (NaN for a single
    draw); ``ci95`` is cut to the values the measure can take (ShOp ≥ 0, ShPred in [0, 1]; a
    loss increase can be negative). ``per_draw`` holds each draw's value (a batch mean for
    output sharpness, the loss increase for loss sharpness), ``per_sample`` the mean over draws
    per example (output sharpness only), ``reference`` the unperturbed loss :math:`L(\\theta)`
    (loss sharpness only). All values already include ``scale``.
    """

    name: str
    estimate: float
    stderr: float
    ci95: tuple[float, float]
    draws: int
    sigma: float
    per_draw: Tensor
    per_sample: Tensor | None = None
    reference: float | None = None
    scale: float = 1.0

    def __str__(self) -> str:
        lo, hi = self.ci95
        return (
            f"{self.name} {self.estimate:.4g} ± {self.stderr:.2g} "
            f"(95% CI {lo:.4g}–{hi:.4g}; {self.draws} weight draws of std {self.sigma:g})"
        )

    def __float__(self) -> float:
        return self.estimate


@dataclass(frozen=True)
class OutputSharpness:
    """Result of :func:`output_sharpness`: ``shop`` (output L1 change) and ``shpred`` (predicted
    class changes; ``None`` when the outputs are not class scores, e.g. a sequence of logits, a
    regression or multi-label head, or an undeclared one-column output in [0, 1]).
    ``shpred_reason`` says why ShPred is ``None`` (``None`` when it is reported)."""

    shop: SharpnessResult
    shpred: SharpnessResult | None
    num_examples: int
    shpred_reason: str | None = None

    def __str__(self) -> str:
        if self.shpred is not None:
            pred = str(self.shpred)
        else:
            pred = "ShPred n/a" + (f" ({self.shpred_reason})" if self.shpred_reason else "")
        return f"{self.shop}; {pred}; {self.num_examples:,} examples"


# ----------------------------------------------------------------------------------- helpers
def _generator(generator: Seed, device: torch.device) -> torch.Generator:
    """An explicit generator: given, or seeded (default 0) on the model's device. The seed is
    checked as the token-wise estimator checks it (a numpy int is an int; a negative seed, which
    torch wrapped round 2**64 without a word, is refused), and on a CPU model a seed of 2**32 or
    more, which torch's CPU generator would read as seed % 2**32, is refused (:func:`_seeded`)."""
    return _seeded(generator, device)


def _check_sigma(sigma: float, name: str) -> float:
    """``sigma`` as a float: any real number ≥ 0 (a numpy float too), not a bool."""
    if isinstance(sigma, bool) or not isinstance(sigma, Real):
        raise ValueError(f"{name} is a noise standard deviation: pass a number ≥ 0 (a float), "
                         f"got {type(sigma).__name__} {sigma!r}")
    if not (math.isfinite(sigma) and sigma >= 0):
        raise ValueError(f"{name} is a noise standard deviation and must be >= 0, got {sigma!r}")
    return float(sigma)


def _check_draws(draws: int, name: str) -> int:
    """``draws`` as an int ≥ 1: a numpy int (read from an array or a config) is one; it was
    refused as "must be >= 1, got np.int64(5)"."""
    if isinstance(draws, bool) or not isinstance(draws, Integral) or draws < 1:
        raise ValueError(f"{name} is the number of weight draws and must be an integer >= 1, "
                         f"got {draws!r} ({type(draws).__name__})")
    return int(draws)


def _check_scale(scale: float) -> float:
    """A finite number > 0: NaN or inf made every value NaN, a negative one flipped the sign,
    and ``True`` passed for 1. Any real number, as for ``sigma``: a numpy one (read from an
    array or a config) was refused as "must be a finite number > 0, got float32 4.0"."""
    if isinstance(scale, bool) or not isinstance(scale, Real) \
            or not (math.isfinite(scale) and scale > 0):
        raise ValueError(
            f"scale multiplies every reported value and must be a finite number > 0 (e.g. "
            f"scale=4 for Hahn & Rofin's ±1 scale), got {type(scale).__name__} {scale!r}"
        )
    return float(scale)


def _check_examples(inputs: Inputs, what: str) -> None:
    """Refuse a batch of no examples: a loss summed over none is 0 at every draw, reported
    as a sharpness of ``0 ± 0``; a mean is NaN, blamed on the model; ShOp and the blow-up
    failed inside a reshape. Inputs without a batch-shaped tensor are left to the model."""
    first = next(_tensors(inputs), None)
    if first is not None and first.dim() > 0 and first.shape[0] == 0:
        raise ValueError(
            f"inputs hold no example (batch size 0), so {what} has nothing to be measured on; "
            "pass a batch of at least one example (an empty split, or a filter that kept none?)"
        )



def _clean_call(model: nn.Module, inputs: Inputs, output: OutputSelector = None,
                raw: bool = False) -> Any:
    """The first clean forward (``call_model``; the raw output with ``raw``), as the token-wise
    measures make it (:func:`~senslab.tokens.base.clean_forward`): a model that fails on
    floating inputs of another dtype than its weights (float32 inputs into
    ``model.double()``) raises :class:`~senslab.tokens.base.DtypeClash` naming both dtypes and
    the conversion, where torch's "mat1 and mat2 must have the same dtype" came from deep
    inside the forward. The inputs are not cast: a model that converts its inputs itself is
    measured as it is."""
    try:
        return forward(model, inputs) if raw else call_model(model, inputs, output)
    except RuntimeError as err:
        own = model_dtype(model)
        other = sorted({str(t.dtype).removeprefix("torch.") for t in _tensors(inputs)
                        if t.is_floating_point() and t.dtype != own})
        if own is None or not other:
            raise
        name = str(own).removeprefix("torch.")
        said = str(err).splitlines()[0] if str(err) else type(err).__name__
        raise DtypeClash(
            f"the inputs are {'/'.join(other)} but the model's weights are {name}, and the "
            f"model failed on them ({said}); "
            f"convert the floating inputs with .to(torch.{name}) (or measure a copy of the "
            f"model in theirs, copy.deepcopy(model).to(torch.{other[0]}))"
        ) from err

#: the default ``exclude``: the model's positional embeddings, found by :func:`positional`
POSITIONAL = "positional"

#: a dotted-name component of a positional embedding: pos, pos_embed(ding), position(s)_…,
#: positional_…, …_pos, embed_positions, GPT-2's wpe (not post_…, as in post_attention_layernorm)
_POSITIONAL = re.compile(r"^(pos|positions?|positional)(_\w*)?$|^\w*_(pos|positions?|positional)$"
                         r"|^wpe$")


def positional(name: str) -> bool:
    """Whether parameter ``name`` belongs to a positional embedding (a component of its dotted
    name matches :data:`_POSITIONAL`)."""
    return any(_POSITIONAL.match(part) for part in name.lower().split("."))


#: a word of a name component (split at ``_`` and at camelCase) that says "position": the
#: names :data:`_POSITIONAL` misses (abs_pos_embed, learned_pos_embedding, posEmbed)
_POSITION_WORD = re.compile(r"^(pos|positions?|positional|posemb\w*|posenc\w*)$")


def _position_like(name: str) -> bool:
    """Whether a component of ``name`` has a word that says "position" (:data:`_POSITION_WORD`)."""
    return any(_POSITION_WORD.match(word)
               for part in name.split(".")
               for word in re.sub(r"([a-z0-9])([A-Z])", r"\1_\2", part).lower().split("_"))


def _warn_unmatched_positional(model: nn.Module, names: list[str], exclude: Sequence[str]
                               ) -> None:
    """Say so when :data:`POSITIONAL` matched no parameter while some name has a word that
    says "position" (:func:`_position_like`): the rule reads whole name components, so an
    ``abs_pos_embed`` was perturbed and counted in the norm under "positional embeddings
    excluded" without a word (a toy model's norm 7.02 where it is 2.10 without it). The
    number is unchanged; the warning names both fixes."""
    if any(positional(n) for n in names):
        return
    near = [n for n in names if _position_like(n) and not _excluded(n, exclude)]
    if not near:
        return
    shown = ", ".join(map(repr, near[:3])) + (f" and {len(near) - 3} more"
                                               if len(near) > 3 else "")
    warnings.warn(
        f"exclude entry {POSITIONAL!r} (the positional embeddings, left out by Hahn & Rofin: "
        f"the default of loss_sharpness and parameter_norm) matched no parameter of "
        f"{type(model).__name__}, though its parameter(s) {shown} look positional: they are "
        "perturbed by the sharpness measures and counted by parameter_norm. The entry matches "
        "a name component that is pos, pos_..., "
        "position(s)_..., ..._pos(itions), positional... or wpe. If they are positional "
        f"embeddings, exclude them by name (exclude=({POSITIONAL!r}, {near[0]!r})); if not "
        f"(a relative position bias, say), pass exclude without {POSITIONAL!r}, e.g. "
        "exclude=(), for the same number without this warning",
        UserWarning, stacklevel=user_level())


def _excluded(name: str, exclude: Sequence[str]) -> bool:
    """``exclude``: substrings of parameter names; :data:`POSITIONAL` among them stands for the
    positional embeddings (:func:`positional`)."""
    return any(positional(name) if s == POSITIONAL else s in name for s in exclude)


def _exclude_tuple(exclude: Sequence[str] | str) -> tuple[str, ...]:
    """``exclude`` as a tuple of name substrings. A bare string is one entry (it would otherwise
    be iterated character by character). ``None`` (a config's ``exclude: null``) and entries
    that are not strings are refused: torch's "'NoneType' object is not iterable" or "'in
    <string>' requires string as left operand" named neither the argument nor the fix."""
    if isinstance(exclude, str):
        return (exclude,)
    if exclude is None:
        raise TypeError(
            f"exclude=None: pass exclude=() to perturb (and count) every parameter, or a list of "
            f"substrings of parameter names to leave out ({POSITIONAL!r} for the positional "
            "embeddings)"
        )
    try:
        entries = tuple(exclude)
    except TypeError:
        entries = None
    bad = [e for e in entries if not isinstance(e, str)] if entries is not None else [exclude]
    if bad:
        raise TypeError(
            f"exclude holds substrings of parameter names (str), got {bad[0]!r} "
            f"({type(bad[0]).__name__}) in exclude={exclude!r}; pass e.g. exclude=('embed.',) "
            f"or exclude=() for none"
        )
    return entries


def _check_exclude(model: nn.Module, names: list[str], exclude: Sequence[str]) -> None:
    """Refuse an ``exclude`` substring that is in no parameter name: a typo would silently
    measure the unexcluded model. :data:`POSITIONAL` may match nothing (a model without
    positional embeddings). An entry found only in the second name of a tied weight
    (``head.weight`` = ``embed.weight``; ``named_parameters()`` lists it once, under its
    first name) is refused with both names: the tied tensor is perturbed or left alone as
    one. So is an entry that matches such a second name and also other parameters, while
    the first name is matched by none (the tied weight was perturbed without a word).
    :data:`POSITIONAL` matching nothing beside a name that looks positional is warned of
    (:func:`_warn_unmatched_positional`)."""
    if POSITIONAL in exclude:
        _warn_unmatched_positional(model, names, exclude)
    for s in exclude:
        if s == POSITIONAL or any(s in n for n in names):
            continue
        first: dict[int, str] = {}
        for n, p in model.named_parameters(remove_duplicate=False):
            first.setdefault(id(p), n)
            if s in n and first[id(p)] != n:
                raise ValueError(
                    f"exclude entry {s!r} is only in {n!r}, which is tied to {first[id(p)]!r}"
                    f" (one parameter under two names; named_parameters() lists it as "
                    f"{first[id(p)]!r}): a tied weight is perturbed or left alone as one "
                    f"tensor, under both names. To leave it alone, exclude {first[id(p)]!r}; "
                    "to perturb it, drop the entry"
                )
        prefixes = {".".join(n.split(".")[:k]) for n in names for k in range(1, n.count(".") + 2)}
        parts = sorted(prefixes | {c for n in names for c in n.split(".")})
        close = difflib.get_close_matches(s, parts, n=3, cutoff=0.5) or names[:3]
        raise ValueError(
            f"exclude entry {s!r} is in no parameter name of {type(model).__name__}, so it would "
            f"exclude nothing; closest: {', '.join(map(repr, close))}. Entries are substrings "
            f"of the names in model.named_parameters() (or {POSITIONAL!r} for the positional "
            "embeddings); fix or drop it"
        )
    # an entry that also matches another parameter passes the check above, while a tied
    # weight it matches only by its second name is judged by its first: exclude=("head",)
    # left head.bias alone but perturbed (and counted in the norm) head.weight = embed.weight
    first_name: dict[int, str] = {}
    for n, p in model.named_parameters(remove_duplicate=False):
        f = first_name.setdefault(id(p), n)
        if f != n and _excluded(n, exclude) and not _excluded(f, exclude):
            raise ValueError(
                f"exclude={tuple(exclude)!r} matches {n!r} but not {f!r}, and they are one "
                f"tied parameter (named_parameters() lists it once, as {f!r}), so it would be "
                f"perturbed under both names: a tied weight is perturbed or left alone as one "
                f"tensor. To leave it alone, also exclude {f!r}; to perturb it, narrow the "
                f"entry that matches {n!r}"
            )


def _summary(
    name: str, per_draw: Tensor, sigma: float, scale: float,
    bounds: tuple[float, float] = (-math.inf, math.inf), **extra: Any
) -> SharpnessResult:
    """Mean, standard error over draws and a t-based 95% interval, cut to ``bounds``: the
    values the measure can take (ShOp ≥ 0, ShPred in [0, 1]; a ShPred of 0.8 ± 0.2 over 5
    draws read [0.24, 1.36]), as the Boolean and token-wise intervals are cut."""
    per_draw = per_draw.double().cpu() * scale
    r = len(per_draw)
    est = per_draw.mean().item()
    if r < 2:
        se, ci = math.nan, (math.nan, math.nan)
    else:
        from scipy.stats import t as student_t  # imported lazily: only needed here

        se = per_draw.std(unbiased=True).item() / math.sqrt(r)
        half = float(student_t.ppf(0.975, r - 1)) * se
        ci = (max(est - half, bounds[0]), min(est + half, bounds[1]))
    return SharpnessResult(
        name, est, se, ci, r, float(sigma), per_draw, scale=float(scale), **extra
    )


def _check_repeatable(first: Any, second: Any, what: str, loss: bool = False) -> None:
    """Refuse a clean forward whose two evaluations of the same inputs differ, as
    ``boolean._check_repeatable`` does: ``what`` is reported as weight sensitivity otherwise.
    Float rounding is allowed for: relative 1e-3 of the largest output (5e-2 below float32);
    NaN agrees with NaN (refused on its own). ``loss``: the two are the clean loss."""
    if not (isinstance(first, Tensor) and isinstance(second, Tensor)):
        return  # a selector that returns something else: compared through the loss
    if first.shape != second.shape:
        differ, worst = True, math.inf
    elif first.is_floating_point():
        rtol = 1e-3 if first.dtype in (torch.float32, torch.float64) else 5e-2
        a, b = first.double(), second.double()
        same = (a == b) | (a.isnan() & b.isnan())
        worst = float(torch.where(same, 0.0, (a - b).abs()).max()) if a.numel() else 0.0
        finite = a[torch.isfinite(a)]
        scale = float(finite.abs().max()) if finite.numel() else 0.0
        differ = worst > rtol * scale
    else:
        differ = not torch.equal(first, second)
        worst = float((first.double() - second.double()).abs().max()) if differ else 0.0
    if differ:
        subject = ("the clean loss differed between two evaluations of the same inputs and "
                   "targets" if loss else "the model returned different outputs on two clean "
                   "forwards of the same inputs")
        cause = "the model's forward or loss_fn is random" if loss else "its forward is random"
        raise ValueError(
            f"{subject} (by up to {worst:.3g}): {cause} in eval mode — F.dropout(..., "
            "training=True) (MC dropout), a sampling layer, noise added in forward — or keeps "
            "state from call to call (a call counter, a buffer updated in eval mode), so "
            f"{what} would count that randomness as weight sensitivity. Make it deterministic "
            "while measuring (e.g. F.dropout(..., training=self.training))"
        )


def _check_real(out: Tensor) -> None:
    """Refuse a complex output: its distances were taken of the real part alone (torch casts
    complex to float64 by dropping the imaginary part, with a warning of its own that names
    no measure: ShOp 0.29 where the outputs' L1 change is 0.66), and ShPred was said n/a as
    for "an integer tensor"."""
    if out.is_complex():
        raise ValueError(
            f"the model's output is complex ({str(out.dtype).removeprefix('torch.')}, shape "
            f"{tuple(out.shape)}): ShOp would read its real part alone and ShPred has no class "
            "to read. Select a real output with output=, e.g. output=torch.view_as_real (both "
            "parts, each counted in the L1 distance) or output=lambda o: o.abs()"
        )


def _check_finite(value: Tensor, where: str, fix: str) -> None:
    """Refuse NaN/inf ``value``: the mean over draws would be NaN without a word."""
    if value.is_floating_point() and not bool(torch.isfinite(value).all()):
        bad = "NaN" if bool(value.isnan().any()) else "infinite"
        raise ValueError(f"{where} is {bad}, so sharpness is undefined; {fix}")


#: low-precision weights: the applied noise may be off from the drawn one by this share of its
#: root mean square at most (see :meth:`_WeightNoise.draw`)
ROUNDING_RTOL = 0.1
#: … and at most this share of their coordinates may round back to the clean weight
ROUNDING_MAX_UNCHANGED = 0.5


def _expected_unchanged(p: Tensor, sigma: float) -> float:
    """The expected share of ``p``'s coordinates that keep their value when N(0, σ²) noise is
    added and the sum rounded to ``p``'s grid: the noise within half the spacing on its side,
    probability Φ(up/2σ) − Φ(−down/2σ) per coordinate, ``up`` the spacing away from 0 and
    ``down`` the one towards 0 (half of it at an exact power of two, as a LayerNorm gain of 1);
    0 at an exact 0, whose spacing is tiny."""
    flat, total = p.detach().reshape(-1), 0.0
    scale = 2 * math.sqrt(2) * sigma
    for lo in range(0, flat.numel(), _CHECK_SLICE):
        part = flat[lo:lo + _CHECK_SLICE]
        up = _spacing(part)
        mantissa, _ = torch.frexp(part.double())
        down = torch.where(mantissa.abs() == 0.5, up / 2, up)
        total += float((torch.special.erf(up / scale) + torch.special.erf(down / scale)).sum())
    return total / 2 / max(flat.numel(), 1)


#: elements of a parameter compared at a time by the rounding check (bounds its memory)
_CHECK_SLICE = 1 << 22


def _applied_stats(p: Tensor, p0: Tensor, grid: torch.dtype | None = None
                   ) -> tuple[Tensor, Tensor]:
    """(Σ applied², # unchanged) of the noise a low-precision parameter ``p`` took on over its
    clean value ``p0``, in float32 (which holds a difference of two bf16/fp16 weights) slices
    of :data:`_CHECK_SLICE` elements: a whole float64 copy doubled a large model's peak
    memory. ``grid``: the dtype a float32 ``p`` is cast to before use (by the forward's own
    autocast), both cast to it slice by slice."""
    flat, flat0 = p.reshape(-1), p0.reshape(-1)
    sq = torch.zeros((), dtype=torch.float64, device=p.device)
    same = torch.zeros((), dtype=torch.float64, device=p.device)
    for lo in range(0, flat.numel(), _CHECK_SLICE):
        part, part0 = flat[lo:lo + _CHECK_SLICE], flat0[lo:lo + _CHECK_SLICE]
        if grid is not None:
            part, part0 = part.to(grid), part0.to(grid)
        a = part.float() - part0  # not in place: a float32 part's .float() is itself
        same += (a == 0).sum()
        sq += torch.linalg.vector_norm(a).double().square()
    return sq, same


class _WeightNoise:
    """Sets the chosen parameters to θ + σ·ε with ε ~ N(0, I) drawn from ``generator``.

    ε is drawn in float32 (:data:`._noise.DRAW_DTYPE`) whatever the parameters' dtype (a
    float64 parameter takes it cast to float64), so the draws are a function of the generator
    alone: drawn in the parameter's dtype, a float64 copy of a float32 model
    (``copy.deepcopy(model).double()``, the check that the messages below advise) drew other
    numbers from the same seed, and its ShOp differed from the float32 one by the sample (×0.97
    at every σ on an MLP), not by the precision.

    A bf16/fp16 parameter holds θ + σ·ε rounded to its own grid (spacing about
    ``torch.finfo(dtype).eps · |θ|``). For σ near or below that spacing the noise actually applied
    is not the one drawn: mostly zero (σ = 0.001 on bf16 weights of size 1: a third of σ, ShOp
    16× too small) or larger (σ about the spacing). The first draw of a call therefore compares
    the noise applied to every low-precision parameter with the noise drawn, over all their
    coordinates together, and refuses (a ``ValueError``) when the root mean square of the applied
    noise differs from that of the drawn noise by more than :data:`ROUNDING_RTOL` (10%), or when
    more than :data:`ROUNDING_MAX_UNCHANGED` (half) of the coordinates kept their clean value.
    float32 parameters are checked too, on their own grid (spacing about 1.2e-7 · |θ|: σ = 1e-7
    on weights of 1 gave ShOp exactly 0 without a word), or on the bf16/fp16 grid that the
    forward's own autocast casts them to (:meth:`watch`); float64 ones are not.

    The perturbed weights are written into tensors of their own (one per parameter, same dtype
    and strides), swapped in as the parameters' ``.data`` on the first draw; :meth:`reset` swaps
    the clean tensors back. The clean values are never written and no version counter moves, so
    an autograd graph the caller built on the parameters (a pending ``loss.backward()``) stays
    valid. A forward that writes into its own parameters (by their version counters, or by
    their content for a write through ``.data``) is refused on the first draw.
    """

    def __init__(
        self, params: list[nn.Parameter], gen: torch.Generator, names: list[str] | None = None,
        aliased: bool = False,
    ) -> None:
        self.params, self.gen = params, gen
        #: a parameter's storage is also read through another tensor (a view of a flat buffer,
        #: an alias a module keeps, two parameters on one storage): a swapped-in tensor would
        #: hide the noise from it (ShOp 0), so the noise is written in place and the clean
        #: values copied back (a pending backward through those parameters is then invalid)
        self.aliased = aliased
        self.saved = [p.detach().clone() if aliased else p.detach() for p in params]
        self.versions = [_version(p) for p in params]
        #: their content too: a write through ``.data`` (``self.weight.data.clamp_(…)`` in
        #: the forward) moves no version counter
        self.prints = _fingerprints(params)
        self.work: list[Tensor] | None = None  # the perturbed weights, allocated on first draw
        self.names = names if names is not None else [f"#{i}" for i in range(len(params))]
        self.checked = False
        #: index → dtype: float32 parameters that the forward's own autocast casts to a low
        #: precision before use (:meth:`watch`), checked on that grid like bf16/fp16 ones
        self.cast: dict[int, torch.dtype] = {}

    @contextmanager
    def watch(self, device_type: str) -> Iterator[None]:
        """Around a clean forward: note the float32 parameters that an autocast the forward
        switches on itself casts to bf16/fp16 (:class:`_CastProbe`). The noise added to them in
        float32 reaches the forward rounded to that grid: at a σ near the grid's spacing
        mostly rounded away while the outputs' own rounding is counted as sensitivity (σ =
        0.0003 on an MLP under bf16 autocast: ShOp 0.0052, 95% CI 0.0048–0.0056, where the
        float32 model gives 0.0042), unchecked where bf16 weights are refused."""
        probe = _CastProbe(device_type, self.params)
        with probe:
            yield
        self.cast = probe.cast

    def _grid(self, i: int) -> Tensor:
        """Parameter ``i``'s clean value on the grid the forward uses it on."""
        cast = self.cast.get(i)
        return self.saved[i] if cast is None else self.saved[i].to(cast)

    @torch.no_grad()
    def draw(self, sigma: float, name: str = "sigma") -> None:
        """Perturb; ``name`` is the caller's argument for σ (for the rounding refusal)."""
        if self.work is None:
            now = _fingerprints(self.params)
            written = [n for n, p, v, a, b in zip(self.names, self.params, self.versions,
                                                  self.prints, now, strict=True)
                       if _version(p) != v or not torch.equal(a.isnan(), b.isnan())
                       or bool((a != b)[~a.isnan()].any())]
            if written:
                raise ValueError(
                    f"the forward writes into the parameter(s) {', '.join(map(repr, written[:3]))}"
                    " in place (also through .data, e.g. a clamp_ of the weights), so the clean "
                    "weights change from call to call and no draw perturbs the weights measured"
                    " (the clean forwards have already changed them, as any forward of the model"
                    " would); make the forward leave its parameters alone. If another thread"
                    " trains the model (optimizer.step()), hold senslab.measure.exclusive(model)"
                    " around its training step, or measure a copy of the model (copy.deepcopy)"
                )
            if self.aliased:
                self.work = [p.data for p in self.params]
            else:
                self.work = [torch.empty_like(p0) for p0 in self.saved]
                for p, w in zip(self.params, self.work, strict=True):
                    p.data = w
        check = not self.checked and sigma > 0
        low: list[int] = []  # indices of the parameters checked (all but float64 ones)
        sums: list[Tensor] = []  # per such parameter: Σ drawn², Σ applied², # unchanged
        for i, (p, p0) in enumerate(zip(self.work, self.saved, strict=True)):
            # drawn in DRAW_DTYPE whatever the weights' dtype (see the class docstring), added
            # in at least float32 so half-precision weights round θ + σ·ε once
            eps = torch.randn(p.shape, generator=self.gen, device=self.gen.device,
                              dtype=DRAW_DTYPE)
            wide = torch.float64 if p.dtype == torch.float64 else DRAW_DTYPE
            delta = sigma * eps.to(p.device, wide)
            p.copy_(p0 + delta)
            cast = self.cast.get(i)
            if check and p.is_floating_point() and (cast is not None
                                                    or p.dtype != torch.float64):
                drawn = torch.linalg.vector_norm(delta).double().square()
                stats = torch.stack([drawn, *_applied_stats(p, p0, cast)])
                sums.append(stats.to(sums[0].device) if sums else stats)  # no sync yet
                low.append(i)
        self.checked = self.checked or sigma > 0
        if not low:
            return
        per = torch.stack(sums).cpu()  # (parameters, 3): one host sync
        drawn_sq, applied_sq, unchanged = per.sum(0).tolist()
        if drawn_sq > 0:
            ratio = math.sqrt(applied_sq / drawn_sq)
            share = unchanged / sum(self.saved[i].numel() for i in low)
            if abs(ratio - 1) > ROUNDING_RTOL or share > ROUNDING_MAX_UNCHANGED:
                worst = low[int(per[:, 2].argmax())]  # the most coordinates unchanged
                self._refuse(sigma, name, ratio, share, low, worst)
            self._warn_groups(sigma, name, low, per[:, 2].tolist())

    def _warn_groups(self, sigma: float, name: str, low: list[int], unchanged: list[float]
                     ) -> None:
        """The check above is over all low-precision coordinates together: a small group
        whose values are large for σ (LayerNorm gains of 1 beside small weights) can keep
        most of its clean values while the whole passes. Say which, once per call. A
        parameter is named where the share of its coordinates σ-noise leaves on their clean
        value is above :data:`ROUNDING_MAX_UNCHANGED` both in this draw and in expectation
        (:func:`_expected_unchanged`): one draw alone misjudges a parameter of a few
        coordinates (a scalar is unchanged or not)."""
        seen = [i for i, u in zip(low, unchanged, strict=True)
                if self.saved[i].numel() and u / self.saved[i].numel() > ROUNDING_MAX_UNCHANGED]
        kept = [(i, share) for i in seen
                if (share := _expected_unchanged(self._grid(i), sigma)) > ROUNDING_MAX_UNCHANGED]
        if not kept:
            return
        copy = ("float64 copy (copy.deepcopy(model).double())"
                if all(self._grid(i).dtype == torch.float32 for i, _ in kept)
                else "float32 copy (copy.deepcopy(model).float())")
        kept = [(self.names[i], share) for i, share in kept]
        shown = ", ".join(f"{n!r} (about {share:.0%} unchanged)" for n, share in kept[:3])
        more = f" and {len(kept) - 3} more" if len(kept) > 3 else ""
        warnings.warn(
            f"{name}={sigma:g} is rounded away on most coordinates of {len(kept)} "
            f"parameter(s) — {shown}{more} — so the result hardly perturbs them. "
            "Exclude them to say so (exclude=[...]), use a larger "
            f"{name}, or measure a {copy}"
            + (", with the forward's own autocast switched off" if self.cast else ""),
            UserWarning, stacklevel=4,
        )

    def _refuse(self, sigma: float, name: str, ratio: float, share: float, low: list[int],
                worst: int) -> None:
        saved = [self._grid(i) for i in low]
        dtypes = "/".join(sorted({str(p0.dtype).removeprefix("torch.") for p0 in saved}))
        spacing = math.sqrt(sum(_spacing(p0).square().sum().item() for p0 in saved)
                            / sum(p0.numel() for p0 in saved))
        if any(i in self.cast for i in low):
            raise ValueError(
                f"{name}={sigma:g} is too small for the weights that the model's forward casts "
                f"to {dtypes} under its own torch.autocast: rounded to that grid (root-mean-"
                f"square spacing {spacing:.2g}), the noise the forward sees has {ratio:.2f}x the"
                f" root mean square of the noise drawn and leaves {share:.0%} of those weights "
                f"unchanged (most in {self.names[worst]!r}), so the result would describe "
                f"another noise, and the outputs' own {dtypes} rounding would count as "
                f"sensitivity (accepted: within {ROUNDING_RTOL:.0%}, at most "
                f"{ROUNDING_MAX_UNCHANGED:.0%} unchanged). Use a larger {name}, well above "
                f"{spacing:.2g}, or measure the model with the autocast in its forward switched "
                "off (float32 arithmetic)"
            )
        if dtypes == "float32":
            raise ValueError(
                f"{name}={sigma:g} is too small for the float32 weights: rounded to their grid "
                f"(root-mean-square spacing {spacing:.2g}), the noise applied has {ratio:.2f}x "
                f"the root mean square of the noise drawn and leaves {share:.0%} of those "
                f"weights unchanged (most in {self.names[worst]!r}), so the result would "
                f"describe another noise (accepted: within {ROUNDING_RTOL:.0%}, at most "
                f"{ROUNDING_MAX_UNCHANGED:.0%} unchanged). Use a larger {name}, well above "
                f"{spacing:.2g}, or measure in float64: copy.deepcopy(model).double(), inputs "
                "cast to float64"
            )
        raise ValueError(
            f"{name}={sigma:g} is too small for the {dtypes} weights: rounded to their grid "
            f"(root-mean-square spacing {spacing:.2g}), the noise applied has {ratio:.2f}x the "
            f"root mean square of the noise drawn and leaves {share:.0%} of those weights "
            f"unchanged (most in {self.names[worst]!r}), so the result would describe another "
            f"noise (accepted: within {ROUNDING_RTOL:.0%}, at most {ROUNDING_MAX_UNCHANGED:.0%} "
            f"unchanged). Measure in float32 — model.float() (on a copy.deepcopy to keep the "
            f"{dtypes} model), inputs cast to float32 — or use a larger {name}, well above "
            f"{spacing:.2g}"
        )

    def reset(self) -> None:
        """The clean tensors back in place (a swap: nothing is written)."""
        if self.work is not None:
            for p, p0 in zip(self.params, self.saved, strict=True):
                if self.aliased:
                    with torch.no_grad():
                        p.data.copy_(p0)
                else:
                    p.data = p0
            self.work = None


def _address(t: Tensor) -> int | None:
    """The address of ``t``'s storage (None for a tensor without one)."""
    try:
        return t.untyped_storage().data_ptr()
    except (RuntimeError, NotImplementedError):
        return None


class _CastProbe(TorchFunctionMode):
    """Sees every torch call of one forward: where autocast is on for ``device_type`` and a
    call returns a tensor in autocast's dtype, the float32 parameters among ``params`` that it
    read (the parameter itself or any view of its storage) were cast to that dtype; ``cast``
    maps their index to it. A torch function mode sees functional calls on a module's own
    parameters too, which forward hooks do not."""

    def __init__(self, device_type: str, params: list[nn.Parameter]) -> None:
        super().__init__()
        self.device_type = device_type
        self.where: dict[int, list[int]] = {}
        for i, p in enumerate(params):
            if p.dtype == torch.float32 and p.numel() and (a := _address(p)) is not None:
                self.where.setdefault(a, []).append(i)
        self.cast: dict[int, torch.dtype] = {}

    def __torch_function__(self, func: Any, types: Any, args: Any = (),
                           kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        if self.where and autocast_on(self.device_type):
            dtype = autocast_dtype(self.device_type)
            if any(isinstance(t, Tensor) and t.dtype == dtype for t in tree_leaves(out)):
                for t in tree_leaves((args, kwargs)):
                    if isinstance(t, Tensor) and t.dtype == torch.float32:
                        for i in self.where.get(_address(t) or -1, ()):
                            self.cast.setdefault(i, dtype)
        return out


def _fingerprints(params: list[nn.Parameter]) -> list[Tensor]:
    """Per parameter, (Σθ, Σθ²) in float64 (on the host: one sync), sliced by
    :data:`_CHECK_SLICE` elements: any in-place change of values that moves no version counter
    (a clamp, a rescale, a write through ``.data``) changes them, bar a coincidence."""
    out = []
    for p in params:
        flat = p.detach().reshape(-1)
        acc = torch.zeros(2, dtype=torch.float64, device=p.device)
        for lo in range(0, flat.numel(), _CHECK_SLICE):
            part = flat[lo:lo + _CHECK_SLICE].double()
            acc += torch.stack([part.sum(), part.square().sum()])
        out.append(acc)
    return list(torch.stack([a.to(out[0].device) for a in out]).cpu().unbind()) if out else []


def _aliased(model: nn.Module, params: list[nn.Parameter]) -> bool:
    """Whether a chosen parameter's storage is also reachable through another tensor: it is a
    view into a larger storage, shares one with another parameter or buffer, or a module keeps
    a tensor on it among its attributes (``self.w_t = self.weight.t()``)."""
    def key(t: Tensor) -> int:
        return t.untyped_storage().data_ptr()

    mine: dict[int, int] = {}
    for p in params:
        if p.storage_offset() != 0 or p.untyped_storage().nbytes() != p.numel() \
                * p.element_size():
            return True
        mine[key(p)] = mine.get(key(p), 0) + 1
    if any(n > 1 for n in mine.values()):
        return True
    ids = {id(p) for p in params}
    for m in model.modules():
        others = [t for t in (*m._parameters.values(), *m._buffers.values(),
                              *vars(m).values()) if isinstance(t, Tensor) and id(t) not in ids]
        if any(t.numel() and key(t) in mine for t in others):
            return True
    return False


def _version(t: Tensor) -> int | None:
    """``t``'s version counter (bumped by every in-place write); None for an inference tensor,
    which keeps none."""
    try:
        return t._version
    except RuntimeError:
        return None


#: (module, "_parameters" or "_buffers", name, tensor or None): one slot of a module's state
_Slot = tuple[nn.Module, str, str, Any]


def _slots(model: nn.Module) -> list[_Slot]:
    """Every parameter slot of every module, by module and attribute name, so that a parameter
    the forward reassigns can be put back (buffers: :func:`._options._kept_buffers`)."""
    return [(m, "_parameters", name, t) for m in model.modules()
            for name, t in m._parameters.items()]


def _check_no_autocast(device: torch.device) -> None:
    """Refuse a call inside an enabled ``torch.autocast`` on the model's device: autocast
    caches the low-precision copy of each weight on the first (clean) forward and every
    perturbed forward reused it (ShOp exactly 0), and the noise it casts is never checked
    against the low-precision grid (:class:`_WeightNoise`)."""
    try:
        on = autocast_on(device.type)
    except RuntimeError:  # a device type autocast does not know: it cannot be on
        return
    if on:
        dtype = str(autocast_dtype(device.type)).removeprefix("torch.")
        raise ValueError(
            f"sharpness was called inside torch.autocast ({device.type}, {dtype}): autocast "
            f"caches the {dtype} copy of each weight on the first forward, so every perturbed "
            "forward would reuse the clean weights (sharpness 0), and the noise would be "
            f"rounded to {dtype} unchecked. Call it outside the autocast block (measures the "
            f"float32 model), or on a {dtype} copy of the model (copy.deepcopy(model)."
            f"to(torch.{dtype}), inputs cast to match), whose noise is checked"
        )


def _parametrized(model: nn.Module) -> list[tuple[str, list[str], str]]:
    """(the weight a layer uses, the parameters it is computed from, how) for every
    parametrized tensor of ``model``: ``torch.nn.utils.parametrize`` (``parametrizations.
    weight_norm`` / ``spectral_norm`` / ``orthogonal`` / one's own) and the older hook-based
    ``torch.nn.utils.weight_norm`` / ``spectral_norm``."""
    from torch.nn.utils import parametrize

    found: list[tuple[str, list[str], str]] = []
    for mn, m in model.named_modules():
        pre = f"{mn}." if mn else ""
        if parametrize.is_parametrized(m):
            for tname, plist in m.parametrizations.items():
                how = "/".join(type(f).__name__.lstrip("_") for f in plist)
                found.append((pre + tname, [f"{pre}parametrizations.{tname}.{n}"
                                            for n, _ in plist.named_parameters(recurse=False)],
                              how))
        for hook in m._forward_pre_hooks.values():
            kind, tname = type(hook).__name__, getattr(hook, "name", None)
            if kind == "WeightNorm" and isinstance(tname, str):
                found.append((pre + tname, [f"{pre}{tname}_g", f"{pre}{tname}_v"], kind))
            elif kind == "SpectralNorm" and isinstance(tname, str):
                found.append((pre + tname, [f"{pre}{tname}_orig"], kind))
    return found


def _parametrized_said(model: nn.Module, found: list[tuple[str, list[str], str]],
                       chosen_names: list[str]) -> str | None:
    """"N weight(s) of Model are parametrized — 'w' (kind) through 'w_orig', …": the weights of
    ``found`` (:func:`_parametrized`) whose own parameters are among ``chosen_names``, in
    words; None where there is none."""
    chosen = set(chosen_names)
    hit = [(w, [n for n in orig if n in chosen], how) for w, orig, how in found]
    hit = [(w, orig, how) for w, orig, how in hit if orig]
    if not hit:
        return None
    shown = "; ".join(f"{w!r} ({how}) through {', '.join(map(repr, orig))}"
                      for w, orig, how in hit[:3])
    more = f"; and {len(hit) - 3} more" if len(hit) > 3 else ""
    return f"{len(hit)} weight(s) of {type(model).__name__} are parametrized — {shown}{more}"


def _check_parametrized(model: nn.Module, chosen_names: list[str]) -> None:
    """Refuse a parametrized model inside ``torch.nn.utils.parametrize.cached()``: the cache
    keeps the weight computed on the first (clean) forward, so every perturbed forward reused
    it (a weight-normed MLP: ShOp 0.19, the biases' share only, where it is 0.65). Warn,
    once per call, that the noise perturbs a parametrized weight's own parameters (weight_norm's
    g and v, spectral_norm's unnormalised weight), not the weight the layer uses: the result
    is the sharpness in that parametrization, a different number from that of the same layer
    with a plain weight (weight_norm on an MLP: ShOp 0.65 against 0.74)."""
    from torch.nn.utils import parametrize

    found = _parametrized(model)
    if not found:
        return
    if getattr(parametrize, "_cache_enabled", 0):
        raise ValueError(
            f"sharpness was called inside torch.nn.utils.parametrize.cached() on a model with "
            f"parametrized weights ({', '.join(repr(w) for w, _, _ in found[:3])}): the cache "
            "keeps each weight computed on the first, clean forward, so every perturbed "
            "forward would reuse the clean weight (their share of the sharpness 0). Call it "
            "outside the cached() block"
        )
    said = _parametrized_said(model, found, chosen_names)
    if said is None:
        return
    warnings.warn(
        f"{said} — "
        "so the noise perturbs the parametrization's own parameters, not the weight the layer "
        "uses, and the result is the sharpness in that parametrization: not the same number "
        "as for the same weights held plainly. To measure the weights the layers use, "
        "measure a copy with the parametrization removed (m = copy.deepcopy(model); "
        "torch.nn.utils.parametrize.remove_parametrizations(layer, 'weight') for each layer, "
        "or torch.nn.utils.remove_weight_norm / remove_spectral_norm for the hook-based ones)",
        UserWarning, stacklevel=6,
    )


#: the floating dtypes weight noise is added in; the others (float8_e4m3fn, float8_e5m2, their
#: fnuz variants, float8_e8m0fnu, float4_e2m1fn_x2) have no arithmetic of their own in torch
_NOISE_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


def _listed(named: list[tuple[str, torch.dtype]]) -> str:
    """The first three (name, dtype) pairs in words, and how many more."""
    shown = ", ".join(f"{n!r} ({str(d).removeprefix('torch.')})" for n, d in named[:3])
    return shown + (f" and {len(named) - 3} more" if len(named) > 3 else "")


def _check_floating(params: list[nn.Parameter], names: list[str]) -> None:
    """Refuse a parameter to perturb that is not real floating point: Gaussian noise copied
    into an integer parameter was truncated (3 + 0.3ε became 2 or 3), into a complex one it
    reached the real part only. Refuse a float8 (or float4) one too: torch neither adds to
    nor promotes those dtypes, so the first draw failed inside torch ("Promotion for Float8
    Types is not supported"), naming neither the parameter nor the fix; and their grid
    (spacing up to an eighth of the value in e4m3, a quarter in e5m2) would round a usual σ away."""
    bad = [(n, p.dtype) for n, p in zip(names, params, strict=True) if not p.is_floating_point()]
    if bad:
        raise ValueError(
            f"parameter(s) {_listed(bad)} are not real floating point, so the Gaussian weight "
            "noise cannot be added to them (an integer parameter would round it away). "
            f"Exclude them: exclude={[n for n, _ in bad]!r}"
        )
    low = [(n, p.dtype) for n, p in zip(names, params, strict=True)
           if p.dtype not in _NOISE_DTYPES]
    if low:
        raise ValueError(
            f"parameter(s) {_listed(low)} are stored in a float8/float4 dtype, which torch "
            "cannot add weight noise to (it has no arithmetic or type promotion for them), and "
            "whose grid (spacing up to 1/8 of the value in float8_e4m3fn, 1/4 in "
            "float8_e5m2) would round a usual sigma away. Leave them unperturbed, exclude="
            f"{[n for n, _ in low]!r}, or measure a copy with them cast to bfloat16 or "
            "float32 (m = copy.deepcopy(model); for each name: p = m.get_parameter(name); "
            "p.data = p.data.float()), if its forward accepts that"
        )


def _extent(t: Tensor) -> tuple[torch.device, int, int]:
    """(device, first byte, one past the last byte) of the memory ``t`` reads."""
    if t.numel() == 0:
        return t.device, 0, 0
    span = 1 + sum((n - 1) * st for n, st in zip(t.shape, t.stride(), strict=True))
    return t.device, t.data_ptr(), t.data_ptr() + span * t.element_size()


def _check_apart(named: list[tuple[str, nn.Parameter]], exclude: Sequence[str]) -> None:
    """Refuse an excluded parameter whose memory overlaps a perturbed one's (two Parameter
    objects on one tensor: ``self.b = nn.Parameter(self.a.data)``): the noise written into
    the perturbed one reached the excluded one, which was measured perturbed without a word.
    Disjoint views of one flat buffer are fine."""
    kept = [(n, _extent(p)) for n, p in named if _excluded(n, exclude) and p.numel()]
    if not kept:
        return
    for name, (dev, lo, hi) in ((n, _extent(p)) for n, p in named if not _excluded(n, exclude)):
        for other, (dev2, lo2, hi2) in kept:
            if dev == dev2 and lo < hi2 and lo2 < hi:
                raise ValueError(
                    f"the excluded parameter {other!r} shares its memory with {name!r}, which "
                    f"is perturbed, so the noise would reach {other!r} too. Exclude both, or "
                    "neither (they are one tensor)"
                )


@contextmanager
def _perturbable(
    model: nn.Module, exclude: Sequence[str], generator: Seed, device: torch.device
) -> Iterator[_WeightNoise]:
    """Eval mode and a :class:`_WeightNoise` inside; parameters, buffers and every module's
    training flag restored bit-exactly on exit (also on an exception)."""
    if not isinstance(model, nn.Module):
        raise TypeError(f"sharpness needs an nn.Module with parameters, got {type(model).__name__}")
    named = [(n, p) for n, p in model.named_parameters()]
    chosen = [p for n, p in named if not _excluded(n, exclude)]
    if not chosen:
        names = ", ".join(n for n, _ in named) or "none"
        raise ValueError(
            f"no parameter left to perturb: exclude={tuple(exclude)!r} matches every parameter "
            f"of {type(model).__name__} (parameters: {names}); pass a narrower exclude"
        )
    _check_exclude(model, [n for n, _ in named], exclude)
    _check_no_autocast(device)
    chosen_names = [n for n, _ in named if not _excluded(n, exclude)]
    _check_floating(chosen, chosen_names)
    _check_apart(named, exclude)
    _check_parametrized(model, chosen_names)
    gen = _generator(generator, device)
    slots = _slots(model)
    modes = [(m, m.training) for m in model.modules()]
    noise = _WeightNoise(chosen, gen, chosen_names, aliased=_aliased(model, chosen))
    model.eval()
    try:
        # a measurement started inside the forwards run here is refused (senslab._exclusive);
        # so is one during which another thread switched a module's mode and back, or stepped
        # its optimizer (modes_kept: dropout in some draws, or the clean outputs of other
        # weights, ShOp 1.09 or 1.12 for 0.95 without a word). Not by hooks on a compiled
        # model, whose graph they would break at every module
        with perturbing(type(model).__name__), _kept_buffers(model), modes_kept(
                model, hooks=not _compiled(model), unit="measurement",
                undone=("; and that step was taken on the perturbed weights, which sharpness "
                        "then put back as they were before it: the step is undone, and the "
                        "training it belongs to must take it again")):
            try:
                yield noise
            finally:
                noise.reset()
    finally:
        for m, kind, name, t in slots:  # a parameter the forward reassigned: the old one back
            if getattr(m, kind).get(name) is not t:
                getattr(m, kind)[name] = t
        for m, was in modes:  # per module, so mixed train/eval submodules come back as they were
            m.training = was


def _compiled(model: nn.Module) -> bool:
    """Whether ``model`` is or holds a ``torch.compile`` wrapper (an ``_orig_mod`` inside)."""
    return any(hasattr(m, "_orig_mod") for m in model.modules())


# ----------------------------------------------------------------------------------- sharpness
@one_at_a_time  # one measurement at a time (see senslab._exclusive)
def output_sharpness(
    model: nn.Module,
    inputs: Inputs,
    *,
    sigma_w: float = 0.05,
    repeats: int = 5,
    generator: Seed = None,
    exclude: Sequence[str] | str = (),
    output_kind: str | None = None,
    threshold: float | None = None,
    output: OutputSelector = None,
) -> OutputSharpness:
    r"""ShOp and ShPred of ``model`` on the batch ``inputs`` (see the module docstring).

    ``repeats`` weight draws :math:`\Delta \sim \mathcal N(0, \sigma_w^2 I)` (paper code:
    :math:`\sigma_w = 0.05`, 5 repeats), each evaluated with one forward pass on the whole batch.
    The model must return one output row per example (a model that reduces over the batch is
    refused). The L1 distance sums over all output entries of an example — of its real
    positions only, for a per-position output (B, T, ...) of a dict input whose
    ``attention_mask`` (B, T) of 0/1 marks padding (:func:`_real_entries`). ShPred compares
    predicted classes with the decision rule of :mod:`senslab.measure.outputs`, as
    :func:`token_sensitivity` does (argmax of (B, C) logits; one column by ``output_kind``,
    default the model's attribute, else its sign). Unless ``output_kind`` is given, ShPred is
    ``None`` — with the reason in ``shpred_reason`` — for other output shapes, for a Hugging Face
    regression or multi-label head (``config.problem_type``: no class to flip, or not by argmax;
    :func:`~senslab.measure.outputs.check_head`) and for a one-column output in [0, 1] (some
    values strictly inside) whose kind nobody declared (probabilities or logits?). A given
    ``output_kind`` that cannot read the output raises instead.

    A one-column output whose clean values are all exactly 0 or 1, some 1 (a saturated sigmoid:
    every example confidently one class; exact 0s alone are a logit head) is read as logits
    when no kind is declared, since it reads the same either way; if a perturbed output then
    lies in [0, 1] with values strictly inside, it was a probability after all — read as logits
    nothing would ever flip — and the call raises the same ``ValueError`` naming
    ``output_kind``.

    On bf16/fp16 weights a ``sigma_w`` near or below the weights' spacing is refused: the noise
    rounded onto their grid is not the noise drawn (see :class:`_WeightNoise`). On float32
    outputs a ``sigma_w`` so small that the forward's own rounding makes up a share of ShOp
    (output changes within 1000 of the outputs' spacings that do not double with the noise)
    comes with a UserWarning naming a ``sigma_w`` that is safe (:func:`_check_output_rounding`).

    A ShPred whose standard error rests on no flipped prediction (``0 ± 0``) or on few comes
    with a RuntimeWarning (:func:`_warn_few_flips`); with none, it gives the 95% bound of R
    draws, :math:`1 - 0.05^{1/R}` (0.45 for 5 draws; about the rule of three's 3/R for many):
    the draws are the sampling unit, not the R·B predictions.

    Args:
        model: the network; evaluated in eval mode, left exactly as it was (a loss the
            caller computed before still backpropagates). A forward that is random in eval
            mode (MC dropout, sampling) is refused: its two clean forwards differ. So is a
            call inside ``torch.autocast`` (measure outside it, or a bf16/fp16 copy of the
            model), and a parameter that is not real floating point (exclude it).
        inputs: a tensor (positional argument), a tuple (``*args``) or a dict (``**kwargs``).
            They are passed as they are, not cast: floating inputs of another dtype than the
            weights that the model fails on raise a ``DtypeClash`` (a ``TypeError``) naming
            the conversion, as the token-wise measures do.
        sigma_w: standard deviation of the per-coordinate weight noise.
        repeats: number of weight draws R (the sampling unit of the standard error).
        generator: a ``torch.Generator`` or an int seed (default seed 0 on the model's device).
            On a CPU model the seed must be below 2**32: torch's CPU generator keeps only a
            seed's low 32 bits (seed 2**32 + 1 would draw seed 1's weights), so larger seeds
            are refused; a CUDA generator takes all 64 bits.
        exclude: parameters whose name contains any of these substrings are not perturbed;
            an entry in no parameter name is refused (with the closest names). Frozen
            parameters (``requires_grad=False``) are perturbed unless excluded here.
        output_kind, threshold: the one-column decision rule of ShPred (see
            :class:`~senslab.measure.TokenSensitivity`).
        output: which part of the model's raw output holds the logits: an int index into a
            tuple/list, a str key (or attribute), or a function of the raw output. Default: a
            tensor as it is, ``.logits`` / ``["logits"]``, a one-element tuple's element;
            longer tuples are refused (:func:`~senslab.tokens.base.select_output`).

    Example:
        >>> import torch
        >>> model = torch.nn.Linear(4, 3)
        >>> res = output_sharpness(model, torch.randn(8, 4), sigma_w=0.05, generator=0)
        >>> res.shop.draws, res.shop.estimate > 0
        (5, True)
    """
    sigma_w = _check_sigma(sigma_w, "sigma_w")
    repeats = _check_draws(repeats, "repeats")
    check_kind(output_kind, threshold)
    device = check_device(model, inputs)
    _check_examples(inputs, "output sharpness")
    exclude = _exclude_tuple(exclude)
    with _perturbable(model, exclude, generator, device) as noise, torch.no_grad():
        clean = _clean_call(model, inputs, output)  # a dtype clash named (DtypeClash)
        with noise.watch(device.type):  # an autocast of the forward's own: its grid is checked
            again = call_model(model, inputs, output)
        _check_repeatable(clean, again, "ShOp and ShPred")
        clean = clean.detach().clone()  # not an alias of a weight the draws swap out
        check_rows(clean, batch_size(inputs), "examples")
        _check_real(clean)
        _check_finite(clean, "the clean model's output", "fix the model or its inputs")
        b = clean.shape[0]
        keep = _real_entries(inputs, clean)  # pad positions' outputs are no part of ShOp
        declared = kind = declared_kind(model, output_kind)
        reason: str | None = None
        try:
            check_head(model, "class", output_kind, output)
            kind = resolve_kind(clean, kind, threshold)
            clean_pred: Tensor | None = predictions(clean, kind, threshold)
        except ValueError as err:
            if output_kind is not None:  # asked for: its error is the answer, not a None
                raise
            clean_pred = None  # no class rule for this output (shape, head or ambiguous kind)
            reason = str(err)
        # read as logits only because its clean values are all exactly 0 or 1 (see above)
        saturated = (
            clean_pred is not None and kind == "logits" and declared is None
            and inferred_from_zero_one(clean, None)
        )
        l1 = torch.empty(repeats, b, dtype=torch.float64, device=clean.device)
        flips = torch.empty_like(l1)
        # examples whose clean class is a tie; per draw, the squared change of each example's
        # margin, whether it sat exactly on the tie again and whether it moved to the clean
        # class's side (:func:`_warn_ties`)
        ties = None if clean_pred is None else tied(clean, clean_pred, kind, threshold)
        moves, stuck, away = (torch.zeros_like(l1) for _ in range(3))
        margin = (margins(clean, clean_pred, kind, threshold).double()
                  if ties is not None and bool(ties.any()) else None)
        first_draw = noise.gen.get_state()  # to redraw the first draw's noise, doubled
        for r in range(repeats):
            noise.draw(sigma_w, "sigma_w")
            out = call_model(model, inputs, output)
            check_perturbed_kind(out, saturated, f"with the weights perturbed (sigma_w="
                                 f"{sigma_w:g})")
            _check_finite(out, f"the output with the weights perturbed (draw {r + 1} of "
                          f"{repeats}, sigma_w={sigma_w:g})", "use a smaller sigma_w")
            # in float64: an fp16 model's outputs can each be finite while an example's sum
            # of distances passes fp16's largest number (a 50,000-class head: inf before)
            l1[r] = ((out.double() - clean.double()) * keep).reshape(b, -1).abs().sum(1)
            if clean_pred is not None:
                flips[r] = (predictions(out, kind, threshold) != clean_pred).double()
                if margin is not None:
                    now = margins(out, clean_pred, kind, threshold).double()
                    moves[r], stuck[r] = (now - margin).square(), (now == 0).double()
                    away[r] = (now > 0).double()
        if sigma_w > 0:
            _check_output_rounding(model, inputs, output, noise, first_draw, clean, l1[0],
                                   sigma_w)
    if sigma_w > 0 and clean.is_floating_point() and not bool(l1.ne(0).any()):
        # an exact 0 from a model whose outputs move with its weights means the change was
        # below the outputs' own rounding (σ = 1e-7 on a float32 Linear(64, 1) of weights 1:
        # each output moves by about 6e-7, its spacing at 64 is 7.6e-6)
        spacing = 2 * max(_resolution(v) for v in clean.detach().reshape(-1)[:64])
        warnings.warn(
            f"no draw changed any output (ShOp exactly 0 at sigma_w={sigma_w:g}): either the "
            f"outputs do not depend on the weights perturbed, or the change is below the "
            f"outputs' own {str(clean.dtype).removeprefix('torch.')} rounding (spacing up to "
            f"{spacing:.2g} at the clean outputs), and ShOp is then no measurement. Use a "
            "larger sigma_w, or measure in float64 (copy.deepcopy(model).double(), inputs cast "
            "to float64)", UserWarning, stacklevel=2)
    shop = _summary("ShOp", l1.mean(1), sigma_w, 1.0, (0.0, math.inf),
                    per_sample=l1.mean(0).cpu())
    shpred = None
    if clean_pred is not None:
        shpred = _summary("ShPred", flips.mean(1), sigma_w, 1.0, (0.0, 1.0),
                          per_sample=flips.mean(0).cpu())
        _warn_few_flips(shpred, flips, b)
        _warn_ties(clean, clean_pred, ties, flips, moves, stuck, away, sigma_w)
    return OutputSharpness(shop, shpred, b, reason)


def _real_entries(inputs: Inputs, out: Tensor) -> Tensor | float:
    """1 at the output entries of an example's real positions, 0 at its padding: for a
    per-position output (B, T, ...) of a dict input whose ``attention_mask`` (B, T) marks
    padding (:func:`_real_positions`); else 1. A pad position's outputs are no part of the
    example, and their L1 change counted in ShOp made it grow with the batch's padding (one
    example's per-position logits: ShOp 1.11 alone, 2.35 padded by 6 pad tokens)."""
    real = _real_positions(inputs, out.shape[0]) if out.dim() >= 3 else None
    if real is None or real.shape[1] != out.shape[1]:
        return 1.0
    return real.to(out.device, torch.float64).reshape(*real.shape, *(1,) * (out.dim() - 2))


#: output changes within this many spacings of the clean outputs (ShOp over the sum of the
#: outputs' spacings, float32/float64 outputs) are checked for rounding (below: 1.2e-4 of the
#: outputs' size in float32, where a smooth model's output change is linear in the noise)
ROUNDING_OUTPUT_SPACINGS = 1000
#: … and warned of when doubling the first draw's noise moves the outputs' L1 change by a
#: factor off 2 by more than this share (ShOp about as much or up to twice as much too high)
ROUNDING_SCALING_TOL = 0.005


def _check_output_rounding(model: nn.Module, inputs: Inputs, output: OutputSelector,
                           noise: _WeightNoise, first_draw: Tensor, clean: Tensor,
                           first_l1: Tensor, sigma_w: float) -> None:
    """Warn when the float rounding of the forward, not the weight noise, makes up a share of
    ShOp. A float32 forward's outputs carry rounding errors of a few of their spacings (more
    in deep or large-weight models, whose outputs are differences of larger values), different
    for every perturbed forward; they add to each output change |f(θ+Δ) − f(θ)|, and the L1
    of the sum is larger than that of the change (σ_w = 3e-8 on an MLP: ShOp 6% above the
    float64 value of the same draws). Where the changes are large next to the spacings
    (ShOp at least :data:`ROUNDING_OUTPUT_SPACINGS` times the sum of the clean outputs'
    spacings, as at every ordinary σ_w) nothing is done. Below, where a smooth model's output
    change is linear in the noise, the first draw's noise is applied again doubled (one more
    forward; the generator's state restored after, so the draws and results are unchanged):
    its L1 change must be twice the first's, while rounding, whose size does not grow with
    the noise, adds less than twice as much. A factor off 2 by more than
    :data:`ROUNDING_SCALING_TOL` is warned of, with the σ_w at which rounding's share would be
    under 0.1% (it shrinks at least as 1/σ_w). Noise that the weights' grid rounds (large
    weights near σ_w) breaks the doubling too and is warned of alike. bf16/fp16 outputs are left
    to the weights' own check (:class:`_WeightNoise`): within 1000 of their spacings the output
    change is not small enough to be linear."""
    if clean.dtype not in (torch.float32, torch.float64):
        return
    b = clean.shape[0]
    keep = _real_entries(inputs, clean)  # padding left out, as in ShOp
    spacings = (_spacing(clean) * keep).sum().item() / b  # per example, over its outputs
    first = first_l1.sum().item() / b  # the first draw's ShOp: the doubling is compared on it
    if first == 0 or spacings == 0 or first >= ROUNDING_OUTPUT_SPACINGS * spacings:
        return
    after = noise.gen.get_state()
    noise.gen.set_state(first_draw)
    try:
        noise.draw(2 * sigma_w, "sigma_w")
        doubled = call_model(model, inputs, output)
    finally:
        noise.gen.set_state(after)  # the caller's generator advances by the draws alone
    if not (isinstance(doubled, Tensor) and doubled.shape == clean.shape):
        return
    twice = ((doubled.double() - clean.double()) * keep).abs().sum().item() / b
    if not (math.isfinite(twice) and twice > 0):
        return
    off = 2 * first / twice - 1
    if abs(off) <= ROUNDING_SCALING_TOL:
        return
    dtype = str(clean.dtype).removeprefix("torch.")
    safe = sigma_w * abs(off) / 0.001
    warnings.warn(
        f"ShOp at sigma_w={sigma_w:g} is within the float rounding of the forward: its output "
        f"changes are only {first / spacings:.0f} times the {dtype} outputs' own spacing "
        f"(summed over an example's outputs), and doubling the first draw's noise multiplied "
        f"them by {2 / (1 + off):.3f} instead of 2, so rounding errors of the forward (or of "
        f"the perturbed weights on their grid) make up about {abs(off):.1%} to "
        f"{2 * abs(off):.1%} of ShOp and bias it. Use sigma_w of at least {safe:.2g} (where "
        "that share is below 0.1%), or measure in float64 (copy.deepcopy(model).double(), "
        "inputs cast to float64)", UserWarning, stacklevel=user_level())


def _no_flip_bound(draws: int) -> float:
    """The one-sided 95% upper bound on ShPred when none of ``draws`` weight draws flipped a
    prediction: :math:`1 - 0.05^{1/R}` (Clopper–Pearson for 0 of R; the rule of three's 3/R is
    its approximation for many draws, and above it: 0.45 against 0.6 at R = 5). The draws are
    the sampling unit — the B examples of one draw share its Δ, and a draw may flip all of
    them or none — so the bound is on the probability that a draw flips *some* prediction,
    which bounds ShPred (each draw's flipped share is at most 1); 3/(R·B), as if the R·B
    (draw, example) pairs were independent, would claim a confidence the draws do not
    give."""
    return 1.0 - 0.05 ** (1.0 / draws)


def _warn_few_flips(res: SharpnessResult, flips: Tensor, b: int) -> None:
    """Say so when ShPred's standard error rests on no flipped prediction or on few, as
    the token-wise and Boolean estimators say of few flips; the number is unchanged.

    The standard error is the spread of the R per-draw flipped shares, so what it learns from
    is the draws that flipped something. **No flip** (no draw flipped any of the B
    predictions): ShPred reads ``0 ± 0 (95% CI 0–0)``, an interval that excludes any rate
    above 0; the warning gives the bound :func:`_no_flip_bound` (R draws, not R·B pairs). On
    64 examples flipping independently at a rate of 0.001 per example, 5 draws read ``0 ± 0``
    in 73% of seeds. **Few flips**: some draw flipped nothing while fewer than
    :data:`~senslab.measure._alloc.MIN_FLIPS` draws flipped something, or fewer than
    ``MIN_FLIPS`` predictions flipped in all. The per-draw shares are then a few steps of 1/B
    and exact zeros, and the t interval moves with the few seen (64 examples at 0.01, 5 draws:
    where all 5 draws flipped but fewer than 10 predictions in all, it covered the rate in 17%
    of seeds; 20 draws at 0.02 with fewer than 10 draws flipping, in 46%). Where every draw
    flipped something and ``MIN_FLIPS`` predictions or more flipped, the spread is the draws'
    own, which the Student's t interval is for: nothing is said; nor where ``MIN_FLIPS`` draws
    or more flipped something and ``MIN_FLIPS`` predictions or more flipped, though some draw
    flipped none (with many draws that is the usual case: 2,000 draws, 1,754 flipping, were
    told to take more draws, which only makes a draw without a flip likelier, while the t
    interval of 20 draws at 0.02 over 64 examples covers in 95% of seeds there); nor at
    ``sigma_w=0``, whose 0 is exact. Each message's cause (the
    text before its first ``:``) is the same from call to call, so a training loop that
    measures at every evaluation says it once per run (:func:`senslab._stack.said_once`)."""
    r = len(flips)
    per_draw = flips.sum(1)
    events = int(per_draw.gt(0).sum())  # draws that flipped some prediction
    total = int(per_draw.sum())  # flipped (draw, example) predictions
    if (events >= min(r, MIN_FLIPS) and total >= MIN_FLIPS) or res.sigma == 0:
        return  # at sigma_w = 0 nothing can flip: the 0 is exact
    lo, hi = res.ci95
    shown = (f"ShPred {res.estimate:.4g} ± {res.stderr:.2g} (95% CI {lo:.4g}–{hi:.4g}; "
             f"{r} weight draws of std {res.sigma:g})")
    how = f"measure with more weight draws (repeats=, now {r})"
    if total == 0:
        bound = _no_flip_bound(r)
        message = (
            f"ShPred's standard error rests on no flip: none of the {r} weight draws flipped a "
            f"prediction of the {b:,} examples, so {shown} cannot be trusted as a 95% "
            f"interval. The draws are the sampling unit (the examples of one draw share it), so "
            f"with 95% confidence a draw flips some prediction with probability below "
            f"1 - 0.05^(1/{r}) = {bound:.2g} (the rule of three's 3/{r} for many draws), and "
            f"ShPred is below that bound too. For a standard error, {how}")
    else:
        message = (
            f"ShPred's standard error rests on few flips: {events} of the {r} weight draws "
            f"flipped a prediction, {total} of the {r * b:,} predictions in all (the standard "
            f"error needs {min(r, MIN_FLIPS)} draws that flip one and {MIN_FLIPS} flips or "
            f"more); a standard error estimated from so few moves with them, and the 95% "
            f"interval of {shown} can cover ShPred less often than 95%. For a firmer one, {how}")
    warnings.warn(message, RuntimeWarning, stacklevel=user_level())


def _warn_ties(clean: Tensor, clean_pred: Tensor | None, ties: Tensor | None, flips: Tensor,
               moves: Tensor, stuck: Tensor, away: Tensor, sigma_w: float) -> None:
    """Say so when ShPred counts flips of examples whose clean class is a tie
    (:func:`~senslab.measure.outputs.tied`), by the rule the token-wise estimator says them
    with too (:func:`~senslab.measure.outputs.tie_breaks`).

    **float32/float64 outputs.** A tie of the model's own — zero or equal head rows, a dead
    class — breaks under any ``sigma_w`` > 0, however small, and flips about half the time, so
    ShPred does not go to 0 with ``sigma_w`` (a 3-class head with two zero rows, 31 of 64
    examples tied: ShPred 0.26 ± 0.03 at sigma_w 0.001 and 0.01, all its flips from the tied
    examples, where the others flip none). Said of the tied examples that flipped, unless clamped on
    their tie: back on it in some draw and never on the clean class's side (a ReLU'd logit of
    0 with a negative pre-activation).

    **bf16/fp16 outputs.** Said of a tied example that flipped while the noise moved its
    margin by at most :data:`~senslab.measure.outputs.TIE_SPACINGS` spacings (root mean
    square over the draws): in a bf16 MLP of 200 classes, 5 of 256 examples tied, margins
    moved by 1.4–2.4 spacings at sigma_w=0.001 (said) and by 4–7 at 0.003, where ShPred
    (0.092) is its float32 copy's (0.090) and nothing is said.

    The number is left as it is: it is the rate at which the prediction changes, and the
    token-wise estimator, too, counts a flip of an example tied on the clean input (and says
    so). The warning names how many examples tie and which, how many flips are theirs, and
    ShPred over the other examples."""
    if ties is None or clean_pred is None or not bool(ties.any()):
        return
    ties = ties.to(flips.device)
    said = tie_breaks(clean, clean_pred.to(flips.device), ties, flips.gt(0).any(0),
                      stuck.gt(0).any(0), away.gt(0).any(0), moves.mean(0).sqrt())
    n = int(said.sum())
    if n == 0:
        return
    b, r = flips.shape[1], flips.shape[0]
    theirs, total = int(flips[:, said].sum()), int(flips.sum())
    which = said.nonzero()[:, 0].tolist()
    shown = ", ".join(map(str, which[:5])) + (", ..." if n > 5 else "")
    rest = (f"ShPred over the other {b - n:,} examples is {float(flips[:, ~said].mean()):.4g}"
            if n < b else "no other example is left")
    fix = ("drop the tied examples from the batch if their tie-break is not a prediction "
           "you mean to measure (a zero or duplicated head row ties its classes)")
    warnings.warn(
        tie_warning("ShPred", "sigma_w", n, b, theirs, total, "flipped predictions",
                    f"{r} draws at sigma_w={sigma_w:g}", rest, clean.dtype, fix,
                    index=f" (index {shown})"),
        UserWarning, stacklevel=user_level())


@one_at_a_time
def loss_sharpness(
    model: nn.Module,
    loss_fn: Callable[[Tensor, Any], Tensor],
    inputs: Inputs,
    targets: Any,
    *,
    sigma: float = 0.02,
    draws: int = 20,
    exclude: Sequence[str] | str = (POSITIONAL,),
    generator: Seed = None,
    scale: float = 1.0,
    output: OutputSelector = None,
) -> SharpnessResult:
    r"""Hahn & Rofin's sharpness :math:`\mathbb E_\Delta L(\theta+\Delta) - L(\theta)`.

    :math:`L(\theta)` = ``loss_fn(model(inputs), targets)`` (a scalar, e.g. the batch-mean MSE);
    :math:`\Delta \sim \mathcal N(0, \sigma^2)` per coordinate (paper: σ = 0.02) on every
    parameter whose name contains none of ``exclude`` (paper: positional embeddings excluded,
    hence the default :data:`POSITIONAL`), frozen ones (``requires_grad=False``) included.
    ``draws`` (ours: 20) independent draws, one forward pass each.

    ``scale`` multiplies every reported value: Hahn & Rofin train an MSE against {0, 1} targets and
    report sharpness ×4, the value on the ±1 scale (squared errors scale by 2² = 4) — pass
    ``scale=4``. ``reference`` is :math:`L(\theta)` times ``scale``.

    ``output`` selects the part of a structured model output that ``loss_fn`` receives, as in
    :func:`output_sharpness`, and ``generator`` seeds the draws as there (an int seed below
    2**32 on a CPU model). On bf16/fp16 weights a ``sigma`` near or below the weights' spacing
    is refused (see :class:`_WeightNoise`).

    Refused (``ValueError``): a clean loss that differs between two evaluations (a random
    forward or ``loss_fn``), a NaN or infinite loss — clean or perturbed, the error says which
    — an ``exclude`` entry in no parameter name, and a ``scale`` that is not a finite number
    > 0.

    **Precision of the loss.** Every draw is :math:`L(\theta+\Delta) - L(\theta)` with the
    same clean :math:`L(\theta)`, so its rounding to the loss's dtype (half the spacing there:
    ±0.002–0.004 for a bf16 MSE near 1, ±6e-8 in float32) plus the difference between its two
    evaluations shifts every draw alike, a bias the standard error does not include. A result
    is refused when that bound exceeds a quarter of the standard error (a tenth of the estimate
    when the draws do not spread), naming the dtype to compute the loss in: a bf16 MSE gave
    -0.00008 ± 0.0005 where the same model's float32 loss gives 0.0020 ± 0.0005. A loss that
    no draw changed is an exact 0 if no output moved either, or in float32/float64 (a
    piecewise-constant loss such as an error rate); in bf16/fp16 with outputs that moved it is
    refused (the change was rounded away).

    Example:
        >>> import torch
        >>> model = torch.nn.Linear(4, 1)
        >>> x, y = torch.randn(16, 4), torch.randn(16, 1)
        >>> res = loss_sharpness(model, torch.nn.functional.mse_loss, x, y, generator=0)
        >>> res.draws, res.ci95[0] <= res.estimate <= res.ci95[1]
        (20, True)
    """
    sigma = _check_sigma(sigma, "sigma")
    draws = _check_draws(draws, "draws")
    scale = _check_scale(scale)
    device = check_device(model, inputs)
    _check_examples(inputs, "loss sharpness")
    exclude = _exclude_tuple(exclude)

    def loss(out: Any, where: str, fix: str) -> Tensor:
        value = loss_fn(out, targets)
        if not isinstance(value, Tensor) or value.numel() != 1:
            shape = tuple(value.shape) if isinstance(value, Tensor) else type(value).__name__
            raise ValueError(
                f"loss_fn must return a scalar tensor, got {shape}; reduce it, e.g. "
                "reduction='mean'"
            )
        if value.is_complex():  # .double() would drop the imaginary part with a torch warning
            raise ValueError(
                f"loss_fn returned a complex loss ({value.dtype}); loss sharpness reads a real "
                "one: return a real scalar (e.g. the loss of the outputs' .abs() or .real)"
            )
        _check_finite(value, where, fix)
        return value.reshape(())

    with _perturbable(model, exclude, generator, device) as noise, torch.no_grad():
        clean = _clean_call(model, inputs, output)  # a dtype clash named (DtypeClash)
        with noise.watch(device.type):  # an autocast of the forward's own: its grid is checked
            again = call_model(model, inputs, output)
        _check_repeatable(clean, again, "loss sharpness")
        fix = "check the model, loss_fn, inputs and targets (a log of 0, a NaN input)"
        first = loss(clean, "the loss of the clean model", fix)
        second = loss(again, "the loss of the clean model", fix)
        _check_repeatable(first, second, "loss sharpness", loss=True)  # a random loss_fn
        base = first.double().item()
        # how far off the clean loss may be: its rounding, and two evaluations' difference
        slack = _resolution(first) + abs(second.double().item() - base)
        clean = clean.detach().clone() if isinstance(clean, Tensor) else None  # no weight alias
        moved = clean is None  # whether a draw changed the model's output
        per_draw = torch.empty(draws, dtype=torch.float64)
        for r in range(draws):
            noise.draw(sigma, "sigma")
            out = call_model(model, inputs, output)
            moved = moved or not (isinstance(out, Tensor) and torch.equal(out, clean))
            value = loss(out, f"the loss with the weights perturbed "
                         f"(draw {r + 1} of {draws}, sigma={sigma:g}; clean loss {base:.4g})",
                         "use a smaller sigma, or a loss that stays finite (cross_entropy on "
                         "logits rather than a log of probabilities)")
            per_draw[r] = value.double().item() - base
    res = _summary("loss sharpness", per_draw, sigma, scale, reference=base * scale)
    _check_resolution(res, first, slack * scale, moved and sigma > 0)
    return res


#: a loss held less precisely than this share of the standard error is refused
LOSS_SLACK_SE = 0.25
#: … and, without a standard error (one draw, or all draws equal), this share of the estimate
LOSS_SLACK_ESTIMATE = 0.1


def _resolution(value: Tensor) -> float:
    """Half the spacing of ``value``'s dtype at ``value`` (0 for a non-float): how far its
    rounding can have moved it."""
    if not value.is_floating_point():
        return 0.0
    return float(_spacing(value.detach().reshape(1))) / 2


def _check_resolution(res: SharpnessResult, clean: Tensor, slack: float, moved: bool) -> None:
    """Refuse a loss sharpness the loss's own precision cannot carry. The clean loss is known
    to ``slack`` (scaled): its rounding to its dtype's grid — a bf16 MSE near 1 to ±0.002–0.004 —
    plus the difference between its two evaluations. That error shifts every draw alike, a
    bias the standard error does not include: refused when it exceeds
    :data:`LOSS_SLACK_SE` of the standard error (the 95% interval then still covers about
    94%), or, with no spread over draws, :data:`LOSS_SLACK_ESTIMATE` of the estimate. A loss
    that no draw changed is an exact 0 when no draw changed the model's output either (hard
    decisions), and in float32/float64 (a piecewise-constant loss such as the error rate; a
    change below their ~1e-7 of the loss is negligible); in bf16/fp16, whose spacing is
    0.05–0.8% of the loss, with outputs that moved (``moved``), the change was rounded
    away."""
    se = res.stderr
    tol = (LOSS_SLACK_SE * se if math.isfinite(se) and se > 0
           else LOSS_SLACK_ESTIMATE * abs(res.estimate))
    never = not bool(res.per_draw.ne(0).any())
    if never and (not moved or clean.dtype in (torch.float32, torch.float64)):
        return
    if slack <= tol or slack == 0:
        return
    dtype = str(clean.dtype).removeprefix("torch.")
    if never:
        what = "no draw changed the loss although the outputs moved"
    elif math.isfinite(se) and se > 0:
        what = (f"that bias is not small next to the standard error {se:.2g} (sharpness "
                f"{res.estimate:.4g})")
    else:
        what = f"that bias is not small next to the sharpness {res.estimate:.4g}"
    if clean.dtype == torch.float64:
        fix = "Use a larger sigma"
    else:
        to = "float64" if clean.dtype == torch.float32 else "float32"
        cast = "double" if to == "float64" else "float"
        fix = (f"Compute the loss in {to} (e.g. loss_fn=lambda out, y: F.mse_loss(out.{cast}(), "
               f"y.{cast}())), or use a larger sigma")
    scaled = f" (×{res.scale:g}: scale)" if res.scale != 1 else ""
    raise ValueError(
        f"the loss ({dtype}) is too coarse for this sharpness: near the clean loss "
        f"{float(clean):.6g} its values are {2 * _resolution(clean):.2g} apart (its spacing), "
        f"so the clean loss is known to ±{slack:.2g}{scaled} only, which shifts every draw "
        f"alike, and {what}. {fix}"
    )


# ----------------------------------------------------------------------------------- blow-up
def _parent(name: str) -> str:
    return name.rpartition(".")[0]


_STACK_LAYERS = (nn.TransformerEncoderLayer, nn.TransformerDecoderLayer)


def _layout_flag(module: nn.Module | None) -> bool | None:
    """The ``batch_first`` a module declares: its own attribute, that of an
    ``nn.MultiheadAttention`` child, or — for a stack such as ``nn.TransformerEncoder`` /
    ``nn.TransformerDecoder``, whose ``layers`` are Transformer layers — its first layer's
    ``self_attn``. None when it says nothing."""
    if module is None:
        return None
    flags = [getattr(module, "batch_first", None)] + [
        c.batch_first for c in module.children() if isinstance(c, nn.MultiheadAttention)]
    layers = getattr(module, "layers", None)
    if isinstance(layers, nn.ModuleList) and len(layers) and isinstance(layers[0], _STACK_LAYERS):
        flags.append(layers[0].self_attn.batch_first)
    return next((f for f in flags if isinstance(f, bool)), None)


def _check_normalised_axes(name: str, module: nn.Module, h: Tensor) -> None:
    """Refuse a LayerNorm input whose last axes are not the layer's ``normalized_shape``: the
    layer normalises other axes (a channels-first LayerNorm, (B, C, H, W) over C), and the
    factor read over the last ones would be another number."""
    shape = tuple(module.normalized_shape)
    if h.dim() < len(shape) or tuple(h.shape[h.dim() - len(shape):]) != shape:
        raise ValueError(_other_axes_message(name, module, tuple(h.shape)))


def _check_own_forward(name: str, module: nn.Module, args: tuple[Any, ...], out: Any) -> None:
    """Refuse an ``nn.LayerNorm`` subclass whose forward does not normalise its input over the
    last axes (``F.layer_norm`` of the input is not its output): one that permutes
    (B, C, H, W) to normalise C, with C equal to W, passes :func:`_check_normalised_axes`."""
    x = args[0] if args else None
    if not isinstance(x, Tensor) or not isinstance(out, Tensor) or out.shape != x.shape:
        raise ValueError(_other_axes_message(name, module, tuple(getattr(x, "shape", ()))))
    ref = F.layer_norm(x, tuple(module.normalized_shape), module.weight, module.bias,
                       module.eps)
    low = x.dtype in (torch.bfloat16, torch.float16)
    scale = float(ref.detach().abs().max()) if ref.numel() else 0.0
    tol = (5e-2 if low else 1e-4) * max(scale, 1.0)
    if not torch.allclose(out.detach().float(), ref.detach().float(), rtol=0.0, atol=tol):
        raise ValueError(_other_axes_message(name, module, tuple(x.shape)))


def _other_axes_message(name: str, module: nn.Module, shape: tuple[int, ...]) -> str:
    return (
        f"LayerNorm {name!r} ({type(module).__name__}) does not normalise the last axes of its "
        f"input {shape} (normalized_shape {tuple(module.normalized_shape)}): a channels-first "
        "LayerNorm (ConvNeXt's, timm's LayerNorm2d) normalises the channel axis of "
        "(B, C, H, W), and the factor read over the last axes would be another number without "
        "a word. layernorm_blowup and layernorm_factors read LayerNorms that normalise their "
        "last axes (nn.LayerNorm's own forward); measure a model whose LayerNorms do, or one "
        "that applies nn.LayerNorm to channels-last (B, H, W, C) maps"
    )


def _real_positions(inputs: Inputs, b: int) -> Tensor | None:
    """(B, T) bool, the positions a dict input's 2-D 0/1 ``attention_mask`` marks as real,
    where it marks some as padding; None otherwise (no mask, no padding, another form)."""
    mask = inputs.get("attention_mask") if isinstance(inputs, dict) else None
    if not (isinstance(mask, Tensor) and mask.dim() == 2 and mask.shape[0] == b):
        return None
    if not bool(((mask == 0) | (mask == 1)).all()) or bool((mask != 0).all()):
        return None
    return mask != 0


def _max_over_real(name: str, inv: Tensor, real: Tensor | None) -> Tensor:
    """Per example, the maximum of ``inv`` (B, positions) over its real positions: a padded
    position's LayerNorm input (a pad token's embedding) is no part of the example, and read
    with the others it made an example's blow-up depend on how far its batch was padded (a
    BERT example alone: 39.2; padded by 10 pad tokens: 55.7, same output). A LayerNorm whose
    positions are not the mask's (a decoder's, a pooled stage's) is refused in a padded
    batch: which of its positions are padding is unknown."""
    if real is None or inv.shape[1] == 1:
        return inv.amax(dim=1)
    if inv.shape[1] != real.shape[1]:
        raise ValueError(
            f"LayerNorm {name!r} sees {inv.shape[1]} positions per example, while the "
            f"attention_mask ({real.shape[1]} positions) marks some of the inputs as padding, so "
            "which of its positions are padding is unknown and the maximum over positions "
            "would read them with the others. Measure batches without padding (examples of "
            "equal length, or one example at a time)"
        )
    if not bool(real.any(dim=1).all()):
        empty = (~real.any(dim=1)).nonzero()[:, 0].tolist()
        raise ValueError(
            f"the attention_mask marks every position of example(s) {empty[:5]} as padding, so "
            "they have no position to read the LayerNorm blow-up at; drop them from the batch"
        )
    return inv.masked_fill(~real.to(inv.device), -math.inf).amax(dim=1)


@one_at_a_time
def layernorm_factors(
    model: nn.Module,
    inputs: Inputs,
    *,
    readout_position: int | None = None,
    readout_modules: Sequence[str] | None = None,
    batch_first: bool | None = None,
) -> dict[str, Tensor]:
    r"""Per LayerNorm call, per example: :math:`\max_t 1/\sqrt{\operatorname{Var}(h_t) + \epsilon}`.

    :math:`h_t` is the LayerNorm's input at position :math:`t`, the variance the biased one over
    the normalised dimensions and :math:`\epsilon` the module's own ``eps`` — exactly the divisor
    ``nn.LayerNorm`` uses. Every ``nn.LayerNorm`` submodule is hooked (functional
    ``F.layer_norm`` calls are invisible); a module called k > 1 times per forward contributes
    ``name``, ``name#1``, …, ``name#{k-1}``. Keys are in the order the calls ran. Only the
    LayerNorms' inputs are read, so a structured model output needs no ``output=``.

    **Layout.** A LayerNorm's input is (B, T, …) or, sequence-first, (T, B, …). The layout is
    read from the nearest enclosing module that declares one: its ``batch_first`` attribute, its
    ``nn.MultiheadAttention`` child's (so ``nn.TransformerEncoderLayer``'s default
    ``batch_first=False`` gives (T, B, D)), or, for ``nn.TransformerEncoder`` /
    ``nn.TransformerDecoder`` (their final ``norm``), the first layer's ``self_attn``. A
    LayerNorm no module speaks for takes ``batch_first`` (True: (B, T, …), False: (T, B, …));
    left at None it is read batch-first, except that an input whose first two axes both have
    the batch size B is refused when the model contains a sequence-first layer (any module with
    ``batch_first=False``): (B, B, …) cannot tell examples from positions. A sequence-first model
    that declares nothing (hand-written attention) is refused when T ≠ B, and must pass
    ``batch_first=False`` — at T = B it cannot be told from a batch-first one.

    **Read-out rule.** With a ``readout_position`` (default: ``model.readout_position`` when the
    model defines one, as senslab's ``BooleanTransformer`` does), the LayerNorms of the *last
    layer* count only at that position of their (B, T, D) input, since no other position of the
    last layer reaches the output. The last layer is ``readout_modules`` when given (module names),
    otherwise the trailing run of LayerNorm calls that share the parent module of the last
    LayerNorm to run (for a stack ``blocks.0 … blocks.L-1`` of post-LN blocks:
    ``blocks.L-1.ln1`` and ``blocks.L-1.ln2``; for a pre-LN stack with a final ``norm``: that
    ``norm`` alone, not an embedding LayerNorm that runs first under the same parent). Pass
    ``readout_modules=()`` to take the maximum over all positions everywhere; other
    ``readout_modules`` need a ``readout_position`` (refused without one: they would be
    ignored).

    **Padding.** With a dict input whose ``attention_mask`` (B, T) of 0/1 marks padding, the
    maximum over positions is over each example's real positions only (pad tokens are no part
    of it; read with the others, an example's blow-up depended on how far its batch was
    padded). A read-out position that is padding in some example, or a LayerNorm with other
    positions than the mask's, is refused in a padded batch. An ``nn.TransformerEncoder``
    that would turn a padded batch into a nested tensor in eval mode (its default
    ``enable_nested_tensor=True``) is read with the padded layout it uses in training, its
    setting put back after; a nested tensor that reaches a LayerNorm otherwise is refused.

    Evaluated in eval mode without gradients; the hooks exist only inside the call.
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"layernorm_blowup needs an nn.Module, got {type(model).__name__}")
    if batch_first is not None and not isinstance(batch_first, bool):
        raise TypeError(
            f"batch_first must be True, False or None (read from the layers), got "
            f"{batch_first!r} ({type(batch_first).__name__})"
        )
    norms = [(n, m) for n, m in model.named_modules() if isinstance(m, nn.LayerNorm)]
    if not norms:
        raise ValueError(
            f"{type(model).__name__} has no nn.LayerNorm submodule; the blow-up is undefined"
        )
    if readout_position is None:
        readout_position = getattr(model, "readout_position", None)
    if readout_position is not None and (isinstance(readout_position, bool)
                                         or not isinstance(readout_position, Integral)):
        # True indexed a new axis (a (B, 1, T) factor), a float failed inside torch's indexing
        raise TypeError(
            f"readout_position is the index of the position the output is read from (an int, "
            f"e.g. -1 for the last), got {readout_position!r} "
            f"({type(readout_position).__name__})"
        )
    if isinstance(readout_modules, str):  # one module name, not its characters
        readout_modules = (readout_modules,)
    if readout_modules is not None:
        known = {n for n, _ in norms}
        unknown = [n for n in readout_modules if n not in known]
        if unknown:
            raise ValueError(
                f"readout_modules {unknown} are not LayerNorms of {type(model).__name__}; "
                f"its LayerNorms are: {', '.join(sorted(known))}"
            )
    if readout_modules and readout_position is None:
        raise ValueError(
            f"readout_modules={list(readout_modules)!r} name the last layer's LayerNorms, read "
            f"at the read-out position only, but no readout_position is given and "
            f"{type(model).__name__} defines none, so they would be ignored (the maximum over "
            "all positions taken everywhere). Pass readout_position= (e.g. -1 for the last "
            "position), or drop readout_modules"
        )
    check_device(model, inputs)
    _check_examples(inputs, "the LayerNorm blow-up")
    b = batch_size(inputs)
    real = _real_positions(inputs, b)  # padding is no part of an example's maximum
    calls: list[tuple[str, Tensor]] = []  # (module name, (B, positions) inverse std)
    own = OwnForwards(model)

    modules = dict(model.named_modules())
    # a sequence-first layer somewhere: a LayerNorm no layer speaks for may see its (T, B, …)
    mixed = any(getattr(m, "batch_first", None) is False for m in model.modules())

    def seq_first(name: str) -> bool | None:
        """Whether the LayerNorm ``name`` runs sequence-first, read from the nearest enclosing
        module that declares a layout (:func:`_layout_flag`); None when none does."""
        while name:
            name = _parent(name)
            flag = _layout_flag(modules.get(name))
            if flag is not None:
                return not flag
        return None

    def hook_for(name: str, eps: float, ndim: int) -> Callable[..., None]:
        declared = seq_first(name)
        first = declared if declared is not None else (
            None if batch_first is None else not batch_first)

        def hook(module: nn.Module, args: tuple[Any, ...]) -> None:
            h = args[0]
            if isinstance(h, Tensor) and h.is_nested:  # torch failed on its shape: "Internal error"
                raise ValueError(
                    f"LayerNorm {name!r} got a nested tensor (one sequence per example, no "
                    "padding), which has no (batch, positions, ...) shape to read the blow-up "
                    "from. Pass padded inputs, (batch, positions, ...) with an attention_mask "
                    "marking the padding, to a model that does not build nested tensors itself"
                )
            _check_normalised_axes(name, module, h)
            positions = h.dim() >= ndim + 2
            if (first is None and mixed and positions and h.shape[0] == b
                    and h.shape[1] == b):
                raise ValueError(
                    f"LayerNorm {name!r} got input of shape {tuple(h.shape)}: batch {b} and "
                    f"{b} positions, and no enclosing layer says which axis is the batch while "
                    f"{type(model).__name__} has sequence-first layers (batch_first=False). "
                    "Say how LayerNorms without a layer of their own are laid out: "
                    "batch_first=False for (positions, batch, ...), batch_first=True for "
                    "(batch, positions, ...)"
                )
            if first and positions:  # (T, B, …): the batch axis first
                h = h.transpose(0, 1)
            if h.dim() < ndim + 1 or h.shape[0] != b:
                fix = ("" if declared is not None else
                       "; a LayerNorm that runs sequence-first, (positions, batch, ...), with no "
                       "enclosing layer saying so needs batch_first=False")
                layout = (f" (read as {'sequence' if first else 'batch'}-first: batch axis "
                          f"{1 if first and positions else 0})" if positions else "")
                raise ValueError(
                    f"LayerNorm {name!r} got input of shape {tuple(args[0].shape)}{layout}, "
                    f"whose batch axis is not the batch size {b}, read from the first axis of "
                    "the model's inputs. The model's inputs must be batch-first, (batch, ...): "
                    "for a sequence-first model, pass a wrapper whose forward transposes "
                    f"(batch, positions, ...) inputs to the model's layout{fix}"
                )
            flat = h.detach().double().reshape(b, -1, *h.shape[h.dim() - ndim :])
            var = flat.flatten(2).var(dim=2, unbiased=False)
            calls.append((name, (var + eps).rsqrt()))

        return hook

    modes = [(m, m.training) for m in model.modules()]
    # nn.TransformerEncoder turns a padded batch (src_key_padding_mask given) into a nested
    # tensor in eval mode, and its layers' LayerNorms saw that: the hook failed with torch's
    # "Internal error: NestedTensorImpl doesn't support sizes". Read with the padded layout
    # the encoder uses in training (the same values at the real positions), restored after
    nested = [m for m in model.modules()
              if isinstance(m, nn.TransformerEncoder) and getattr(m, "use_nested_tensor", False)]
    handles = [
        m.register_forward_pre_hook(own.hook(hook_for(n, m.eps, len(m.normalized_shape))))
        for n, m in norms
    ] + [  # a subclass with a forward of its own: does it normalise its input's last axes?
        m.register_forward_hook(own.hook(functools.partial(_check_own_forward, n)))
        for n, m in norms if type(m).forward is not nn.LayerNorm.forward
    ]
    try:
        for m in nested:
            m.use_nested_tensor = False
        model.eval()
        # another thread's model.train() (dropout before a LayerNorm) or optimizer.step()
        # within the forward is refused, also where it was undone before the forward ended
        with torch.no_grad(), modes_kept(model, hooks=not _compiled(model),
                                         unit="measurement"):
            _clean_call(model, inputs, raw=True)  # the LayerNorms' inputs are read
    finally:
        for handle in handles:
            handle.remove()
        own.close()
        for m in nested:
            m.use_nested_tensor = True
        for m, was in modes:
            m.training = was
    if not calls:
        raise RuntimeError(f"no LayerNorm of {type(model).__name__} ran during the forward pass")

    # which calls are the last layer's: by name when readout_modules is given, else the
    # trailing run of calls whose module shares the parent of the last one to run. By parent
    # alone a top-level embedding LayerNorm beside a top-level final norm (GPT2Classifier's
    # embed_ln and norm, BLOOM's word_embeddings_layernorm and ln_f) counted as the last layer
    # and was read at the read-out position only (its factor 58 where the maximum is 75),
    # although every position of it reaches the output
    if readout_position is None:
        last: set[str] = set()
        start = len(calls)
    elif readout_modules is not None:
        last = set(readout_modules)
        start = len(calls)
    else:
        last = set()
        parent = _parent(calls[-1][0])
        start = len(calls)
        while start > 0 and _parent(calls[start - 1][0]) == parent:
            start -= 1
    factors: dict[str, Tensor] = {}
    counts: dict[str, int] = {}
    for i, (name, inv) in enumerate(calls):
        k = counts.get(name, 0)
        counts[name] = k + 1
        if name in last or i >= start:
            t = inv.shape[1]
            if not -t <= readout_position < t:
                raise ValueError(
                    f"readout_position {readout_position} is out of range for LayerNorm "
                    f"{name!r} with {t} positions"
                )
            if real is not None and t == real.shape[1] \
                    and not bool(real[:, readout_position].all()):
                pads = (~real[:, readout_position]).nonzero()[:, 0].tolist()  # a host sync
                raise ValueError(
                    f"readout_position {readout_position} is padding in example(s) {pads[:5]} "
                    f"(their attention_mask is 0 there), so LayerNorm {name!r} would be read at "
                    "a pad token, not at the position the output is read from. Pad on the "
                    "other side (tokenizer padding_side), or measure without padding"
                )
            value = inv[:, readout_position]
        else:
            value = _max_over_real(name, inv, real)
        factors[name if k == 0 else f"{name}#{k}"] = value.cpu()
    return factors


@one_at_a_time
def layernorm_blowup(
    model: nn.Module,
    inputs: Inputs,
    *,
    readout_position: int | None = None,
    readout_modules: Sequence[str] | None = None,
    batch_first: bool | None = None,
) -> Tensor:
    r"""Hahn & Rofin's LayerNorm blow-up per example, shape (B,), float64:
    :math:`\prod_{\ell} \max_t 1/\sqrt{\operatorname{Var}(h^{(\ell)}_t) + \epsilon_\ell}` over all
    LayerNorm calls :math:`\ell`, the last layer read at ``readout_position`` only. See
    :func:`layernorm_factors` (the individual factors) for the rules, and for ``batch_first``
    (the layout of LayerNorms that no enclosing layer declares)."""
    factors = layernorm_factors(
        model, inputs, readout_position=readout_position, readout_modules=readout_modules,
        batch_first=batch_first,
    )
    return torch.stack(list(factors.values())).prod(dim=0)


@one_at_a_time
def parameter_norm(model: nn.Module, exclude: Sequence[str] | str = (POSITIONAL,)) -> float:
    r""":math:`\lVert\theta\rVert_2 = \sqrt{\sum_i \lvert\theta_i\rvert^2}` over every parameter
    whose name contains none of ``exclude`` (default: positional embeddings, as Hahn & Rofin), in
    float64: the same parameters the sharpness measures perturb with the same ``exclude``.

    * Memory counts once: a tied parameter (one object under two names) and two parameter
      objects on one memory (``self.b = nn.Parameter(self.a.data.t())``, which the sharpness
      measures perturb as one tensor) were counted twice (2.83 for one 2×2 tensor of 1s).
    * A complex parameter counts :math:`\lvert z\rvert^2` (its real part alone was read, with a
      torch warning that named no measure: 3 for 3 + 4i).
    * Frozen parameters (``requires_grad=False``) count, as the sharpness measures perturb
      them: θ is every weight of the function, whatever an optimizer updates.
    * A parametrized weight (``weight_norm``, ``spectral_norm``, any
      ``torch.nn.utils.parametrize``) counts through its parametrization's own parameters
      (weight_norm's g and v), those that ``named_parameters()`` lists and the sharpness
      measures perturb, not the weight the layer computes from them: said in a warning
      naming them, with how to measure the other (:func:`_warn_parametrized_norm`).

    An entry in no parameter name (a typo) is refused, naming the closest, as for the sharpness
    measures; so is a parameter on the ``meta`` device (no values)."""
    exclude = _exclude_tuple(exclude)
    named = list(model.named_parameters())  # one object under two names: listed once
    _check_exclude(model, [n for n, _ in named], exclude)
    kept = [(n, p) for n, p in named if not _excluded(n, exclude)]
    meta = [n for n, p in kept if p.is_meta]
    if meta:  # torch failed on them inside ("Cannot copy out of meta tensor")
        raise ValueError(
            f"parameter(s) {', '.join(map(repr, meta[:3]))}"
            f"{f' and {len(meta) - 3} more' if len(meta) > 3 else ''} of "
            f"{type(model).__name__} are on the 'meta' device: they have shapes but no values "
            "(a model built under torch.device('meta') or init_empty_weights, weights "
            "offloaded by accelerate, or never loaded), so they have no norm. Measure the model "
            "with its weights loaded (model.to_empty(device='cpu') and then "
            "model.load_state_dict(weights))"
        )
    _warn_parametrized_norm(model, [n for n, _ in kept])
    total = torch.zeros((), dtype=torch.float64)
    for group in _by_memory([p for _, p in kept]):
        total += _squared_norm(group)
    return math.sqrt(total.item())


def _by_memory(params: list[Tensor]) -> list[list[Tensor]]:
    """``params`` in groups whose memory may overlap (same device, storage and dtype, and
    byte ranges that meet); a parameter on memory of its own is a group alone."""
    groups: dict[tuple[Any, ...], list[Tensor]] = {}
    alone: list[list[Tensor]] = []
    for p in params:
        where = _address(p) if p.numel() else None
        if where is None:
            alone.append([p])
        else:
            groups.setdefault((p.device, where, p.dtype), []).append(p)
    out = alone
    for group in groups.values():
        group.sort(key=lambda t: _extent(t)[1])
        current, end = [group[0]], _extent(group[0])[2]
        for p in group[1:]:
            lo, hi = _extent(p)[1:]
            if lo < end:
                current.append(p)
                end = max(end, hi)
            else:
                out.append(current)
                current, end = [p], hi
        out.append(current)
    return out


def _squared_norm(group: list[Tensor]) -> Tensor:
    """Σ|θ|² in float64 on the host over the memory a group of :func:`_by_memory` covers, each
    element once (a complex one as |z|²)."""
    if len(group) == 1:
        parts = [group[0].detach()]
    else:  # overlapping: mark the elements they cover on the shared storage, read each once
        p = group[0]
        flat = torch.empty(0, dtype=p.dtype, device=p.device).set_(p.untyped_storage())
        covered = torch.zeros(flat.numel(), dtype=torch.bool, device=p.device)
        for t in group:
            covered.as_strided(t.shape, t.stride(), t.storage_offset()).fill_(True)
        parts = [flat.detach()[covered]]
    total = torch.zeros((), dtype=torch.float64)
    for t in parts:
        t = torch.view_as_real(t) if t.is_complex() else t
        flat = t.reshape(-1)
        for lo in range(0, flat.numel(), _CHECK_SLICE):
            total += flat[lo:lo + _CHECK_SLICE].double().square().sum().cpu()
    return total


def _warn_parametrized_norm(model: nn.Module, kept: list[str]) -> None:
    """Say that the norm of a parametrized weight is that of its parametrization's own
    parameters (weight_norm's g and v: 1.28 for a weight-normed Linear(3, 3), seed 0, whose weight
    and bias have norm 0.92), as the sharpness measures say that they perturb those."""
    said = _parametrized_said(model, _parametrized(model), kept)
    if said is None:
        return
    warnings.warn(
        f"{said} — "
        "so parameter_norm counts the parametrization's own parameters (those the sharpness "
        "measures perturb), not the weight the layer computes from them: not the same number "
        "as for the same weights held plainly. For the norm of the weights the layers use, "
        "measure a copy with the parametrization removed (m = copy.deepcopy(model); "
        "torch.nn.utils.parametrize.remove_parametrizations(layer, 'weight') for each layer, "
        "or torch.nn.utils.remove_weight_norm / remove_spectral_norm for the hook-based ones)",
        UserWarning, stacklevel=user_level())
