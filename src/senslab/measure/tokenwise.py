r"""Token-wise Gaussian sensitivity (main paper, Definition 4.1).

An input is a sequence of :math:`T` tokens :math:`x_1,\dots,x_T`. Perturbing token :math:`i`
replaces it by :math:`x_i + \varepsilon` with :math:`\varepsilon \sim \mathcal N(0, \sigma^2 I)`.
The sensitivity of a classifier :math:`f` on data :math:`D` is the probability that its predicted
class changes,

.. math::

    S_\sigma(f) = \mathbb E_{x \in D}\; \mathbb E_{i \sim U[T_x]}\;
    \mathbb E_{\varepsilon}\, \mathbf 1\big[\hat y(x^{(i,\varepsilon)}) \ne \hat y(x)\big],

averaging uniformly over the real tokens of each example (padding is never perturbed) and then
uniformly over examples. With ``compare="l1"``/``"l2"`` the indicator is replaced by the distance
between the output vectors.

**Decision rule** (:mod:`senslab.measure.outputs`, shared with the control variate, output
sharpness and the training loop). :math:`\hat y` is the argmax of a (B, C) output. A (B,) or
(B, 1) output is one column read by ``output_kind``: ``"logits"`` (class 1 iff :math:`z > 0`),
``"probabilities"`` (iff :math:`p > 1/2`) or ``"scores"`` (iff :math:`s >` ``threshold``). The
default is the model's ``output_kind`` attribute (the zoo's models declare ``"logits"``), else
logits — except that a single column lying entirely in [0, 1] (some values strictly inside),
what a ``sigmoid`` head returns, is refused as ambiguous: read as logits it would never flip.
A clean column of exact 0s and 1s (a sigmoid saturated on every example) is refused the same
way as soon as a perturbed copy's output lies in [0, 1] with a value strictly inside.
An example whose clean class is a tie (two equal top columns, one column exactly on its boundary:
a blank input under a head without bias; in bf16/fp16 outputs, closer than their spacing) has the
tie-break as its clean class and flips about half the time at any σ, however small: its flips are
counted, and ``compute`` says so, once per metric, naming how many examples tie, their flipped
copies and the sensitivity over the others (:meth:`TokenSensitivity._warn_ties`).

**What the model returns.** ``output=`` says where the logits are in the raw output: an int
index into a tuple/list, a str key (or attribute), or a function of the raw output. Without it a
tensor is used as it is, ``.logits`` (Hugging Face ``ModelOutput``) or a mapping's ``"logits"``
entry, or the element of a one-element tuple; a longer tuple such as ``(features, logits)`` is
refused, never read as its first element. The selected output must have one row per example.

**Dtypes.** :class:`~senslab.tokens.Patches` and :class:`~senslab.tokens.Sequence` add the
noise to the inputs themselves, so the inputs must be floating point: integer images are refused
(cast back to uint8 the noise would wrap around, to int64 it would be truncated) with the fix,
``images.float()`` (σ in pixel units) or ``images.float() / 255`` (σ in [0, 1] units). Floating
inputs of another dtype than the weights are measured when the model accepts them (the noise is
added in the inputs' dtype) and refused with the conversion when its clean forward fails.
:class:`~senslab.tokens.Embedding` takes integer token ids: its noise lands on the module's
floating output.

**Estimator.** For every example all its real tokens are enumerated (exhaustive stratification:
no variance from choosing tokens or examples) with ``repeats`` noise draws each, or a random
subset of ``num_tokens`` tokens. All perturbed copies of a chunk are built with tensor ops on the
model's device and evaluated in one forward pass under ``torch.inference_mode``. Against plain
Monte Carlo over (example, token, noise) triples, whose variance per forward pass is
:math:`\bar p(1-\bar p)`, stratification leaves only the within-cell part
:math:`\overline{p_{bt}(1-p_{bt})}`; the between-example and between-token spread of the flip
rates :math:`p_{bt}` no longer costs forward passes.

* ``antithetic=True`` draws the noise in pairs :math:`(\varepsilon, -\varepsilon)` (``repeats``
  even). A pair's mean is unbiased for the cell's rate and has variance
  :math:`\tfrac12\sigma_v^2(1+\rho)`, :math:`\rho` the correlation of the two halves: for a
  decision boundary that is locally flat, the two flips exclude each other and
  :math:`\rho = -p/(1-p) < 0`. Standard errors then use pair means as the i.i.d. units.
* ``control_variate="linear"`` pairs every flip with the flip of the model's first-order
  expansion at the clean input, whose probability is known in closed form
  (:math:`\Phi(-m/(\sigma\lVert g_t\rVert))`, :mod:`._control`); unbiased for any model, with
  a variance that vanishes as the model becomes linear at the scale σ.
* ``target_stderr=s`` (adaptive stopping): ``update`` repeats rounds of ``repeats`` draws per
  token until the fixed-subset standard error of the batch's mean is at most ``s`` or the next
  round would exceed ``max_forward`` forward passes for the batch (default: 64 rounds); a
  standard error of exactly 0 stops it only from the second round on, and one estimated from
  fewer than :data:`._alloc.MIN_FLIPS` flips (nonzero values; with ``allocation="linear"``,
  :data:`._alloc.ALLOC_MIN_FLIPS`) never does: it moves with the flips seen (a few-flips toy
  covered 72% of its 95% intervals without the guard, 92% with it;
  tests/measure/test_allocation.py); a batch that stops without a single flip reports (as its
  subset standard error) the rule of three's, never the 0 or the tangent's spread it estimated
  (:func:`._alloc.zero_floor`). The
  stopping rule looks at the whole batch, never at single cells, so the estimate's bias is
  :math:`O(1/n)`, of either sign: low where the rounds stop on a small standard error (fewer
  flips, a smaller standard error, an earlier stop; a slow test in
  tests/measure/test_allocation.py bounds it at a fifth of the standard error), high where they
  stop on the flips guard — a rule of "draw until 10 flips" overestimates a rate (+8.5%
  relative, a quarter of the standard error, on one batch of 8 examples flipping at 0.03 with
  ``target_stderr=0.05``). The target bounds the noise part of the uncertainty (``"subset"``);
  the data part shrinks only with more examples.
* ``allocation="linear"`` puts the draws where flips happen: from one forward and backward pass
  per example it computes every token's linearised flip probability :math:`q_{bt}` and gives
  each token an expected ``budget``-scaled share of units in proportion to
  :math:`\sqrt{q_{bt}(1-q_{bt})}/(K_b\sqrt{c_b})`, never less than a floor (a token weighs
  :math:`1/K_b` in the estimate and its copies cost in proportion to the example's extent
  :math:`c_b`; with ``target_stderr`` the first round spends ``budget``, and after each round
  the tangent's σ is refitted to the flips (``last_tangent_scale``) and the next round sized
  for the target by the refitted tangent's prediction, the rounds combined by their sizes); a
  token is then drawn with
  probability :math:`\pi_{bt} > 0` and weighted by :math:`1/\pi_{bt}` (Horvitz–Thompson), so
  the estimate stays unbiased for any model (:mod:`._alloc`). ``budget`` may be below 1: the
  tokens the tangent says cannot flip are visited rarely. It pays where the tangent knows where
  flips happen, and can cost more than equal draws where it does not (:mod:`._alloc`, *When it
  pays*).
* ``allocation="uniform"`` measures a random share ``budget`` of every example's real tokens
  (a simple random sample, without replacement) with one draw each, and gives a random quarter
  of them a second draw: where one draw per token already overshoots the precision asked for
  (flips concentrated in few tokens), a target is reached with fewer forwards. With
  ``target_stderr`` the first round is a pilot of that share, later rounds go to the share the
  variance measured so far predicts for the target (at least ``budget`` more), and once all
  tokens are in, rounds add to every token the draws it predicts (short of two draws for every
  token it stops only once :data:`._alloc.MIN_PAIRS` tokens have two). Unbiased for any
  model, and its standard error is an unbiased variance estimate: the paired draws estimate the
  within-token variance that one draw per token cannot (:class:`._alloc.Sampled`).

**Uncertainty.** Two estimands are distinguished:

* ``"data"`` (default): the sensitivity of the *data distribution* the examples were drawn from.
  The examples are the sampling unit, so the standard error is the standard deviation of the
  per-example flip rates divided by :math:`\sqrt{n}` (tokens of one example are not independent
  of each other, so pooling all flips would understate it).
* ``"subset"``: the sensitivity of *this fixed set of examples*; only the token/noise randomness
  counts. With all tokens and at least two units per token it uses the stratified variance
  :math:`\operatorname{Var}(\hat m_b) = K_b^{-2}\sum_t s^2_{bt}/r` (:mod:`._stats`); otherwise
  the units of an example are treated as i.i.d. draws (conservative under stratification).

Both are estimated from the flips seen (with the control variate, the copies whose flip differs
from the tangent's): from a few they move with those seen, and from none they are 0. So
``compute`` warns, once per metric, where fewer than :data:`._alloc.MIN_FLIPS` copies flipped,
and gives the rule of three's bound 3/N where none of N did (the counts are merged and
all-reduced with the state). With ``"data"`` on one example the standard error and its interval
are NaN (one rate has no spread): ``compute`` says so, once per metric, and gives the
``"subset"`` one of that example (``stderr_subset``). With ``"subset"`` an example of a single unit
of draws (``mode="whole", repeats=1``; ``num_tokens=1``; one draw per token of a single real
token) makes the standard error NaN, and ``compute`` says why and which draws give a finite one.

**Speed and memory.** ``chunk_size="auto"`` (the default) evaluates a small probe chunk while
counting the bytes its forward pass allocates, then sizes the chunks to ``memory_budget`` bytes
(default: half the free GPU memory, or a quarter of the free RAM but at most 64 MiB on CPU,
where cache-near chunks run fastest: ViT-small on one core ran 43 copies/s at 5–20 copies per
pass and 23/s at 80).
The noise is drawn in fixed blocks, so chunking never changes the numbers; nor does the split of
the examples into ``update`` calls (12 examples in one call or in 12 read the same numbers: each
copy takes the next rows of one stream, example-major), except where a batch draws more than
noise — ``num_tokens``' token subsets, the rounds of ``target_stderr`` (each batch stops on its
own standard error) and an ``allocation``'s draws are per batch, and ``mode="whole"`` draws
afresh at a new width — so that another split gives other draws, as unbiased, with standard
errors as right. ``autocast`` runs the
forwards in bf16/fp16 (and keeps their decisions) and ``compile=True`` through ``torch.compile``.
``precision="bf16-checked"`` — chosen by the default ``"auto"`` where the hardware multiplies
bf16 matrices natively and faster — evaluates the copies in bf16 but re-evaluates in float32
those whose bf16 margin is within a per-model calibrated bound of a class boundary, so the flips
are float32's (:mod:`._precision`; ``num_forward_fp32`` and ``recheck_fraction`` report the cost).
``precision="int8-checked"`` does the same with int8 linear layers on a CPU (:mod:`._int8`);
``"auto"`` picks it where bf16 does not pay and int8 does, and on a CPU drops either back to
float32 when its calibration, timed, finds that the re-checks cost more than they save.
In eval mode, models that support it reuse the clean computation: prefix reuse for models that
read left to right (:class:`~senslab.tokens.Embedding`, the zoo's LSTM and GPT-2) and local reuse
for convolutional networks (:class:`~senslab.tokens.Patches`, the zoo's ResNet and CNN) — same
predictions as full forwards, 1.3–2.9× the perturbed forwards per second on CPU.

**Padding** (:mod:`._trim`). Padding is never perturbed, and with ``trim_padding=True`` (the
default) never evaluated either: with :class:`~senslab.tokens.Embedding` tokens, each perturbed
copy runs on inputs cut after its example's last real token (one past the last true position of
a dict input's ``attention_mask``, else of ``mask``), and copies are grouped by that length, each
chunk cut to its longest. Every input tensor whose second axis is the token axis is cut
(``input_ids``, ``attention_mask``, ``token_type_ids``, ``position_ids``…); other inputs pass
unchanged. For right padding and a model that ignores its padding this is exact: the noise a
copy receives is keyed by its place in the example-major plan, not by its chunk, so every
(example, token, draw) gets the same vector and the flips are those of the padded evaluation
(``tests/measure/test_padding.py`` checks this on the zoo's text models and on Hugging Face BERT
and GPT-2). Left padding in the attention mask is refused (pad on the right, or pass
``trim_padding=False``); if cutting changes a clean example's output — the model reads positions
the mask calls padding — the batch runs at full width (with a warning when the padding came from
the model's own attention mask, said once per metric and kind of change, and
:attr:`~TokenSensitivity.untrimmed_batches` counting every batch; a ``mask`` may leave out real
tokens, e.g. an end token).
Patches and :class:`~senslab.tokens.Sequence` inputs are never cut (the model cannot tell
padding vectors from tokens).

The state is sums and counts, so results over many batches and processes merge exactly
(:meth:`TokenSensitivity.merge`, which refuses metrics of different quantities). With
``eval_mode=False`` the model runs in its own mode, and a buffer a forward changed is restored
after ``update``: measuring never changes the model; a forward that is random in that mode
(dropout in train mode) is refused, and so is BatchNorm that normalises by batch statistics
(train mode), whose copies' outputs would depend on their chunk. A caller's autocast region
is switched off during ``update``: without ``autocast=`` the forwards keep the model's own
precision.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import math
import os
import threading
import uuid
import warnings
import weakref
from collections.abc import Callable, Iterator, Mapping
from contextlib import AbstractContextManager, ExitStack, contextmanager, nullcontext
from typing import Any, Literal

import torch
from torch import Tensor, nn
from torch.overrides import TorchFunctionMode

from .._autocast import autocast_on
from .._exclusive import (
    OwnForwards,
    TurnLock,
    exclusive,
    first_few,
    held_modules,
    modes_kept,
)
from .._onednn import missing_kernel
from ..tokens.base import (
    Inputs,
    OutputSelector,
    Tokenization,
    batch_size,
    check_device,
    check_selector,
)
from ..tokens.embedding import (
    NO_PAD_TOKEN,
    hf_model_inside,
    hf_pad_token_config,
    left_padding_judged,
    no_pad_id_message,
    unwrapped,
)
from ..tokens.patches import _BoundPatches
from . import _alloc, _precision, _trim
from ._chunks import free_memory
from ._compiled import CompiledModel
from ._control import LinearControl
from ._noise import NOISE_BLOCK, NoiseStream
from ._options import (
    _check_call_options,
    _check_flag,
    _check_generator,
    _check_number,
    _check_positive,
    _eval,
    _identity,
    _kept_buffers,
    _resolve_sigma,
    _seeded,
    _shapes,
    float32_default,
)
from ._precision import Precision, PrecisionCheck
from ._runner import ChunkRunner, _reduced, verify_copies, verify_deterministic
from ._stats import (
    SHARED_NOISE,
    SensitivityResult,
    State,
    accumulate,
    accumulate_tokens,
    all_reduced,
    interval,
    merged,
    no_data_stderr,
    one_example_warning,
    one_unit_warning,
    result,
    subset_dof,
)
from ._stats import units as _units
from ._stats import within_variance as _within_variance
from .outputs import (
    OutputKind,
    check_finite,
    check_head,
    check_kind,
    check_rows,
    declared_kind,
    generating_t5,
    inferred_from_zero_one,
    margins,
    predictions,
    resolve_kind,
    tie_breaks,
    tie_warning,
    tied,
)

Compare = Literal["class", "l1", "l2"]
Estimand = Literal["data", "subset"]

__all__ = ["NOISE_BLOCK", "SensitivityResult", "TokenSensitivity", "token_sensitivity"]

#: rounds of ``repeats`` draws that ``target_stderr`` may spend per batch without ``max_forward``
DEFAULT_MAX_ROUNDS = 64
#: adaptive stopping never stops on a standard error of exactly 0 before this many rounds: a
#: variance estimate of 0 from one round's few draws per token is no evidence of precision
ROUNDS_AT_ZERO = 2
#: ``update`` calls with ``target_stderr`` after which a metric warns (once) that the batches'
#: stopping biases add up while the standard error of their mean shrinks
STOPPING_WARN_BATCHES = 10
#: bytes a perturbed copy holds until its batch is added (:meth:`TokenSensitivity._plan`: its
#: example and token, int64; its value, float64 at most; its owned and event flags), twice for
#: the rounds joined
PLAN_BYTES = 2 * (8 + 8 + 8 + 1 + 1)
#: a plan this size or smaller is never refused, whatever the free memory reads
PLAN_FLOOR = 16 << 30
#: whole perturbed copies checked int8 calibrates a static int8 model on (``_static_inputs``)
STATIC_COPIES = 256


#: a patch grid: patches per column and per row, and the patch size
Grid = tuple[int, int, int]


def _grid(bound: Any) -> Grid | None:
    """The grid of patches a bound :class:`~senslab.tokens.Patches` batch numbers its tokens
    on (row-major); None for other tokens, whose position is a token's place along one axis
    and means the same at every length."""
    if isinstance(bound, _BoundPatches):
        return int(bound.gh), int(bound.gw), int(bound.p)
    return None


def _grid_text(grid: Grid) -> str:
    rows, cols, p = grid
    return (f"a {rows}×{cols} grid of {p}×{p} patches ({rows * p}×{cols * p} images, "
            f"{rows * cols} tokens)")


def _grid_mismatch(held: Grid, new: Grid, other: str, mine: str = "this metric's") -> str:
    """The refusal to mix ``mine`` per-position profile over ``held`` (this metric's, or a
    rank's) with ``other``'s over ``new``: position k is another patch of the image on each
    grid."""
    rows, cols, p = held
    return (
        f"{mine} per-position profile (per_position) is over {_grid_text(held)}, but "
        f"{other} is over {_grid_text(new)}: "
        "position k, counted row-major over the grid, is another patch of the image on each "
        "grid, so the profile would add up unrelated patches. Measure each image size with a "
        f"metric of its own (and compare their profiles side by side), or resize the images to "
        f"{rows * p}×{cols * p} first; mode='whole' records no profile and takes any size"
    )


def _ranks_grid_mismatch(grids: list[Grid | None]) -> str | None:
    """The refusal of the processes' profiles, one grid (or None: no patches measured) a rank
    in rank order, where two ranks' grids differ: the first rank with a grid and the first
    with another are named (the same text on every rank, which all see the same grids); None
    where every rank with a grid has the same one."""
    held = [(rank, grid) for rank, grid in enumerate(grids) if grid is not None]
    for rank, grid in held[1:]:
        if grid != held[0][1]:
            return _grid_mismatch(held[0][1], grid, f"rank {rank}'s", mine=f"rank {held[0][0]}'s")
    return None


def _refuse_ranks_grids(infos: list[dict[str, Any]]) -> None:
    """:meth:`TokenSensitivity.all_reduce`'s check of the gathered ``infos``: every rank's
    grid (``grid``; ranks that measured no patches have none) is compared with every other's,
    not only with rank 0's, which may have none."""
    said = _ranks_grid_mismatch([info.get("grid") for info in infos])
    if said is not None:
        raise ValueError("cannot all_reduce: " + said)


def _warn_reduced_float32(model: Any, device: torch.device) -> None:
    """Warn, once per metric, where the model's float32 forwards would run in a reduced
    precision (TF32 on a GPU: PyTorch's default for cuDNN convolutions): the decisions that
    ``precision="float32"`` and ``"bf16-checked"`` report as float32's would be TF32's."""
    reduced = _precision.reduced_float32(model, device)
    if reduced:
        warnings.warn(
            f"the model's float32 forwards on {device} run {'; '.join(reduced)}: the flips "
            "counted (and precision='bf16-checked''s re-checks) are then decided in that "
            "precision, not float32, and can differ for copies near a class boundary. For "
            "float32's decisions change the setting before measuring; to accept reduced "
            "precision, pass autocast= instead",
            RuntimeWarning, stacklevel=_trim._user_level(),
        )



@contextmanager
def _own_forward(model: Any) -> Iterator[None]:
    """Measure through the model's own forward where Hugging Face accelerate's mixed precision
    (``Trainer(bf16=True)``, ``Accelerator(mixed_precision=...)``) replaced it, on the model
    object itself, with one that enters autocast: that patch stays after training, and every
    forward, clean and perturbed, ran in bf16 whatever ``precision`` said. The precision is
    senslab's to choose (``precision=``, ``autocast=``); the patch is put back afterwards."""
    patched = (isinstance(model, nn.Module) and "forward" in vars(model)
               and callable(getattr(model, "_original_forward", None)))
    if not patched:
        yield
        return
    wrapped = vars(model)["forward"]
    model.forward = model._original_forward
    try:
        yield
    finally:
        model.forward = wrapped


def _modes(model: Any) -> tuple[bool, ...]:
    """Whether each module of ``model`` is in training mode, in ``modules()`` order; for a
    callable, of the modules it holds (:func:`~senslab._exclusive.held_modules`:
    ``lambda x: net(x)`` holds ``net``, which ``eval_mode`` does not switch). A forward checked
    in one mode says nothing of another (dropout in train mode), so
    :meth:`TokenSensitivity._update` checks each mode it meets."""
    return tuple(m.training for top in held_modules(model) for m in top.modules())


class _AutocastProbe(TorchFunctionMode):
    """Looks at the autocast state at every torch call while it is entered (one forward):
    :attr:`seen` is True once a call ran with autocast on for ``device_type``."""

    def __init__(self, device_type: str) -> None:
        super().__init__()
        self.device_type, self.seen = device_type, False

    def __torch_function__(self, func: Any, types: Any, args: Any = (),
                           kwargs: Any = None) -> Any:
        if not self.seen and autocast_on(self.device_type):
            self.seen = True
        return func(*args, **(kwargs or {}))


@contextmanager
def _refuse_own_autocast(model: Any, device: torch.device) -> Iterator[None]:
    """Refuse a model whose forward enters autocast itself (Lightning Fabric's module under
    ``precision="bf16-mixed"``, a forward or a predict function with its own
    ``torch.autocast``): senslab switched autocast off, so a torch call that runs with it on
    was switched on by the model, and every decision said to be float32's would be the
    reduced precision's. Wraps the first forward (the clean one), before anything is counted:
    a torch function mode sees every call, also a plain callable's and functional ops on a
    module's own parameters (a forward pre-hook on submodules saw neither, and a ScriptModule
    takes no hooks); the other forwards run without it. Pre-hooks on the submodules look too:
    a mode is thread-local, and ``nn.DataParallel`` runs its replicas in threads of its own
    (another thread's forward of the model itself, a training loop's, is not looked at)."""
    probe = _AutocastProbe(device.type)
    own = OwnForwards(model)

    def look(module: nn.Module, args: Any) -> None:
        if autocast_on(device.type):
            probe.seen = True

    handles = ([m.register_forward_pre_hook(own.hook(look)) for m in model.modules()
                if m is not model]
               if isinstance(model, nn.Module) else [])
    try:
        with probe:
            yield
    finally:
        for h in handles:
            h.remove()
        own.close()
    if probe.seen:
        name = (type(model).__name__ if isinstance(model, nn.Module)
                else getattr(model, "__name__", type(model).__name__))
        raise ValueError(
            f"{name}'s forward switches autocast on by itself (a mixed-precision wrapper: "
            "Lightning Fabric's module under precision='bf16-mixed', a forward or a predict "
            "function with its own torch.autocast), so the decisions counted would be the "
            "reduced precision's, not float32's as precision= says. Measure the model without "
            "it (the module inside the wrapper: fabric_module.module; a predict function "
            "without its autocast), or accept reduced precision with autocast=torch.bfloat16")


def _generating_t5(model: Any) -> tuple[nn.Module, str] | None:
    """``(model, its name)`` for a T5-like generating encoder-decoder (``config.model_type`` in
    :data:`.outputs.T5_LIKE`, ``is_encoder_decoder``, ``can_generate()``:
    ``T5ForConditionalGeneration``), bare or inside a user's wrapper; None for any other."""
    found = hf_model_inside(model)
    inner, what = found if found is not None else (unwrapped(model), None)
    if not isinstance(inner, nn.Module) or not generating_t5(inner):
        return None
    return inner, what or type(inner).__name__


#: what a T5-like model reads its decoder's inputs from (one given: it builds the rest)
_DECODER_INPUTS = ("decoder_input_ids", "decoder_inputs_embeds", "labels")


@contextmanager
def _refuse_no_decoder_inputs(model: Any) -> Iterator[None]:
    """Refuse a T5-like generating encoder-decoder (:func:`_generating_t5`) called without
    decoder inputs, at the clean forward (before it runs; bare, or inside a user's wrapper,
    whose call to it is the one looked at): it builds none from ``input_ids``, and Hugging
    Face failed with "You must specify exactly one of input_ids or inputs_embeds", about the
    decoder's, though ``input_ids`` were given (with ``output=``, ``compare='l1'``/``'l2'``, or
    a wrapper; ``compare='class'`` without ``output=`` is refused before,
    :func:`.outputs.check_head`)."""
    found = _generating_t5(model)
    if found is None:
        yield
        return
    inner, what = found
    try:
        signature: inspect.Signature | None = inspect.signature(inner.forward)
    except (TypeError, ValueError):
        signature = None

    def look(module: nn.Module, args: Any, kwargs: Any) -> None:
        if signature is None:
            return
        try:
            given = signature.bind_partial(*args, **kwargs).arguments
        except TypeError:
            return  # a call the model refuses itself
        if any(given.get(k) is not None for k in _DECODER_INPUTS):
            return
        where = ("in the inputs" if inner is unwrapped(model)
                 else "in your wrapper's call to it (or in the inputs it passes on)")
        raise ValueError(
            f"{what} is a T5-like encoder-decoder model called without decoder inputs: it "
            "makes none from input_ids (Hugging Face then fails with 'You must specify "
            "exactly one of input_ids or inputs_embeds', about the decoder's, though "
            f"input_ids were given). Give the decoder its inputs, decoder_input_ids {where}: "
            "for its first output token, torch.full((batch, 1), "
            "model.config.decoder_start_token_id)"
        )

    own = OwnForwards(model)
    handle = inner.register_forward_pre_hook(own.hook(look), with_kwargs=True)
    try:
        yield
    finally:
        handle.remove()
        own.close()


def _refuse_batch_statistics(model: nn.Module, eval_mode: bool = False) -> None:
    """Refuse BatchNorm layers that normalise by their batch's statistics: a copy's output
    would depend on the copies that share its chunk, so the number would change with
    ``chunk_size``. With ``eval_mode=False``: those in train mode or without running
    statistics; with ``eval_mode=True`` (eval() is applied for the measurement): those without
    running statistics (``track_running_stats=False``), which eval() leaves normalising by the
    batch."""
    norms = [name or type(model).__name__ for name, m in model.named_modules()
             if isinstance(m, nn.modules.batchnorm._BatchNorm)
             and ((m.training and not eval_mode) or m.running_mean is None)]
    if not norms:
        return
    shown = first_few(norms)
    why = ("each perturbed copy would be normalised with the copies that share its chunk, so "
           "its flips, and the number, would depend on chunk_size")
    if eval_mode:
        raise ValueError(
            f"BatchNorm layers without running statistics ({shown}: track_running_stats="
            f"False) normalise each forward by its own batch, in eval mode too: {why}. Give "
            "them running statistics (estimated on training data), or measure a model without "
            "them")
    raise ValueError(
        f"eval_mode=False with BatchNorm layers that normalise by batch statistics ({shown}: "
        f"train mode, or no running statistics): {why}. Measure with eval_mode=True (the "
        "default: eval() for the measurement, the model's mode restored after it), or put the "
        "BatchNorm layers in eval() and keep the rest of the model's mode")


def _refuse_empty_tokens(tokens: Any, t: int, dim: int, inputs: Any) -> None:
    """Refuse inputs of no token, or of tokens of no entries: the first read "examples [0, 1,
    2, 3] have no real token (the mask is all padding)" of a mask nobody passed, the second
    failed with a bare ZeroDivisionError in the noise's drawing."""
    shapes = ", ".join(str(s) for s in _shapes(inputs))  # an example's, without the batch axis
    if t == 0:
        raise ValueError(
            f"{type(tokens).__name__} finds no token in these inputs (an example of shape "
            f"{shapes}: a token axis of size 0, or images smaller than one patch), so there is "
            "nothing to perturb; pass inputs of at least one token (Sequence: (batch, tokens, "
            "features); Patches: images at least one patch high and wide)")
    if dim == 0:
        raise ValueError(
            f"the tokens that {type(tokens).__name__} finds in these inputs (an example of shape "
            f"{shapes}) have no entries (a feature axis of size 0, or images of no channel), so "
            "noise on them changes nothing; pass tokens of at least one feature (Sequence: "
            "(batch, tokens, features), features >= 1)")


def _refuse_padding_without_pad_id(model: Any, bound: Any, real: Tensor,
                                   device: torch.device) -> None:
    """Refuse a single padded example (``real``: (1, T), false on padding) for a Hugging Face
    classifier that pools at the last non-pad token and declares no pad id (in its config, or
    in the text part of a composite one: :func:`~senslab.tokens.embedding.hf_pad_token_config`):
    its clean forward ran (one example is the batch it accepts) but read the logits at the
    padding. Asked of the model by evaluating the example twice, once, and only where the
    config has no pad id: the copies' forward refuses the pair
    (:func:`~senslab.tokens.embedding.no_pad_id_message`, as for a batch of several examples in
    the clean forward)."""
    if real.shape[0] != 1 or bool(real[0, -1]):
        return
    found = hf_pad_token_config(model)
    if found is None or getattr(found[0], "pad_token_id", None) is not None:
        return
    twice = torch.zeros(2, dtype=torch.long, device=device)
    bound.forward_perturbed(twice, None, torch.zeros(2, real.shape[1], bound.dim, device=device))


#: one lock per :class:`TokenSensitivity` (and :class:`.compare.CompareSensitivity`), kept
#: outside the object (which stays copyable and picklable); see :func:`_lock`
_LOCKS: weakref.WeakKeyDictionary[Any, TurnLock] = weakref.WeakKeyDictionary()
_LOCKS_GUARD = threading.Lock()


def _fresh_guard() -> None:
    """A forked child's guard of ``_LOCKS``: free (the metrics' locks tell their own state)."""
    global _LOCKS_GUARD
    _LOCKS_GUARD = threading.Lock()


if hasattr(os, "register_at_fork"):  # not on Windows, which does not fork
    os.register_at_fork(after_in_child=_fresh_guard)


def _lock(metric: Any) -> TurnLock:
    """The lock that serializes ``metric``'s ``update``, ``merge``, ``compute`` and ``reset``:
    two threads updating one metric at once took the same noise rows (``NoiseStream.take``
    reads, then assigns) and added to one state unguarded, and a ``compute`` during an
    ``update`` read a half-added state (the new count with the old sum)."""
    with _LOCKS_GUARD:
        lock = _LOCKS.get(metric)
        if lock is None:
            lock = _LOCKS[metric] = TurnLock("this metric")
        return lock


def _one_thread_at_a_time(method: Callable[..., Any]) -> Callable[..., Any]:
    """``method`` under the metric's :func:`_lock`."""

    @functools.wraps(method)
    def guarded(self: Any, *args: Any, **kwargs: Any) -> Any:
        with _lock(self):
            return method(self, *args, **kwargs)

    return guarded


def _one_measurement_at_a_time(method: Callable[..., Any]) -> Callable[..., Any]:
    """``method`` (one that runs the model) under the measurements' lock
    (:func:`senslab._exclusive.exclusive`), then the metric's: always in that order, so a
    caller holding ``exclusive(model)`` and another thread updating the same metric never wait
    for each other in a circle."""
    metric_locked = _one_thread_at_a_time(method)

    @functools.wraps(method)
    def guarded(self: Any, *args: Any, **kwargs: Any) -> Any:
        with exclusive():
            return metric_locked(self, *args, **kwargs)

    return guarded


@dataclasses.dataclass(frozen=True)
class _TieCounts:
    """One batch's flips of examples whose clean class is a tie (:class:`_Ties`): ``said``
    (B,) bool on the host, the examples (this process's, in the order their rates are added)
    whose flips are tie-breaks; ``theirs``, their flipped copies; ``flips``, every example's."""

    said: Tensor | None
    theirs: int
    flips: int


class _Ties:
    """Watches the copies of one batch for the flips of examples whose clean class is a tie
    (:func:`~senslab.measure.outputs.tied`: equal top columns, one column exactly on its
    boundary; in bf16/fp16 outputs, closer than their spacing), as output sharpness does
    (:func:`~senslab.measure.outputs.tie_breaks`). It reads the outputs the copies are
    decided on, where they are compared with the clean class (:class:`_Runner`): no forward of
    its own, and the same copies whatever the chunking, the padding-aware batching, the reuse
    path or the checked precision (whose copies near a boundary, a tie's, are float32's),
    and the raw flips, before a control variate adjusts them. Per example it counts the
    flipped copies and, where the batch has a tied example, the copies that sat exactly on the
    tie again or moved to the clean class's side (a clamped output never does: not a tie) and
    the squared change of the margin (bf16/fp16 outputs: a tie that rounding decides); one
    host sync at the end of the batch."""

    def __init__(self, clean: Tensor, ref: Tensor, kind: str, threshold: float | None) -> None:
        self.clean, self.ref, self.kind, self.threshold = clean, ref, kind, threshold
        self.ties = tied(clean, ref, kind, threshold)
        self.any = bool(self.ties.any())  # one host sync per batch
        self.total = torch.zeros((), dtype=torch.float64, device=ref.device)
        if self.any:
            b = len(ref)
            self.margin = margins(clean, ref, kind, threshold).double()
            self.flipped, self.stuck, self.away, self.moves, self.draws = (
                torch.zeros(b, dtype=torch.float64, device=ref.device) for _ in range(5))

    def see(self, out: Tensor, src: Tensor, flips: Tensor) -> None:
        """Count the copies ``src`` (their examples) with outputs ``out`` and ``flips``."""
        flips = flips.to(self.total.device, torch.float64)
        self.total += flips.sum()
        if not self.any:
            return
        src = src.to(self.ref.device)
        now = margins(out, self.ref[src], self.kind, self.threshold).double()
        # the margin's change where the example ties (elsewhere an -inf column may make it NaN)
        move = torch.where(self.ties[src], now - self.margin[src], torch.zeros_like(now))
        self.flipped.index_add_(0, src, flips)
        self.stuck.index_add_(0, src, (now == 0).double())
        self.away.index_add_(0, src, (now > 0).double())
        self.moves.index_add_(0, src, move.square())
        self.draws.index_add_(0, src, torch.ones_like(now))

    def counts(self, mine: Tensor | None = None) -> _TieCounts:
        """The batch's counts; ``mine``: this process's examples (``shard``), whose rows the
        state holds (the other examples' copies were never seen here)."""
        total = int(self.total.item())
        if not self.any:
            return _TieCounts(None, 0, total)
        said = tie_breaks(self.clean, self.ref, self.ties, self.flipped > 0, self.stuck > 0,
                          self.away > 0, (self.moves / self.draws.clamp(min=1)).sqrt())
        theirs = int(self.flipped[said].sum())
        if mine is not None:
            said = said[mine.to(said.device)]
        return _TieCounts(said.cpu(), theirs, total)


class _Runner(ChunkRunner):
    """:class:`~._runner.ChunkRunner` that shows every chunk's outputs and flips to the
    batch's :class:`_Ties` (None: not compared by class)."""

    def __init__(self, *args: Any, ties: _Ties | None = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.ties = ties

    def _compare(self, out: Tensor, src: Tensor) -> Tensor:
        vals = super()._compare(out, src)
        if self.ties is not None:
            self.ties.see(out, src, vals)
        return vals


class TokenSensitivity:
    """Accumulating token-wise sensitivity (torchmetrics-style ``update``/``compute``/``reset``).

    Args:
        model: any callable or ``nn.Module``; it is put in eval mode while measuring (its mode is
            restored afterwards) unless ``eval_mode=False``.
        tokens: a :class:`~senslab.tokens.Tokenization` — ``Patches(p)``, ``Embedding(name)``,
            ``Sequence()``; defaults to ``model.default_tokens()`` if the model has one.
        sigma: noise **standard deviation** (the paper states variances: pass ``variance=``
            instead to give σ² directly). Exactly one of the two, unless ``replace_with``.
        variance: noise variance σ².
        replace_with: a (V, D) vocabulary; the perturbation then replaces the token by a row
            drawn uniformly from it instead of adding noise (the synthetic task's sensitivity).
        repeats: noise draws per token (per round, with ``target_stderr``).
        num_tokens: perturb a random subset of this many tokens per example (default: all;
            each round draws a new subset, and the standard error counts the token sampling).
        mode: ``"token"`` (one token at a time) or ``"whole"`` (noise on every token at once,
            the random-noise variant of the paper's A.2).
        compare: ``"class"`` (predicted class changes; default, as in the paper), ``"l1"`` or
            ``"l2"`` (distance between output vectors).
        output_kind: how ``compare="class"`` reads a one-column output (:mod:`.outputs`):
            ``"logits"`` (class 1 iff > 0), ``"probabilities"`` (iff > 0.5) or ``"scores"``
            (iff > ``threshold``); several columns are always read by argmax. Default: the
            model's ``output_kind`` attribute, else logits — but a one-column output entirely
            in [0, 1] (some values strictly inside) is then refused as ambiguous, on the clean
            inputs or, after a clean column of exact 0s and 1s, on the perturbed copies.
        threshold: the class boundary of ``output_kind="scores"``. ``output_kind`` and
            ``threshold`` with ``compare="l1"``/``"l2"`` (which read no class) are refused.
        output: which part of the model's raw output holds the logits: an int index into a
            tuple/list, a str key (or attribute), or a function of the raw output. Default: a
            tensor as it is, ``.logits`` / ``["logits"]``, a one-element tuple's element;
            longer tuples are refused (:func:`~senslab.tokens.base.select_output`).
        estimand: ``"data"`` or ``"subset"``, which standard error ``compute`` reports.
        generator: a ``torch.Generator`` or an int seed; all randomness comes from it
            (default seed 0: same call, same numbers). An int seed makes a generator on the
            model's device; on a CPU it must be below 2**32, as torch's CPU generator keeps
            only a seed's low 32 bits (seed 2**32 + 1 would draw seed 1's noise).
        chunk_size: perturbed copies per forward pass, or ``"auto"``/None (default): sized from
            a probe forward's allocations and ``memory_budget``.
        memory_budget: bytes one chunk may allocate with ``chunk_size="auto"`` (default: see
            the module docstring).
        antithetic: draw noise in pairs (ε, −ε); ``repeats`` must be even.
        target_stderr: adaptive stopping — add rounds of ``repeats`` draws per token until the
            fixed-subset standard error of each batch's mean is at most this (a batch that
            stops without a flip reports the rule of three's standard error).
        max_forward: forward passes one ``update`` may spend with ``target_stderr`` (at least
            one round always runs; default 64 rounds). The rounds after the first never pass
            it: with ``allocation="linear"`` each is sized by the most copies its random draws
            can make, not by their expectation. Refused without ``target_stderr``, with or
            without an allocation: there is then one round, which always runs, so the cap
            would be ignored (set ``repeats`` or ``budget`` instead).
        allocation: ``"linear"``: draws where the linearised flip probability says flips happen,
            weighted back so the estimate stays unbiased (module docstring; :mod:`._alloc`);
            costs one forward and backward per example (counted as one forward pass).
            ``"uniform"``: a random share of every example's tokens, one draw each (a quarter
            of them two, for the standard error), so that a target needing less than one draw
            per token is reached with fewer forwards (module docstring; :mod:`._alloc`).
        budget: with ``allocation="linear"``, the mean units (copies, or antithetic pairs) per
            real token of the round (default 1; may be below 1); with ``target_stderr``, of the
            first round and the least of the next, whose size the refitted tangent predicts
            for the target (a top-up after it at least a quarter of ``budget``), so a small
            pilot (0.25) leaves most draws to a round the tangent has been fitted for
            (docs/benchmarks.md, *Sized rounds*); with ``"uniform"``, the share of every
            example's tokens each round adds (in (0, 1], default 1). ``repeats`` stays at 1
            (2 with ``antithetic``, its default there). Refused without an allocation, which
            ignored it.
        control_variate: ``"linear"`` subtracts the flip indicator of the model's tangent
            hyperplane and adds its closed-form mean (:mod:`._control`): unbiased for any
            model, exact for a linear one; costs one forward and backward per example (counted
            as one more forward pass). Its standard error rests on the copies whose flip
            differs from the tangent's: where none did it is the spread of the tangent's
            probabilities between tokens (one draw per token) or 0 (more), no evidence, and
            ``compute`` warns, as it does below 10 of them. On a small MLP at one draw per
            token 90% of the 95% intervals covered: none of the 6% of runs without such a copy,
            96% of the others; more draws alone did not help (4: 92%).
        autocast: a dtype (``torch.bfloat16``/``torch.float16``) to run forwards under autocast,
            keeping that precision's own decisions. Without it the forwards run in the model's
            own dtype, also when ``update`` is called inside an autocast region (a bf16-mixed
            validation step): that autocast is switched off for the measurement.
        precision: ``"bf16-checked"`` evaluates the copies under bf16 autocast and those whose
            bf16 margin lies within a calibrated bound of a class boundary again in float32:
            float32's decisions at bf16's speed (:mod:`._precision`; the bound is
            ``check_bound``, the re-checked share ``recheck_fraction``). ``"int8-checked"``
            (CPU): the same with the model's linear layers as int8 products (:mod:`._int8`).
            ``"float32"``: every forward in the model's own precision. ``"auto"`` (default):
            checked bf16 on hardware with native bf16 matrix units (GPUs of compute
            capability ≥ 8.0; AVX-512 BF16/AMX CPUs where a bf16 matrix product is measured
            faster), else checked int8 on CPUs where an int8 linear layer is measured faster,
            for float32 ``nn.Module`` models and ``compare="class"``, else the model's
            precision; on a CPU ``"auto"`` also times the calibration and goes back to
            float32 when checking would not pay (``checked_precision`` says which ran,
            ``float32_reason`` why float32).
            ``autocast=`` takes precedence.
        compile: evaluate the perturbed copies through ``torch.compile``: the model's call
            and, where the tokenization reuses the clean computation, the model's
            ``forward_local``/``forward_suffix`` (:mod:`._compiled`).
        align: per-position alignment, ``"left"`` or ``"right"``; default from the tokenization.
        eval_mode: False measures the model in its own mode; a buffer a forward changed is
            restored afterwards. A forward that is random in that mode (dropout in train mode)
            is refused: its randomness would be counted as flips; so is BatchNorm in train mode
            (batch statistics), which would make each copy's output depend on its chunk.
        shard: ``(rank, world_size)``: this process measures only examples ``b`` with
            ``b % world_size == rank`` of every batch, drawing the same random stream as a single
            process would; after :meth:`all_reduce` every rank holds the one-process result.
        trim_padding: padding-aware batching (default True): evaluate each perturbed copy on
            inputs cut after its example's last real token, grouping copies by length; same
            flips as the padded evaluation for right-padded inputs (module docstring,
            *Padding*). Left-padded ``attention_mask`` inputs are refused while it is on;
            ``False`` evaluates every copy at the batch's full width. It costs one clean
            forward per example at its own length (a check that cutting changes nothing; not
            counted in ``num_forward``).

    Example:
        >>> import torch
        >>> from senslab.measure import TokenSensitivity
        >>> from senslab.tokens import Patches
        >>> model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(16, 3))
        >>> metric = TokenSensitivity(model, Patches(2), sigma=0.5, generator=0)
        >>> for batch in torch.randn(2, 8, 1, 4, 4):
        ...     metric.update(batch)
        >>> result = metric.compute()
        >>> result.num_examples, 0.0 <= result.estimate <= 1.0
        (16, True)
    """

    def __init__(
        self,
        model: nn.Module | Any,
        tokens: Tokenization | None = None,
        *,
        sigma: float | None = None,
        variance: float | None = None,
        replace_with: Tensor | None = None,
        repeats: int = 1,
        num_tokens: int | None = None,
        mode: Literal["token", "whole"] = "token",
        compare: Compare = "class",
        estimand: Estimand = "data",
        generator: torch.Generator | int | None = None,
        chunk_size: int | Literal["auto"] | None = None,
        memory_budget: int | None = None,
        antithetic: bool = False,
        target_stderr: float | None = None,
        max_forward: int | None = None,
        control_variate: Literal["linear"] | None = None,
        allocation: Literal["linear", "uniform"] | None = None,
        budget: float | None = None,
        autocast: torch.dtype | None = None,
        compile: bool = False,
        align: Literal["left", "right"] | None = None,
        eval_mode: bool = True,
        shard: tuple[int, int] | None = None,
        output_kind: OutputKind | None = None,
        threshold: float | None = None,
        output: OutputSelector = None,
        trim_padding: bool = True,
        precision: Precision = "auto",
        **unknown: Any,
    ) -> None:
        if unknown:
            raise TypeError(_unknown_options(unknown))
        if tokens is None:  # default_tokens(), else auto_tokens for HF/timm; else a TypeError
            from ..tokens.auto import default_tokens

            tokens = default_tokens(model)
        _check_call_options(model, tokens, autocast, shard)
        _check_generator(generator)
        check_selector(output)
        check_kind(output_kind, threshold)
        self.model, self.tokens, self.output = model, tokens, output
        #: the decision rule for one-column outputs: the option, else the model's attribute
        self.output_kind = declared_kind(model, output_kind)
        self._output_kind_option = output_kind  # read again for a model assigned later
        #: the model the per-model checks and caches below are of (:meth:`_follow_model`)
        self._caches_for: Any = model
        self.threshold = threshold
        #: the kind the last batch was read with (``output_kind`` or, if None, logits)
        self.kind: str = self.output_kind or "logits"
        #: the last batch's logits reading was inferred from a clean column of exact 0s and 1s,
        #: so the perturbed outputs are checked (:func:`.outputs.check_perturbed_kind`)
        self.kind_from_zero_one = False
        self.sigma = _resolve_sigma(sigma, variance, replace_with)
        self.replace_with = replace_with
        if replace_with is not None and mode != "token":
            raise ValueError("replace_with works one token at a time: use mode='token'")
        # as Python ints: a NumPy int64 stayed one in the metric's options (JSON fails on it)
        repeats = _check_positive("repeats", repeats)
        if num_tokens is not None:
            num_tokens = _check_positive("num_tokens", num_tokens)
        if mode not in ("token", "whole"):
            raise ValueError(f"mode must be 'token' or 'whole', got {mode!r}")
        if num_tokens is not None and mode == "whole":
            # mode='whole' perturbs every token of a copy at once: num_tokens was ignored, and
            # the noise landed on every token, not on the ones asked for
            raise ValueError(f"num_tokens={num_tokens} samples tokens to perturb one at a time, "
                             "but mode='whole' perturbs every token of a copy at once; drop "
                             "num_tokens, or use mode='token'")
        if compare not in ("class", "l1", "l2"):
            raise ValueError(f"compare must be 'class', 'l1' or 'l2', got {compare!r}")
        if compare != "class" and (output_kind is not None or threshold is not None):
            # the distance between outputs reads no decision rule: both were accepted and
            # ignored, so a user's threshold= changed nothing without a word
            given = ", ".join(f"{k}={v!r}" for k, v in (("output_kind", output_kind),
                                                         ("threshold", threshold))
                              if v is not None)
            raise ValueError(
                f"{given} sets how compare='class' reads a class from the outputs, but "
                f"compare={compare!r} measures how far the outputs move and reads no class; "
                f"drop {given}, or measure flips of the class with compare='class'")
        check_head(model, compare, output_kind, output)
        if estimand not in ("data", "subset"):
            raise ValueError(f"estimand must be 'data' or 'subset', got {estimand!r}")
        self.repeats, self.num_tokens, self.mode = repeats, num_tokens, mode
        self.compare, self.estimand = compare, estimand
        if chunk_size in (None, "auto"):
            self.chunk_size: int | None = None
        else:
            self.chunk_size = _check_positive("chunk_size", chunk_size)  # type: ignore[arg-type]
        if memory_budget is not None:
            _check_positive("memory_budget", memory_budget, "2**26 (bytes)")
            if self.chunk_size is not None:
                # a fixed chunk is never sized: the budget was ignored without a word, every
                # chunk holding chunk_size copies whatever they allocate
                raise ValueError(
                    f"memory_budget={memory_budget} sizes the chunks of chunk_size='auto' (the "
                    f"default), but chunk_size={chunk_size} fixes them at {chunk_size} copies "
                    "per forward pass whatever they allocate, so the budget would be ignored. "
                    "Drop chunk_size to keep each chunk within the budget, or drop "
                    "memory_budget to keep the fixed chunk (the numbers never change with the "
                    "chunk size)")
        self.memory_budget = memory_budget
        self.antithetic = _check_flag("antithetic", antithetic)
        if self.antithetic and allocation is not None and repeats == 1:
            # with an allocation budget= sets the draws, and repeats is one antithetic pair (the
            # default of 1 was refused as "needs an even number of repeats", which no option
            # of the allocation's fixes)
            repeats = self.repeats = 2
        if self.antithetic:
            if replace_with is not None:
                raise ValueError("antithetic pairs (ε, −ε) need Gaussian noise, not replace_with")
            if repeats % 2 and allocation is None:
                raise ValueError(
                    f"antithetic=True needs an even number of repeats (pairs ε, −ε), got {repeats}"
                )
            if self.chunk_size is not None and self.chunk_size % 2:
                self.chunk_size += 1  # pairs never straddle two chunks
        if target_stderr is not None:
            _check_number("target_stderr", target_stderr, "0.01")
        if target_stderr is not None and not (target_stderr > 0 and math.isfinite(target_stderr)):
            raise ValueError(f"target_stderr must be a positive number, got {target_stderr!r}")
        if max_forward is not None:
            max_forward = _check_positive("max_forward", max_forward)
            if target_stderr is None:
                # without a target every design runs one round, all of it: repeats= draws per
                # token, or an allocation='s budget= (95 forwards under max_forward=20), so the
                # cap was ignored
                spent, fewer = (("the allocation's budget=", "a smaller budget=")
                                if allocation is not None
                                else ("repeats= draws per token", "fewer repeats"))
                raise ValueError(
                    f"max_forward={max_forward} caps the rounds of target_stderr=, which is not "
                    f"given: without it one round runs, all of it ({spent}); drop max_forward, "
                    f"set {fewer}, or pass target_stderr=")
        if target_stderr is not None and shard is not None:
            raise ValueError("target_stderr (adaptive stopping) cannot be combined with shard")
        self.target_stderr, self.max_forward = target_stderr, max_forward
        if control_variate not in (None, "linear"):
            raise ValueError(f"control_variate must be None or 'linear', got {control_variate!r}")
        if control_variate and (mode != "token" or compare != "class" or replace_with is not None):
            raise ValueError(
                "control_variate='linear' needs Gaussian noise on one token at a time and "
                "compare='class' (mode='token', no replace_with)"
            )
        self.control_variate = control_variate
        self.allocation, self.budget = _check_allocation(
            allocation, budget, mode=mode, compare=compare, replace_with=replace_with,
            num_tokens=num_tokens, shard=shard, repeats=repeats, antithetic=self.antithetic,
            control_variate=control_variate)
        self.autocast = autocast
        self._float32_checked = False  # whether update has looked at PyTorch's float32 settings
        self._own_autocast_checked = False  # whether a forward has shown no autocast of its own
        _precision.check_precision(precision, autocast, compare)
        self.precision = precision
        self._check = _precision.PrecisionCheck()
        self.eval_mode = _check_flag("eval_mode", eval_mode)
        self.trim_padding = _check_flag("trim_padding", trim_padding)
        #: whether the last ``update`` cut the padding (False: nothing to cut, or switched off)
        self.last_trimmed = False
        #: ``update`` batches since the last :meth:`reset` whose copies ran at full width
        #: because cutting changed the clean outputs (:meth:`_extent`): the warning says the
        #: cause once per metric, this counts every batch it cost
        self.untrimmed_batches = 0
        self.compile = _check_flag("compile", compile)
        self._compiled: Any = None
        #: copies per forward pass in the last ``update`` (the automatic size, once probed)
        self.last_chunk_size: int | None = None
        #: ``allocation="linear"``: the scale κ of the tangent's σ that the last batch's final
        #: round was allocated by (1: the tangent as it is; fitted to the flips after each round)
        self.last_tangent_scale: float | None = None
        self._per_copy: dict[Any, float] = {}
        #: input shapes whose zero-noise copies were verified (``_runner.verify_copies``)
        self._verified: set[Any] = set()
        #: paths whose batch independence was checked: a property of the model and the
        #: options, not of the padded width (text batches of new widths would repeat it)
        self._batch_checked: set[Any] = set()
        #: this process's own state while :attr:`state` holds the all-reduced total
        self._local: State | None = None
        self.align = align or getattr(tokens, "align", "left")
        if self.align not in ("left", "right"):
            raise ValueError(f"align must be 'left' or 'right', got {self.align!r}")
        if not isinstance(generator, torch.Generator):
            seed = 0 if generator is None else int(generator)
            self._seed: int | None = seed
            self.generator: torch.Generator | None = None  # made on the model's device lazily
        else:
            self._seed, self.generator = None, generator
        self._stream: NoiseStream | None = None
        self.shard = None if shard is None else (int(shard[0]), int(shard[1]))
        #: the causes this metric has warned of once (:meth:`_once`), kept by reset
        self._said: set[str] = set()
        #: the dtype of the clean outputs the classes were read from (:meth:`_warn_ties`)
        self._out_dtype: torch.dtype | None = None
        self.reset()

    # -- state ---------------------------------------------------------------------------------
    @_one_thread_at_a_time
    def reset(self) -> None:
        """Forget all accumulated examples and the calibration of checked precision (the random
        stream continues). The metric gets a new id (:meth:`merge`): its next examples are not
        those a metric it was merged into holds."""
        self.state = State()
        self._local = None
        self._check.reset()
        #: a random id of this metric's own examples, and the ids of every metric whose
        #: examples the state holds (its own included): :meth:`merge` refuses a repeat
        self._id = uuid.uuid4().hex
        self._ids = {self._id}
        #: the first numbers of the randomness this metric's own examples drew (None: none
        #: drawn since the reset), and those of every metric whose examples the state holds
        #: (:meth:`_held_marks`): two that start alike drew the same noise, copy for copy
        self._noise_mark: tuple[Any, ...] | None = None
        self._marks: set[tuple[Any, ...]] = set()
        self._stopped = 0  # update() calls stopped by target_stderr (_warn_stopping_bias)
        #: whether the state holds batches of an older pickle, which counted no copies
        #: (:meth:`_warn_few_events`)
        self._copies_uncounted = False
        self.untrimmed_batches = 0
        #: the patch grid the per-position profile is over (None: no patches recorded yet);
        #: ``_batch_grid``: the grid of the batch being measured, recorded when it is added
        self._grid: Grid | None = None
        self._batch_grid: Grid | None = None

    def __setstate__(self, state: dict[str, Any]) -> None:
        """A copy (``copy.deepcopy``, a pickle) gets an id of its own, its updates being other
        examples than the original's; it keeps the ids of the examples it holds (none if the
        original held none), so a copy made after measuring is refused where the original's
        examples are already, and copies of an empty metric merge freely."""
        self.__dict__.update(state)
        # an older pickle: no causes said yet, no batch counted at full width
        self.__dict__.setdefault("_said", set())
        self.__dict__.setdefault("untrimmed_batches", 0)
        self.__dict__.setdefault("_grid", None)  # an older pickle: no grid recorded
        self.__dict__.setdefault("_batch_grid", None)
        self.__dict__.setdefault("_out_dtype", None)
        # an older pickle: its caches are its model's, and its output_kind taken as given
        self.__dict__.setdefault("_caches_for", self.model)
        self.__dict__.setdefault("_output_kind_option", self.output_kind)
        # an older pickle's state counted no copies (State.copies read 0): not "none drawn"
        self.__dict__.setdefault("_copies_uncounted", "copies" not in vars(self.state))
        held = self._held_ids() if "_ids" in state else set()  # an older pickle: no ids
        self._id = uuid.uuid4().hex
        self._ids = held | {self._id}
        self.__dict__.setdefault("_noise_mark", None)  # an older pickle: no marks
        self.__dict__.setdefault("_marks", set())

    def _holds_examples(self) -> bool:
        return bool(self.state.n or (self._local is not None and self._local.n))

    def _held_ids(self) -> set[str]:
        """The ids of the metrics whose examples the state holds (none while it is empty)."""
        return set(self._ids) if self._holds_examples() else set()

    def _held_marks(self) -> set[tuple[Any, ...]]:
        """Where the noise of the examples the state holds started (:attr:`_noise_mark`: its
        own, and those merged in); none while it is empty, or sharded (a shard draws the whole
        batch's stream, as every other shard does: their copies' noise is one draw)."""
        if not self._holds_examples() or self.shard is not None:
            return set()
        own = {self._noise_mark} if self._noise_mark is not None else set()
        return set(self._marks) | own

    def _once(self, cause: str) -> bool:
        """Whether this metric has not yet warned of ``cause`` (from now on it has). A warning
        whose cause stays with the metric (its options, its model, its data) would otherwise be
        said at every ``update`` batch and again in every evaluation after a :meth:`reset` — a
        training loop's callback floods its logs, whatever the warning filter, as logging
        frameworks and pytest record with ``"always"`` — so such a cause is said once per
        metric; another cause, or a new metric object, is said again."""
        if cause in self._said:  # kept by reset(); an older pickle gets it in __setstate__
            return False
        self._said.add(cause)
        return True

    def _warn_stopping_bias(self) -> None:
        """Adaptive stopping stops each ``update`` batch on that batch's own standard error, with
        a small bias of order 1/n per batch, low or high (module docstring). Over many batches the
        bias stays while the standard error of the whole shrinks like 1/√batches: say so once per
        metric, not again after each :meth:`reset` (a training loop's evaluations would repeat
        it in every one, whatever the warning filter; other warnings are said as before)."""
        if self.target_stderr is None:
            return
        self._stopped = getattr(self, "_stopped", 0) + 1
        if self._stopped != STOPPING_WARN_BATCHES or not self._once("stopping bias"):
            return
        warnings.warn(
            f"target_stderr stops each update() batch on its own standard error, {self._stopped} "
            "batches so far: each stop leaves a small bias (a share of that batch's standard "
            "error: low where it stops on a small standard error, high where it stops on its "
            "10th flip), which stays as the batches add up while the standard error of the whole "
            "shrinks like 1/sqrt(batches), so over many batches the bias becomes a larger share "
            "of the reported standard error. For many batches, measure with fixed repeats (no "
            "target_stderr), or pass fewer, larger batches",
            UserWarning, stacklevel=_trim._user_level(),
        )

    @property
    def check_bound(self) -> float | None:
        """The calibrated margin below which checked precision (bf16 or int8) re-evaluates a
        copy in float32 (:mod:`._precision`); None before calibration or when no batch ran
        checked (``"auto"`` found that checking does not pay: the copies ran in float32)."""
        return None if self._check.idle else self._check.bound

    @property
    def bf16_bound(self) -> float | None:
        """:attr:`check_bound` when the checked precision is bf16, else None."""
        return self.check_bound if self._check.low == "bf16" else None

    @property
    def checked_precision(self) -> str | None:
        """The low precision the copies ran in and were checked against float32 (``"bf16"``
        or ``"int8"``), ``"float32"`` where ``"auto"``'s calibration found that checking does
        not pay here (or int8 found no layer to run), None where nothing ran checked."""
        if self._check.low is None:
            return None
        return "float32" if self._check.idle else self._check.low

    @property
    def float32_reason(self) -> str | None:
        """Why the copies run in float32 where checking was asked for
        (``checked_precision == "float32"``), in words: int8 found no layer to run, the static
        int8 copy could not be made, or ``"auto"``'s timed calibration found no gain (with the
        share it would re-check and what a checked copy would cost). None otherwise."""
        return self._check.why_idle if self._check.idle else None

    @property
    def recheck_fraction(self) -> float | None:
        """Share of the copies evaluated in checked bf16 that were evaluated again in float32
        (calibration included); None if no copy ran checked."""
        return self.state.forward_fp32 / self.state.checked if self.state.checked else None

    def merge(self, other: TokenSensitivity) -> TokenSensitivity:
        """Add ``other``'s accumulated state to this one (e.g. results of other processes).

        ``per_sample`` then lists this metric's examples, then ``other``'s (shards of one
        batch merged this way are not interleaved back: :meth:`all_reduce` does that).
        Both must measure the same quantity: the same noise level, ``compare`` rule, ``mode``,
        tokenization, ``replace_with`` vocabulary, decision rule (``output_kind``/``threshold``,
        output selector) and per-position alignment; otherwise a ValueError names the first
        difference. Profiles over patches must be over one grid (one image size): position k
        is another patch on another grid, so a merge of two is refused, naming both.
        Precision options (repeats, antithetic, control variate, token subsets) may differ:
        every one of them is unbiased for the same per-example rates, and the
        per-position profile weighs every token of every example alike whatever draws it had
        (``position_counts`` in this metric's copies per token: ``repeats``, or one with an
        ``allocation``). An
        ``Embedding`` module given as the object and one given by its dotted name are the same
        tokens when the name is the object's in the model.

        Every metric carries a random id and the ids of the metrics whose examples it holds
        (carried through merges and copies), so a merge that would count examples twice is
        refused: a metric merged into itself, the same metric merged twice, a metric that holds
        one merged before, or a copy (``copy.deepcopy``, a pickle) of a metric made after it
        measured merged back into it. A copy of a metric that held no examples yet gets an id
        of its own and merges freely; so does a metric after :meth:`reset`. Two metrics that
        hold the same per-example rates, every one of them (the same examples measured under
        the same seed, or the same ``shard``, by two processes), are merged with a warning, as
        :meth:`all_reduce` warns of two such ranks; so are two where every rate of the smaller
        one recurs, in order, from the start of one of the larger one's updates (at least two
        of them neither 0 nor 1, and too many to agree by chance: a run over the first 100
        examples merged with a run over 190 under the same seed), the warning naming how many
        repeat.

        Shards that overlap by some examples measured under other draws (another seed, or
        another place in the seed's stream: rank 0 on examples 0–99 and rank 1 on 90–189, a
        ``DistributedSampler`` padding an uneven dataset with its first examples) are **not
        detected**: the state holds one rate per example, and two measurements of one example
        under other noise agree only by chance, as two examples' rates do. They are counted
        twice, the standard error too small. Give every metric disjoint examples: its own
        slice, ``shard=(rank, world_size)`` over the same batches, or a
        ``DistributedSampler(drop_last=True)``.

        Metrics of other examples that drew the same noise — one seed from the same point of its
        stream (``generator=0``, the default, in every job of an array, or copies of one metric
        that had measured nothing) — are merged with a warning: the k-th copy of each got the
        same noise, their flips are correlated, and the standard error, which takes every
        example's draws as independent, is too small. Give each its own seed (or, over the
        same batches, ``shard=``). Each metric knows where its noise started since its last
        :meth:`reset` (its first numbers); sharded metrics share one stream by design.
        """
        self._refuse_other(other)
        with _lock(other):  # a snapshot: another thread may be adding a batch to ``other``
            theirs = dataclasses.replace(
                other.state, pos_sum=other.state.pos_sum.clone(),
                pos_cnt=other.state.pos_cnt.clone(), samples=list(other.state.samples))
            their_total = other._local is not None
            their_ids = other._held_ids()
            their_marks = other._held_marks()
            their_grid = other._grid
            their_dtype = getattr(other, "_out_dtype", None)
        with _lock(self):
            self._refuse_repeat(their_total, their_ids)
            if self._grid is not None and their_grid is not None and self._grid != their_grid:
                raise ValueError("cannot merge: " + _grid_mismatch(self._grid, their_grid,
                                                                   "the other metric's"))
            self._grid = self._grid or their_grid
            self._out_dtype = self._out_dtype or their_dtype
            twins = _same_rates(self.state.samples, theirs.samples)
            shared = bool(self._held_marks() & their_marks)
            self.state = merged(self.state, theirs, self.align,
                                self._profile_unit / other._profile_unit)
            self._ids |= their_ids
            self._marks |= their_marks
            self._copies_uncounted = self._copies_uncounted or getattr(
                other, "_copies_uncounted", False)
        twins, every = twins
        if twins and self._once("merged repeated"):
            held = (f"all {twins} of them" if every else
                    f"{twins} of them (all of the smaller one's, in the same order)")
            warnings.warn(
                f"this metric and the merged one hold the same per-example rates, {held}: "
                "most likely both measured the same examples with the same seed (or the same "
                f"shard=), and the merged state counts those {twins} twice (the standard error "
                "too small, by about sqrt(2) where every example repeats). Merge metrics of "
                "other examples: give each its own examples, or its own share of every batch "
                "(shard=(rank, world_size), one rank each), and keep one of two runs over the "
                "same examples (said once per metric)",
                RuntimeWarning, stacklevel=_trim._user_level())
        elif shared and self._once("shared noise"):
            warnings.warn(SHARED_NOISE.format(who="this metric and the merged one",
                                              how="generator=0, the default, on both, say"),
                          RuntimeWarning, stacklevel=_trim._user_level())
        return self

    @property
    def _profile_unit(self) -> float:
        """The weight of one real token of one example in this metric's per-position profile
        (``position_counts``): ``repeats`` copies each (per round, with ``num_tokens`` in
        expectation), one with an ``allocation`` (it counts tokens). :meth:`merge` and
        :meth:`all_reduce` count another metric's profile in this unit: counted as they come,
        the tokens of a metric with 8 repeats had weighed 8 times those of one with 1 (two
        halves flipping at rates 1 and 0 read 0.11 at every position, for an estimate of 0.5)."""
        return 1.0 if self.allocation else float(self.repeats)

    def _refuse_other(self, other: Any) -> None:
        """Raise where ``other`` is not a metric of the same quantity (or is this one)."""
        if not isinstance(other, TokenSensitivity):
            raise TypeError(f"can only merge a TokenSensitivity, got {type(other).__name__}")
        if other is self:
            raise ValueError(
                "cannot merge a metric into itself: its examples would count twice (a smaller "
                "standard error from the same examples); merge the other shards' metrics"
            )
        for name, a, b in _identity(self, other):
            if a != b:
                raise ValueError(
                    f"cannot merge: {name} {a!r} vs {b!r} — the two metrics measure different "
                    "quantities; build both with the same options"
                )

    def _refuse_repeat(self, their_total: bool, their_ids: set[str]) -> None:
        """Raise where a state (``their_total``: an all_reduce total; ``their_ids``: the ids
        of the metrics whose examples it holds) would count examples twice here."""
        for name, total in (("this metric", self._local is not None),
                            ("the other metric", their_total)):
            if total:
                raise ValueError(
                    f"cannot merge: {name} holds the total of an all_reduce, which would be "
                    "counted again; merge the processes' own metrics, or all_reduce alone"
                )
        if self._ids & their_ids:
            raise ValueError(
                "cannot merge: this metric already holds examples of the other one — it was "
                "merged here before, or it holds a metric merged here before, or it is a copy "
                "(copy.deepcopy, a pickle) of this metric made after it measured — and they "
                "would count twice (a smaller standard error from the same examples); merge "
                "each metric once, and copy a metric before it measures (or reset() the copy)"
            )

    # -- measuring -----------------------------------------------------------------------------
    @_one_measurement_at_a_time
    @torch.inference_mode()
    def update(self, inputs: Inputs, mask: Tensor | None = None) -> None:
        """Measure one batch of examples and add it to the state.

        ``inputs``: a tensor, a tuple (positional arguments) or a dict (keyword arguments) with
        the example axis first. ``mask``: (B, T) bool, true on real tokens (padding excluded);
        with ``trim_padding`` the positions after an example's last real token (by ``mask`` or,
        for a dict, its ``attention_mask``) are cut from every input tensor whose second axis
        is the token axis. Any other mapping (a tokenizer's ``BatchEncoding``) is read as the
        dict of its items.

        With :class:`~senslab.tokens.Patches`, every batch must make the grid of patches the
        per-position profile is over (the first batch's; images of one size): a batch of
        another image size is refused, naming both grids (measure it with a metric of its own,
        or resize it); ``mode="whole"`` records no profile and takes any size.

        An update that raises (a refused batch, a warning raised as an error, an interrupt)
        adds nothing: the state (after :meth:`all_reduce`, the total) and
        :attr:`untrimmed_batches` stay as they were; the random stream may have moved on.

        Calls from several threads run one at a time (the measurements' lock, see
        docs/measuring.md#one-model-several-threads, and one per metric): the counts stay
        right, but which batch draws which noise then follows the threads' scheduling, so the
        numbers are not reproducible. For reproducible numbers use one metric per thread, each
        with its own ``generator``, and :meth:`merge` them.
        """
        if isinstance(inputs, Mapping) and not isinstance(inputs, dict):
            inputs = dict(inputs)
        if batch_size(inputs) == 0:
            raise ValueError("empty batch: sensitivity needs at least one example")
        if mask is not None and not isinstance(mask, Tensor):
            raise TypeError(
                f"mask must be a (batch, tokens) bool tensor, got {type(mask).__name__}; "
                "e.g. mask=torch.tensor(...) or inputs['attention_mask'].bool()"
            )
        self._follow_model()
        device = check_device(self.model, inputs)
        if self.autocast is None and not self._float32_checked:
            self._float32_checked = True
            _warn_reduced_float32(self.model, device)
        # An update that raises adds nothing and leaves the metric as it was: the batch is added
        # to a copy (after all_reduce: of this process's own state), and an exception puts the
        # state before it back. A refusal after all_reduce had left the process's own state in
        # place of the total (2 ranks: compute() then read 7 of 13 examples), and an exception
        # after the batch was added (a warning raised as an error, an interrupt) had kept a
        # batch whose update the caller saw fail, counted again on a retry.
        before = (self.state, self._local, self.untrimmed_batches, self._grid)
        own = self._local if self._local is not None else self.state  # after all_reduce: own
        try:
            # the profile's tensors are replaced, never changed in place: a shallow copy will do
            self.state, self._local = dataclasses.replace(own, samples=list(own.samples)), None
            with float32_default():  # a bf16 default (a Lightning bf16-true step): float32 draws
                self._update_model(inputs, mask, device)
        except BaseException:
            self.state, self._local, self.untrimmed_batches, self._grid = before
            raise

    def _follow_model(self) -> None:
        """Forget what the metric learnt of a model it no longer measures (``metric.model =
        other``, an EMA or a reloaded model swapped in between two updates): the compiled
        copies (``compile=True`` ran the perturbed copies through the old model's compiled
        graph, 0.39 for a sensitivity of 0.078 measured with the clean outputs of the new
        one), the input shapes whose forwards were checked for randomness and batch
        independence (a swapped-in model with dropout in train mode had its dropout counted as
        flips, 0.375, where a metric of its own refuses it), the chunk sizes, the checked
        precision's calibration, and the decision rule the old model declared
        (``output_kind``, unless given as an option). The new model is checked as the first
        one was."""
        if self._caches_for is self.model:
            return
        _check_call_options(self.model, self.tokens, self.autocast, self.shard)
        kind = declared_kind(self.model, self._output_kind_option)
        check_head(self.model, self.compare, self._output_kind_option, self.output)
        self.output_kind, self._caches_for = kind, self.model
        self._compiled = None
        self._verified, self._batch_checked, self._per_copy = set(), set(), {}
        self._float32_checked = self._own_autocast_checked = False
        self._check.reset()

    def _update_model(self, inputs: Inputs, mask: Tensor | None, device: torch.device) -> None:
        """:meth:`update`'s work on the model: checks, mode, buffers, forwards."""
        module = isinstance(self.model, nn.Module)
        if module:
            _refuse_batch_statistics(self.model, self.eval_mode)
        mode = _eval(self.model) if module and self.eval_mode else nullcontext()
        # a forward may update buffers (in training mode, some in eval mode too): restore them
        kept = _kept_buffers(self.model) if module else nullcontext()
        probe = (_refuse_own_autocast(self.model, device)
                 if self.autocast is None and not self._own_autocast_checked else nullcontext())
        # each forward's mode, read at each module's call (not under compile=True, whose graphs
        # would break at every hook): a switch and a switch back (another thread's train(),
        # then eval()) between two forwards left the end's mode as it was; and the weights
        watched = modes_kept(self.model, hooks=not self.compile)
        try:
            try:
                with mode, kept, _own_forward(self.model), self._autocast(device), watched:
                    self._update(inputs, mask, device, probe)
            finally:
                self._rounding = None  # the batch's bound: never kept past its update
            self._own_autocast_checked = True
            self._warn_stopping_bias()
        except RuntimeError as err:
            if not missing_kernel(err, device):
                raise
            if self.autocast is None and self.precision != "bf16-checked":
                raise
            raise RuntimeError(
                f"the model failed in reduced precision on this CPU ({err}): its oneDNN has no "
                "bf16 kernel for one of the model's layers (an nn.LSTM on a CPU without "
                "AVX-512, say). Measure in float32: precision='float32' and no autocast= "
                "(senslab measure: --precision float32)"
            ) from err

    def _autocast(self, device: torch.device, low: bool = True) -> Any:
        """The precision the forwards run in: ``autocast``'s, else (or with ``low`` False)
        float32 — also inside a caller's autocast (a bf16-mixed validation step, say), which is
        switched off here, so the decisions never silently become bf16's."""
        if low and self.autocast is not None:
            return torch.autocast(device_type=device.type, dtype=self.autocast)
        try:
            return torch.autocast(device_type=device.type, enabled=False)
        except (RuntimeError, ValueError):  # a device type without autocast: nothing to undo
            return nullcontext()

    def _rng(self, device: torch.device, row: int) -> NoiseStream:
        if self.generator is None:
            # an int seed on the model's device; on a CPU one of 2**32 or more is refused, as
            # the CPU generator would read it as seed % 2**32 (another seed's numbers)
            self.generator = _seeded(self._seed, device)
        if self._stream is None or self._stream.row != row:
            self._stream = NoiseStream(self.generator, row, device)
        return self._stream

    def _update(self, inputs: Inputs, mask: Tensor | None, device: torch.device,
                probe: AbstractContextManager[Any]) -> None:
        # the modes the model's modules are measured in (the caller's, or eval()'s) belong to
        # the checked path: with eval_mode=False a model checked in eval() and measured after
        # model.train() (a training step between two updates) counted its dropout as flips,
        # 0.48 for 0.016, unchecked. Read before the clean forward: a switch during the
        # measurement is :func:`._options._eval`'s to refuse
        modes = _modes(self.model)
        with ExitStack() as stack:
            try:
                # left padding is judged here: refused by padding-aware batching (:meth:`_extent`),
                # else said after it, where the measurement goes on with the left-padded inputs
                with probe, left_padding_judged(), _refuse_no_decoder_inputs(self.model):
                    # probe: around the clean forward alone
                    bound = stack.enter_context(
                        self.tokens.bind(self.model, inputs, mask, output=self.output))
            except ValueError as err:
                if NO_PAD_TOKEN not in str(err):
                    raise
                raise ValueError(no_pad_id_message(self.model)) from err
            # judged before the batch's result is added (:meth:`_judge_rounding`), after the
            # bound's context has closed: held until then (:meth:`_update_model` lets it go)
            self._rounding = bound
            self._batch_grid = None if self.mode == "whole" else _grid(bound)
            if self._grid is not None and self._batch_grid not in (None, self._grid):
                raise ValueError(_grid_mismatch(self._grid, self._batch_grid, "this batch"))
            clean = bound.clean_output
            valid = bound.valid
            # the real tokens, for the right-aligned profile: mask= may perturb fewer of them
            real = valid if bound.padding is None else bound.padding | valid
            b, t = valid.shape
            _refuse_empty_tokens(self.tokens, t, bound.dim, inputs)
            check_rows(clean, b, "examples")
            check_finite(clean, "clean examples", self.compare)
            _refuse_padding_without_pad_id(self.model, bound, real, device)
            # every refusal of the clean outputs before the padding-aware batching's check,
            # whose warning would otherwise come first (an output of no class: a seq2seq model's
            # decoder logits)
            if self.compare == "class":
                self.kind = resolve_kind(clean, self.output_kind, self.threshold)
                self.kind_from_zero_one = inferred_from_zero_one(clean, self.output_kind)
                predictions(clean, self.kind, self.threshold)
            if (self.control_variate or self.allocation == "linear") \
                    and not clean.is_floating_point():
                option = ("control_variate=" + repr(self.control_variate)
                          if self.control_variate else "allocation='linear'")
                raise ValueError(
                    f"{option} follows the model's logits along their tangent, but the model "
                    f"returns class labels ({clean.dtype}): return the logits, or drop "
                    f"{option}")
            if self.replace_with is not None and self.replace_with.shape[1] != bound.dim:
                raise ValueError(
                    f"replace_with rows have {self.replace_with.shape[1]} entries but a token has "
                    f"{bound.dim}; pass a (vocabulary, {bound.dim}) tensor"
                )
            if not valid.any(dim=1).all():
                empty = (~valid.any(dim=1)).nonzero().flatten().tolist()
                raise ValueError(
                    f"examples {empty[:5]} have no real token (the mask is all padding); "
                    "drop them or fix the mask"
                )
            whole = self.mode == "whole"
            self._refuse_huge_plan(valid)
            stream = self._rng(device, t * bound.dim if whole else bound.dim)
            extent = self._extent(bound, clean)
            said = getattr(bound, "warn_left_padding_read", None)
            if callable(said):  # not refused: left-padded inputs the model misreads are said
                said()
            if extent is not None and (self.autocast is not None or _reduced(self.model)
                                       or clean.dtype in (torch.bfloat16, torch.float16)):
                # the reference at each example's own width, in the copies' precision (an
                # autocast, or a bf16/fp16 model's own, also where it returns float32 outputs;
                # the chunks then hold one width, :class:`ChunkRunner`): bf16's rounding
                # moves with the width, and a copy must differ from its reference by its noise
                # alone (a near-tie read at full width made 78% of one example's copies flip,
                # 27% alone)
                clean = _trim.clean_cut(bound, extent, clean)
                check_finite(clean, "clean examples", self.compare)
            ties = None
            if self.compare == "class":
                ref = predictions(clean, self.kind, self.threshold)
                # the clean classes that are ties, from the outputs the copies are compared
                # with (at each example's width, in the copies' precision, where cut above)
                ties = _Ties(clean, ref, self.kind, self.threshold)
                self._out_dtype = clean.dtype
            else:  # a float64 model's distances are taken in float64: tiny ones are differences
                ref = clean.double() if clean.dtype == torch.float64 else clean.float()
                self._warn_label_distance(clean)
            control = None
            if self.control_variate or self.allocation == "linear":
                assert self.sigma is not None
                control = LinearControl(bound, ref, self.sigma, 32, self.kind, self.threshold,
                                        extent)
            shape = (_shapes(inputs), whole, self.autocast, extent is not None, modes)
            if shape not in self._verified:  # once per input shape and mode
                # every copy in a forward of its own (chunk_size=1, no checked precision
                # gathering re-checks, no tangent of the batch): nothing shares a forward, so
                # the batch check is moot (the zero-noise copies still face the clean batch)
                path = (whole, self.autocast, extent is not None, modes)
                alone = (self.chunk_size == 1 and self.precision == "float32"
                         and not self.control_variate and not self.allocation) \
                    or path in self._batch_checked
                if self.eval_mode:
                    verify_copies(bound, clean, whole, extent, self.autocast is not None,
                                  alone=alone)
                else:  # the model's own mode: batch statistics may differ, randomness may not
                    verify_deterministic(bound, clean, whole, extent, self.autocast is not None,
                                         alone=alone)
                self._verified.add(shape)
                self._batch_checked.add(path)
            check = self._checked(bound, clean, device)
            key = (*shape, check is None)
            if self.allocation:
                with _Runner(self, bound, stream, ref, whole, device, None,
                             self._per_copy.get(key), check, ties=ties) as runner:
                    if control is None:
                        self._sampled(runner, valid, stream, extent, check, real, ties)
                    else:
                        self._allocated(runner, control, valid, stream, extent, check, real,
                                        ties)
                    self.last_chunk_size = runner.chunk
                    if runner.per_copy is not None:
                        self._per_copy[key] = runner.per_copy
                return
            # per round: values, examples, tokens, owned, and which copies are events
            # (:func:`_events`, elementwise: found once per round, not again over all rounds)
            parts: list[tuple[Tensor, Tensor, Tensor, Tensor, Tensor]] = []
            rounds = 0
            with _Runner(self, bound, stream, ref, whole, device, control,
                         self._per_copy.get(key), check, ties=ties) as runner:  # restores model
                while True:
                    src, tok = self._plan(valid, stream)
                    own = self._owned(src)
                    vals = runner.run(src, tok, own, extent)
                    parts.append((vals, src, tok, own, _events(vals, src, tok, control)))
                    rounds += 1
                    if not self._more(parts, valid, rounds):
                        break
            self.last_chunk_size = runner.chunk
            if runner.per_copy is not None:
                self._per_copy[key] = runner.per_copy  # later batches of this shape: no probe
        vals, src, tok, own, changed = (torch.cat(x) for x in zip(*parts, strict=True))
        mine = None
        if self.shard is not None:
            keep = own.nonzero().flatten()
            changed = changed[keep]
            mine = self._owned(torch.arange(b, device=device))
            src, tok, vals = src[keep], tok[keep], vals[keep]
            b = int(mine.sum())
            remap = torch.cumsum(mine.long(), 0) - 1  # global example → local row
            valid, real, src = valid[mine], real[mine], remap[src]
        forward = b * (2 if self.control_variate else 1) + len(src)
        checked = (0, 0) if check is None else check.take_counts()
        events = (_varying_pairs(vals, src, tok, valid, self._per_cell(rounds), self.group)
                  if self._pairs_vary() else int(changed.sum()))
        floor = 0.0
        if self._floored(events, len(changed)):  # events: the flips where mirrored
            floor = _alloc.zero_floor(*self._draws(src, tok, valid))  # never with shard
        tie_counts = None if ties is None else ties.counts(mine)
        self._add(vals, src, tok, valid, self._per_cell(rounds), forward, checked, real, rounds,
                  events, floor, tie_counts)

    def _allocated(self, runner: ChunkRunner, control: LinearControl, valid: Tensor,
                   stream: NoiseStream, extent: Tensor | None,
                   check: PrecisionCheck | None, real: Tensor,
                   ties: _Ties | None = None) -> None:
        """One batch with ``allocation="linear"`` (:mod:`._alloc`): rounds of draws spread by
        the linearised flip probabilities, Horvitz–Thompson weighted per token."""
        b = valid.shape[0]
        per_unit = 2 if self.antithetic else 1
        per_round = self.budget * int(valid.sum()) * per_unit
        cap = self.max_forward or 2 * b + DEFAULT_MAX_ROUNDS * per_round
        counts = torch.zeros(valid.shape, dtype=torch.float64, device=valid.device)
        events = 0

        def evaluate(src: Tensor, tok: Tensor) -> Tensor:
            nonlocal events
            vals = runner.run(src, tok, torch.ones_like(src, dtype=torch.bool), extent)
            counts.index_put_((src.to(counts.device), tok.to(counts.device)),
                              torch.ones(len(src), dtype=torch.float64, device=counts.device),
                              accumulate=True)
            events += int((vals != 0).sum())
            return vals

        y, var, copies, kappa = _alloc.linear_rounds(
            control.x, valid, self.budget, stream.gen, evaluate, per_unit=per_unit,
            target=self.target_stderr, max_copies=cap - 2 * b, rounds_at_zero=ROUNDS_AT_ZERO,
            mirrored=self._mirrored())
        self.last_tangent_scale = kappa
        floor = _alloc.zero_floor(counts, valid) if self._floored(events, copies) else 0.0
        self._add_tokens(y, var, valid, 2 * b + copies, check, real, copies, events, floor,
                         None if ties is None else ties.counts())

    def _sampled(self, runner: ChunkRunner, valid: Tensor, stream: NoiseStream,
                 extent: Tensor | None, check: PrecisionCheck | None, real: Tensor,
                 ties: _Ties | None = None) -> None:
        """One batch with ``allocation="uniform"`` (:class:`._alloc.Sampled`): a ``budget``
        share of every example's tokens, one draw each (a quarter of them two); with a target,
        rounds up to the share the variance so far predicts for it (at least ``budget`` more
        each) until the standard error reaches it; once every token is in, rounds of the draws
        per token it predicts (:meth:`._alloc.Sampled.run`)."""
        b = valid.shape[0]
        plan = _alloc.Sampled(valid, stream.gen, self.budget)
        # by default as many forwards as 64 rounds of one draw for every token
        cap = self.max_forward or b + DEFAULT_MAX_ROUNDS * int(valid.sum())

        def evaluate(src: Tensor, tok: Tensor) -> Tensor:
            return runner.run(src, tok, torch.ones_like(src, dtype=torch.bool), extent)

        plan.run(evaluate, self.target_stderr, cap - b, ROUNDS_AT_ZERO, self._mirrored())
        pairs = int((plan.cnt >= 2).sum())
        if self.target_stderr is None and self.estimand == "subset" and not plan.full \
                and pairs < _alloc.MIN_PAIRS and self._once("uniform pairs"):
            # the cause (batches too small for the budget, without a target) is the metric's:
            # said once, not at every batch and every evaluation (:meth:`_once`)
            warnings.warn(
                f"allocation='uniform' drew fewer than {_alloc.MIN_PAIRS} tokens of a batch "
                "twice: its (subset) standard error rests on them, and with few it is often far "
                "too small, even 0 with flips seen. Pass target_stderr= (rounds until enough "
                "pairs), measure more examples per update, or use repeats= without allocation "
                "(said once per metric: later batches like it are not said again)",
                RuntimeWarning, stacklevel=_trim._user_level())
        floor = (_alloc.zero_floor(plan.cnt, valid)
                 if self._floored(plan.events, plan.copies) else 0.0)
        self._add_tokens(*plan.values(), valid, b + plan.copies, check, real, plan.copies,
                         plan.events, floor, None if ties is None else ties.counts())

    def _add_tokens(self, y: Tensor, var: Tensor, valid: Tensor, forward: int,
                    check: PrecisionCheck | None, real: Tensor | None = None, copies: int = 0,
                    events: int = 0, floor: float = 0.0,
                    ties: _TieCounts | None = None) -> None:
        """Add one batch measured token by token (an allocation) to the state: each real
        token's unbiased value ``y`` and variance share ``var`` (B, T), ``forward`` passes;
        ``copies``, ``events`` and ``floor``: :func:`._stats.accumulate_tokens`'s; ``ties``:
        :meth:`_add_ties`'s."""
        self._judge_rounding()
        checked = (0, 0) if check is None else check.take_counts()
        accumulate_tokens(self.state, y, var, valid, positions=self.align, real=real,
                          copies=copies, events=events, floor=floor,
                          ties=None if ties is None else ties.said)
        self._add_ties(ties)
        self.state.forward += forward
        self.state.checked += checked[0]
        self.state.forward_fp32 += checked[1]
        if self._batch_grid is not None:
            self._grid = self._batch_grid

    def _checked(self, bound: Any, clean: Tensor, device: torch.device) -> PrecisionCheck | None:
        """The checked-bf16 state if this batch runs in it (:mod:`._precision`), after
        calibrating on the clean examples when the bound is not yet known."""
        low = _precision.checked(self, device, clean)
        if low is None:
            return None
        if not bool(torch.isfinite(clean).all()):  # -inf entries: masked classes
            # a checked precision's margins and bands are sizes of the outputs: infinite here,
            # so its band would not be a bound; "auto" keeps such a batch in float32
            if self.precision == "auto":
                return None
            raise ValueError(
                f"precision={self.precision!r} with -inf in the model's outputs (classes "
                "masked out with -inf): the checked precision bounds its error by the size of "
                "the outputs, which -inf makes infinite. Pass precision='float32', or clamp the "
                "masked entries to a large finite value (output=lambda o: o.clamp(min=-1e4))")
        b = bound.valid.shape[0]
        if self.allocation:  # rounds sized as they go: the first is a share budget of the tokens
            copies = int(bound.valid.sum() * self.budget)
        else:
            copies = (b if self.mode == "whole" else int(bound.valid.sum())) * self.repeats
        self._check.use(*low, model=self.model, copies=copies,
                        reuse=bool(getattr(bound, "reuse", False)) and self.mode != "whole")
        if self._check.idle:
            return None
        self._check.take_counts()  # nothing left over from a failed update
        n = min(len(clean), _precision.CALIBRATION_CLEAN)

        def forward() -> Tensor:  # the clean examples, through the copies' code path
            zero = torch.zeros(n, bound.valid.shape[1], bound.dim, device=device)
            return bound.forward_perturbed(torch.arange(n, device=device), None, zero)

        if self._check.wants_inputs:
            self._check.build(self._static_inputs(bound, n, device))
        self._check.calibrate_clean(forward, clean[:n], device, self.kind, self.threshold)
        return None if self._check.idle else self._check

    def _static_inputs(self, bound: Any, n: int, device: torch.device) -> Tensor | None:
        """Whole perturbed copies of the first ``n`` examples — :data:`STATIC_COPIES` of them,
        each with σ-noise on one real token — on which checked int8 calibrates its static copy
        (:class:`._int8.StaticInt8`); their noise comes from a generator of its own, so the
        metric's stream is untouched. None where there is no σ (``replace_with``) or the
        tokenization passes no whole tensor to the model."""
        if self.sigma is None:
            return None
        g = torch.Generator().manual_seed(0)
        src = torch.arange(n).repeat(-(-STATIC_COPIES // n))[:STATIC_COPIES]
        tok = torch.multinomial(bound.valid.cpu()[src].float(), 1, generator=g).flatten()
        noise = torch.randn(len(src), bound.dim, generator=g) * self.sigma
        captured: list[Tensor] = []

        def capture(*args: Any, **kwargs: Any) -> Tensor:  # stands in for the model
            # keeps the copies of a one-tensor call; a dict input's keyword call (Patches on
            # {"pixel_values": x, …}) cannot reach the static copy, which takes one tensor
            if len(args) == 1 and not kwargs and isinstance(args[0], Tensor):
                captured.append(args[0])
            first = next(v for v in (*args, *kwargs.values()) if isinstance(v, Tensor))
            return torch.zeros(len(first), 1, device=device)

        model, reuse = bound.model, getattr(bound, "reuse", None)
        bound.model = capture
        if reuse is not None:
            bound.reuse = False  # whole copies, not local reuse's patches
        try:
            bound.forward_perturbed(src.to(device), tok.to(device), noise.to(device))
        finally:
            bound.model = model
            if reuse is not None:
                bound.reuse = reuse
        return torch.cat(captured) if captured else None

    def _extent(self, bound: Any, clean: Tensor) -> Tensor | None:
        """Per-example widths for padding-aware batching (:mod:`._trim`), or None: switched
        off, nothing to cut, or cutting changed the clean outputs (counted in
        :attr:`untrimmed_batches`; with a warning, once per metric and kind of change: whether
        the model reads its padding is the model's, the same at every batch)."""
        self.last_trimmed = False
        if not self.trim_padding:
            return None
        if getattr(bound, "reuse", False) and self.mode == "token":
            return None  # prefix reuse already reads each copy up to its last real token
        extent = _trim.extents(bound)
        if extent is None:
            return None
        # whether the model reads the padding is the model's question, asked in float32 under
        # autocast: in bf16 an exact cut moves small outputs by more than any tolerance of
        # bf16's rounding could tell from reading the padding (MiniLM's logits: 0.0078)
        with self._autocast(clean.device, low=False):
            if self.autocast is not None:
                b, t = bound.valid.shape
                clean = bound.forward_perturbed(
                    torch.arange(b, device=clean.device), None,
                    torch.zeros(b, t, bound.dim, device=clean.device))
            # a bf16/fp16 model computes in its precision whatever its outputs' dtype
            found = _trim.check(bound, extent, clean, low_precision=_reduced(self.model))
        if found is not None:
            self.untrimmed_batches += 1
            kind, reason = found
            # the model's own padding mask: it should not matter
            if bound.padding is not None and self._once(f"untrimmed: {kind}"):
                _trim.warn_untrimmed(reason)
            # a ``mask`` alone may leave out real tokens (an end token, `=`): full width, quietly
            return None
        self.last_trimmed = True
        return extent

    def _add(
        self, vals: Tensor, src: Tensor, tok: Tensor, valid: Tensor, per_cell: int | None,
        forward: int, checked: tuple[int, int] = (0, 0), real: Tensor | None = None,
        rounds: int = 1, events: int | None = None, floor: float = 0.0,
        ties: _TieCounts | None = None,
    ) -> None:
        """Add one batch's copies to the state (:mod:`.compare` defers this until every model
        has measured the batch); ``checked``: copies run in checked bf16 and their float32
        re-evaluations; ``events`` and ``floor``: :func:`._stats.accumulate`'s; ``ties``:
        :meth:`_add_ties`'s."""
        self._judge_rounding()
        accumulate(
            self.state, vals, src, tok, valid, group=self.group, per_cell=per_cell,
            positions=None if self.mode == "whole" else self.align,
            num_tokens=self.num_tokens if self.mode == "token" else None, real=real,
            rounds=rounds, events=events, floor=floor, ties=None if ties is None else ties.said,
        )
        self._add_ties(ties)
        self.state.forward += forward
        self.state.checked += checked[0]
        self.state.forward_fp32 += checked[1]
        if self._batch_grid is not None:
            self._grid = self._batch_grid

    def _add_ties(self, ties: _TieCounts | None) -> None:
        """Add a batch's flipped copies to the state, those of examples whose clean class is a
        tie (:class:`_Ties`) and every example's; how many such examples, and the sum of their
        rates, are added with the rates (:func:`._stats.accumulate`). They are sums, so they
        merge and all-reduce with the state (:meth:`_warn_ties` reads them)."""
        if ties is not None:
            self.state.flips += ties.flips
            self.state.tie_flips += ties.theirs

    def _judge_rounding(self) -> None:
        """Before a batch's result is added: the low-precision rounding of its noise judged on
        every copy, however few (:meth:`~senslab.tokens.base.BoundTokens.judge_rounding`)."""
        bound = getattr(self, "_rounding", None)
        if bound is not None:
            self._rounding = None  # once per batch (compare adds it later, judged already)
            bound.judge_rounding()

    @property
    def group(self) -> int:
        """Copies per i.i.d. unit (:func:`._stats.units`): all ``repeats`` draws of a sampled
        token (``num_tokens``), an antithetic pair, or one copy."""
        if self.mode == "token" and self.num_tokens is not None:
            return self.repeats
        return 2 if self.antithetic else 1

    def _per_cell(self, rounds: int) -> int | None:
        """Units per real token when every token got the same draws (stratified), else None."""
        if self.mode == "whole" or self.num_tokens is not None:
            return None
        return rounds * self.repeats // (2 if self.antithetic else 1)

    def _more(self, parts: list[tuple[Tensor, ...]], valid: Tensor, rounds: int) -> bool:
        """Adaptive stopping: another round while the batch's subset s.e. exceeds the target.
        ``parts``: the rounds so far, each (values, examples, tokens, owned, events). The flips
        counted for the :data:`._alloc.MIN_FLIPS` guard are the events (:func:`_events`), the
        values that vary: with the control variate, the copies whose flip differs from the
        tangent's (an adjusted value v − c + q is nonzero on nearly every copy, and the guard
        never held)."""
        if self.target_stderr is None:
            return False
        b = valid.shape[0]
        per_round = len(parts[0][1])
        spent = b + rounds * per_round
        cap = self.max_forward or b + DEFAULT_MAX_ROUNDS * per_round
        if spent + per_round > cap:
            return False
        vals, src, tok = (torch.cat([p[i] for p in parts]) for i in range(3))
        u, usrc, utok = _units(vals, src, tok, self.group)
        within = _within_variance(u, usrc, utok, valid, self._per_cell(rounds)).sum().item()
        se = math.sqrt(max(within, 0.0)) / b if math.isfinite(within) else math.inf
        # a standard error estimated from a handful of flips is too noisy to stop on, and one
        # of no flip at all ends the rounds only once the rule of three allows it
        flips = self._flips(parts, valid, rounds)
        if self._mirrored():  # as few copies that kept the class are as little to learn from
            flips = min(flips, int((vals == 0).sum()))
        counts, cells = self._draws(src, tok, valid) if flips == 0 else (None, valid)
        more = se > self.target_stderr or (se == 0.0 and rounds < ROUNDS_AT_ZERO) \
            or not _alloc.enough_flips(flips, counts=counts, valid=cells,
                                       target=self.target_stderr)
        return more and self._room(rounds, per_round, spent, se, valid.device)

    def _room(self, rounds: int, per_round: int, spent: int, se: float,
              device: torch.device) -> bool:
        """Whether another round of ``per_round`` copies fits in ``device``'s free memory: the
        rounds' copies are kept until the batch is added (about :data:`PLAN_BYTES` bytes each,
        :meth:`_refuse_huge_plan`), and a tiny ``target_stderr`` with a huge ``max_forward``
        grew them round after round into torch's raw out-of-memory error. Where it does not fit,
        the rounds end there as at ``max_forward``, said once per metric."""
        kept = rounds * per_round
        if (kept + per_round) * PLAN_BYTES <= PLAN_FLOOR:
            return True
        # the kept copies are in memory already: the next round, and all rounds joined
        need = (kept + 2 * per_round) * (PLAN_BYTES // 2)
        free = free_memory(device)
        if need <= free:
            return True
        if self._once("rounds memory"):
            warnings.warn(
                f"target_stderr={self.target_stderr} was not reached: a batch's rounds ended "
                f"after {rounds} ({kept:,} perturbed copies, {spent:,} forwards, standard error "
                f"{se:.4g}), as another round's copies would need about {need / 2**30:,.1f} GiB, "
                f"more than the {free / 2**30:,.1f} GiB free on {device}. The batch is measured "
                "with the rounds done, as where max_forward ends them: its standard error is "
                f"short of the target. Pass max_forward={spent} or less (the rounds "
                "then end the same way without this warning), a larger target_stderr, or fewer "
                "tokens (num_tokens=) or examples per update. Said once per metric",
                RuntimeWarning, stacklevel=_trim._user_level())
        return False

    def _pairs_vary(self) -> bool:
        """Whether the events are antithetic pairs that vary (:func:`_varying_pairs`): flips
        compared with antithetic draws and no control variate (which has its own events)."""
        return self.antithetic and self.control_variate is None and self.compare == "class"

    def _mirrored(self) -> bool:
        """Whether the events are the flips themselves (class decisions, no control variate, no
        antithetic pairs), so that every copy flipped is the mirror of none: a standard error
        rests on the copies of the rarer outcome, kept classes as much as flips."""
        return self.compare == "class" and self.control_variate is None \
            and not self._pairs_vary()

    def _floored(self, events: int, copies: int) -> bool:
        """Whether a batch of ``copies`` with ``events`` events reports the rule of three's
        standard error (:func:`._alloc.zero_floor`): with a target, where it saw no event or
        (its mirror, :meth:`_mirrored`) every copy flipped. A standard error of 0 from either
        is no evidence, and the floor is symmetric in p and 1 − p (1.0 ± 0 stopped 18.5% of
        runs at a rate of 0.9, its intervals covering 79.5%)."""
        return self.target_stderr is not None and (
            events == 0 or (self._mirrored() and events == copies))

    def _flips(self, parts: list[tuple[Tensor, ...]], valid: Tensor, rounds: int) -> int:
        """The events of the rounds so far (``parts`` as for :meth:`_more`): the standard error
        learns from them, and a few of them are too few to trust it."""
        if self._pairs_vary():
            vals, src, tok = (torch.cat([p[i] for p in parts]) for i in range(3))
            return _varying_pairs(vals, src, tok, valid, self._per_cell(rounds), self.group)
        return int(torch.cat([p[4] for p in parts]).sum())

    def _draws(self, src: Tensor, tok: Tensor, valid: Tensor) -> tuple[Tensor, Tensor]:
        """Draws (copies, not units) per real token of the copies (src, tok), and the real
        tokens, as :func:`._alloc.zero_bound` takes them; with ``mode="whole"`` an example is
        one token (its noise lands on all of them at once)."""
        if self.mode == "whole":
            valid = torch.ones(valid.shape[0], 1, dtype=torch.bool, device=valid.device)
        counts = torch.zeros(valid.shape, dtype=torch.float64, device=src.device)
        counts.index_put_((src, tok), torch.ones_like(src, dtype=torch.float64), accumulate=True)
        return counts, valid

    def _warn_label_distance(self, clean: Tensor) -> None:
        """Say, once per metric, that integer outputs are measured by a distance: a model that
        returns class labels (a ``predict``'s argmax) had its label changes counted by their
        numbering (3 → 1 a distance of 2, 3 → 2 of 1) without a word. Counts or other
        integer-valued quantities are measured as they are; bool outputs are not said (their
        distance is the change itself)."""
        if clean.is_floating_point() or clean.is_complex() or clean.dtype == torch.bool \
                or getattr(self, "_said_label_distance", False):
            return
        self._said_label_distance = True
        warnings.warn(
            f"compare={self.compare!r} measures how far the outputs move, and the model returns "
            f"integers ({str(clean.dtype).removeprefix('torch.')}): if they are class labels, "
            "a change is counted by the labels' numbering (3 → 1 twice 3 → 2), not as one "
            "change; use compare='class' to count label changes (or return the logits). "
            "Integer-valued quantities (counts) are measured as they are. Said once per metric",
            UserWarning, stacklevel=_trim._user_level())

    def _refuse_huge_plan(self, valid: Tensor) -> None:
        """Refuse, before any perturbed forward, a round whose plan (:meth:`_plan`) and
        per-copy results cannot fit in the free memory of ``valid``'s device: every copy holds
        its example, token, value and flags (about :data:`PLAN_BYTES` bytes, twice where the
        rounds are joined). ``repeats=10**14`` ended in torch's "can't allocate memory: you
        tried to allocate 8000000000000000 bytes", from inside :meth:`_plan`."""
        if self.allocation:
            return  # budget= sizes those rounds as they go
        b = valid.shape[0]
        if self.mode == "whole":
            cells = b
        elif self.num_tokens is not None:
            cells = int(valid.sum(dim=1).clamp(max=self.num_tokens).sum())
        else:
            cells = int(valid.sum())
        copies = cells * self.repeats
        need = copies * PLAN_BYTES
        free = free_memory(valid.device)
        # where the free memory cannot be read (no /proc/meminfo: 1 GiB is assumed) a plan of
        # a few GiB may still fit: only what no such machine holds is refused there
        if need <= max(free, PLAN_FLOOR):
            return
        fewer = max(free // max(cells * PLAN_BYTES, 1), 1)
        raise ValueError(
            f"repeats={self.repeats} makes {copies:,} perturbed copies of this batch "
            f"({cells:,} {'examples' if self.mode == 'whole' else 'tokens'} x {self.repeats} "
            f"draws), whose plan and results need about {need / 2**30:,.1f} GiB, more than "
            f"the {free / 2**30:,.1f} GiB free on {valid.device}. Measure with fewer repeats "
            f"(at most about {fewer:,} here; senslab measure: a smaller --repeats), fewer "
            "tokens per example (num_tokens=), "
            "fewer examples per update, or adaptive stopping (target_stderr= with a small "
            "repeats: rounds of repeats draws until the standard error is reached)"
        )

    def _plan(self, valid: Tensor, stream: NoiseStream) -> tuple[Tensor, Tensor]:
        """Which example (src) and token (tok) each perturbed copy has, sample-major."""
        b, t = valid.shape
        if self.mode == "whole":
            src = torch.arange(b, device=valid.device).repeat_interleave(self.repeats)
            return src, torch.zeros_like(src)
        chosen = valid
        if self.num_tokens is not None and self.num_tokens < t:
            # float32 whatever the default dtype: a float64 default drew other token subsets
            scores = torch.rand(b, t, generator=stream.gen, device=stream.gen.device,
                                dtype=torch.float32)
            scores = scores.to(valid.device).masked_fill(~valid, float("inf"))
            rank = scores.argsort(dim=1).argsort(dim=1)
            chosen = valid & (rank < self.num_tokens)
        cells = chosen.nonzero()
        rep = self.repeats
        return cells[:, 0].repeat_interleave(rep), cells[:, 1].repeat_interleave(rep)

    def _owned(self, src: Tensor) -> Tensor:
        if self.shard is None:
            return torch.ones_like(src, dtype=torch.bool)
        rank, world = self.shard
        return src % world == rank

    def _compiled_model(self) -> Any:
        # compiled from the model measured now (:meth:`_follow_model`), never an earlier one
        if self._compiled is None or self._compiled._model is not self.model:
            self._compiled = CompiledModel(self.model)
        return self._compiled

    @_one_thread_at_a_time
    def all_reduce(self, group: Any = None) -> TokenSensitivity:
        """Sum the state over all processes of ``torch.distributed`` (every rank then holds the
        total; per-sample rates are gathered in the one-process order). Each rank keeps its own
        state beside the total: a later ``update`` adds to its own state, and another
        ``all_reduce`` (an interim value, then the final one) sums the ranks' own states again,
        never a total twice.

        Refused with a ValueError (on every rank alike, before anything is summed) where the
        ranks measure different quantities (the options :meth:`merge` requires equal), or where
        sharded ranks do not add up to one measurement: shards that are not one each of
        ``(0, world) … (world − 1, world)`` for the group's ``world`` processes, some ranks
        sharded and others not, or different numbers of ``update`` calls (a rank that skipped
        a batch leaves its share out of the one-process result), or where two ranks' profiles
        are over two grids of patches (images of another size; every rank's grid is compared
        with every other's, and a rank that measured no patches agrees with any). Ranks without
        ``shard`` that measured their own data may differ in batches: ``per_sample`` then lists
        rank 0's examples, then rank 1's, … (interleaved where every update's examples are the
        shares of one batch, as a ``DistributedSampler`` deals them); two of them that hold the same
        per-example rates, every one (the same examples under the same seed, counted twice),
        are warned of. Ranks whose examples overlap only in part are **not detected** and the
        overlap counts twice (see :meth:`merge`): among them a ``DistributedSampler`` with the
        default ``drop_last=False``, which pads an uneven dataset by repeating its first
        examples on the last ranks (7 examples on 2 processes: 8, one of them twice). Use
        ``DistributedSampler(drop_last=True)`` (it drops up to world − 1 examples instead), or
        give every rank the same batches with ``shard=(rank, world_size)``, which counts every
        example once (or :class:`~senslab.integrations.torchmetrics.TokenSensitivityMetric`
        with ``index=``, which skips repeats). Unsharded ranks whose noise started alike (one
        ``generator=`` seed on every rank) are warned of, as :meth:`merge` warns: seed each
        rank, ``generator=seed + 1_000_003 * rank``. The per-position profile counts in rank 0's
        copies per token, as :meth:`merge` counts in its metric's."""
        local = self._local if self._local is not None else self.state
        about = {"identity": [(name, repr(a)) for name, a, _ in _identity(self, self)],
                 "shard": self.shard, "unit": self._profile_unit, "grid": self._grid,
                 "marks": sorted(self._held_marks_local(local))}
        self.state = all_reduced(local, self.align, group, about, self._say_repeated,
                                 _refuse_ranks_grids)
        self._local = local
        return self

    def _held_marks_local(self, local: State) -> set[tuple[Any, ...]]:
        """:meth:`_held_marks` of this process's own state ``local``."""
        if not local.n or self.shard is not None:
            return set()
        return set(self._marks) | ({self._noise_mark} if self._noise_mark is not None else set())

    def _say_repeated(self, message: str) -> None:
        """Warn (once per metric and cause: a loop's evaluations would repeat it) that two
        ranks hold the same examples (:func:`._stats.repeated_ranks`), or drew the same noise
        for theirs (:func:`._stats.shared_noise_ranks`)."""
        if self._once("ranks shared noise" if message.startswith("ranks") and " drew the same "
                      "noise" in message else "ranks repeated"):
            warnings.warn(message, RuntimeWarning, stacklevel=_trim._user_level())

    @_one_thread_at_a_time
    def compute(self) -> SensitivityResult:
        """The estimate over everything accumulated since the last :meth:`reset` (waits for an
        ``update`` another thread runs: the state is read whole, never half-added). Warns, once
        per metric, where the data standard error is NaN for one example
        (:meth:`_warn_one_example`), where the fixed-subset one is NaN for a single unit of
        draws (:meth:`_warn_one_unit`), where flips of examples whose clean class is a tie are
        counted (:meth:`_warn_ties`), and where the standard error rests on fewer than
        :data:`._alloc.MIN_FLIPS` flips (:meth:`_warn_few_events`)."""
        r = result(self.state, self.estimand, self.align, self.compare == "class", self.sigma)
        self._warn_one_example(r)
        self._warn_one_unit(r)
        self._warn_ties(r)
        self._warn_few_events(r)
        self._warn_no_spread(r)
        return r

    def _warn_ties(self, r: SensitivityResult) -> None:
        """Say, once per metric (:meth:`_once`), that the result counts flips of examples whose
        clean class is a tie (:class:`_Ties`; :func:`~senslab.measure.outputs.tie_breaks`, the
        rule output sharpness says ShPred's by): two classes with equal clean outputs (one
        column exactly on its boundary: a blank input under a head without bias), whose clean
        class is the tie-break, flip about half the time at any sigma, however small, so the
        sensitivity does not go to 0 with sigma (5 blank examples of 16 under a linear head
        without bias: 0.16 at sigma 1e-4 and 1e-2, every flip theirs). In bf16/fp16 outputs,
        the ties that rounding decides. The number is left as it is (the rate at which the
        prediction changes, as ShPred counts it); the warning names how many examples tie,
        their flipped copies out of all, and the sensitivity over the other examples. The
        counts are the state's (merged and all-reduced with it); the dtype the wording
        follows is this process's clean outputs'."""
        st = self.state
        if not st.ties or not self._once("ties"):
            return
        n, b = st.ties, st.n
        others = st.s1 - st.tie_rates  # both float64 sums of the same rates
        if abs(others) <= 1e-12 * abs(st.s1):  # no other example flipped: their rates are 0
            others = 0.0
        rest = (f"the sensitivity over the other {b - n:,} examples is "
                f"{others / (b - n):.4g}" if n < b else "no other example is left")
        noise = None if self.sigma is None else "sigma"
        draws = (f"{st.copies:,} perturbed copies"
                 + ("" if self.sigma is None else f" at sigma={self.sigma:g}"))
        fix = ("drop the tied examples if their tie-break is not a prediction you mean to "
               "measure (their clean outputs show them: the top two columns equal, or one "
               "column exactly on its boundary; a blank input under a head without bias sits "
               "there)")
        message = tie_warning("the sensitivity", noise, n, b, st.tie_flips, st.flips,
                              "flipped copies", draws, rest, self._out_dtype or torch.float32,
                              fix)
        warnings.warn(message + " (said once per metric)", UserWarning,
                      stacklevel=_trim._user_level())

    def _warn_no_spread(self, r: SensitivityResult) -> None:
        """Say, once per metric, that a data standard error of exactly 0 from several examples
        whose copies did flip (their fixed-subset one above 0) rests on per-example rates that
        all came out alike: ``0.5000 ± 0.0000 (95% CI 0.5000–0.5000, data)`` of two examples
        at 4 of 8 flips each said nothing, while such rates are whole multiples of one over the
        draws and fall alike by chance among few examples. Class flips only (distances alike
        to the last digit are no chance), and only where the warning of few flips did not
        speak."""
        if (r.estimand != "data" or self.compare != "class" or r.stderr != 0
                or r.num_examples < 2 or not r.stderr_subset > 0
                or self.state.events < _alloc.MIN_FLIPS or not self._once("no spread")):
            return
        warnings.warn(
            f"the standard error is 0 because the per-example flip rates of all "
            f"{r.num_examples} examples came out alike ({r.estimate:.4g}): with so few examples "
            "and draws, rates are whole multiples of one over the draws and can coincide by "
            "chance, so the 95% interval of width 0 says only that no spread between examples "
            "was seen, not that there is none. The noise alone gives stderr_subset "
            f"{r.stderr_subset:.2g}. Measure more examples (or more draws: repeats=) for a "
            "standard error (said once per metric)", RuntimeWarning,
            stacklevel=_trim._user_level())

    def _warn_one_unit(self, r: SensitivityResult) -> None:
        """Say, once per metric (:meth:`_once`), why the fixed-subset standard error asked for
        (``estimand="subset"``) is NaN: an example had a single unit of noise draws
        (:func:`._stats.one_unit_warning`), whose spread there is none to estimate the noise's
        variance from — ``mode="whole"`` with ``repeats=1`` (or one antithetic pair), one
        sampled token (``num_tokens=1``), or with one draw per token an example of a single
        real token, which made the whole batch's standard error NaN. Without it
        ``0.1562 ± nan (95% CI nan–nan, subset)`` came with no word, or with the warning of few
        flips only. The fix named is the design's: the draws that give every example two
        units."""
        if r.estimand != "subset" or not math.isnan(r.stderr) or not self._once("one unit"):
            return
        pair = "one antithetic pair" if self.antithetic else "one copy"
        more = f"repeats={4 if self.antithetic else 2} or more"
        if self.allocation:
            unit = "a token drawn once"
            fix = "target_stderr= (rounds add draws until the standard error is known)"
        elif self.mode == "whole":
            unit = f"{pair}, noise on every token at once"
            fix = (f"{more} (mode='whole' draws that many copies of each example"
                   + (", a unit being a pair)" if self.antithetic else ")"))
        elif self.num_tokens is not None:
            unit = "all draws of one sampled token"
            fix = ("num_tokens=2 or more (a unit is a sampled token, whatever its repeats); an "
                   "example of a single real token has one unit at any num_tokens: measure it "
                   f"without num_tokens, with {more}")
        else:
            unit = f"{pair}, of its single real token"
            fix = (f"{more}: every token then has two units, and the stratified variance "
                   "applies to examples of any length")
        what = f"sensitivity {r.estimate:.4g} is reported ± nan"
        warnings.warn(
            one_unit_warning(what, self.state.single, r.num_examples, unit, fix)
            + " (said once per metric)", RuntimeWarning, stacklevel=_trim._user_level())

    def _subset_shown(self, r: SensitivityResult) -> tuple[float, tuple[float, float], str]:
        """The standard error, 95% interval and estimand a warning shows for ``r``: its own,
        or where the data one is NaN for one example the fixed-subset one, named so (a warning
        that the NaN interval "can cover the rate far less often" said nothing true)."""
        if not no_data_stderr(r.estimand, r.num_examples):
            if r.estimand == "subset" and math.isnan(r.stderr):  # a single unit of draws
                return r.stderr, r.ci95, "subset; NaN for a single unit of draws, said apart"
            return r.stderr, r.ci95, r.estimand
        ci = interval(r.estimate, r.stderr_subset, "subset", r.num_examples,
                      self.compare == "class", self._subset_dof())
        return r.stderr_subset, ci, "subset; the data one needs two examples"

    def _subset_dof(self) -> float:
        """The degrees of freedom of the subset interval, as :func:`._stats.result` takes them:
        Student's t on the Satterthwaite ones for distances, the normal's for class flips."""
        return math.inf if self.compare == "class" else subset_dof(self.state)

    def _warn_one_example(self, r: SensitivityResult) -> None:
        """Say, once per metric (:meth:`_once`), why the data standard error of one example is
        NaN, and give the fixed-subset one of that example (:func:`._stats.one_example_warning`).
        Without it ``0.9375 ± nan (95% CI nan–nan, data)`` came with no word of the reason, or
        only with the warning of few kept copies, which is not it."""
        if not no_data_stderr(r.estimand, r.num_examples) or not self._once("one example"):
            return
        se = r.stderr_subset
        subset = None
        if math.isfinite(se):
            lo, hi = interval(r.estimate, se, "subset", r.num_examples, self.compare == "class",
                              self._subset_dof())
            subset = f"± {se:.2g} (95% CI {lo:.4g}–{hi:.4g})"
            if se == 0:  # the warning of no flip follows: a 0 that no variation gave bounds nothing
                subset += ", a 0 from copies that all agree, no evidence of precision"
        what = f"sensitivity {r.estimate:.4g} is reported ± nan"
        warnings.warn(
            one_example_warning(what, subset, self.target_stderr is not None)
            + " (said once per metric)", RuntimeWarning, stacklevel=_trim._user_level())

    def _warn_no_copies(self, r: SensitivityResult) -> None:
        """:meth:`_warn_few_events`'s case of no perturbed copy at all."""
        se, (lo, hi), estimand = self._subset_shown(r)
        if self.allocation:
            spent = (f"allocation={self.allocation!r} with budget={self.budget:g} draws "
                     f"{self.budget:g} {'antithetic pairs' if self.antithetic else 'copies'} "
                     "per real token on average, and the draws gave none")
            fix = ("pass a larger budget= (a round draws about budget × the batch's real "
                   "tokens: 10 or more want budget >= 10 / tokens per batch), or target_stderr= "
                   "with max_forward= (the rounds until the standard error reaches the target "
                   f"are held to {DEFAULT_MAX_ROUNDS} rounds of budget otherwise, which a budget "
                   "this small may spend on nothing)")
        else:
            spent = "nothing drew one"
            fix = "measure with repeats= or target_stderr="
        tangents = (" and their tangents" if self.allocation == "linear" or self.control_variate
                    else "")
        warnings.warn(
            f"no perturbed copy was drawn: {spent}, so sensitivity {r.estimate:.4g} ± {se:.2g} "
            f"(95% CI {lo:.4g}–{hi:.4g}, {estimand}) rests on no evidence at all (its "
            f"{r.num_forward:,} forward passes ran the clean examples{tangents}). For an "
            f"estimate, {fix} (said once per metric)",
            RuntimeWarning, stacklevel=_trim._user_level())

    def _warn_few_events(self, r: SensitivityResult) -> None:
        """Say, once per metric (:meth:`_once`; no flip and a few flips are two causes), that
        the result's standard error rests on fewer than :data:`._alloc.MIN_FLIPS` events:
        flips (nonzero values), with the control variate copies whose flip differs from the
        tangent's, or with antithetic draws the pairs that vary (:func:`_varying_pairs`, counted
        among the pairs, not the copies). Estimated from a few it moves with those seen, and
        from none it is 0 (with the control variate and one draw per token, the spread of the
        tangent's probabilities between tokens; with ``target_stderr``, the rule of three's:
        :func:`._alloc.zero_floor`).
        On six examples of a small MLP at a flip rate of 0.008 (36 tokens, repeats=2) 55% of
        the runs read ``0.0000 ± 0.0000``, and none of them covered the rate. The counts are
        the state's (merged and all-reduced with it).

        Where no perturbed copy was drawn at all (``allocation="linear"`` with a budget of a
        fraction of a copy per batch: 0.01 on 16 tokens drew none in 5 of 6 seeds, and read
        ``0.0000 ± 0.0000`` for a rate of about 0.13, without a word), that is said: the
        estimate rests on no evidence. Nothing is said where no copy was counted because the
        state comes from an older pickle, which counted none."""
        st = self.state
        if not st.copies:
            if st.n and not getattr(self, "_copies_uncounted", False) \
                    and self._once("no copies"):
                self._warn_no_copies(r)
            return
        if st.events >= _alloc.MIN_FLIPS:
            kept = st.copies - st.events
            if self._mirrored() and kept < _alloc.MIN_FLIPS and self._once("few kept"):
                se, (lo, hi), estimand = self._subset_shown(r)
                rule = (f" by the rule of three, the copies' mean rate of keeping the class is "
                        f"below 3/{st.copies:,} = {3 / st.copies:.2g} with 95% confidence."
                        if kept == 0 else "")
                # with a target each batch that kept no class reported the rule of three's
                floored = kept == 0 and self.target_stderr is not None \
                    and estimand.startswith("subset")
                worth = ("takes its standard error from the rule of three (target_stderr)"
                         if floored else "can cover the rate far less often, as with few flips")
                warnings.warn(
                    f"the standard error rests on {'no' if kept == 0 else 'few'} copies that "
                    f"kept the prediction: {kept} of the {st.copies:,} perturbed copies, fewer "
                    f"than {_alloc.MIN_FLIPS} (every other one flipped it), so sensitivity "
                    f"{r.estimate:.4g} ± {se:.2g} (95% CI {lo:.4g}–{hi:.4g}, "
                    f"{estimand}) {worth};{rule} For a firmer one, measure with more draws "
                    "(repeats=, more examples) or with target_stderr=, or a smaller sigma "
                    "(said once per metric)", RuntimeWarning, stacklevel=_trim._user_level())
            return
        n, cv = st.copies, self.control_variate is not None
        # with antithetic draws the events are the units (pairs) that varied
        # (:func:`_varying_pairs`), not copies: they are counted among the units
        pairs = self._pairs_vary() and not self.allocation
        units = n // self.group if pairs else n
        unit = "pair" if self.group == 2 else "unit"
        of = (f"the {units:,} antithetic {unit}s ({n:,} perturbed copies"
              + ("" if self.group == 2 else f", {self.group} draws of a sampled token each")
              + ")" if pairs else f"the {n:,} perturbed copies measured")
        if cv:
            what = "flipped otherwise than the model's tangent (control_variate)"
        elif pairs:
            what = f"held other flips than most {unit}s of their example or token"
        elif self.compare == "class":
            what = "flipped the prediction"
        else:
            what = f"moved the output (a nonzero {self.compare} distance)"
        se, (lo, hi), estimand = self._subset_shown(r)
        shown = (f"sensitivity {r.estimate:.4g} ± {se:.2g} (95% CI {lo:.4g}–{hi:.4g}, "
                 f"{estimand})")
        how = ("measure with more draws (repeats=, more examples) or with target_stderr=, whose "
               f"rounds stop only on {_alloc.MIN_FLIPS} flips or on the rule of three (said "
               "once per metric)")
        if st.events == 0:
            if not self._once("no flips"):
                return
            rate = ("the rate at which a copy's flip differs from its tangent's" if cv
                    else "the copies' mean flip rate" if self.compare == "class"
                    else "the share of copies that move the output")
            # with num_tokens the tangent's mean is over the sampled tokens: their sampling
            # error comes on top (it exceeded 3/N in 13 of 40 runs of a linear model)
            sampled = (" over the tokens drawn, off from its mean over every token by their "
                       "sampling error and by at most that rate" if self.num_tokens is not None
                       else ", off by at most that rate")
            after = (f" The estimate is the tangent's mean flip probability{sampled}." if cv
                     else "")
            # with a target each batch reported the rule of three's standard error (subset)
            floored = self.target_stderr is not None and estimand.startswith("subset")
            worth = ("takes its standard error from the rule of three (target_stderr)"
                     if floored else "cannot be trusted as a 95% interval")
            # a unit without a flip bounds the flip rate of its copies, which may flip together
            # (3/copies would not); units that all flipped alike (one copy of each pair on a
            # decision boundary) bound nothing
            rule = (f"by the rule of three, {rate} is below 3/{units:,} = {3 / units:.2g} with "
                    "95% confidence" if not pairs or r.estimate == 0 else
                    f"every {unit} flipped as the others of its example or token, and their "
                    "spread of 0 says nothing of the estimate's error")
            warnings.warn(
                f"the standard error rests on no {f'varying {unit}' if pairs else 'flip'}: "
                f"none of {of} {what}, so {shown} {worth}; {rule}.{after} For a standard "
                f"error, {how}",
                RuntimeWarning, stacklevel=_trim._user_level())
        elif self._once("few flips"):
            warnings.warn(
                f"the standard error rests on few {f'varying {unit}s' if pairs else 'flips'}: "
                f"only {st.events} of {of} {what}, fewer than {_alloc.MIN_FLIPS}; a standard "
                "error estimated from so few moves with them, and the 95% interval of "
                f"{shown} can cover the rate far less often (on a small MLP, of the runs with "
                "1–4 such copies, 63% with the control variate at 4 draws per token, 87% with "
                f"num_tokens=2). For a firmer one, {how}",
                RuntimeWarning, stacklevel=_trim._user_level())


#: the chance below which :func:`_same_rates` reads rates of the smaller metric that recur in
#: the larger one as the same examples measured twice (the product of each rate's share among
#: both metrics' rates, times the places tried)
_CHANCE = 1e-6


def _same_rates(mine: list[Tensor], theirs: list[Tensor]) -> tuple[int, bool]:
    """How many examples two states both hold with the same per-example rates, drawn in the same
    order, and whether that is all of both (else 0, False). Two measurements of one example
    agree exactly only where they drew the same noise: the same examples under the same seed,
    as :func:`._stats.repeated_ranks` tells two ranks that measured them. That is all of both
    states (every rate equal: at least two, one of them neither 0 nor 1, as rates of 0 and 1
    agree by chance), or all of the smaller one recurring from the start of one of the larger
    one's updates (a run over the first examples merged with a longer run under its seed, or
    with a metric that merged such a run). Rates of other examples agree by chance too (1/8,
    0, 1/8 of three other examples recurred at one of 57 places, updates of one example), so
    there at least two rates neither 0 nor 1 must agree, and the product of every agreeing
    rate's share among both metrics' rates, times the places tried, must be below
    :data:`_CHANCE`.
    :meth:`TokenSensitivity.merge` merged such twins without a word (24 examples from 12, a
    standard error of 0.026 for 0.038; 160 from 100), where
    :meth:`~TokenSensitivity.all_reduce` warned of equal ranks. Examples measured by both under
    other draws (another seed, another place in the stream: shards that overlap by a few
    examples) agree only by chance and are not told: the state holds one rate per example."""
    if not mine or not theirs:
        return 0, False
    flat = [torch.cat([r.detach().flatten().cpu().float() for r in rates])
            for rates in (mine, theirs)]
    if len(flat[0]) == len(flat[1]):
        a, b = flat
        if len(a) < 2 or not bool(((a != 0) & (a != 1)).any()) or not torch.equal(a, b):
            return 0, False
        return len(a), True
    (small, _), (large, parts) = sorted(zip(flat, (mine, theirs), strict=True),
                                        key=lambda pair: len(pair[0]))
    if int(((small != 0) & (small != 1)).sum()) < 2:
        return 0, False
    starts, start = [], 0
    for part in parts:
        if start + len(small) > len(large):
            break
        starts.append(start)
        start += part.numel()
    for start in starts:
        if large[start] == small[0] and torch.equal(large[start : start + len(small)], small):
            values, counts = torch.unique(torch.cat([small, large]), return_counts=True)
            share = (counts.double() / (len(small) + len(large)))[
                torch.searchsorted(values, small)]
            if share.log().sum().item() + math.log(len(starts)) < math.log(_CHANCE):
                return len(small), False
    return 0, False


def _varying_pairs(vals: Tensor, src: Tensor, tok: Tensor, valid: Tensor,
                   per_cell: int | None, group: int = 2) -> int:
    """The antithetic units (pairs; with ``num_tokens`` all ``group`` draws of a sampled token)
    the standard error learns from: those whose mean flip (0, ½ or 1 for a pair) differs from
    the most common one of their cell — of their example where a cell holds one unit, the units
    the variance is then estimated over. A pair of one flip is no event where
    every pair of its cell has one: an example on the decision boundary flips once in each pair
    (±ε, one on each side), its variance is 0, and those flips had counted towards the few-flips
    guard, so the rounds stopped and the warning was silent while the other examples, which
    the standard error rests on, had shown no flip (their 95% intervals, often ± 0, covered the
    rate in 48–80% of runs)."""
    if not len(vals):
        return 0
    u, usrc, utok = _units(vals, src, tok, group)
    if per_cell is not None and per_cell >= 2:
        key = usrc.long() * valid.shape[1] + utok.long()
    else:
        key = usrc.long()
    code = torch.round(u * group).long().clamp(0, group).to(key.device)
    counts = torch.bincount(key * (group + 1) + code,
                            minlength=(group + 1) * (int(key.max()) + 1)).view(-1, group + 1)
    return int((counts.sum(1) - counts.max(1).values).sum())


def _events(vals: Tensor, src: Tensor, tok: Tensor, control: Any) -> Tensor:
    """Which copies the standard error learns from (bool, one per copy): the nonzero values, or
    with the control variate the copies whose flip differs from the tangent's (an adjusted
    value v − c + q is nonzero on nearly every copy)."""
    if control is None:
        return vals != 0
    return (vals - control.q[src, tok].to(vals)) != 0


#: option names from other libraries (and senslab's own older habits), and what to pass instead
_OTHER_NAMES = {
    **dict.fromkeys(("seed", "rng", "random_state", "random_seed"),
                    "generator= (an int seed or a torch.Generator)"),
    **dict.fromkeys(("num_samples", "n_samples", "samples", "draws", "num_draws", "n_draws",
                     "n_repeats", "num_repeats"), "repeats= (draws per token)"),
    **dict.fromkeys(("batch_size", "chunk"), "chunk_size= (perturbed copies per forward)"),
    **dict.fromkeys(("std", "noise_std", "noise_scale", "noise"),
                    "sigma= (the noise's standard deviation)"),
}


def _unknown_options(unknown: dict[str, Any]) -> str:
    """The message for options :class:`TokenSensitivity` does not take: what to pass instead
    where the name is known from elsewhere, the closest option name otherwise."""
    import difflib
    import inspect

    names = [n for n, p in inspect.signature(TokenSensitivity.__init__).parameters.items()
             if p.kind is inspect.Parameter.KEYWORD_ONLY]
    hints = []
    for name in unknown:
        if name in _OTHER_NAMES:
            hints.append(f"{name}=: pass {_OTHER_NAMES[name]}")
            continue
        close = difflib.get_close_matches(name, names, n=1)
        hints.append(f"{name}=: did you mean {close[0]}=?" if close
                     else f"{name}=: not an option")
    return ("TokenSensitivity (and token_sensitivity) got unknown options: " + "; ".join(hints)
            + f". The options are: {', '.join(names)}.")


def _check_allocation(allocation: Any, budget: Any, *, mode: str, compare: str,
                      replace_with: Any, num_tokens: Any, shard: Any, repeats: int,
                      antithetic: bool, control_variate: Any) -> tuple[str | None, float]:
    if allocation is None:
        if budget is not None:  # ignored without an allocation (the same forwards as without)
            raise ValueError(
                f"budget={budget!r} applies with allocation='linear' or 'uniform' (the draws "
                "the allocation spreads), and none is given: without one, repeats= sets the "
                "draws per token; drop budget, or pass allocation=")
        return None, 1.0
    budget = 1.0 if budget is None else budget
    if allocation not in ("linear", "uniform"):
        raise ValueError(f"allocation must be None, 'linear' or 'uniform', got {allocation!r}")
    name = f"allocation={allocation!r}"
    if allocation == "uniform":
        if mode != "token":
            raise ValueError(f"{name} samples tokens: it needs mode='token'")
        if antithetic or control_variate is not None:
            raise ValueError(
                f"{name} cannot be combined with antithetic or control_variate: a token gets "
                "one draw (a quarter of them two); use one of the two designs"
            )
    elif mode != "token" or compare != "class" or replace_with is not None:
        raise ValueError(
            "allocation='linear' needs Gaussian noise on one token at a time and "
            "compare='class' (mode='token', no replace_with)"
        )
    if control_variate is not None:
        raise ValueError(
            "allocation='linear' cannot be combined with control_variate: the draws would "
            "measure the tangent's misses, which the allocation cannot see (its standard error "
            "is then too small); use one of the two"
        )
    if num_tokens is not None:
        raise ValueError(f"{name} chooses the draws per token itself: drop num_tokens")
    if shard is not None:
        raise ValueError(f"{name} cannot be combined with shard; measure all examples")
    if repeats != (2 if antithetic else 1):
        what = ("the share of every example's tokens measured per round" if allocation ==
                "uniform" else "the draws per token (mean units per token; with "
                "target_stderr, of the first round)")
        raise ValueError(
            f"with {name}, budget= sets {what}; leave repeats at {2 if antithetic else 1}, "
            f"got {repeats}"
        )
    b = _check_number("budget", budget, "0.5")
    if not (b > 0 and math.isfinite(b)):
        raise ValueError(f"budget must be a positive number, got {budget!r}")
    if allocation == "uniform" and b > 1:
        raise ValueError(
            f"with allocation='uniform', budget is the share of every example's tokens measured "
            f"per round, at most 1; got {budget!r} (for more draws per token, use "
            "target_stderr: once every token is in, rounds add draws to each)"
        )
    return allocation, b


def token_sensitivity(
    model: nn.Module | Any,
    inputs: Inputs,
    tokens: Tokenization | None = None,
    *,
    mask: Tensor | None = None,
    **options: Any,
) -> SensitivityResult:
    """Token-wise sensitivity of ``model`` on a batch ``inputs`` (see the module docstring).

    Same options as :class:`TokenSensitivity`; equivalent to one ``update`` and ``compute``.
    Variable-length text is cut after each example's last real token by default
    (``trim_padding=True``, exact for right padding; see the module docstring, *Padding*).

    Example:
        >>> import torch
        >>> from senslab.measure import token_sensitivity
        >>> from senslab.tokens import Patches
        >>> model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(3 * 8 * 8, 10))
        >>> r = token_sensitivity(model, torch.randn(32, 3, 8, 8), Patches(4), sigma=0.1)
        >>> r.num_forward  # 32 clean + 32 examples × 4 patches × 1 draw
        160
    """
    metric = TokenSensitivity(model, tokens, **options)
    metric.update(inputs, mask)
    return metric.compute()
