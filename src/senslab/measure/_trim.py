r"""Padding-aware batching (``trim_padding=True``, the default): evaluate a perturbed copy on its
inputs cut after the last real token of its example, never on the padding.

A copy of example :math:`b` is evaluated on inputs cut to a width :math:`w \ge e_b`, where the
*extent* :math:`e_b` is one past the last position that is real for the model (its attention mask
in a dict input, else the ``mask``). With right padding the positions :math:`\ge e_b` are padding
that a correct model ignores (masked keys, read-out at a real token), and the real positions keep
their indices, so the outputs are those of the padded inputs: the same flips, up to float rounding
of the outputs themselves. Copies are ordered by extent, longest first, and cut into chunks,
each evaluated at its longest extent; a chunk also ends before the first copy that would carry
more than :data:`SLACK` of padding, so it holds examples of nearly one length (groups by length,
each filled up to the chunk size). In reduced precision (autocast, a bf16/fp16 model) a chunk
holds examples of exactly one length: each copy is compared with its example's clean output at
the example's own width, and bf16 rounds otherwise at another width, so a copy run at a longer
neighbour's width could flip at a near-tie, and the number would move with the chunk size.

Nothing random depends on this: the noise of copy :math:`n` is row :math:`n` of the stream in the
order of the plan (example-major), drawn for a *window* of whole examples before the copies are
reordered (:data:`WINDOW_BYTES` of noise at most), so every (example, token, draw) receives the same
vector with and without trimming.

Left padding (padding before the real tokens in the attention mask, as decoders are often fed)
is refused: cutting it would move the real tokens to other positions. Before the first chunk the
clean examples are evaluated once at their own extents (not counted in ``num_forward``); if that
changes the clean outputs beyond float rounding — the model reads the positions the mask calls
padding, or another input has its token axis elsewhere — or if noise on the padding of the most
padded examples changes their outputs at full width (a max over every position, padding
included, whose clean outputs a cut leaves as they are: :func:`_padding_read`; a convolution that
reads a padding embedding of zeros, which a cut replaces by its own zero padding, is run at full
width too, slower but the same number), or if noise on their last real token changes their
outputs at full width and not when cut (a model that carries its real tokens into the padding
and reads them there, as a text CNN that zeroes its padding embeddings and takes a max over
every position: :func:`_carried`), trimming is switched off for the batch
and the copies are evaluated at full width: with a warning when the extents came from the
model's attention mask (once per metric and kind of change, :func:`check`: a model that reads
its padding does so at every batch, and a training loop's evaluations would repeat it in each),
quietly when they came from a ``mask`` alone (which may leave real tokens unperturbed, such as
an end token). A Hugging Face decoder classifier that reads its padding because the padding holds
another id than its pad id is refused before this check, by :class:`~senslab.tokens.Embedding`'s
clean forward (with a ``mask`` alone: where it reads every such example at one id).
"""

from __future__ import annotations

import math
import warnings

import torch
from torch import Tensor

from .._stack import user_level as _user_level
from ..tokens.base import BoundTokens
from ..tokens.embedding import READ_AS_TEXT

#: a chunk ends before a copy whose example is shorter than (1 − SLACK) × the chunk's width:
#: at most this fraction of a chunk's positions is padding, in few chunks per length group
SLACK = 0.125

#: at most this many bytes of noise are drawn ahead for one window of examples
WINDOW_BYTES = 1 << 27

#: largest relative change of a clean output that trimming may cause (float rounding only)
RTOL = {torch.float64: 1e-9, torch.float32: 1e-4}
LOW_PRECISION_RTOL = 5e-2

