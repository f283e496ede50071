"""Chunked evaluation of the perturbed copies of one batch (the estimator's inner loop)."""

from __future__ import annotations

import bisect
import math
import warnings
from typing import Any

import torch
from torch import Tensor, nn

from .._sigint import SigintWatch
from ..tokens.base import BoundTokens, last_real
from ..tokens.embedding import _BoundEmbedding
from . import _chunks, _trim
from ._noise import NoiseStream
from ._precision import PrecisionCheck
from .outputs import check_finite, check_perturbed_kind, check_rows, predictions


def _size(t: Tensor) -> Tensor:
    """``|t|`` where finite, 0 elsewhere: the size a tolerance scales with (a ``-inf`` logit of
    a masked class would make every tolerance infinite and every check pass)."""
    return torch.where(torch.isfinite(t), t.abs(), torch.zeros_like(t))


def _gap(a: Tensor, b: Tensor) -> Tensor:
    """``|a − b|``, 0 where they are equal (the same ``-inf`` in both) or both NaN (the same
    undefined value: no sign of randomness or of a batch, :func:`verify_copies` refuses it as
    NaN), ``inf`` where one is finite and the other not, or one alone is NaN."""
    d = (a - b).abs()
    return torch.where((a == b) | (a.isnan() & b.isnan()), torch.zeros_like(d),
                       torch.where(torch.isfinite(d), d, torch.full_like(d, math.inf)))


#: examples whose zero-noise copies are compared with their clean outputs, per batch
VERIFY_ROWS = 2
#: noisy copies of example 0 evaluated both through a model's own reuse path and by full
#: forwards, per input shape (:func:`verify_copies`): one forward per path for all of them
VERIFY_NOISY = 3
#: seed of the noisy copies' own generator: the measurement's noise stream is never drawn from
VERIFY_SEED = 20240527
#: noisy copies of the first examples evaluated all in one forward and again in two halves, per
#: input shape (:func:`_verify_batch`): three forwards in all
VERIFY_BATCH = 6
#: a calibrated checked precision gathers at most this many chunks per call (ChunkRunner._gather)
GATHER_MAX = 8


def _tolerance(clean: Tensor, low_precision: bool) -> float:
    """Largest relative difference between two evaluations of one input that float rounding
    explains: float32 products at full precision, else bf16-class rounding (autocast, a
    reduced-precision model, TF32 matrix products, or cuDNN convolutions in TF32 — PyTorch's
    default on CUDA — whose algorithm may change with the batch size)."""
    highest = torch.get_float32_matmul_precision() == "highest"
    tf32 = clean.device.type == "cuda" and (torch.backends.cudnn.allow_tf32
                                            or torch.backends.cuda.matmul.allow_tf32)
    if (low_precision or clean.dtype not in (torch.float32, torch.float64) or not highest
            or tf32):
        return 5e-2
    return 1e-3


def _dynamic_quantized(model: Any) -> list[str]:
    """Names of ``model``'s dynamically quantised modules (``quantize_dynamic``'s Linear, LSTM…,
    from ``torch.ao.nn.quantized.dynamic``): each forward takes its activation scale from the
    range of its own batch, so an example's output depends on the examples it is batched with."""
    if not isinstance(model, nn.Module):
        return []
    prefixes = ("torch.ao.nn.quantized.dynamic", "torch.nn.quantized.dynamic")
    return [name or type(model).__name__ for name, m in model.named_modules()
            if type(m).__module__.startswith(prefixes)]


def _buffer_versions(model: Any) -> dict[str, int]:
    """Version counter of each of ``model``'s buffers (no copy: an in-place update bumps it),
    to name the buffers a forward updates; buffers made in inference mode keep none."""
    if not isinstance(model, nn.Module):
        return {}
    out = {}
    for name, buf in model.named_buffers():
        try:
            out[name] = buf._version
        except RuntimeError:  # an inference tensor tracks no version
            continue
    return out


def _updated(model: Any, before: dict[str, int]) -> list[str]:
    """The buffers of ``model`` updated in place since ``before`` (:func:`_buffer_versions`)."""
    now = _buffer_versions(model)
    return [name for name, v in before.items() if now.get(name, v) != v]


def _quantized_cause(names: list[str]) -> str:
    shown = ", ".join(map(repr, names[:3])) + (", …" if len(names) > 3 else "")
    return (
        f"The model holds dynamically quantised modules ({shown}: quantize_dynamic), which take "
        "their activation scale from the range of each forward's batch, so an example's output "
        "depends on the examples evaluated with it, and the number would depend on chunk_size. "
        "Measure the float model with precision='int8-checked' (int8 speed, float32's "
        "decisions), or, for this quantised model's own decisions, feed one example per "
        "update() with chunk_size=1 and precision='float32' (exact, one copy per forward: slow)"
    )


def _reuse_names(bound: BoundTokens) -> tuple[str, str, str]:
    """(the model's reuse methods, the kind of reuse, the tokens that turn it off)."""
    if isinstance(bound, _BoundEmbedding):
        return ("prefix_cache/forward_suffix", "prefix reuse",
                "Embedding(..., reuse_prefix=False)")
    size = getattr(bound, "p", None)
    return ("local_cache/forward_local", "local reuse",
            f"Patches({size if isinstance(size, int) else 'p'}, reuse_local=False)")


def _full_forwards(bound: BoundTokens, run: Any) -> Any:
    """``run()`` with the model's reuse path off, every copy a full forward (the reuse is back
    on after it); None where the full forwards raise, which then tells nothing."""
    bound.reuse = False  # type: ignore[attr-defined]
    try:
        return run()
    except Exception:  # noqa: BLE001  # a diagnosis only: the reuse path's fault stays open
        return None
    finally:
        bound.reuse = True  # type: ignore[attr-defined]


