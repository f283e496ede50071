"""Sensitivity and Fourier analysis of functions on the Boolean cube {±1}ⁿ
(docs/definitions.md#boolean-functions).

For f: {±1}ⁿ → R and x ∈ {±1}ⁿ let x^⊕i be x with bit i flipped. The *sensitivity* of f at x is

    s(f, x) = Σᵢ 1[f(x) ≠ f(x^⊕i)],

its average over uniform x is the *average sensitivity* as(f) = E_x s(f, x), the per-bit terms
Inf_i(f) = P_x[f(x) ≠ f(x^⊕i)] are the *influences* (so as(f) = Σᵢ Inf_i(f)), and
s_max(f) = max_x s(f, x). Every f has a Fourier expansion f(x) = Σ_S f̂(S) χ_S(x) with
χ_S(x) = Π_{i∈S} xᵢ and f̂(S) = 2⁻ⁿ Σ_x f(x) χ_S(x). With D_i f(x) = (f(x) − f(x^⊕i)) / 2,

    E_x[(D_i f)²] = Σ_{S∋i} f̂(S)²,   Σᵢ E_x[(D_i f)²] = Σ_S |S| f̂(S)²,

and for ±1-valued f, (D_i f)² = 1[f(x) ≠ f(x^⊕i)], which gives the classical identities
Inf_i(f) = Σ_{S∋i} f̂(S)² and as(f) = Σ_S |S| f̂(S)². For real-valued f the same sums are the
"real" sensitivity below (squared change / 4), e.g. MEAN(x) = (1/n) Σ xᵢ has as = 1/n.

Encoding (used by every function here)
    A *truth table* is a 1-D tensor of length 2ⁿ indexed by an integer i whose bit j (the
    2ʲ digit) encodes coordinate j: x_j = 1 − 2·bit_j(i), so bit 0 ↦ +1 and bit 1 ↦ −1, and i = 0
    is the all-(+1) string. Flipping coordinate j is ``i ^ (1 << j)``, and a subset S of
    coordinates is also a bitmask, so ``coefficients[S]`` is f̂(S) and χ_S(x_i) = (−1)^popcount(S&i).

How a change is counted (``output``)
    f may return shape (N,) or (N, 1) values / logits, or (N, C) class logits (C ≥ 2). A
    structured output is read as the token-wise estimator reads it by default: ``.logits``, a
    ``"logits"`` key, the element of a one-element tuple; for any other tuple or mapping (a
    ``(features, logits)`` pair) pass a callable that returns the logits tensor.

    - ``"sign"``: the indicator of a change of the *predicted class*: argmax for (N, C); equality
      for integer or bool outputs (class labels); ``value > threshold`` for real outputs (±1
      values, {0, 1} values or logits with the default boundary 0; use 0.5 for probabilities
      or a regression onto {0, 1} targets). Without a ``threshold`` or a declared kind, real
      values all in [0, 1] with some strictly inside (a sigmoid head) are refused as
      ambiguous, as :mod:`senslab.measure.outputs` refuses them: read as logits (class =
      value > 0) nothing would ever flip.
    - ``"real"``: (f(x) − f(x^⊕i))² / 4, scalar outputs only. It equals the indicator for ±1
      outputs and gives the Fourier identities above for any real f.
    - ``"auto"`` (default): ``"sign"`` for class-like outputs — (N, C) logits, integer or bool
      dtype, or real values that are all in {−1, 1} or all in {0, 1} — and ``"real"`` otherwise.
      The rule looks at *all* evaluated values, so a model that outputs a raw scalar logit is
      measured with ``"real"``: pass ``output="sign"`` for logit models. Since the token-wise
      estimator and sharpness read such a column as a logit, ``boolean_sensitivity`` warns
      when ``"auto"`` chooses ``"real"`` for an ``nn.Module`` (or a callable holding one) that
      declares no ``output_kind`` (a wrapper hides the kind its model declares: the warning
      names it); ``output="real"`` keeps the number without the warning.
      Sampled, it sees only
      the sampled values: a callable whose sampled values were all in {0, 1} gets ``"sign"``
      with a warning (a value in between elsewhere would have made it ``"real"``), unless it
      declares ``boolean_output = "sign"`` as MAJORITY does. Real values that all lie within
      ``NEAR_BOOLEAN`` (1e-2) of 0 and 1 (or −1 and 1) but not on them — a saturated
      sigmoid's 0.9999999 — get ``"real"``, a quarter of the class changes for 0/1, with a
      warning (a model gets the one above), and so do two values other than 0/1 and ±1 (a
      change between 1 and 2 counts 1/4) and float class labels (whole numbers, none
      negative, some ≥ 2: labels 0/1/2 counted 3.05 for their 6.0 class changes). A
      ``threshold`` with a rule that
      has none (``"real"``, given or chosen by ``"auto"``) is refused, and so is one on class
      labels (integer outputs, or (N, C) logits), which are compared as they are.
    - A model that declares ``output_kind`` (``"logits"`` or ``"probabilities"``, as
      :mod:`senslab.measure.outputs` reads it) is a classifier: ``"auto"`` counts its class
      changes, and a probability column's class boundary is 1/2 unless ``threshold`` says
      otherwise; (N, C) probabilities are read by their argmax, as any (N, C) output.

A random f has no truth table, and an f whose output for one string depends on the other
strings of its forward has none either (its number would move with ``chunk_size``): at most
:data:`REPEAT_ROWS` strings of the first batch are evaluated in one forward and again in two
halves, and outputs that differ beyond float rounding are refused; one more forward of the
same strings tells the two causes apart, so the error names the cause — a random forward
(dropout in training mode) or batch statistics (BatchNorm in training mode) — and the fix,
``model.eval()`` (also when f wraps the model). Class labels (integer or bool outputs) are
only evaluated twice in one forward: rounding may move a label at a decision boundary when
the batch changes. A module passed as f with BatchNorm that normalises by batch statistics
(training mode, or ``track_running_stats=False``) is refused before any forward. The buffers
of f — an ``nn.Module``, or the modules a callable holds (its closure, the globals it names,
a bound method's object, a ``functools.partial``'s arguments, its attributes) — are as they
were after the call (a forward in training mode updates BatchNorm's running statistics even
under ``torch.inference_mode``).

The Fourier side (coefficients, degree, spectral weights, noise stability) is in
:mod:`senslab.measure.fourier`, the reference functions (PARITY, MAJORITY, FIRST, MEAN, sparse
parities, random tables) in :mod:`senslab.measure.functions`; both are re-exported here.

Example::

    >>> from senslab.measure.boolean import boolean_sensitivity, majority, parity
    >>> boolean_sensitivity(parity, 6).average
    6.0
    >>> round(boolean_sensitivity(majority, 5).average, 4)
    1.875
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from numbers import Integral, Real
from typing import Literal

import torch
from torch import Tensor, nn

from .._exclusive import first_few, modes_kept, one_at_a_time
from .._exclusive import held_modules as _held_modules
from .._stack import user_level as _user_level
from ..tokens.base import _describe, select_output
from ..tokens.embedding import unwrapped
from ._alloc import MIN_FLIPS
from ._cube import (
    MAX_EXACT_N,
    all_inputs,
    check_n,
    check_string_dtype,
    index_to_inputs,
    inputs_to_index,
    table_n,
)
from ._options import _check_generator, _seeded
from ._options import _kept_buffers as _kept_model_buffers
from ._runner import _reduced_dtype as _reduced_dtype_of
from ._runner import _tolerance
from ._stats import interval_quantile

# Fourier analysis and the reference functions live in their own files; re-exported here so
# ``from senslab.measure.boolean import parity, fourier_coefficients`` keeps working.
from .fourier import (
    NEAR_BOOLEAN,
    _near_two_valued,
    average_sensitivity_fourier,
    degree,
    fourier_coefficients,
    influence_fourier,
    noise_stability,
    spectral_weights,
    subset_sizes,
)
from .functions import (
    first,
    majority,
    mean,
    parity,
    random_function,
    sparse_parity,
    table_function,
)
from .outputs import _labels, declared_kind, is_scalar

BoolFn = Callable[[Tensor], Tensor] | nn.Module | Tensor
Output = Literal["auto", "sign", "real"]
Method = Literal["auto", "exact", "sample"]

DEFAULT_CHUNK = 1 << 15
_PM_ONE, _ZERO_ONE = torch.tensor([-1, 1]), torch.tensor([0, 1])


@dataclass(frozen=True)
class BooleanSensitivity:
    """Result of :func:`boolean_sensitivity`.

    ``average`` is as(f) (exact, or the mean of s(f, x) over ``num_points`` sampled strings),
    ``normalized`` = average / n, ``influence[i]`` the mean change when bit i flips,
    ``max`` the largest s(f, x) over the evaluated points (s_max(f) when exact, a lower bound when
    sampled), ``stderr`` the standard error of ``average`` across sampled points (0 when exact),
    ``ci95`` the 95% interval ``average`` ± t·``stderr`` with t the 0.975 quantile of
    Student's t with ``num_points`` − 1 degrees of freedom (1.96 for many points, 4.30 for 3),
    cut to the range s(f, x) can take ([0, n] for "sign", [0, ∞) for "real"),
    ``num_evaluations`` the rows f was evaluated on (0 for a
    truth table; the checks' evaluations of at most 2·``REPEAT_ROWS`` strings are not
    counted), ``output`` the counting rule actually used ("sign" or "real").
    """

    average: float
    normalized: float
    influence: Tensor
    max: float
    stderr: float
    ci95: tuple[float, float]
    num_points: int
    num_evaluations: int
    method: str
    output: str
    n: int

    def __str__(self) -> str:
        err = "" if self.method == "exact" else f" ± {self.stderr:.4f}"
        return (
            f"as(f) = {self.average:.4f}{err} (normalized {self.normalized:.4f}, "
            f"max {self.max:g}; {self.method}, {self.output}, n={self.n}, "
            f"{self.num_points} points)"
        )


# ----------------------------------------------------------------------------- evaluating f


def _refuse_batch_statistics(model: nn.Module) -> None:
    """Refuse BatchNorm layers that normalise by their batch's statistics (training mode, or
    no running statistics): a string's output would depend on the strings that share its
    chunk, so the number would move with ``chunk_size`` (0.12 at the default chunk, 0.31 at
    64, 0.36 in eval mode), and every forward would update the running statistics."""
    norms = [repr(name) if name else type(model).__name__
             for name, m in model.named_modules()
             if isinstance(m, nn.modules.batchnorm._BatchNorm)
             and (m.training or m.running_mean is None)]
    if not norms:
        return
    shown = first_few(norms)
    raise ValueError(
        f"f has BatchNorm layers that normalise by batch statistics ({shown}: training mode, "
        "or track_running_stats=False): each string would be normalised with the strings that "
        "share its chunk, so the sensitivity would depend on chunk_size, and each forward "
        "would update the running statistics. Call model.eval() first (BatchNorm then uses "
        "its running statistics); a BatchNorm without running statistics normalises by the "
        "batch in eval mode too: give it running statistics or measure a model without it"
    )


def _module_placement(f: object) -> tuple[torch.device | None, torch.dtype | None]:
    if isinstance(f, nn.Module):
        _refuse_batch_statistics(f)
        if f.training:
            warnings.warn(
                "the module is in training mode (dropout makes f random); call model.eval() "
                "before measuring its Boolean sensitivity",
                stacklevel=_user_level(),
            )
        for p in list(f.parameters()) + list(f.buffers()):
            if p.is_floating_point():
                return p.device, p.dtype
    return None, None


def _as_tensor(raw: object) -> Tensor:
    """f's raw output as one tensor. A structured output is read as the token-wise estimator
    reads it by default (:func:`~senslab.tokens.base.select_output`): ``.logits``, a mapping's
    ``"logits"``, the element of a one-element tuple; anything else is refused, since
    ``output=`` here is the counting rule: wrap f to return its logits."""
    if isinstance(raw, Tensor):
        return raw
    structured = isinstance(raw, Mapping) or hasattr(raw, "logits") or (
        isinstance(raw, (tuple, list)) and any(isinstance(v, Tensor) for v in raw))
    if structured:
        try:
            return select_output(raw)
        except TypeError:
            pass
        pick = ("lambda x: model(x)[1]" if isinstance(raw, (tuple, list))
                else f"lambda x: model(x)[{next(iter(raw))!r}]" if isinstance(raw, Mapping) and raw
                else "lambda x: <the logits in model(x)>")
        raise TypeError(
            f"f returned {type(raw).__name__} {_describe(raw)}, not one tensor of outputs, and "
            "no part of it is marked as the logits (.logits, a 'logits' key or a one-element "
            f"tuple); pass a callable that returns the logits, e.g. {pick} (with device= and "
            "dtype= when the model is not on CPU in float32)"
        )
    try:
        return torch.as_tensor(raw)
    except (TypeError, ValueError, RuntimeError) as err:
        raise TypeError(
            f"f returned {type(raw).__name__}, which is not a tensor of outputs ({err}); f must "
            "return a (N,), (N, 1) or (N, C) tensor for a (N, n) batch of ±1 strings"
        ) from err


def _canonical(raw: object, rows: int, output: Output) -> Tensor:
    """Reduce raw outputs to one value per row: long class labels, or float64 scalars."""
    out = _as_tensor(raw)
    if out.dim() == 2 and out.shape[1] == 1:
        out = out[:, 0]
    if out.dim() not in (1, 2) or out.shape[0] != rows:
        raise ValueError(
            f"f returned shape {tuple(out.shape)} for {rows} inputs; expected ({rows},), "
            f"({rows}, 1) or ({rows}, C) — check that f takes a (N, n) batch of ±1 strings"
        )
    if out.is_complex():
        raise ValueError(
            f"f returned complex outputs ({_dtype_name(out.dtype)}): read as labels their "
            "imaginary part would be dropped and the real part cut to an integer without a word "
            "(0.3 and 0.7 both label 0). Return real values, e.g. out.real or out.abs()"
        )
    if out.dim() == 2 and out.shape[1] == 0:
        raise ValueError(
            f"f returned shape {tuple(out.shape)}: no output column per input, so no class or "
            "value to change; f must return (N,), (N, 1) or (N, C) outputs with C ≥ 2"
        )
    if out.is_floating_point() and not torch.isfinite(out).all():
        raise ValueError("f returned NaN or infinite outputs; sensitivity is undefined for them")
    if out.dim() == 2:
        if output == "real":
            raise ValueError("output='real' needs scalar outputs; f returned (N, C) logits")
        if out.dtype == torch.bool:  # argmax takes no bool: one-hot rows are classes
            trues = out.sum(1)
            if bool(trues.ne(1).any()):
                raise ValueError(
                    f"f returned {tuple(out.shape)} bool outputs with rows of "
                    f"{sorted(set(trues.unique().tolist()) - {1})[:3]} True entries: not one "
                    "class per string (one-hot), so no class to compare. Return the class "
                    "index (logits.argmax(1)), the logits, or measure one label at a time "
                    "(lambda x: f(x)[:, k])")
            out = out.long()
        return out.argmax(1).long().cpu()
    if not out.is_floating_point():
        return out.long().cpu()
    return out.double().cpu()


#: rows of the first batch that f is evaluated on twice, to refuse a random f
REPEAT_ROWS = 64


def _difference(first: Tensor, second: Tensor, rtol: float) -> float | None:
    """The largest difference of two evaluations of the same inputs if it is more than float
    rounding explains (``rtol`` of the largest output; class labels must be equal), else None.
    Non-finite outputs are left to :func:`_canonical`, which refuses them with its own message."""
    if first.shape != second.shape:
        return math.inf
    if first.is_floating_point() and second.is_floating_point():
        if not (torch.isfinite(first).all() and torch.isfinite(second).all()):
            return None
        worst = float((first.double() - second.double()).abs().max()) if first.numel() else 0.0
        scale = float(first.double().abs().max()) if first.numel() else 0.0
        return worst if worst > rtol * scale else None
    if torch.equal(first, second):
        return None
    return float((first.double() - second.double()).abs().max())


def _check_repeatable(first: Tensor, second: Tensor, rows: int, low: bool = False) -> None:
    """Refuse an f whose two evaluations of the same ``rows`` inputs differ: a random f (a
    model in training mode with dropout, called directly or inside a wrapper) has no truth
    table, and its sensitivity would count the randomness. Float rounding is allowed for:
    relative 1e-3 of the largest output (5e-2 below float32, or where ``low``: f runs a
    bf16/fp16 model, whatever its outputs' dtype)."""
    full = first.dtype in (torch.float32, torch.float64) and not low
    rtol = 1e-3 if full else 5e-2
    worst = _difference(first, second, rtol)
    if worst is not None:
        raise ValueError(
            f"f returned different outputs on two evaluations of the same {rows} inputs (by up "
            f"to {worst:.3g}): f is random — a model in training mode with dropout, or noise in "
            "the forward — so it has no truth table and its sensitivity would count that "
            "randomness. Call model.eval() first (also when f wraps the model), or make f "
            "deterministic"
        )


def _check_batch_independent(f: Callable[[Tensor], object], probe: Tensor,
                              low: bool = False) -> None:
    """Refuse a random f, or one whose output for a string depends on the other strings of its
    forward (batch statistics: BatchNorm in training mode, a batch mean or max). ``probe`` is
    evaluated in one forward and again in two halves; outputs that differ beyond float rounding
    (:func:`~senslab.measure._runner._tolerance`: 1e-3 of the largest output in float32, 5e-2
    below it or with TF32 products) are refused, after one more forward of the whole probe that
    tells randomness (:func:`_check_repeatable`) from batch dependence. Class labels (integer
    or bool outputs) and a one-row probe are only evaluated twice in one forward: a label may
    move at a decision boundary when rounding changes with the batch. Two forwards of
    ``len(probe)`` rows in all for an f that passes. ``low``: f runs a bf16/fp16 model
    (:func:`_reduced_dtype`), judged by bf16's rounding also where its outputs are cast to
    float32, as :func:`~senslab.measure._runner.verify_copies` judges one (float32's
    tolerance refused a bf16 MLP whose products sum in another order for a smaller batch,
    1 bf16 step of its output, while the same outputs left in bf16 passed)."""
    rows = len(probe)
    whole = _as_tensor(f(probe))
    half = rows // 2
    if rows < 2 or not whole.is_floating_point() or whole.dim() == 0 or len(whole) != rows:
        _check_repeatable(whole, _as_tensor(f(probe)), rows, low)
        return
    parts = [_as_tensor(f(probe[:half])), _as_tensor(f(probe[half:]))]
    if any(p.dim() == 0 or p.shape[1:] != whole.shape[1:] for p in parts):
        _check_repeatable(whole, _as_tensor(f(probe)), rows, low)  # shapes: by _canonical
        return
    low = low or whole.dtype not in (torch.float32, torch.float64)
    rtol = _tolerance(whole, low)
    worst = _difference(whole, torch.cat(parts), rtol)
    if worst is None:
        return
    _check_repeatable(whole, _as_tensor(f(probe)), rows, low)
    size = float(whole.double().abs().max())
    raise ValueError(
        f"f's output for a string depends on the other strings in its forward: {rows} strings "
        f"gave other outputs evaluated in one forward than in two halves (by up to "
        f"{worst:.3g}, outputs of size up to {size:.3g}; float rounding explains "
        f"{rtol * size:.3g}), while two forwards of all {rows} agree. f is evaluated on "
        "chunk_size strings per forward, so every change counted would depend on which strings "
        "share a chunk, and the number on chunk_size. Likely causes: BatchNorm in training "
        "mode (batch statistics) or without running statistics, a batch mean or max used to "
        "normalise, dynamic quantisation's per-batch activation range. Call model.eval() first "
        "(also when f wraps the model), or measure a model whose output for one string does "
        "not depend on the others"
    )


@contextmanager
def _kept_buffers(f: object) -> Iterator[None]:
    """Every buffer of the modules ``f`` is or holds (:func:`._exclusive.held_modules`) as it
    was after the block (:func:`._options._kept_buffers`); and the block refused where another
    thread switched one of those modules' mode and back, or changed a parameter in place (its
    ``optimizer.step()``), while f was evaluated (:func:`._exclusive.modes_kept`): dropout in
    some evaluations, or other weights in some, counted without a word (0.030 or 0.50 for a
    sampled average sensitivity of 0.020). Not by hooks on a compiled model, whose graph they
    would break at every module."""
    if isinstance(f, Tensor):
        yield
        return
    held = _held_modules(f)
    compiled = any(hasattr(m, "_orig_mod") for top in held for m in top.modules())
    with _kept_model_buffers(*held), modes_kept(f, hooks=not compiled, unit="measurement"):
        yield


def _evaluator(
    f: BoolFn, n: int, output: Output, device: torch.device | str | None, dtype: torch.dtype | None
) -> Callable[[Tensor], Tensor]:
    """A function index-or-string → canonical values, for a truth table or a callable. The
    first call also evaluates (up to :data:`REPEAT_ROWS` of) its inputs in one forward and in
    two halves, and refuses a random or batch-dependent f (:func:`_check_batch_independent`).
    Its ``low_precision`` is the reduced float type (bf16, fp16) f's values were rounded in:
    that of its outputs, else of the model f is or holds (:func:`_reduced_dtype`), whose
    outputs cast to float32 keep bf16's rounding."""
    if isinstance(f, Tensor):
        table = f[:, 0] if f.dim() == 2 else f
        table = _canonical(table, table.shape[0], output)

        def lookup(x: Tensor) -> Tensor:
            return table[inputs_to_index(x).cpu()]

        return lookup
    if not callable(f):
        raise TypeError(f"f must be a callable, an nn.Module or a truth table, not {type(f)}")
    _check_input_dtype(dtype)
    dev, own_dtype = _module_placement(f)
    dev = torch.device(device) if device is not None else (dev or torch.device("cpu"))
    dtype = dtype or own_dtype or torch.float32
    reduced = _reduced_dtype(f)
    checked = False
    said = False

    def call(x: Tensor) -> Tensor:
        nonlocal checked, said
        with torch.inference_mode():
            x = x.to(device=dev, dtype=dtype)
            if not checked:
                try:
                    _check_batch_independent(f, x[:REPEAT_ROWS], reduced is not None)
                except (RuntimeError, IndexError) as err:
                    _explain_indices(err, dtype)
                    if isinstance(err, IndexError):
                        raise
                    if "dtype" in str(err) or "scalar type" in str(err):
                        _explain_dtype(err, f, dtype)
                    if "shape" not in str(err) and "size" not in str(err):
                        raise
                    raise RuntimeError(
                        f"f failed on ({min(len(x), REPEAT_ROWS)}, {n}) inputs, strings of n={n} "
                        f"±1 bits: {err}. If n is not the model's input width, pass the n it "
                        "was built for"
                    ) from err
                checked = True
            out = f(x)
            if isinstance(out, Tensor) and out.dtype in (torch.bfloat16, torch.float16):
                call.low_precision = out.dtype  # type: ignore[attr-defined]
            if not said and isinstance(out, Tensor) and n > 2 and out.shape == (x.shape[0], n):
                said = True
                _warn_per_position(out.shape)
            return _canonical(out, x.shape[0], output)

    call.low_precision = reduced  # type: ignore[attr-defined]
    return call


def _warn_per_position(shape: torch.Size) -> None:
    """Warn that outputs of one column per bit (a sequence model's output per position, its
    ``[:, -1]`` forgotten) are read as that many class scores: the argmax over the positions
    was taken for the class, without a word."""
    warnings.warn(
        f"f returned {tuple(shape)} outputs for strings of {shape[1]} bits: one column per bit, "
        f"read as {shape[1]} class scores (the class is their argmax). If they are one output "
        "per position (a sequence model's per-position logit), measure the position the "
        "prediction is read from: lambda x: model(x)[:, -1] (or [:, 0] for a CLS token). If f "
        f"has {shape[1]} classes, this warning can be ignored",
        UserWarning, stacklevel=4)


def _explain_indices(err: Exception, dtype: torch.dtype) -> None:
    """Raise ``err`` again with the fix where f looked the ±1 strings up as indices (an
    ``nn.Embedding`` over 0/1 bits): float strings failed with torch's "Expected tensor for
    argument #1 'indices' to have one of the following scalar types", integer ones with
    "index out of range in self" (bit −1), neither naming the encoding or the wrapper."""
    text = str(err)
    if not ("'indices'" in text if isinstance(err, RuntimeError)
            else "index out of range in self" in text):
        return
    raise (IndexError if isinstance(err, IndexError) else RuntimeError)(
        f"f failed on {_dtype_name(dtype)} strings of −1/+1 bits, used as indices: {err}. "
        "boolean_sensitivity and truth_table evaluate f on ±1 strings; a model that looks "
        "0/1 bits up (an nn.Embedding over bits) needs a wrapper that gives it those: "
        "lambda x: model((x < 0).long()) (bit 1 ↦ −1, the encoding of truth tables here) or "
        "lambda x: model((x > 0).long()) (+1 ↦ 1)") from err


def _explain_dtype(err: RuntimeError, f: object, dtype: torch.dtype) -> None:
    """Raise ``err`` again with the fix where f holds a module of another float type than the
    strings were given in (a function wrapping a bf16 model gets float32 strings unless told:
    torch's "mat1 and mat2 must have the same dtype" named neither f nor ``dtype=``)."""
    held = {t.dtype for m in _held_modules_of(f) for t in (*m.parameters(), *m.buffers())
            if t.is_floating_point()} - {dtype}
    if len(held) != 1:
        return
    (own,) = held
    raise RuntimeError(
        f"f failed on {_dtype_name(dtype)} strings: {err}. The model f holds computes in "
        f"{_dtype_name(own)}, and a function wrapping a model gets {_dtype_name(dtype)} "
        f"strings unless told: pass dtype=torch.{_dtype_name(own)} (or give f the model "
        "itself)") from err


def _reduced_dtype(f: object) -> torch.dtype | None:
    """The reduced float type (bf16, else fp16) of the first module ``f`` is or holds
    (:func:`._exclusive.held_modules`) with such a parameter or buffer
    (:func:`~senslab.measure._runner._reduced_dtype`), else None. Its outputs are rounded as
    such also where f casts them to float32 (``.float()``): read by float32's rules, a bf16
    linear model's truth table went without the warning that its degree reads 10, not 1."""
    return next((d for d in map(_reduced_dtype_of, _held_modules_of(f)) if d is not None),
                None)


def _check_input_dtype(dtype: object) -> None:
    """Refuse an input ``dtype`` that cannot hold the ±1 strings: bool turned both −1 and +1
    into True (every f constant: as(f) = 0 for PARITY), an unsigned type wrapped −1 round to
    255 (FIRST on uint8 read 16129), a complex one is no bit. Signed integers and floats hold
    ±1 exactly."""
    if dtype is None:
        return
    check_string_dtype(
        dtype, "torch.float64", " f is evaluated on", "every f would be constant",
        "or, for a model that takes 0/1 or bool bits, wrap it: lambda x: model(x < 0) (bit 1 ↦ "
        "−1, the encoding of truth tables here) or lambda x: model(x > 0) (True ↦ +1)")


def _resolve(values: Tensor, output: Output) -> str:
    """The counting rule for ``output`` given *all* canonical values (see module docstring)."""
    if output not in ("auto", "sign", "real"):
        raise ValueError(f"output must be 'auto', 'sign' or 'real', got {output!r}")
    if output != "auto":
        return output
    if not values.is_floating_point():
        return "sign"
    u = values.unique()
    two_valued = torch.isin(u, _PM_ONE.double()).all() or torch.isin(u, _ZERO_ONE.double()).all()
    return "sign" if two_valued else "real"


def _declared(f: object, output: Output) -> tuple[Output, str | None]:
    """(output, declared kind) for ``f``: a callable that declares ``output_kind`` (the
    attribute :mod:`senslab.measure.outputs` reads) is a classifier, so ``"auto"`` counts its
    class changes."""
    if isinstance(f, Tensor):
        return output, None
    kind = _declared_kind(f)
    if kind is not None and output == "auto":
        output = "sign"
    return output, kind


def _declared_kind(f: object, wrapped: bool = False) -> str | None:
    """``f``'s ``output_kind`` as :func:`~senslab.measure.outputs.declared_kind` reads it, a
    declared ``"scores"`` refused in this module's terms: its error advised passing
    ``output_kind="scores", threshold=t`` to the measurement, an option these functions do
    not take (a TypeError), so the paper-2 rule a checkpoint saves (``{"output_kind":
    "scores", "threshold": 0.5}``) could not be followed. A scores column is counted with
    ``output="sign", threshold=t``; ``wrapped``: f is a module a callable holds, which is then
    named as ``"scores"`` instead."""
    try:
        return declared_kind(f, None)
    except ValueError:
        declared = getattr(f, "output_kind", None) or getattr(unwrapped(f), "output_kind", None)
        if declared != "scores":
            raise
        if wrapped:
            return "scores"
        raise ValueError(
            f"{type(f).__name__}.output_kind is 'scores' (one column, class 1 iff score > a "
            "threshold), and boolean_sensitivity and truth_table take no output_kind=: count "
            "its class changes with output='sign', threshold=t on a callable that hides the "
            "attribute, e.g. boolean_sensitivity(lambda x: model(x), n, output='sign', "
            "threshold=0.5)"
        ) from None


def _boundary(values: Tensor, kind: str | None, threshold: float | None) -> float:
    """The class boundary of one real column: the ``threshold`` given, else 1/2 for a declared
    ``"probabilities"`` column (at 0 no probability ever changes class: a false 0), else 0.
    Class labels and argmax classes are compared as they are, whatever it is."""
    if threshold is not None:
        return float(threshold)
    return 0.5 if kind == "probabilities" and values.is_floating_point() else 0.0


def _check_threshold_type(threshold: object) -> None:
    if threshold is None:
        return
    if isinstance(threshold, bool) or not isinstance(threshold, Real):
        raise TypeError(
            f"threshold must be a number, got {threshold!r} ({type(threshold).__name__})"
        )
    if not math.isfinite(threshold):
        raise ValueError(f"threshold must be finite, got {threshold!r}")


def _check_threshold(rule: str, output: Output, threshold: float | None,
                     values: Tensor | None = None) -> None:
    """A threshold the rule would ignore is refused: ``output="real"``, or ``"auto"`` that
    chose ``"real"``, and class labels (integer or bool outputs, or the argmax of (N, C)
    logits), which are compared as they are. Only a threshold the caller gave is checked (0
    passes, as it changes nothing)."""
    if threshold is None or threshold == 0.0:
        return
    if rule == "sign" and values is not None and not values.is_floating_point():
        raise ValueError(
            f"threshold={threshold!r} applies to one real output per input (class = value > "
            "threshold), but f returned class labels (integer or bool outputs, or (N, C) logits "
            "read by their argmax), whose changes are counted as they are: drop threshold, or "
            "return the real value to threshold")
    if rule == "real":
        why = ("output='real' counts" if output == "real"
               else f"output={output!r} chose 'real' for these real values, which counts")
        raise ValueError(
            f"threshold={threshold!r} applies to class changes (output='sign': class = value > "
            f"threshold), but {why} the squared change / 4, with no threshold: pass "
            "output='sign' to count class changes at the threshold, or drop threshold"
        )


def _check_unit_interval(rule: str, values: Tensor, kind: str | None,
                         threshold: float | None, low: torch.dtype | None = None) -> None:
    """The ambiguous column of :func:`senslab.measure.outputs.resolve_kind`: with the "sign"
    rule, no declared kind and no threshold, real values all in [0, 1] with some strictly
    inside are probabilities (a sigmoid head) as likely as logits, and read as logits
    (class = value > 0) nothing ever flips — a false 0. Refused; the error names the fix.
    So are, as there, float whole numbers, none negative and some ≥ 2 (class labels as
    floats): read with boundary 0, labels 1, 2, … are one class (float labels 1/2 read
    as(f) = 0, and 0/1/2 half their class changes). Rounded in bf16 or fp16 (``low``: the
    outputs' type or the model's) every value from 1/eps on (128 in bf16, 1024 in fp16) is
    whole, so such a column passes; below it whole numbers are labels in any type (a bf16
    model's labels 0/1/2 read 0.39 for its 1.95 class changes, in bf16 or cast to float32)."""
    if rule != "sign" or not values.is_floating_point() or values.numel() == 0:
        return
    if kind == "probabilities" and threshold is not None and is_scalar(values) \
            and not 0.0 < threshold < 1.0:
        raise ValueError(
            f"threshold={threshold!r} on a column f declares output_kind='probabilities': "
            "a probability is never on the other side of a boundary outside (0, 1), so no "
            "class would ever change (a false 0). Drop threshold (class 1 iff p > 1/2) or "
            "pass one inside (0, 1)"
        )
    if kind == "probabilities" and threshold is None and is_scalar(values):
        lo, hi = float(values.min()), float(values.max())
        if lo < 0.0 or hi > 1.0:
            raise ValueError(
                f"f declares output_kind='probabilities' but its values range over [{lo:.3g}, "
                f"{hi:.3g}], outside [0, 1]: these are not probabilities. Declare "
                "output_kind='logits' (class = sign), or pass threshold=t"
            )
        return
    if kind is not None or threshold is not None:
        return
    lo, hi = float(values.min()), float(values.max())
    rounded = low is not None and hi * torch.finfo(low).eps >= 1.0  # all whole from there
    if not rounded and is_scalar(values) and _labels(values, lo, hi):
        raise ValueError(
            f"f returns one real value per input, every one a whole number from {lo:g} to "
            f"{hi:g}: class labels as floats? output='sign' reads the class as value > 0 "
            "(threshold 0), so labels 1, 2, … would be one class and a change among them "
            "never counted. Return integer labels (.long()), which are compared as they are; "
            "or, if these are scores, say where the boundary is: threshold=t (or an attribute "
            "output_kind='logits' on f for class = sign)"
        )
    if 0.0 <= lo and hi <= 1.0 and bool(((values > 0) & (values < 1)).any()):
        raise ValueError(
            f"f returns one real value per input, every one in [0, 1] (min {lo:.3g}, max "
            f"{hi:.3g}): probabilities or logits? output='sign' reads the class as value > 0 "
            "(threshold 0), so read as logits nothing would ever flip. Say which: "
            "threshold=0.5 for probabilities (class 1 iff p > 1/2), or give f an attribute "
            "output_kind='probabilities' (class at 1/2) or output_kind='logits' (class = sign); "
            "threshold=0.0 keeps the sign as well"
        )


def _warn_real_column(f: object, output: Output, rule: str) -> None:
    """Say so when ``output="auto"`` read a model's one real column as a real-valued function:
    the token-wise estimator and sharpness read the same column as a logit (class = value > 0),
    and for a logit the "real" number is not the flip count (an 8-bit MLP's (N, 1) logit:
    0.073 against 1.922 class changes). Only for an ``nn.Module`` or a callable holding one
    (:func:`_held_modules`) that declares no ``output_kind``; the number is unchanged."""
    held = [] if isinstance(f, Tensor) else _held_modules(f)
    if output != "auto" or rule != "real" or not held:
        return
    kinds = [k for k in (_declared_kind(m, wrapped=True) for m in held) if k is not None]
    wrapped = ("; f wraps a model that declares output_kind='scores' (class 1 iff score > t): "
               "output='sign', threshold=t counts its class changes" if kinds[:1] == ["scores"]
               else f"; f wraps a model that declares output_kind={kinds[0]!r}, which the "
               "wrapper hides (the model passed itself is counted by class)" if kinds else "")
    warnings.warn(
        "output='auto' measured the model's one real output per string as a real-valued "
        "function (output='real': the squared change / 4 when a bit flips), not as a "
        "classifier's logit, as token_sensitivity and output_sharpness read one column (class "
        f"= value > 0): for a logit this is not the count of class changes{wrapped}. Pass "
        "output='sign' to count class changes (threshold=0.5 for a probability), or "
        "output='real' to keep this number without this warning; or give the model an "
        "attribute output_kind='logits' (or 'probabilities')",
        UserWarning, stacklevel=_user_level(),
    )


def _held_modules_of(f: object) -> list[nn.Module]:
    return [] if isinstance(f, Tensor) else _held_modules(f)


def _warn_near_boolean(values: Tensor, output: Output, rule: str, counted: bool = True) -> None:
    """Say so when ``output="auto"`` chose ``"real"`` for values that all lie within
    :data:`~senslab.measure.fourier.NEAR_BOOLEAN` of 0 and 1 (or of −1 and 1), each taken: a
    Boolean function up to rounding (a saturated sigmoid's 0.9999999) gets the "real" count,
    a quarter of its flips for 0/1 values (0.469 for MAJORITY on 5 bits, not 1.875), while
    exact 0/1 values would be counted by class. ``counted``: the caller counts changes
    (boolean_sensitivity), else it returns the table (truth_table). The number is unchanged."""
    if output != "auto" or rule != "real" or not values.is_floating_point():
        return
    pair = _near_two_valued(values.unique())
    if pair is None:
        _warn_labels(values, counted)
    else:
        low, high = pair
        boolean = f"output='sign' with threshold={(low + high) / 2:g}"
        if counted:
            what = ("counts the squared change / 4 (output='real')", "class changes "
                    + ("are about 4 times this count" if low == 0.0 else "this nearly is"),
                    f"Pass {boolean} to count class changes")
        else:
            what = ("returns the values as they are (output='real')",
                    "±1 table the Fourier functions would analyse",
                    f"Pass {boolean} for the ±1 table")
        warnings.warn(
            f"output='auto' {what[0]} for real values that all lie within {NEAR_BOOLEAN:g} "
            f"of {low:g} or {high:g}: a Boolean function up to rounding (a saturated "
            f"sigmoid's 0.9999999?), whose {what[1]}. {what[2]}, or output='real' to keep "
            "these values without this warning",
            UserWarning, stacklevel=_user_level(),
        )


def _warn_labels(values: Tensor, counted: bool) -> None:
    """Say so when ``output="auto"`` chose ``"real"`` for values that look like a Boolean
    function's or a classifier's labels in another encoding: two values other than 0/1 and
    ±1, or whole numbers, none negative and some ≥ 2 (class labels as floats, as
    :func:`_check_unit_interval` reads them for ``"sign"``). A plain function returning
    the float labels 0/1/2 (the number of +1 bits mod 3 on 6 bits) got as = 3.05, not its 6.0
    class changes, and labels 1/2 a quarter of each change, without a word. ``counted`` as in
    :func:`_warn_near_boolean`; the number is unchanged."""
    u = values.unique()
    if u.numel() < 2 or not is_scalar(values):
        return
    lo, hi = float(u[0]), float(u[-1])
    if u.numel() == 2:
        per_change = ((hi - lo) / 2) ** 2
        what = (f"two values, {lo:g} and {hi:g}: a Boolean function in another encoding? A "
                f"change between them counts ({hi:g} − {lo:g})² / 4 = {per_change:.4g}, not 1")
    elif _labels(u, lo, hi):  # whole, none negative, some ≥ 2: sums of ±1 bits pass
        what = (f"{u.numel()} whole numbers from {lo:g} to {hi:g}: class labels as floats? A "
                "change counts its squared size / 4 (1/4 between neighbouring labels), not 1")
    else:
        return
    done = ("counts the squared change / 4 (output='real')" if counted
            else "returns the values as they are (output='real')")
    warnings.warn(
        f"output='auto' {done} for real values that take {what}. A Boolean function returns "
        "values in {0, 1} or {−1, 1}: map the values onto one of those, or return integer "
        "labels (.long()), whose changes are counted by class; pass output='real' to keep "
        "these values as a real-valued function without this warning",
        UserWarning, stacklevel=_user_level(),
    )


def _changes(v0: Tensor, nb: Tensor, rule: str, threshold: float) -> Tensor:
    """(m, n) change per point and flipped bit: indicator ("sign") or squared change / 4."""
    if rule == "real":
        return (v0.double().unsqueeze(1) - nb.double()).pow(2) / 4
    if v0.is_floating_point():
        v0, nb = v0 > threshold, nb > threshold
    return (v0.unsqueeze(1) != nb).double()


@one_at_a_time  # one measurement at a time (see senslab._exclusive)
def truth_table(
    f: Callable[[Tensor], Tensor] | nn.Module,
    n: int,
    *,
    output: Output = "auto",
    threshold: float | None = None,
    chunk_size: int = DEFAULT_CHUNK,
    device: torch.device | str | None = None,
    dtype: torch.dtype | None = None,
) -> Tensor:
    """The truth table of ``f`` on {±1}ⁿ (length 2ⁿ, index encoding in the module docstring).

    With the "sign" rule a two-valued output becomes a float64 ±1 table (+1 where the output
    is the positive class: above the boundary — ``threshold``, else 1/2 for a declared
    probability column, else 0 —, label 1, or argmax 1 of two logits), so Fourier analysis
    applies directly; more than two integer classes stay long labels. With "real" the table
    holds the float64 outputs. f is called on at most ``chunk_size`` rows at a time. The
    ``threshold`` and the refusals are those of :func:`boolean_sensitivity`; in addition,
    ``output="auto"`` refuses an f that returns 0 for every string (the zero function, or the
    constant False of a logit or Boolean f: pass ``output="real"`` or ``output="sign"``), and
    warns when it returns values near 0/1 or ±1 as they are.
    """
    _check_threshold_type(threshold)
    n = check_n(n)
    if n > MAX_EXACT_N:  # _raw_table's error named method=, which truth_table does not take
        raise ValueError(
            f"n={n} is too large for a truth table: it holds f on all 2^{n} strings (limit "
            f"n ≤ {MAX_EXACT_N}), and the Fourier quantities read every entry. For the "
            f"sensitivity, sample strings instead: boolean_sensitivity(f, {n}, "
            "method='sample', num_samples=...)"
        )
    output, kind = _declared(f, output)
    with _kept_buffers(f):
        values, low = _raw_table(f, n, output, chunk_size, device, dtype)
    rule = _resolve(values, output)
    _check_threshold(rule, output, threshold, values)
    _check_unit_interval(rule, values, kind, threshold, low)
    if output == "auto" and rule == "sign" and threshold is None and values.is_floating_point() \
            and not bool(values.ne(0).any()):
        raise ValueError(
            "f returned 0 for every string: a real-valued f that is the zero function (a "
            "table of zeros) or a logit or Boolean f that is the constant False (a table of "
            "−1)? output='auto' cannot tell. Pass output='real' for the zeros or output='sign' "
            "for the −1 table")
    _warn_near_boolean(values, output, rule, counted=False)
    if rule == "real":
        table = values.double()  # read as it is: a table of zeros, or of 0/1, is real here
        if low is not None and degree(table, output="real") != degree(table, rtol=1e-2,
                                                                      output="real"):
            warnings.warn(
                f"the truth table holds {_dtype_name(low)} outputs "
                f"({8 if low == torch.bfloat16 else 11} significant bits, also where f casts "
                "a reduced-precision model's outputs to float32), returned as float64: their "
                "rounding leaves Fourier coefficients at every degree, so "
                "degree() and spectral quantities read it with the default rtol as a "
                "high-degree function (a bf16 linear model: degree 10 for 1). Pass "
                "degree(table, rtol=1e-2), or evaluate a float32 copy of the model "
                "(copy.deepcopy(model).float())",
                UserWarning, stacklevel=_user_level(),
            )
        return values.double()
    if values.is_floating_point():
        return (values > _boundary(values, kind, threshold)).double() * 2 - 1
    labels = values.unique()
    if torch.isin(labels, _ZERO_ONE).all() or torch.isin(labels, _PM_ONE).all():
        return (values > 0).double() * 2 - 1
    return values


def _low(dtype: torch.dtype) -> torch.dtype | None:
    """``dtype`` if it is a reduced float type (bf16, fp16), else None."""
    return dtype if dtype in (torch.bfloat16, torch.float16) else None


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def _raw_table(
    f: BoolFn,
    n: int,
    output: Output,
    chunk_size: int,
    device: torch.device | str | None,
    dtype: torch.dtype | None,
) -> tuple[Tensor, torch.dtype | None]:
    """Canonical values of f on all 2ⁿ strings, f called on ``chunk_size`` rows at a time, and
    the reduced float type (bf16, fp16) f's outputs came in, if any."""
    n = check_n(n)
    if n > MAX_EXACT_N:
        raise ValueError(
            f"n={n} is too large for exact enumeration (2^{n} evaluations, limit n ≤ "
            f"{MAX_EXACT_N}); use method='sample' (or 'auto') with num_samples"
        )
    chunk_size = _check_chunk(chunk_size, 1)
    evaluate = _evaluator(f, n, output, device, dtype)
    values = torch.cat(
        [evaluate(index_to_inputs(c, n)) for c in torch.arange(1 << n).split(chunk_size)]
    )
    return values, evaluate.low_precision


def _check_chunk(chunk_size: int, row_cost: int) -> int:
    """``chunk_size`` as an int, refused unless it is a whole number of at least ``row_cost``
    rows. Any integer type is taken (a NumPy ``int64`` from a config or an array was refused as
    "too small", 4096 ≥ 21 included); a float or a bool is named as not an integer."""
    if isinstance(chunk_size, bool) or not isinstance(chunk_size, Integral):
        raise ValueError(
            f"chunk_size must be an integer number of rows, got {chunk_size!r} "
            f"({type(chunk_size).__name__}); e.g. chunk_size={DEFAULT_CHUNK}"
        )
    if chunk_size < row_cost:
        raise ValueError(
            f"chunk_size={chunk_size!r} is too small: one evaluation needs {row_cost} rows "
            f"(a sampled point comes with its n flips); pass chunk_size ≥ {row_cost}"
        )
    return int(chunk_size)


# ----------------------------------------------------------------------------- sensitivity


@one_at_a_time
def boolean_sensitivity(
    f: BoolFn,
    n: int | None = None,
    *,
    method: Method = "auto",
    num_samples: int = 2000,
    generator: torch.Generator | int | None = None,
    chunk_size: int = DEFAULT_CHUNK,
    output: Output = "auto",
    threshold: float | None = None,
    device: torch.device | str | None = None,
    dtype: torch.dtype | None = None,
) -> BooleanSensitivity:
    """Average, per-bit and maximum sensitivity of ``f`` on {±1}ⁿ.

    ``f`` is a truth table (``n`` then optional), or a callable / ``nn.Module`` taking a (N, n)
    batch of ±1 strings. f runs under ``torch.inference_mode()`` on ``device`` with inputs of
    ``dtype`` (defaults: a module's own device and parameter dtype; CPU and float32 for other
    callables). ``output`` and ``threshold`` say how a change is counted (module docstring);
    ``threshold`` None (default) is the class boundary 0 of real outputs, 1/2 for a model that
    declares ``output_kind="probabilities"``. A random f (dropout in training mode) is refused.

    - ``method="exact"`` enumerates all 2ⁿ strings: the truth table is evaluated once, in chunks
      of ``chunk_size`` rows (2ⁿ evaluations instead of (n+1)·2ⁿ), and the flips are read from it.
      Functions need n ≤ MAX_EXACT_N; a truth table of any size can be enumerated.
    - ``method="sample"`` draws ``num_samples`` uniform strings from ``generator`` (a
      ``torch.Generator`` or an int seed; seed 0 when None) and evaluates each together with its
      n flips, ``chunk_size // (n+1)`` points per call. An int seed ``s`` draws from
      ``torch.Generator().manual_seed(s)``, a CPU generator, which keeps only a seed's low 32
      bits: seeds from 2**32 on are refused (seed 2**32 + 1 would repeat seed 1's points).
      ``stderr`` = std over points of s(f, x) / √num_samples; ``ci95`` = average ± t·stderr,
      t the 0.975 quantile of Student's t with num_samples − 1 degrees of freedom (2.78 for 5
      samples, 1.96 for many), cut to [0, n] ([0, ∞) for "real"). A standard error that
      rests on fewer than 10 sampled strings with a change, not all of them (none: ``0 ± 0``),
      comes with a RuntimeWarning that gives the rule of three's bound.
    - ``method="auto"``: exact for truth tables and, for n ≤ MAX_EXACT_N, whenever
      2ⁿ ≤ (n+1)·num_samples (enumeration costs no more evaluations than sampling), sampled
      otherwise.
    """
    if isinstance(f, (list, tuple)):
        raise TypeError(
            f"a truth table must be a tensor, got a Python {type(f).__name__} of {len(f)} values; "
            "pass torch.tensor(table)"
        )
    if not isinstance(f, Tensor) and not callable(f) and hasattr(f, "__array__"):
        # a NumPy table was told "n is required unless f is a truth table", or, with n, that
        # f must be "a callable, an nn.Module or a truth table"
        raise TypeError(
            f"a truth table must be a tensor, got a {type(f).__module__.split('.')[0]} "
            f"{type(f).__name__} of shape {tuple(getattr(f, 'shape', ()))}; pass "
            "torch.as_tensor(table)"
        )
    _check_generator(generator)
    _check_threshold_type(threshold)
    if isinstance(f, Tensor):
        m = table_n(f)
        if n is not None and n != m:
            raise ValueError(f"the truth table has length 2^{m}, so n={m}, but n={n} was passed")
        n = m
    elif n is None:
        raise ValueError("n (the number of input bits) is required unless f is a truth table")
    n = check_n(n)
    if method not in ("auto", "exact", "sample"):
        raise ValueError(f"method must be 'auto', 'exact' or 'sample', got {method!r}")
    if output not in ("auto", "sign", "real"):
        raise ValueError(f"output must be 'auto', 'sign' or 'real', got {output!r}")
    output, kind = _declared(f, output)
    if output == "real":  # refused before anything is evaluated
        _check_threshold("real", output, threshold)
    is_table = isinstance(f, Tensor)
    # any integer type (a NumPy int64 was refused as "not an integer ≥ 2", 500 included);
    # checked before "auto" compares 2ⁿ with (n+1)·num_samples, where None or a str failed
    # with a bare TypeError ("'<=' not supported between instances of 'int' and 'str'")
    if method != "exact" and (isinstance(num_samples, bool)
                              or not isinstance(num_samples, Integral) or num_samples < 1):
        raise ValueError(f"num_samples must be an integer ≥ 2, got {num_samples!r}")
    if method == "auto":
        method = "exact" if is_table or (n <= MAX_EXACT_N
                                         and (1 << n) <= (n + 1) * num_samples) else "sample"
    if method == "exact":
        chunk_size = _check_chunk(chunk_size, 1)  # also a table's: it bounds the flips read
        if is_table:
            table, evaluations, low = _canonical(f, f.shape[0], output), 0, _low(f.dtype)
        else:
            with _kept_buffers(f):
                table, low = _raw_table(f, n, output, chunk_size, device, dtype)
            evaluations = 1 << n
        rule = _resolve(table, output)
        _check_threshold(rule, output, threshold, table)
        _check_unit_interval(rule, table, kind, threshold, low)
        _warn_real_column(f, output, rule)
        if rule == "real" and not _held_modules_of(f):  # a model: _warn_real_column's
            _warn_near_boolean(table, output, rule)
        boundary = _boundary(table, kind, threshold)
        stats = _Stats(n)
        masks = 1 << torch.arange(n)
        step = max(1, chunk_size // (n + 1))  # bounds the (points, n) change matrix too
        for idx in torch.arange(1 << n).split(step):
            stats.add(_changes(table[idx], table[idx.unsqueeze(1) ^ masks], rule, boundary))
        return stats.result("exact", rule, evaluations, exact=True)

    if num_samples < 2:  # as the token-wise data standard error, which is nan from one example
        exact = (" or enumerate all strings (method='exact'), which has no sampling error"
                 if n <= MAX_EXACT_N else "")
        raise ValueError(
            "num_samples=1: the standard error of a sampled average needs at least two "
            "sampled strings (from one, the spread across strings is undefined: nan, and so is "
            f"the 95% interval). Pass num_samples ≥ 2 for a finite one{exact}")
    num_samples = int(num_samples)
    chunk_size = _check_chunk(chunk_size, n + 1)
    # an int seed (the default seed 0 for None) becomes a CPU generator: the same call gives
    # the same numbers, and a seed of 2**32 or more, which it would read as seed % 2**32, is
    # refused
    gen = _seeded(generator)
    evaluate = _evaluator(f, n, output, device, dtype)
    flip = 1 - 2 * torch.eye(n)  # row i multiplies bit i by −1
    base, neighbours = [], []
    # All strings are drawn up front (num_samples × n bits is small), so the points do not
    # depend on chunk_size and chunked and unchunked runs agree exactly.
    bits = torch.randint(0, 2, (num_samples, n), generator=gen, device=gen.device).cpu()
    with _kept_buffers(f):
        for x in (1 - 2 * bits).float().split(chunk_size // (n + 1)):
            rows = torch.cat([x, (x.unsqueeze(1) * flip).reshape(-1, n)])
            v = evaluate(rows)
            base.append(v[: len(x)])
            neighbours.append(v[len(x) :].reshape(len(x), n))
    v0, nb = torch.cat(base), torch.cat(neighbours)
    # The values the rule and the checks read: a truth table is known in full, so its rule is
    # that of all its entries, as method="exact" reads it. Read from the sampled entries only,
    # a 0/1 table with one entry of 0.999 was counted by class (3.29) where the exact rule is
    # "real" (0.786): the two methods measured one table by two rules.
    values = (_canonical(f, f.shape[0], output) if is_table
              else torch.cat([v0, nb.reshape(-1)]))
    rule = _resolve(values, output)
    declared = getattr(f, "boolean_output", None) == "sign"  # senslab's Boolean functions
    if output == "auto" and rule == "sign" and v0.is_floating_point() and v0.dim() == 1 \
            and not declared and not is_table:
        seen = values.unique()
        if not bool(torch.isin(seen, _PM_ONE.to(seen)).all()):
            warnings.warn(
                "output='auto' took the sampled values, all in {0, 1}, for a Boolean function "
                "and counts changes of class; a value in between that the sample missed would "
                "make the exact rule 'real' (squared change / 4, a quarter of this for a 0/1 "
                "change). Pass output='sign' or output='real' to fix the rule (or give the "
                "callable an attribute boolean_output='sign')",
                UserWarning, stacklevel=_user_level(),
            )
    _check_threshold(rule, output, threshold, v0)
    low = _low(f.dtype) if is_table else evaluate.low_precision  # type: ignore[attr-defined]
    _check_unit_interval(rule, values, kind, threshold, low)
    _warn_real_column(f, output, rule)
    if rule == "real" and not _held_modules_of(f):
        _warn_near_boolean(values, output, rule)
    stats = _Stats(n)
    stats.add(_changes(v0, nb, rule, _boundary(v0, kind, threshold)))
    evaluations = 0 if is_table else num_samples * (n + 1)
    result = stats.result("sample", rule, evaluations, exact=False)
    _warn_few_events(result, stats.events)
    return result


def _warn_few_events(r: BooleanSensitivity, events: int) -> None:
    """Say so when a sampled result's standard error rests on fewer than
    :data:`~senslab.measure._alloc.MIN_FLIPS` points where some flip changed f, as the
    token-wise estimator says of few flips. From none it is 0 and the interval (0, 0): AND on
    12 bits (as(f) = 0.0059) sampled at 200 points read ``0 ± 0`` in about half the seeds, an
    interval that excludes the truth; from a handful it moves with the few points seen. The
    number is unchanged. Where every point changed, the spread is the points' own, which the
    Student's t interval is for: nothing is said."""
    if events >= MIN_FLIPS or events == r.num_points:
        return
    what = "changed the class" if r.output == "sign" else "changed the value"
    how = (f"sample more strings (num_samples, now {r.num_points:,})"
           + (" or enumerate them (method='exact')" if r.n <= MAX_EXACT_N else ""))
    shown = f"as(f) = {r.average:.4g} ± {r.stderr:.2g} (95% CI {r.ci95[0]:.4g}–{r.ci95[1]:.4g})"
    if events == 0:
        bound = 3 / r.num_points
        cap = (f", so as(f) ≤ n·{bound:.2g} = {r.n * bound:.3g}" if r.output == "sign" else "")
        message = (
            f"the standard error rests on no change: no flip of any bit of the {r.num_points:,} "
            f"sampled strings {what}, so {shown} cannot be trusted as a 95% interval; by the "
            f"rule of three, the share of strings where some flip {what} is below "
            f"3/{r.num_points:,} = {bound:.2g} with 95% confidence{cap}. For a standard error, "
            f"{how}")
    else:
        message = (
            f"the standard error rests on few changes: only {events} of the "
            f"{r.num_points:,} sampled strings had a flip that {what}, fewer than {MIN_FLIPS}; "
            f"a standard error estimated from so few moves with them, and the 95% interval of "
            f"{shown} can cover as(f) far less often than 95%. For a firmer one, {how}")
    warnings.warn(message, RuntimeWarning, stacklevel=_user_level())


class _Stats:
    """Running sums of s(f, x), its squared spread and per-bit changes over chunks of points
    (float64)."""

    def __init__(self, n: int) -> None:
        self.n, self.count, self.s1, self.max = n, 0, 0.0, -math.inf
        self.influence = torch.zeros(n, dtype=torch.float64)
        self.events = 0  # points where some flip changed f: what the standard error learns from
        # the spread is summed around the first point's s(f, x): Σs² − N·mean² lost it all to
        # rounding where it is small beside the mean (s = 1e12 + O(1) gave stderr 0, not 0.008)
        self.shift: float | None = None
        self.d1, self.d2 = 0.0, 0.0

    def add(self, changes: Tensor) -> None:
        s = changes.sum(1)
        if not len(s):
            return
        self.count += len(s)
        self.events += int(s.ne(0).sum())
        self.s1 += s.sum().item()
        if self.shift is None:
            self.shift = float(s[0])
        d = s - self.shift
        self.d1 += d.sum().item()
        self.d2 += d.pow(2).sum().item()
        self.max = max(self.max, s.max().item())
        self.influence += changes.sum(0)

    def result(self, method: str, rule: str, evaluations: int, exact: bool) -> BooleanSensitivity:
        mean = self.s1 / self.count
        var = max(self.d2 - self.d1**2 / self.count, 0.0) / (self.count - 1)
        se = 0.0 if exact else math.sqrt(var / self.count)
        # Student's t with count − 1 degrees of freedom, as the token-wise data estimand: the
        # standard error is itself estimated from the points, and ±1.96·se from 3 points of a
        # real-valued f covered as(f) in 80% of seeds, not 95% (t: 93%).
        half = 0.0 if exact else interval_quantile("data", self.count) * se
        # s(f, x) lies in [0, n] ("sign") or [0, ∞) ("real"): no interval reaches outside
        lo, hi = max(mean - half, 0.0), mean + half
        if rule == "sign":
            hi = min(hi, float(self.n))
        return BooleanSensitivity(
            average=mean,
            normalized=mean / self.n,
            influence=self.influence / self.count,
            max=self.max,
            stderr=se,
            ci95=(lo, hi),
            num_points=self.count,
            num_evaluations=evaluations,
            method=method,
            output=rule,
            n=self.n,
        )


__all__ = [
    "MAX_EXACT_N", "BooleanSensitivity", "all_inputs", "average_sensitivity_fourier",
    "boolean_sensitivity", "degree", "first", "fourier_coefficients", "index_to_inputs",
    "influence_fourier", "inputs_to_index", "majority", "mean", "noise_stability", "parity",
    "random_function", "sparse_parity", "spectral_weights", "subset_sizes", "table_function",
    "truth_table",
]