#: seed of the padding-noise check's own generator (:func:`_padding_read`): the measurement's
#: random stream is never drawn from
PADDING_SEED = 20240611
#: examples (the most padded of those a cut shortens) whose padding gets noise in that check
PADDING_ROWS = 2
#: noisy copies of each of those examples evaluated at full width and cut (:func:`_carried`),
#: and the size of their noise on the last real token, in sizes of the real token vectors: of
#: 60 text CNNs (4 channels) whose first padding position can win their max, the checks before
#: found 30, these 4 copies 29 of the other 30 (8 copies: all 30; noise of 1× exposes it in
#: about a quarter of the copies, 8× in most)
CARRIED_DRAWS = 2
CARRIED_SCALE = 8.0


def left_padded_message(row: int, key: str, found: str | None = None) -> str:
    """The refusal of left padding; ``found``: what the tokens found of this model's reading
    of left-padded inputs (``left_padding_read`` of :class:`~senslab.tokens.Embedding`'s bound
    tokens), appended in words — first, where the model reads them as the texts alone
    (XLNet, whose own padding is on the left and which misreads right padding)."""
    if found and READ_AS_TEXT in found:
        return (f"the inputs are left-padded (example {row} starts with padding in {key!r}): "
                "padding-aware batching cuts the padding after the last real token, which is "
                f"exact only for right padding. Checked on this model: {found}. Pass "
                "trim_padding=False, or pad on the right (Hugging Face: tokenizer.padding_side "
                "= 'right'), which lets padding-aware batching cut the padding, where the model "
                "reads right padding as its texts too (most do; XLNet, which reads its last "
                "position, does not)")
    return (
        f"the inputs are left-padded (example {row} starts with padding in {key!r}): "
        "padding-aware batching cuts the padding after the last real token, which is exact "
        "only for right padding. Pad on the right instead (Hugging Face: "
        "tokenizer.padding_side = 'right'; a GPT-2 classifier finds the last real token "
        "through config.pad_token_id), or pass trim_padding=False to measure the left-padded "
        "inputs as they are — a model with absolute positions (GPT-2, BERT) then reads the "
        "real tokens at shifted positions unless the inputs carry position_ids "
        "(attention_mask.cumsum(-1) - 1, clamped at 0), as Hugging Face's generate() passes, "
        "and an encoder classifier that pools its first token (BERT's, DistilBERT's, "
        "RoBERTa's [CLS]) reads padding there whatever its positions: pad such a model on the "
        "right" + (f". Checked on this model: {found}" if found else "")
    )


def left_padded_row(mask: Tensor) -> int | None:
    """The first example whose (B, T) attention ``mask`` (true on real tokens) starts with
    padding and has a real token later, or None: left padding, which trimming cannot cut. None
    too for a mask of other values than 0 and 1, which says no real tokens (the measurement
    refuses it, or reads ``mask=`` instead): an additive mask (0 real, −1e9 padding), read as
    "nonzero is real", made right padding look left-padded, and a callback's subset was refused
    at construction, asked to pad on the right, where it was padded on the right and came with
    ``mask=``."""
    if mask.dtype != torch.bool and bool(((mask != 0) & (mask != 1)).any()):
        return None
    real = mask.bool()
    starts = ~real[:, 0] & real.any(dim=1)
    return int(starts.nonzero()[0, 0]) if bool(starts.any()) else None


def extents(bound: BoundTokens) -> Tensor | None:
    """(B,) one past each example's last real position, or None when nothing can be cut (a
    tokenization that cannot cut its inputs, or no example shorter than the batch)."""
    if not bound.trimmable:
        return None
    valid = bound.valid
    real = valid if bound.padding is None else bound.padding | valid
    if bound.padding is not None:
        row = left_padded_row(bound.padding)
        if row is not None:
            # the model's reading of left padding, judged by the tokens (one forward, once per
            # bind), where they judge it: no warning before this refusal says it
            read = getattr(bound, "left_padding_read", None)
            found = read() if callable(read) else None
            raise ValueError(left_padded_message(row, bound.padding_key or "attention_mask",
                                                 found))
    t = real.shape[1]
    ext = t - real.flip(1).int().argmax(dim=1)
    if bool((ext == t).all()):
        return None
    return ext