def _reuse_at_fault(bound: BoundTokens, what: str, passed: str, why: str) -> str:
    """The error where copies through the model's reuse path fail a check that the same copies
    as full forwards pass: ``what`` the copies through it did, ``passed`` what the full
    forwards did instead, ``why`` it matters."""
    method, kind, option = _reuse_names(bound)
    model = type(getattr(bound, "model", None)).__name__
    return (
        f"evaluated through {model}'s {method} ({kind}, which senslab takes by default in "
        f"eval mode), {what}, while full forwards of the same copies {passed}: the reuse path "
        f"is at fault, not the model's forward, and {why}. Measure with full forwards — pass "
        f"{option} as the tokens — or repair {model}'s {method} (a copy must give what a full "
        "forward of it gives, the same at every call)"
    )


def _reuse_first(bound: BoundTokens) -> str:
    """The note, where the full forwards could not be run to tell, that the reuse path is the
    likely cause."""
    method, kind, option = _reuse_names(bound)
    return (f"The copies were evaluated through the model's {method} ({kind}); the likely "
            f"cause is that path, not the model's forward: measure with {option} to tell. "
            "Otherwise: ")


def verify_deterministic(bound: BoundTokens, clean: Tensor, whole: bool,
                         extent: Tensor | None, low_precision: bool, alone: bool = False) -> None:
    """``eval_mode=False``: refuse a forward that is random in the model's own mode (dropout in
    train mode). The first :data:`VERIFY_ROWS` examples (at least two copies, for train-mode
    BatchNorm) are evaluated twice, together, as copies with zero noise; the two runs must
    agree. Unlike :func:`verify_copies` they are not compared with the clean forward: in train
    mode batch statistics make an example's output depend on its batch. The batch check of
    :func:`_verify_batch` follows (unless ``alone``): a forward whose copies depend on each
    other makes the number depend on ``chunk_size`` in any mode. Rounding is judged as in
    :func:`verify_copies` (a bf16/fp16 model by bf16's, whatever its outputs' dtype)."""
    rows = min(VERIFY_ROWS, len(clean))
    src = torch.arange(rows, device=bound.valid.device)
    if rows == 1:
        src = src.repeat(2)
    width = bound.valid.shape[1] if extent is None else int(extent[src].max())
    cut = {} if extent is None else {"width": width}
    if whole:
        tok = None
        zero = torch.zeros(len(src), width, bound.dim, device=clean.device)
    else:
        tok = last_real(bound.valid)[src]
        zero = torch.zeros(len(src), bound.dim, device=clean.device)

    def twice() -> list[Tensor]:
        return [bound.forward_perturbed(src, tok, zero, **cut).float().reshape(len(src), -1)
                for _ in range(2)]

    runs = twice()
    if runs[0].shape != runs[1].shape:
        return
    low_precision = low_precision or _reduced(getattr(bound, "model", None))
    rtol = _tolerance(clean, low_precision)
    ref = clean[:rows].float().reshape(rows, -1)
    floor = float(_size(ref).max()) * 1e-3 + 1e-30

    def moved(runs: list[Tensor]) -> bool:
        scale = _size(runs[0]).amax(dim=1, keepdim=True).clamp(min=floor)
        return bool((_gap(runs[0], runs[1]) > rtol * scale).any())

    if moved(runs):
        worst = float(_gap(runs[0], runs[1]).max())
        if getattr(bound, "reuse", False) and not whole:
            full = _full_forwards(bound, twice)
            if full is not None and full[0].shape == full[1].shape and not moved(full):
                raise RuntimeError(_reuse_at_fault(
                    bound, f"a copy with zero noise gave another output at each of two "
                    f"evaluations (by up to {worst:.3g})", "agree with each other",
                    "the measured flips would count that randomness"))
        raise RuntimeError(
            f"with eval_mode=False the model's output changed between two evaluations of the "
            f"same input (by up to {worst:.3g}, outputs of size up to "
            f"{float(_size(runs[0]).max()):.3g}): the forward is random in the model's own mode "
            "(dropout in train mode, a stochastic layer), so the measured flips would count that "
            "randomness. Measure with eval_mode=True (the default: eval() for the measurement, "
            "the model's mode restored after it), or make the forward deterministic"
        )
    if not alone:
        _verify_batch(bound, clean, whole, extent, rtol, floor,
                      labels=_exact_labels(bound, clean, low_precision))


def verify_copies(bound: BoundTokens, clean: Tensor, whole: bool, extent: Tensor | None,
                  low_precision: bool, alone: bool = False) -> None:
    """Refuse a model whose perturbed copies are not evaluated like its clean inputs.

    The first :data:`VERIFY_ROWS` examples are evaluated twice as copies with zero noise (at the
    last real token; cut to their extent when padding-aware batching is on), through the same
    path as the perturbed copies. Two runs that differ mean the forward is random (dropout or
    sampling that ``eval()`` does not switch off) or keeps state from call to call; runs that
    agree with each other but not with the clean forward mean the copies' path computes
    something else (an example's output that depends on its batch, or
    ``prefix_cache``/``forward_suffix``/``forward_local`` that disagree with ``forward``).
    Either way every flip count would be wrong, so it is an error. A zero-noise copy evaluated
    alone can agree with its batch although the model is batch-dependent (each example attains
    the batch max it is normalised by), so :data:`VERIFY_BATCH` noisy copies are then
    evaluated together and in two halves (:func:`_verify_batch`; skipped with ``alone``: every
    copy gets a forward of its own, ``chunk_size=1`` in float32). With the model's own prefix
    or local reuse on, :data:`VERIFY_NOISY` noisy copies are evaluated through it and by full
    forwards too (:func:`_verify_noisy`): a reuse path that mishandles the noise agrees with
    zero noise. Where copies through a reuse path fail a check, the same copies are evaluated
    again by full forwards: if those pass, the error names the reuse path as the cause and the
    tokens that turn it off (a wrong ``forward_local`` had been reported as a random or
    batch-dependent model, the reuse named last); if they fail too, the model's own cause is
    reported. These copies are not counted in ``num_forward`` and their noise has a generator
    of its own. The metric calls it on the first batch of each input shape (the path of the
    copies depends on the shape, not on the values). Differences are judged with the rounding
    of the precision the copies compute in (:func:`_tolerance`): bf16's under autocast
    (``low_precision``) and for a model holding bf16/fp16 weights, also where its outputs are
    cast to float32 (float32's tolerance took a correct ``forward_suffix`` for a wrong one).
    """
    rows = min(VERIFY_ROWS, len(clean))
    model = getattr(bound, "model", None)
    # a bf16/fp16 model rounds as such also where its outputs are cast to float32: float32's
    # tolerance took that rounding for a prefix_cache/forward_suffix that disagrees
    low_precision = low_precision or _reduced(model)
    rtol = _tolerance(clean, low_precision)
    ref = clean[:rows].float().reshape(rows, -1)
    floor = float(_size(ref).max()) * 1e-3 + 1e-30
    versions = _buffer_versions(model)

    def twice() -> list[Tensor] | None:
        """Two runs of the zero-noise copies (None: an output of another shape)."""
        runs: list[Tensor] = []
        for _ in range(2):
            outs = []
            for r in range(rows):
                src = torch.tensor([r], device=bound.valid.device)
                width = bound.valid.shape[1] if extent is None else int(extent[r])
                cut = {} if extent is None else {"width": width}
                if whole:
                    tok = None
                    zero = torch.zeros(1, width, bound.dim, device=clean.device)
                else:
                    tok = bound.valid[r].nonzero()[-1:].flatten()
                    zero = torch.zeros(1, bound.dim, device=clean.device)
                out = bound.forward_perturbed(src, tok, zero, **cut)
                if out.shape[1:] != clean.shape[1:]:
                    return None
                outs.append(out.float().reshape(1, -1))
            runs.append(torch.cat(outs))
        return runs

    found = twice()
    if found is None:
        return  # reported with the copies' own shape check
    runs = found
    updated = _updated(model, versions)
    state = (f"its forward updates the buffer(s) {', '.join(map(repr, updated[:3]))} in place, "
             "even in eval() mode (a running mean, a counter), so each forward sees another state"
             if updated else "")
    scale = _size(ref).amax(dim=1, keepdim=True).clamp(min=floor)
    random = _gap(runs[0], runs[1]) > rtol * scale
    diff = _gap(runs[0], ref)
    # NaN or ±inf at both evaluations where the clean output is finite: refused as such (both
    # NaN had read as a random forward, both inf as an output that depends on its batch)
    undefined = (~torch.isfinite(runs[0]) & ~torch.isfinite(runs[1])
                 & torch.isfinite(ref)).any(dim=1)
    reused = bool(getattr(bound, "reuse", False)) and not whole
    full: list[Tensor] | None = None
    if reused and bool(random.any() or (diff > rtol * scale).any()):
        # the same copies by full forwards: where they pass, the reuse path is at fault (its
        # error had blamed the model's randomness or its batch)
        full = _full_forwards(bound, twice)
        if full is not None and not bool((_gap(full[0], full[1]) > rtol * scale).any()
                                         or (_gap(full[0], ref) > rtol * scale).any()):
            size = f"outputs of size up to {float(_size(ref).max()):.3g}"
            if bool(random.any()):
                raise RuntimeError(_reuse_at_fault(
                    bound, f"a copy with zero noise gave another output at each of two "
                    f"evaluations (by up to {float(_gap(runs[0], runs[1]).max()):.3g}, {size})",
                    "agree with each other and with the clean forward",
                    "the measured flips would count that randomness"))
            what = ("a copy with zero noise gives a NaN or infinite output where its clean "
                    f"forward is finite ({size})" if bool(undefined.any()) else
                    f"a copy with zero noise gives another output than its clean forward "
                    f"(by up to {float(diff.max()):.3g}, {size})")
            raise RuntimeError(_reuse_at_fault(
                bound, what, "reproduce the clean output",
                "every perturbed copy would be compared with the wrong reference"))
    # full forwards fail too (the model's own fault), or could not be run (reuse first: likely)
    first = _reuse_first(bound) if reused and full is None else ""
    if bool(random.any()):
        worst = float(_gap(runs[0], runs[1]).max())
        raise RuntimeError(first +
            f"the model's output changed between two evaluations of the same input (by up to "
            f"{worst:.3g}, outputs of size up to {float(_size(ref).max()):.3g}): "
            + (state or "its forward is random or keeps state from call to call")
            + ", so the measured flips would count that. senslab measures in eval() mode; "
            "something else still changes the output — F.dropout(..., training=True), a "
            "stochastic layer, noise added in forward, a buffer the forward updates in eval mode "
            "(a running mean), a call counter. Make the forward deterministic and stateless "
            "while measuring (with eval_mode=False, put the model in eval() yourself)"
        )
    if bool(undefined.any()):
        row = int(undefined.nonzero()[0, 0])
        raise FloatingPointError(
            first + f"model output is NaN or infinite on a copy of example {row} with zero "
            "noise, at both of two evaluations, where the clean forward of the same input is "
            "finite: sensitivity is undefined there, and every perturbed copy would be refused "
            "or compared with the wrong reference. The copy runs in a forward of its own, the "
            "clean inputs as one batch, so the likely cause is a statistic over the batch that "
            "one example leaves undefined (a standard deviation or variance over the batch: NaN "
            "for a batch of one; a division by a batch sum or range)"
            + (f", or state: {state}" if state else "")
            + ". Make an example's output independent of the other examples in its forward "
            "(eval() mode, no batch-level statistics)")
    if bool((diff > rtol * scale).any()):
        row = int((diff > rtol * scale).any(dim=1).nonzero()[0, 0])
        head = first + (
            f"a copy of example {row} with zero noise gives another output than its clean "
            f"forward (by up to {float(diff.max()):.3g}, outputs of size up to "
            f"{float(_size(ref).max()):.3g}), so every perturbed copy would be compared with the "
            "wrong reference. "
        )
        quantized = _dynamic_quantized(model)
        if quantized:
            raise RuntimeError(head + _quantized_cause(quantized))
        if state:
            raise RuntimeError(
                head + state[0].upper() + state[1:] + ": make the forward stateless while "
                "measuring (freeze what it updates), or measure a copy of the model whose "
                "state does not change")
        raise RuntimeError(
            head + "An example's output depends on the other examples in its batch (batch "
            "statistics: a batch max or mean, BatchNorm in train mode, F.batch_norm(..., "
            "training=True)) or on what earlier forwards left behind (a call counter, a buffer "
            "updated in eval mode). Measure a model whose output for one example does not "
            "depend on the others or on earlier calls (eval() mode, no batch-level "
            "statistics), or, where one example at a time is exact, feed one example per "
            "update() with chunk_size=1 and precision='float32'."
        )
    if not alone:
        _verify_batch(bound, clean, whole, extent, rtol, floor,
                      labels=_exact_labels(bound, clean, low_precision))
    if not whole:  # whole-input copies never take a reuse path
        _verify_noisy(bound, clean, extent, rtol, floor)