def groups(ext: Tensor) -> list[Tensor]:
    """Example indices of each distinct extent, longest first."""
    values, inverse = torch.unique(ext, return_inverse=True)
    return [(inverse == i).nonzero().flatten() for i in range(len(values) - 1, -1, -1)]


def check(bound: BoundTokens, ext: Tensor, clean: Tensor,
          low_precision: bool = False) -> tuple[str, str] | None:
    """Evaluate every clean example at its own extent, then the most padded ones at full width
    with noise on their padding (:func:`_padding_read`); None if the outputs equal the full-width
    clean outputs up to rounding (of ``clean``'s dtype: the caller runs both in float32 where
    the copies run under autocast; bf16's where ``low_precision``, a bf16 or fp16 model whose
    outputs are cast to float32: its rounding moves with the width as much, and float32's
    tolerance took it for a model that reads its padding), else the kind of change —
    ``"failed"``, ``"shape"``, ``"changed"`` or ``"padding"``, the cause a metric says once —
    and why, in words, for this batch (trimming is then switched off). Entries that are
    ``-inf`` in both (masked classes) agree; class labels (outputs that are no floats) must be
    equal; any exception on the cut inputs (an ``assert`` on the input length, too) means they
    failed."""
    rtol = LOW_PRECISION_RTOL if low_precision else RTOL.get(clean.dtype, LOW_PRECISION_RTOL)
    for idx in groups(ext):
        width = int(ext[idx[0]])
        try:
            out = _cut(bound, idx, width, clean.device)
        except Exception as err:  # any failure: the full width ran, and will run again
            # a model may check its input length with an assert (a fixed-length classifier):
            # the user's inputs ran, only the cut ones failed, so run at full width instead
            return "failed", (f"the model failed on inputs cut to {width} tokens "
                              f"({type(err).__name__}: {err})")
        ref = clean[idx]
        if out.shape != ref.shape:
            return "shape", (f"the output has shape {tuple(out.shape[1:])} per example on "
                             f"inputs cut to {width} tokens but {tuple(ref.shape[1:])} on the "
                             "padded inputs")
        bad, err = _moved(out, ref, clean, rtol)
        if bool(bad.any()):
            row = int(idx[bad.nonzero()[0, 0]])
            worst = float(err.max())
            return "changed", (f"cutting example {row} after its last real token changed its "
                               f"clean output by {worst:.3g}")
    return _padding_read(bound, ext, clean, rtol) or _carried(bound, ext, clean, rtol)


def _moved(out: Tensor, ref: Tensor, clean: Tensor, rtol: float) -> tuple[Tensor, Tensor]:
    """(rows of ``out`` that differ from ``ref`` beyond rounding, each row's largest gap); the
    floor of the tolerance is set by the whole ``clean`` batch."""
    a, b = out.float().reshape(len(out), -1), ref.float().reshape(len(ref), -1)
    # the same -inf in both (a class masked out) is no change, -inf on one side only is an
    # infinite one; sizes are those of the finite entries: a -inf logit made the floor
    # infinite and its NaN difference hid every other entry, so a model that reads its
    # padding kept trimming on without a word (0.52 measured for 0.34)
    gap = (a - b).abs()
    same = a == b
    gap = torch.where(same, torch.zeros_like(gap),
                      torch.where(torch.isfinite(gap), gap, torch.full_like(gap, math.inf)))
    err = gap.amax(dim=1)
    # a finite masking constant (a class masked with -1e9 or torch.finfo(dtype).min, as Hugging
    # Face masks) sets no size either where it is the same in both: as the row's scale it made
    # every tolerance astronomical (1e-4 × 3.4e38), so a model that reads its padding kept
    # trimming on without a word (0.52 measured where the padded inputs give 0.34)
    size = _finite_size(b)
    scale = size.masked_fill(same & _masking(size), 0).amax(dim=1)
    whole = _finite_size(clean.reshape(len(clean), -1))
    floor = float(whole.masked_fill(_masking(whole), 0).max()) * 1e-3 + 1e-30
    if clean.is_floating_point():
        return err > rtol * scale.clamp(min=floor), err
    # class labels (a predict returning argmax) are equal or not: a tolerance relative to the
    # label's value let class 905 become 907 unseen, so a model that reads its padding kept
    # trimming on (0.31 measured where the padded inputs give 0.10)
    return err > 0, err


def _most_padded(ext: Tensor, t: int) -> Tensor | None:
    """The :data:`PADDING_ROWS` examples a cut after their last real token (``ext``) shortens
    most, of width ``t``; None where a cut shortens none. A model that reads its padding reads
    it in every example, and two rows keep the checks' cost at a few positions per batch."""
    cut = (ext < t).nonzero().flatten()
    if not len(cut):
        return None
    return cut[torch.sort(ext[cut], stable=True).indices[:PADDING_ROWS]]


def _padding_read(bound: BoundTokens, ext: Tensor, clean: Tensor,
                  rtol: float) -> tuple[str, str] | None:
    """Whether the model reads the *content* of the positions a cut removes: the most padded
    examples are evaluated once at full width with noise (of the size of their real token
    vectors, from a generator of its own: the measurement's stream is untouched) on those
    positions alone, and must give their clean outputs. The cut check above sees a model that
    reads its padding only where the padding moves a clean output; one that takes a max over
    every position, padding included (a text CNN pooled without its mask), keeps its clean
    outputs when the padding's values lose to the real ones, but a noisy copy whose real values
    drop below them reads the padding at full width and not when cut: trimming then measured
    0.191 where the padded inputs give 0.193 (compare='l2'), without a word. ``("padding",
    reason)`` where it reads them (trimming is switched off), else None. One forward of
    :data:`PADDING_ROWS` examples at full width, not counted in ``num_forward``."""
    t = bound.valid.shape[1]
    rows = _most_padded(ext, t)
    if rows is None:
        return None
    dev = bound.valid.device
    pos = torch.arange(t, device=dev)
    removed = pos[None, :] >= ext[rows].to(dev)[:, None]  # (n, T): what a cut takes away
    src, tok = (~removed & bound.valid[rows]).nonzero(as_tuple=True)
    size = float(bound.tokens(rows[src], tok).float().pow(2).mean().sqrt()) if len(src) else 1.0
    if not 0 < size < math.inf:
        size = 1.0
    gen = torch.Generator().manual_seed(PADDING_SEED)
    noise = torch.randn(len(rows), t, bound.dim, generator=gen) * size
    noise = (noise.to(dev) * removed.unsqueeze(-1)).to(clean.device)
    # forward_perturbed adds whole-input noise where ``valid`` is true: the removed positions
    # are marked so for this one forward, and only they carry noise
    valid = bound.valid
    bound.valid = valid.clone()
    bound.valid[rows] |= removed
    try:
        out = bound.forward_perturbed(rows, None, noise)
    except Exception as err:  # noqa: BLE001  # as a failure on the cut inputs: run at full width
        return "failed", (f"the model failed with noise on its padding ({type(err).__name__}: "
                          f"{err})")
    finally:
        bound.valid = valid
    ref = clean[rows.to(clean.device)]
    if out.shape != ref.shape:
        return "shape", (f"the output has shape {tuple(out.shape[1:])} per example with noise "
                         f"on the padding but {tuple(ref.shape[1:])} on the clean inputs")
    bad, err = _moved(out, ref, clean, rtol)
    if not bool(bad.any()):
        return None
    row = int(rows[bad.nonzero()[0, 0]])
    return "padding", (f"noise on the padding after example {row}'s last real token changed "
                       f"its output by {float(err.max()):.3g} (the clean inputs hide it: a max "
                       "over every position, padding included, picks a real value there, a "
                       "noisy copy's may lose to the padding's)")