def _verify_batch(bound: BoundTokens, clean: Tensor, whole: bool, extent: Tensor | None,
                  rtol: float, floor: float, labels: bool = False) -> None:
    """Refuse a model whose output for one copy depends on the other copies of its forward.

    The zero-noise check evaluates each example alone and compares it with the clean batch; a
    model normalised by its batch's maximum passes it when every example attains that maximum
    (images each scaled to max 1), while a chunk of noisy copies is divided by its largest noisy
    value, so the number moved with ``chunk_size`` (0.113 at the automatic size, 0.066 one copy
    at a time). So :data:`VERIFY_BATCH` noisy copies of the first two examples (first, middle
    and last real token; whole-input noise with ``whole``) are evaluated in one forward and
    again in two halves, through the copies' own path, and must agree within float rounding.
    The noise, of the size of each example's token vectors, comes from a generator of its own
    (:data:`VERIFY_SEED`, on the CPU): the measurement's stream is untouched. Three forwards on
    the first batch of each input shape. Outputs that are class labels (a ``predict``
    returning argmax) are compared exactly when the forwards run in float32 at full precision
    (``labels``): a noisy copy within float32 rounding of a decision boundary is too rare to
    matter. Under reduced precision (autocast, bf16 weights, TF32) rounding that changes with
    the batch can move a label, so labels are not compared there."""
    if not clean.is_floating_point() and not labels:
        return
    k = VERIFY_BATCH
    rows = min(VERIFY_ROWS, len(clean))
    src = torch.arange(k, device=bound.valid.device) % rows  # examples alternate: 0, 1, 0, 1…
    width = bound.valid.shape[1] if extent is None else int(extent[:rows].max())
    cut = {} if extent is None else {"width": width}
    gen = torch.Generator().manual_seed(VERIFY_SEED + 1)
    toks, noise = [], []
    for i, r in enumerate(src.tolist()):
        real = bound.valid[r].nonzero().flatten()
        if not len(real):
            return
        own = bound.tokens(torch.full_like(real, r), real).float()
        size = float(own.pow(2).mean().sqrt())
        if not 0 < size < float("inf"):
            size = 1.0
        j = i // rows  # this example's j-th copy: first, middle, last real token, first…
        toks.append(real[[0, len(real) // 2, len(real) - 1][j % 3]])
        shape = (width, bound.dim) if whole else (bound.dim,)
        noise.append(torch.randn(shape, generator=gen) * size)
    tok = None if whole else torch.stack(toks)
    eps = torch.stack(noise).to(clean.device)
    if whole:  # padding tokens get no noise (forward_perturbed zeroes them as well)
        eps = eps * bound.valid[src][:, :width].unsqueeze(-1).to(eps.dtype)

    def run(part: slice) -> Tensor:
        return bound.forward_perturbed(src[part], None if tok is None else tok[part], eps[part],
                                       **cut)

    def both() -> tuple[Tensor, Tensor] | None:
        """The copies evaluated together and in two halves (None: outputs of another shape)."""
        bound.verifying = True  # type: ignore[attr-defined]  # copies of a check, not measured
        try:
            together = run(slice(0, k))
            halves = [run(slice(0, k // 2)), run(slice(k // 2, k))]
        finally:
            bound.verifying = False  # type: ignore[attr-defined]
        if together.shape[1:] != clean.shape[1:] or any(h.shape[1:] != together.shape[1:]
                                                       for h in halves):
            return None
        return together.float().reshape(k, -1), torch.cat(halves).float().reshape(k, -1)

    found = both()
    if found is None:
        return  # reported with the copies' own shape check
    a, b = found
    ref = clean[src].float().reshape(k, -1)

    def bad(a: Tensor, b: Tensor) -> Tensor:
        """Where ``a`` and ``b`` differ beyond float rounding (labels: whole rows)."""
        if not clean.is_floating_point():
            return (a != b).any(dim=1, keepdim=True)
        scale = torch.stack([_size(a).amax(dim=1),
                             _size(ref).amax(dim=1)]).amax(dim=0).clamp(min=floor).unsqueeze(1)
        return (_gap(a, b) > rtol * scale) | (torch.isfinite(a) != torch.isfinite(b))

    if bool(bad(a, b).any()) and getattr(bound, "reuse", False) and not whole:
        full = _full_forwards(bound, both)
        if full is not None and not bool(bad(*full).any()):
            moved = bad(a, b).any(dim=1)
            raise RuntimeError(_reuse_at_fault(
                bound, f"{int(moved.sum())} of {k} noisy copies gave other outputs evaluated "
                f"together than in two halves", "agree",
                "every flip would depend on which copies share a chunk, and the number on "
                "chunk_size"))
    if not clean.is_floating_point():
        moved = (a != b).any(dim=1)
        if bool(moved.any()):
            raise RuntimeError(
                f"the model's output for one example depends on the other examples in its "
                f"forward pass: {k} noisy copies of the first "
                f"{'examples' if rows > 1 else 'example'} got other class labels evaluated "
                f"together than in two halves ({int(moved.sum())} of {k} copies, in float32, "
                "where rounding moves no label). senslab evaluates many perturbed copies per "
                "forward, so every flip would depend on which copies share a chunk, and the "
                "number on chunk_size. " + _batch_cause(bound))
        return
    finite = torch.isfinite(a)
    scale = torch.stack([_size(a).amax(dim=1),
                         _size(ref).amax(dim=1)]).amax(dim=0).clamp(min=floor).unsqueeze(1)
    diff = _gap(a, b)
    bad = (diff > rtol * scale) | (finite != torch.isfinite(b))
    if not bool(bad.any()):
        return
    over = torch.where(bad, diff.nan_to_num(float("inf")), torch.zeros_like(diff))
    row = int(over.amax(dim=1).argmax())
    worst, size = float(over[row].max()), float(scale[row])
    cause = _batch_cause(bound)
    raise RuntimeError(
        f"the model's output for one example depends on the other examples in its forward "
        f"pass: {k} noisy copies of the first {'examples' if rows > 1 else 'example'} gave "
        f"other outputs evaluated together than in two halves (copy {row}: by up to "
        f"{worst:.3g}, outputs of size up to {size:.3g}; float rounding explains "
        f"{rtol * size:.3g}). senslab evaluates many perturbed copies per forward, so every "
        "flip would depend on which copies share a chunk, and the number on chunk_size. "
        + cause
    )


def _reduced_dtype(model: Any) -> torch.dtype | None:
    """The reduced float type ``model`` holds a parameter or buffer in: bf16 where it holds
    one, else fp16 where it does, else None (also for a non-module)."""
    if not isinstance(model, nn.Module):
        return None
    dtypes = {t.dtype for t in (*model.parameters(), *model.buffers())}
    return next((d for d in (torch.bfloat16, torch.float16) if d in dtypes), None)


def _reduced(model: Any) -> bool:
    """Whether ``model`` holds a bf16 or fp16 parameter or buffer (a module; else False)."""
    return _reduced_dtype(model) is not None


def _exact_labels(bound: BoundTokens, clean: Tensor, low_precision: bool) -> bool:
    """Whether class labels are compared exactly in the batch check: the forwards run in
    float32 at full precision (no autocast or TF32) and the model, where it is a module, holds
    no bf16/fp16 parameter or buffer (a function wrapping one cannot be told)."""
    if _tolerance(clean.float(), low_precision) > 1e-3:
        return False
    return not _reduced(getattr(bound, "model", None))


def _batch_cause(bound: BoundTokens) -> str:
    """What makes an output depend on its batch, and what to do (:func:`_verify_batch`)."""
    quantized = _dynamic_quantized(getattr(bound, "model", None))
    return _quantized_cause(quantized) if quantized else (
        "Likely causes: batch statistics (a batch max or mean used to normalise, BatchNorm in "
        "train mode), dynamic quantisation's per-batch activation range. Measure a model whose "
        "output for one example does not depend on the others (eval() mode, no batch-level "
        "statistics), or, where one copy at a time is exact, pass chunk_size=1 with "
        "precision='float32' (one copy per forward: slow; feed one example per update() if the "
        "clean batch depends on its examples too)")


def _verify_noisy(bound: BoundTokens, clean: Tensor, extent: Tensor | None, rtol: float,
                  floor: float) -> None:
    """With the model's own reuse on (prefix or local), evaluate noisy copies of example 0 both
    through it and by full forwards, and refuse a disagreement beyond float rounding: a
    ``forward_suffix``/``forward_local`` that is right with zero noise but drops or rescales the
    noise passes the zero-noise check.

    The copies perturb the example's first, middle and last real token (:data:`VERIFY_NOISY`
    copies at most: prefix reuse recomputes the longest suffix from the first, the last moves a
    causal model's output most; local reuse sees a corner and an interior window), each by
    Gaussian noise of the size of the example's own token vectors, drawn from a generator of
    its own (:data:`VERIFY_SEED`, on the CPU): the measurement's stream, and so every number a
    seed gives, is untouched. They take one forward per path (two in all, on the first batch of
    each input shape). Skipped without reuse (and for whole-input noise, which never takes it)
    and for outputs that are class labels (a noisy copy may sit on a decision boundary that
    rounding crosses)."""
    if not getattr(bound, "reuse", False) or not clean.is_floating_point():
        return
    method, _, option = _reuse_names(bound)
    real = bound.valid[0].nonzero().flatten()
    if not len(real):
        return
    tok = torch.unique(real[torch.tensor([0, len(real) // 2, len(real) - 1],
                                         device=real.device)])[:VERIFY_NOISY]
    src = torch.zeros(len(tok), dtype=torch.long, device=real.device)
    own = bound.tokens(src[:1].expand(len(real)), real).float()
    size = float(own.pow(2).mean().sqrt())
    if not 0 < size < float("inf"):
        size = 1.0
    gen = torch.Generator().manual_seed(VERIFY_SEED)
    noise = (torch.randn(len(tok), bound.dim, generator=gen) * size).to(clean.device)
    cut = {} if extent is None else {"width": int(extent[0])}
    bound.verifying = True  # type: ignore[attr-defined]  # copies of a check, not measured
    try:
        reused = bound.forward_perturbed(src, tok, noise, **cut)
        bound.reuse = False  # type: ignore[attr-defined]
        try:
            full = bound.forward_perturbed(src, tok, noise, **cut)
        finally:
            bound.reuse = True  # type: ignore[attr-defined]
    finally:
        bound.verifying = False  # type: ignore[attr-defined]
    if reused.shape[1:] != clean.shape[1:] or full.shape != reused.shape:
        return  # reported with the copies' own shape check
    a, b = full.float().reshape(len(tok), -1), reused.float().reshape(len(tok), -1)
    finite = torch.isfinite(a)
    scale = max(float(_size(a).max()), float(_size(clean[0].float()).max()), floor)
    diff = _gap(a, b)
    bad = (diff > rtol * scale) | (finite != torch.isfinite(b))
    if bool(bad.any()):
        over = torch.where(bad, diff.nan_to_num(float("inf")), torch.zeros_like(diff))
        k = int(over.amax(dim=1).argmax())
        worst = float(over[k].max())
        model = type(getattr(bound, "model", None)).__name__
        raise RuntimeError(
            f"{model}'s {method} disagrees with its forward on a noisy copy (example 0, token "
            f"{int(tok[k])}, noise of norm {float(noise[k].norm()):.3g}): the outputs differ by "
            f"up to {worst:.3g} (outputs of size up to {scale:.3g}; float rounding explains "
            f"{rtol * scale:.3g}), although they agree with zero noise, so the reuse path "
            "drops, rescales or misplaces the noise and every measured flip would be wrong. "
            f"Repair {model}'s {method} (a copy perturbed at one token must give what the full "
            f"forward gives), or measure with full forwards: pass {option} as the tokens"
        )


class ChunkRunner:
    """Evaluates the copies of one batch chunk by chunk; sizes the chunks on the first call
    (probe) when the chunk size is automatic, and keeps that size for later rounds.

    Use it as a context manager around all rounds of one batch: with ``compile=True`` the bound
    tokenization's model is swapped for the compiled one once the chunk size is known, and
    leaving the ``with`` block (also by an error) puts the original model back.
    """

    def __init__(
        self, metric: Any, bound: BoundTokens, stream: NoiseStream, ref: Tensor,
        whole: bool, device: torch.device, control: Any = None, per_copy: float | None = None,
        check: PrecisionCheck | None = None,
    ) -> None:
        self.m, self.bound, self.stream, self.ref, self.whole = metric, bound, stream, ref, whole
        self.device = device
        #: checked bf16 (:mod:`._precision`): copies in bf16, near-boundary ones again in float32
        self.check = check
        self._plain: Any = None  #: ``bound.model`` before the float32-caches wrapper replaced it
        if check is not None:
            self._plain = bound.model  # type: ignore[attr-defined]
            bound.model = check.wrap(self._plain, device)  # type: ignore[attr-defined]
        self.chunk = metric.chunk_size
        self.budget = metric.memory_budget or (
            _chunks.default_budget(device) if self.chunk is None else 0
        )
        self.compiled = False
        self._original: Any = None  #: ``bound.model`` before the compiled model replaced it
        self.control = control
        self.meter: _chunks.ActivationMeter | None = None
        self.input_bytes = 0
        #: bytes one copy costs: from an earlier probe on inputs of the same shape, or measured
        self.per_copy = per_copy
        #: whether a trimmed chunk holds copies of one width only: the copies run in reduced
        #: precision (autocast, a bf16/fp16 model), whose rounding moves with the width, and
        #: each is compared with its example's clean output at the example's own width
        #: (tokenwise cuts the reference then). None: not yet known (a model whose weights do
        #: not tell), decided by the dtype of the first chunk's outputs (:meth:`_evaluate`)
        self.one_width: bool | None = True if (metric.autocast is not None
                                               or _reduced(metric.model)) else None
        #: Ctrl-C is never lost (a finalizer of the probe's bookkeeping may swallow it): checked
        #: after every chunk, and when the ``with`` block ends
        self._sigint = SigintWatch()

    def __enter__(self) -> ChunkRunner:
        self._sigint.__enter__()
        return self

    def __exit__(self, exc_type: Any, *exc: object) -> None:
        try:
            self.restore()
        finally:
            self._sigint.__exit__(exc_type)

    def restore(self) -> None:
        """Give the bound tokenization its own model back if the compiled one (or the
        float32-caches wrapper of checked bf16) replaced it."""
        if self.compiled:
            self.bound.model = self._original  # type: ignore[attr-defined]
            self._original, self.compiled = None, False
        if self._plain is not None:
            self.bound.model = self._plain  # type: ignore[attr-defined]
            self._plain = None

    def run(self, src: Tensor, tok: Tensor, own: Tensor, extent: Tensor | None = None) -> Tensor:
        """Values of the copies ``(src, tok)`` of one round; with ``extent`` (B,) each copy is
        evaluated on inputs cut after its example's last real token (:mod:`._trim`)."""
        prepare = getattr(self.bound, "prepare", None)
        if prepare is not None and not self.whole and len(src):
            prepare()  # shared caches first: the probe meters the copies alone
        if extent is not None:
            return self._run_trimmed(src, tok, own, extent)
        n = len(src)
        vals = torch.empty(n, dtype=torch.float32, device=self.ref.device)
        pos = 0
        if self.chunk is None and self.per_copy is not None:
            self.chunk = _chunks.chunk_from_probe(self.per_copy, 1, self.budget, n,
                                                  even=self.m.antithetic)
        while pos < n:
            if self.chunk is None:  # probe: evaluate a few copies while metering allocations
                sl = slice(pos, pos + _chunks.PROBE_COPIES)
                self.meter = _chunks.ActivationMeter(self.m.model, self.ref.device,
                                                    autocast=self._autocast(),
                                                    exact=bool(self.m.memory_budget))
                vals[sl] = self._evaluate(src[sl], tok[sl], own[sl])
                evaluated = int(own[sl].sum())
                if evaluated:
                    # a callable without modules to hook: count its inputs (copies) twice
                    floor = 2 * self.input_bytes * evaluated
                    self.per_copy = self._capped(
                        max(self.meter.peak, floor) / evaluated + self._copy_bytes(),
                        self.meter.largest / evaluated)
                    self.chunk = _chunks.chunk_from_probe(
                        self.per_copy, 1, self.budget, n, even=self.m.antithetic
                    )
                    self._check_budget(
                        max(self.meter.peak, floor) + evaluated * self._copy_bytes(), evaluated)
                self.meter = None
            else:
                sl = slice(pos, pos + self.chunk * self._gather())
                vals[sl] = self._evaluate(src[sl], tok[sl], own[sl], piece=self.chunk)
            self._sigint.check()
            pos = min(sl.stop, n)
        return vals

    def _run_trimmed(self, src: Tensor, tok: Tensor, own: Tensor, extent: Tensor) -> Tensor:
        """:meth:`run` with padding-aware batching: per window of whole examples, the
        randomness is drawn in plan order, then the copies are sorted by their example's
        extent (longest first) and evaluated chunk by chunk, each chunk cut to its longest."""
        n, full = len(src), self.bound.valid.shape[1]
        vals = torch.empty(n, dtype=torch.float32, device=self.ref.device)
        row = self.stream.row * (4 if self.m.replace_with is None else 0) + 8
        for lo, hi in _trim.windows(src, len(extent), row):
            rand = self._draw(hi - lo)
            width = extent[src[lo:hi]]
            order = torch.sort(width, descending=True, stable=True).indices
            sorted_width = width[order].tolist()
            negated = [-x for x in sorted_width]  # ascending, for bisect
            pos, count = 0, hi - lo
            while pos < count:
                w = sorted_width[pos]
                # probe: the first chunk of the widest copies is evaluated while metering
                probe = self.m.chunk_size is None and self.per_copy is None
                if probe:
                    self.meter = _chunks.ActivationMeter(self.m.model, self.ref.device,
                                                    autocast=self._autocast(),
                                                    exact=bool(self.m.memory_budget))
                size = _chunks.PROBE_COPIES if probe else self._size(w, full, count - pos)
                piece, size = size, size * (1 if probe else self._gather())  # the probe: alone
                # a chunk holds one group of lengths: it ends where the padding it would add to
                # a copy exceeds a fraction _trim.SLACK of the chunk's width
                # — except in reduced precision (:attr:`one_width`), where a copy must run at
                # the width its reference was computed at: a near-tie read at a wider chunk's
                # width flipped otherwise, so the number changed with chunk_size
                slack = 0.0 if self.one_width is not False else _trim.SLACK
                end = bisect.bisect_right(negated, -w * (1 - slack) + 1e-9, pos)
                sl = order[pos:min(pos + size, max(end, pos + 1))]
                at = sl + lo
                vals[at] = self._evaluate(src[at], tok[at], own[at], rand[sl], w, piece)
                if probe:
                    self._sized(w, full, own[at])
                self._sigint.check()
                pos += len(sl)
        return vals

    def _gather(self) -> int:
        """Chunks per call of a calibrated checked precision (:mod:`._precision`): its low
        precision runs the copies a chunk at a time, but float32 re-checks only the copies near
        a class boundary, a share of each chunk too small to run at speed. So a call gathers
        about ``1 / share`` chunks (at most :data:`GATHER_MAX`), and its re-checks fill
        about one chunk. 1 while calibrating, in float32, or when every copy holds the whole
        input (the noise of every copy of a call is drawn at once)."""
        c = self.check
        if c is None or c.bound is None or c.idle or self.whole:
            return 1
        share = c.predicted_recheck if c.predicted_recheck is not None else 1.0
        return int(1.0 / max(share, 1.0 / GATHER_MAX))  # 1 to GATHER_MAX: share ≤ 1

    def _size(self, width: int, full: int, left: int) -> int:
        """Copies in the next chunk of inputs cut to ``width`` of ``full`` tokens: the user's
        chunk size, or the budget over the probed bytes per copy scaled to the width."""
        if self.m.chunk_size is not None:
            return self.m.chunk_size
        assert self.per_copy is not None
        per_copy = self.per_copy * width / full
        chunk = _chunks.chunk_from_probe(per_copy, 1, self.budget, left, even=self.m.antithetic)
        if self.chunk is None:  # reported as last_chunk_size: the size at full width
            self.chunk = _chunks.chunk_from_probe(self.per_copy, 1, self.budget, 1 << 30,
                                                  even=self.m.antithetic)
        return chunk

    def _sized(self, width: int, full: int, own: Tensor) -> None:
        """After the probe: bytes one full-width copy costs, from the probe at ``width``."""
        assert self.meter is not None
        evaluated = int(own.sum())
        if evaluated:
            floor = 2 * self.input_bytes * evaluated
            scale = full / max(width, 1)
            self.per_copy = self._capped(
                max(self.meter.peak, floor) / evaluated * scale + self._copy_bytes(),
                self.meter.largest / evaluated * scale)
            self._check_budget(max(self.meter.peak, floor) + evaluated * self._copy_bytes(),
                               evaluated)
        self.meter = None

    def _check_budget(self, probed: float, copies: int) -> None:
        """Warn where a ``memory_budget`` the user gave is exceeded: by every chunk, when one
        copy (two for antithetic pairs) needs more than the budget, or by the probe alone, whose
        :data:`._chunks.PROBE_COPIES` copies run before the size of a copy is known.
        ``probed``: the bytes the probe's ``copies`` took."""
        budget = self.m.memory_budget
        if not budget or self.per_copy is None:
            return
        least = 2 if self.m.antithetic else 1
        if self.per_copy * least > budget:
            warnings.warn(
                f"memory_budget={budget} bytes is too small for one chunk: one perturbed copy "
                f"takes about {self.per_copy:.3g} bytes (the first chunk's {copies} copies took "
                f"{probed:.3g}), so every chunk of {least} cop{'ies' if least > 1 else 'y'} "
                f"exceeds the budget. Pass memory_budget={math.ceil(self.per_copy * least)} or "
                "more (the numbers never change with the chunk size), or shorter inputs",
                RuntimeWarning, stacklevel=2)
        elif probed > budget:
            chunk = _chunks.chunk_from_probe(self.per_copy, 1, budget, 1 << 30,
                                             even=self.m.antithetic)
            warnings.warn(
                f"the first chunk, which measures the memory a perturbed copy takes, ran "
                f"{copies} copies and took about {probed:.3g} bytes, over memory_budget="
                f"{budget}; the later chunks hold up to {chunk} copies each, within it. Where "
                f"the budget must never be exceeded, pass chunk_size={chunk} (the numbers "
                "never change with the chunk size)",
                RuntimeWarning, stacklevel=2)

    def _capped(self, per_copy: float, largest: float) -> float:
        """Bytes per copy to size chunks by, from the probe's ``per_copy`` (temporaries and the
        caches each copy gathers) and its ``largest`` temporary per copy, with the memory the
        model keeps from call to call (``kept_bytes``, which the probe does not see). A budget
        the user gave, or a GPU's share of free memory, bounds all of it. On CPU under the
        default budget, whose cap (:data:`._chunks.CPU_CHUNK_BYTES`, and the per-tensor cap of
        :func:`._chunks.with_tensor_cap`) keeps temporaries small for speed, kept memory — made
        once and reused, so no cost per call — counts against the host's share of free memory
        (:func:`._chunks.memory_share`) instead."""
        kept_bytes = getattr(self.bound, "kept_bytes", None)
        kept = 0 if kept_bytes is None or self.whole else int(kept_bytes())
        if self.ref.device.type != "cpu" or self.m.memory_budget:
            return per_copy + kept
        capped = _chunks.with_tensor_cap(per_copy, largest, self.budget)
        if kept:
            share = _chunks.memory_share(self.ref.device)
            capped = max(capped, (per_copy + kept) * self.budget / share)
        return capped

    def _copy_bytes(self) -> int:
        """Bytes of shared caches each copy gathers (prefix reuse), which the meter cannot see."""
        copy_bytes = getattr(self.bound, "copy_bytes", None)
        return 0 if copy_bytes is None or self.whole else int(copy_bytes())

    def _draw(self, n: int) -> Tensor:
        """The randomness of the next ``n`` copies of the plan: vocabulary rows to pick
        (``replace_with``) or noise rows scaled by σ."""
        m, stream = self.m, self.stream
        if m.replace_with is not None:
            out = stream.randint(len(m.replace_with), n)
        elif m.antithetic:
            out = stream.take_antithetic(n).mul_(m.sigma)
        else:
            out = stream.take(n).mul_(m.sigma)
        if m._noise_mark is None and len(out):
            # where this metric's noise starts (its first numbers since the reset): two metrics
            # that start alike drew the same noise, copy for copy (TokenSensitivity.merge)
            m._noise_mark = tuple(out.reshape(-1)[:8].tolist())
        return out

    def _evaluate(self, src: Tensor, tok: Tensor, own: Tensor, rand: Tensor | None = None,
                  width: int | None = None, piece: int | None = None) -> Tensor:
        """Values of the copies of one chunk. Randomness is drawn for every copy of the chunk
        (so every shard consumes the stream alike) unless ``rand`` brings it; only ``own``
        copies are evaluated, at ``width`` tokens if given; a checked precision runs its low
        precision ``piece`` copies at a time (:meth:`_gather`)."""
        m, bound = self.m, self.bound
        rand = self._draw(len(src)) if rand is None else rand
        if m.replace_with is not None:
            pick = m.replace_with.to(self.ref.device)[rand]
        else:
            noise = rand
        out_vals = torch.zeros(len(src), dtype=torch.float32, device=self.ref.device)
        idx = None
        if not own.all():
            idx = own.nonzero().flatten()
            if len(idx) == 0:
                return out_vals
            src, tok = src[idx], tok[idx]
            if m.replace_with is not None:
                pick = pick[idx]
            else:
                noise = noise[idx]
        if m.replace_with is not None:
            clean = bound.tokens(src, tok)
            if clean.dtype not in (torch.float32, torch.float64) and m.autocast is None:
                # the copy is built as x + (row − x), in the tokens' dtype: in a bf16 or fp16
                # model the rounded difference puts another vector there (0.0117 for a row of
                # 0.0100); under autocast= low precision's own decisions are asked for
                raise ValueError(
                    f"replace_with needs float32 or float64 tokens, but the model's tokens are "
                    f"{clean.dtype}: the replaced token would not be the vocabulary row but a "
                    "rounding of it. Measure the model in float32 (model.float(); "
                    "autocast=torch.bfloat16 for bf16 arithmetic and its decisions)")
            noise = pick.to(clean.dtype) - clean  # float32: within an ulp of the token
        elif self.whole:
            noise = noise.view(len(src), -1, bound.dim)
            if width is not None:
                noise = noise[:, :width]
        if m.compile and not self.compiled and self.chunk is not None:
            self._original = bound.model  # type: ignore[attr-defined]
            compiled = m._compiled_model()
            bound.model = (compiled if self.check is None  # type: ignore[attr-defined]
                           else self.check.wrap(compiled, self.device))
            self.compiled = True
        if self.meter is not None:
            self.input_bytes = max(noise[0].numel() * noise.element_size(), 1)
            with self.meter:
                out = self._forward(src, tok, noise, width, piece)
        else:
            out = self._forward(src, tok, noise, width, piece)
        if self.one_width is None:  # the clean outputs have the copies' dtype (no autocast)
            self.one_width = out.dtype in (torch.bfloat16, torch.float16)
        vals = self._compare(out, src)
        if self.control is not None:
            vals = self.control.adjust(vals, src, tok, noise)
        if idx is None:
            return vals
        return out_vals.index_copy_(0, idx, vals)

    def _autocast(self) -> bool:
        """Whether the copies' forwards may run under autocast (``autocast=``, checked bf16)."""
        return self.m.autocast is not None or (self.check is not None
                                               and self.check.low == "bf16")

    def _forward(self, src: Tensor, tok: Tensor, noise: Tensor, width: int | None,
                 piece: int | None = None) -> Tensor:
        """Outputs of the copies: one forward, or checked bf16 (:mod:`._precision`), which
        evaluates the copies in bf16 and those near a class boundary again in float32."""
        cut = {} if width is None else {"width": width}
        token = None if self.whole else tok
        if self.check is None:
            return self.bound.forward_perturbed(src, token, noise, **cut)

        def forward(rows: Tensor | None) -> Tensor:
            if rows is None:
                return self.bound.forward_perturbed(src, token, noise, **cut)
            return self.bound.forward_perturbed(
                src[rows], None if token is None else token[rows], noise[rows], **cut)

        return self.check.evaluate(forward, len(src), self.device, self.m.kind, self.m.threshold,
                                   piece)

    def _compare(self, out: Tensor, src: Tensor) -> Tensor:
        check_rows(out, len(src), "perturbed copies")
        check_finite(out, "perturbed copies", self.m.compare)
        ref = self.ref
        if self.m.compare == "class":
            # clean outputs all exact 0/1 were read as logits: a saturated sigmoid shows here
            check_perturbed_kind(out, self.m.kind_from_zero_one)
            return (predictions(out, self.m.kind, self.m.threshold) != ref[src]).float()
        if out[0].shape != ref[0].shape:
            raise ValueError(
                f"the model's output per example has shape {tuple(out.shape[1:])} on perturbed "
                f"copies but {tuple(ref.shape[1:])} on the clean inputs; compare='{self.m.compare}'"
                " needs outputs of one fixed shape"
            )
        # subtracted in the reference's precision (float64 for a float64 model), then stored
        diff = (out.to(ref.dtype) - ref[src]).reshape(len(src), -1)
        return (diff.abs().sum(1) if self.m.compare == "l1" else diff.norm(dim=1)).float()