def _carried(bound: BoundTokens, ext: Tensor, clean: Tensor,
             rtol: float) -> tuple[str, str] | None:
    """Whether the model carries its real tokens into the padding and reads them there: the
    most padded examples are evaluated with noise (:data:`CARRIED_SCALE` times the size of their
    real token vectors, from a generator of its own) on their last perturbable token, each
    :data:`CARRIED_DRAWS` times, at full width and cut after their last real token, and must
    give the same outputs. Both checks above miss a model that zeroes its padding embeddings
    (``embeddings * attention_mask``) before a convolution and then takes a max over every
    position (the common text CNN): the padding's noise is zeroed, the clean maxima are at real
    positions, but the first padding position's convolution reads the last real token, and a
    copy with noise there can win the max at full width only — trimming measured 0.2160 where
    the padded inputs give 0.2211, without a word. ``("carried", reason)`` where the outputs
    differ (trimming is switched off), else None. Two forwards or three (full width, and one
    per width of the cut rows), of at most :data:`PADDING_ROWS` × :data:`CARRIED_DRAWS` copies,
    not counted in ``num_forward``."""
    t = bound.valid.shape[1]
    rows = _most_padded(ext, t)
    if rows is None:
        return None
    dev = bound.valid.device
    valid = bound.valid[rows.to(dev)]
    some = valid.any(dim=1)
    rows, valid = rows[some.to(rows.device)], valid[some]
    if not len(rows):
        return None
    # each row's last perturbable token (the measurement's noise goes there too): nearest the
    # cut, so a local operation (a convolution, a recurrence) carries it into the padding
    last = t - 1 - valid.flip(1).int().argmax(dim=1)
    size = float(bound.tokens(rows.to(dev), last).float().pow(2).mean().sqrt())
    if not 0 < size < math.inf:
        size = 1.0
    rep = rows.repeat_interleave(CARRIED_DRAWS)
    at = last.repeat_interleave(CARRIED_DRAWS)
    gen = torch.Generator().manual_seed(PADDING_SEED + 1)
    noise = torch.zeros(len(rep), t, bound.dim)
    noise[torch.arange(len(rep)), at.cpu()] = (
        torch.randn(len(rep), bound.dim, generator=gen) * size * CARRIED_SCALE)
    noise = noise.to(clean.device)
    try:
        full = bound.forward_perturbed(rep.to(dev), None, noise)
    except Exception as err:  # noqa: BLE001  # the measurement would fail alike: not trimmed
        return "failed", (f"the model failed with noise on the last real token of example "
                          f"{int(rows[0])} ({type(err).__name__}: {err})")
    for width in ext[rep].unique().tolist():
        pick = (ext[rep] == width).nonzero().flatten()
        try:
            out = bound.forward_perturbed(  # type: ignore[call-arg]
                rep[pick].to(dev), None, noise[pick.to(noise.device), :width], width=width)
        except Exception as err:  # noqa: BLE001  # as on the clean cut inputs: full width
            return "failed", (f"the model failed on inputs cut to {width} tokens "
                              f"({type(err).__name__}: {err})")
        ref = full[pick.to(full.device)]
        if out.shape != ref.shape:
            return "shape", (f"the output has shape {tuple(out.shape[1:])} per example on noisy "
                             f"inputs cut to {width} tokens but {tuple(ref.shape[1:])} on the "
                             "padded ones")
        if out.is_floating_point():  # the same NaN in both (from large noise) is no change
            both = out.isnan() & ref.isnan()
            out, ref = out.masked_fill(both, 0), ref.masked_fill(both, 0)
        bad, err = _moved(out, ref, clean, rtol)
        if bool(bad.any()):
            row = int(rep[pick[bad.nonzero()[0, 0]]])
            return "carried", (
                f"with noise on example {row}'s last real token, its outputs at full width and "
                f"on the inputs cut after that token differ by {float(err.max()):.3g} (the "
                "model carries the real tokens into the padding and reads them there — a "
                "convolution or recurrence over the padding pooled with a max over every "
                "position, say; the clean inputs hide it)")
    return None


#: an output entry at least this large, and this many times every entry of its row below it,
#: is a masking constant (-1e4, -1e9, ``torch.finfo(dtype).min``), no measure of the row's size
MASKING_SIZE = 1e3


def _masking(size: Tensor) -> Tensor:
    """The entries of ``size`` ((rows, n), finite sizes) that are masking constants: at least
    :data:`MASKING_SIZE`, and at least :data:`MASKING_SIZE` times the largest entry of their row
    below :data:`MASKING_SIZE` (a row with none such has none)."""
    small = size.masked_fill(size >= MASKING_SIZE, -1).amax(dim=1, keepdim=True)
    return (size >= MASKING_SIZE) & (small >= 0) & (size >= MASKING_SIZE * small)


def _finite_size(t: Tensor) -> Tensor:
    """``|t|`` where finite, 0 elsewhere (as float32)."""
    t = t.float()
    return torch.where(torch.isfinite(t), t.abs(), torch.zeros_like(t))


def clean_cut(bound: BoundTokens, ext: Tensor, clean: Tensor) -> Tensor:
    """The clean outputs with every example cut to its extent (as its copies are), in the
    current precision: under autocast they differ from the padded ones by rounding."""
    out = clean.clone()
    for idx in groups(ext):
        out[idx] = _cut(bound, idx, int(ext[idx[0]]), clean.device).to(out.dtype)
    return out


def _cut(bound: BoundTokens, idx: Tensor, width: int, device: torch.device) -> Tensor:
    """The clean outputs of the examples ``idx``, their inputs cut to ``width`` tokens."""
    zero = torch.zeros(len(idx), width, bound.dim, device=device)
    return bound.forward_perturbed(idx, None, zero, width=width)  # type: ignore[call-arg]


def warn_untrimmed(reason: str) -> None:
    """Say that trimming is off for a batch, and why (:func:`check`'s reason). A model that
    failed on the cut inputs is not said to read its padding: it may only refuse them
    (Longformer pads inside its forward, so the cut inputs come back longer)."""
    if reason.startswith("the model failed on inputs cut"):
        why = ("The model does not take inputs cut after their last real token, so the copies "
               "are evaluated at full width. Pass trim_padding=False to silence this warning")
    elif "carries the real tokens into the padding" in reason:
        why = ("The model reads positions that the mask marks as padding, where its real tokens "
               "reach them, so the copies are evaluated at full width (the padded inputs' "
               "number). Mask the padding before pooling (its positions set to -inf before a max "
               "over positions) to let padding-aware batching cut it, or pass "
               "trim_padding=False to silence this warning")
    else:
        why = ("The model seems to read positions that the mask marks as padding (does it "
               "receive the attention mask?), so the copies are evaluated at full width. Pass "
               "the model's own padding mask, or trim_padding=False to silence this warning")
    warnings.warn(
        f"padding-aware batching is off for this batch: {reason}. {why}. Said once per "
        "metric: later batches that run at full width are counted in its untrimmed_batches",
        RuntimeWarning, stacklevel=_user_level(),
    )


def windows(src: Tensor, num_examples: int, row_bytes: int) -> list[tuple[int, int]]:
    """Copy ranges ``[lo, hi)`` of a plan (``src`` non-decreasing) that start and end at example
    boundaries and hold at most :data:`WINDOW_BYTES` of noise (at least one example each)."""
    ends = torch.cumsum(torch.bincount(src, minlength=num_examples), 0).tolist()
    cap = max(1, WINDOW_BYTES // max(row_bytes, 1))
    out, lo, i = [], 0, 0
    while lo < len(src):
        hi = ends[i]
        while i + 1 < len(ends) and ends[i + 1] - lo <= cap:
            i += 1
            hi = ends[i]
        if hi > lo:
            out.append((lo, hi))
        lo = hi
        i += 1
    return out
