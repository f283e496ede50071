r"""How a model's output becomes a predicted class: the one decision rule of senslab.

Every place that turns outputs into classes — the token-wise estimator, its linear control
variate, output sharpness and the training loop's loss and accuracy — calls this module, so
they cannot disagree.

An output of shape (B, C) with C ≥ 2 columns is a class score per column and the prediction is
the argmax, whatever its kind. An output of shape (B,) or (B, 1) is *one column* and its kind
says where the class boundary lies:

=================  ==========================  ============================================
``output_kind``    one column: class 1 iff     margin of the clean class (≥ 0 on the clean
                                               input; the control variate linearises it)
=================  ==========================  ============================================
``"logits"``       :math:`z > 0`               :math:`\pm z`
``"probabilities"`` :math:`p > 1/2`            :math:`\pm (p - 1/2)` (probability space)
``"scores"``       :math:`s > \text{threshold}` :math:`\pm (s - \text{threshold})`
=================  ==========================  ============================================

With several columns the margin is the clean class's column minus the largest other one.
Integer or bool outputs of shape (B,) are class labels and are compared as they are (unless
the kind is ``"scores"``, whose threshold is then applied).

**The ambiguous case is refused.** A single floating column that lies entirely in [0, 1] (up to
a few units of rounding: a sum of probabilities gives 1.0000001), some values strictly inside, is
what a ``sigmoid`` head returns (its confident examples round to
exactly 0 or 1 in float32); read as logits every value is at least 0, (almost) every prediction
is class 1 and no noise flips it — a sensitivity of (about) 0 that says nothing. When no kind
was given (neither the option nor a model attribute ``output_kind``) such an output raises a
``ValueError`` that names ``output_kind``; any other output is read as logits. A clean column
of exact 0s and 1s (hard decisions, or a sigmoid saturated at 1.0 on every example: float32
rounds a logit above about 17 to 1.0, bf16 one above about 5.5), and a float16 column of
exact 0s (float16 rounds a sigmoid to 0.0 below a logit of about −17), cannot tell, so it is
read as logits *provisionally* (:func:`inferred_from_zero_one`): perturbed outputs in [0, 1]
with a value strictly inside raise the same error (:func:`check_perturbed_kind`). A float32/float64
column of whole numbers, none negative and some ≥ 2, is class labels as floats (read as logits,
labels 1, 2, ... would be one class) and is refused the same way, on the clean outputs or,
after a clean column of exact 0s and 1s, on the perturbed ones. A bf16/fp16 clean column is
refused only where logits of its sizes would all be whole by a chance below 2**-20 (bf16:
three or four labels ≥ 1; every bf16 number from 128 on is whole, so such values say nothing).

Hugging Face heads (:func:`check_head`, ``compare="class"`` without ``output=``): a regression
head, and a sequence, image, audio or video classifier of one output and no ``problem_type``,
are refused unless ``output_kind`` says how to read them, bare or inside a user's wrapper; so
is a T5-like generating encoder-decoder (its logits are per decoder position, and it needs
``decoder_input_ids``). A user's per-token head over a base model is read at the last real
token where the base model is causal (``GPT2Model``) and refused where its attention modules all
say they are not (``BertModel``: [SEP]; :mod:`senslab.tokens.embedding`); a base model without
that flag is read at the last real token: say the position (``Embedding(..., position=0)`` for
[CLS]) there.
"""

from __future__ import annotations

import math
from numbers import Real
from typing import Any, Literal

import torch
from torch import Tensor

from ..tokens.auto import headless_reason
from ..tokens.embedding import hf_model_inside, unwrapped

OutputKind = Literal["logits", "probabilities", "scores"]
OUTPUT_KINDS: tuple[str, ...] = ("logits", "probabilities", "scores")

__all__ = [
    "OUTPUT_KINDS", "OutputKind", "check_finite", "check_kind", "check_perturbed_kind",
    "check_rows", "clean_value", "declared_kind", "inferred_from_zero_one", "is_scalar", "margins",
    "predictions", "resolve_kind", "spacing", "threshold_of", "tie_breaks", "tie_warning", "tied",
]


def is_scalar(out: Tensor) -> bool:
    """True for one column per example: shape (B,) or (B, 1)."""
    return out.dim() == 1 or (out.dim() == 2 and out.shape[1] == 1)


def check_kind(kind: Any, threshold: Any, where: str = "output_kind") -> None:
    """Validate an ``output_kind`` and its ``threshold`` (an error names the fix)."""
    if kind is not None and kind not in OUTPUT_KINDS:
        raise ValueError(
            f"{where} must be 'logits', 'probabilities' or 'scores', got {kind!r} "
            "(one column: sign / > 0.5 / > threshold; several columns: argmax)"
        )
    if threshold is None:
        if kind == "scores":
            raise ValueError(
                "output_kind='scores' needs threshold= (one column is class 1 iff score > "
                "threshold), e.g. threshold=0.5; or use 'logits' (threshold 0) or "
                "'probabilities' (threshold 0.5)"
            )
        return
    if isinstance(threshold, bool) or not isinstance(threshold, Real):
        raise TypeError(
            f"threshold must be a number, got {threshold!r} ({type(threshold).__name__}); "
            "e.g. threshold=0.5"
        )
    if not math.isfinite(threshold):
        raise ValueError(f"threshold must be finite, got {threshold!r}")
    if kind != "scores":
        raise ValueError(
            f"threshold={threshold!r} applies to output_kind='scores' only (got output_kind="
            f"{kind!r}); pass output_kind='scores', threshold={threshold!r}"
        )


def declared_kind(model: Any, kind: str | None) -> str | None:
    """The option ``kind`` if given, else the model's ``output_kind`` attribute (or None)."""
    if kind is not None:
        return kind
    declared = getattr(model, "output_kind", None)
    if declared is None:  # inside DDP, DataParallel or torch.compile: the wrapped model's
        declared = getattr(unwrapped(model), "output_kind", None)
    if declared is not None and declared not in ("logits", "probabilities"):
        raise ValueError(
            f"{type(model).__name__}.output_kind is {declared!r}; a model declares 'logits' or "
            "'probabilities' (for 'scores' pass output_kind='scores', threshold=t to the "
            "measurement)"
        )
    return declared


def check_head(model: Any, compare: str, kind: str | None, output: Any = None) -> None:
    """Refuse ``compare="class"`` on a Hugging Face head whose output is no class score: a
    regression head (``config.problem_type == "regression"``: one column of values, whose
    sign never changes around a positive mean, so it read as a binary logit that never
    flips), also one with one output and no ``problem_type`` (which Hugging Face trains as a
    regression), or a multi-label one of several labels (independent sigmoids: the argmax is
    not its prediction; one label's sigmoid is a binary classifier, read by the sign of its
    logit as any one column). ``output=`` given says how to read it, and is taken as is; so is
    ``output_kind=``, except on a multi-label or regression head of several outputs
    (``config.num_labels`` ≥ 2): ``output_kind`` reads one column, and several are read by
    their argmax whatever the kind."""
    if compare != "class" or output is not None:
        return
    model = unwrapped(model)  # DDP, DataParallel, torch.compile: the wrapped model's head
    _check_generating_decoder(model)
    if kind is not None:
        _check_columns_of_head(model, kind)
        return
    reason = headless_reason(model)  # a timm/HF classifier built without its classifier
    if reason is not None:
        raise ValueError(reason)
    inside = hf_model_inside(model)
    if inside is not None:  # a user's wrapper returning a multi-label head's logits was
        _check_wrapped_head(*inside)  # read by their argmax without a word
        return
    _check_one_output(model, type(model).__name__)
    problem = getattr(getattr(model, "config", None), "problem_type", None)
    labels = getattr(getattr(model, "config", None), "num_labels", None)
    # one label: its one sigmoid is a binary classifier, and the default reading of one column
    # (class 1 iff logit > 0, i.e. sigmoid > 1/2) is its prediction
    if problem == "multi_label_classification" and labels != 1:
        raise ValueError(
            f"{type(model).__name__} is a multi-label head (config.problem_type="
            "'multi_label_classification'): each label is its own sigmoid, so the argmax over "
            "labels is not its prediction. Measure one label at a time with output=<a "
            "function picking its column> and output_kind='logits', or compare='l1'/'l2'"
        )


#: Hugging Face encoder-decoder families whose generating model makes no decoder inputs from
#: ``input_ids`` (BART's shifts them right): without ``decoder_input_ids`` they fail
T5_LIKE = ("t5", "mt5", "umt5", "longt5", "switch_transformers")


def generating_t5(model: Any) -> bool:
    """Whether ``model`` is a T5-like generating encoder-decoder (``config.model_type`` in
    :data:`T5_LIKE`, ``is_encoder_decoder``, ``can_generate()``: ``T5ForConditionalGeneration``,
    not ``T5ForSequenceClassification``, which makes its decoder inputs itself)."""
    config = getattr(model, "config", None)
    can_generate = getattr(model, "can_generate", None)
    if getattr(config, "is_encoder_decoder", False) is not True or not callable(can_generate) \
            or getattr(config, "model_type", None) not in T5_LIKE:
        return False  # BART shifts input_ids into its decoder
    try:
        return bool(can_generate())
    except Exception:  # noqa: BLE001 -- an old or custom class: read as before
        return False


def _check_generating_decoder(model: Any) -> None:
    """Refuse ``compare="class"`` without ``output=`` on a T5-like generating encoder-decoder
    model (``T5ForConditionalGeneration``; ``config.model_type`` in :data:`T5_LIKE`): its
    logits are one prediction per decoder position (never read at an input position without
    ``output=``, whatever the decoder inputs), and it builds no decoder inputs of its own
    (called without ``decoder_input_ids`` it failed inside Hugging Face, "You must specify
    exactly one of input_ids or inputs_embeds", though ``input_ids`` were given)."""
    if not generating_t5(model):  # BART: an explicit position=k reads it
        return
    raise ValueError(
        f"{type(model).__name__} is an encoder-decoder model: its logits are (batch, decoder "
        "positions, vocabulary), a prediction per decoder position, not one class per "
        "example. Give the decoder its inputs, decoder_input_ids in the inputs (T5 makes none "
        "from input_ids, and Hugging Face then fails with 'You must specify exactly one of "
        "input_ids or inputs_embeds', about the decoder's; for its first output token, "
        "torch.full((batch, 1), model.config.decoder_start_token_id)), and select the decoder "
        "position measured with output=lambda o: o.logits[:, k] (k = -1 for the last), or "
        "compare the whole decoder output with position=None and compare='l1' or 'l2'"
    )


#: endings of the Hugging Face head classes whose loss reads one output (``num_labels=1``)
#: without a ``problem_type`` as a regression (transformers' ``LOSS_MAPPING``: each is a
#: ``ForSequenceClassificationLoss``)
REGRESSION_WHEN_ONE = ("ForSequenceClassification", "ForImageClassification",
                       "ForAudioClassification", "ForVideoClassification")


def _check_one_output(head: Any, what: str) -> None:
    """Refuse a Hugging Face regression head (``config.problem_type == "regression"``), and a
    sequence, image, audio or video classifier with one output and no ``problem_type`` (which
    Hugging Face trains as a regression), measured with ``compare="class"`` and no ``output_kind``:
    ``what`` names it (``"X (inside W)"`` for a user's wrapper, which returned its value to be
    read as a binary logit without a word)."""
    config = getattr(head, "config", None)
    problem = getattr(config, "problem_type", None)
    if problem == "regression":
        raise ValueError(
            f"{what} is a regression head (config.problem_type='regression'): "
            "its output is a value, not a class, and read as a binary logit it only flips "
            "where the value changes sign. Measure how far it moves with compare='l1' or "
            "'l2', or say where its decision lies with output_kind='scores', threshold=t"
        )
    # Hugging Face's sequence, image, audio and video classifiers train one output without a
    # problem_type as a regression (other heads, a language model's say, keep their own
    # outputs); an audio or video one (AST's, VideoMAE's) was read as a binary logit
    if problem is None and getattr(config, "num_labels", None) == 1 and type(
            head).__name__.endswith(REGRESSION_WHEN_ONE):
        raise ValueError(
            f"{what} has one output (config.num_labels=1) and no "
            "config.problem_type, which Hugging Face reads as a regression head (its loss is "
            "then MSE): its output is a value, not a binary logit. Say how to read it: "
            "output_kind='logits' for a binary classifier trained on one logit, "
            "output_kind='scores', threshold=t for a decision at t, or compare='l1'/'l2' for "
            "how far it moves"
        )


def _check_wrapped_head(inner: Any, what: str) -> None:
    """Refuse a user's wrapper of a Hugging Face multi-label or regression head with several
    outputs, measured without ``output_kind``: a wrapper that returns its logits had them read
    by their argmax. One that returns one column (one label's logit) says so with
    ``output_kind='logits'``."""
    config = getattr(inner, "config", None)
    problem = getattr(config, "problem_type", None)
    labels = getattr(config, "num_labels", None)
    if not isinstance(labels, int) or labels < 2:  # one output, read as a binary logit: a
        _check_one_output(inner, what)  # regression head's value was, without a word
        return
    if problem not in ("multi_label_classification", "regression"):
        return
    head = ("a multi-label head: each label is its own sigmoid, so the argmax over labels is "
            "not its prediction" if problem.startswith("multi")
            else "a regression head: each output is a value, not a class score")
    raise ValueError(
        f"{what} is {head} (config.problem_type={problem!r}, config.num_labels={labels}), and a "
        "wrapper returning its logits would be read by their argmax. Measure one output at a "
        "time: a wrapper returning one column (logits[:, k]) with output_kind='logits' (or "
        "output_kind='scores', threshold=t for a regression output), or output=lambda o: "
        "o[:, k]; or how far the outputs move with compare='l1'/'l2'"
    )


def _check_columns_of_head(model: Any, kind: str) -> None:
    """Refuse ``output_kind=kind`` on a Hugging Face multi-label or regression head with
    several outputs: the kind reads one column only, so its argmax would be measured."""
    config = getattr(model, "config", None)
    problem = getattr(config, "problem_type", None)
    labels = getattr(config, "num_labels", None)
    if problem not in ("multi_label_classification", "regression") \
            or not isinstance(labels, int) or labels < 2:
        return
    what = ("a multi-label head: each label is its own sigmoid" if problem.startswith("multi")
            else "a regression head: each output is a value")
    route = ("output_kind='logits'" if problem.startswith("multi")
             else "output_kind='scores', threshold=t")
    raise ValueError(
        f"{type(model).__name__} is {what} (config.problem_type={problem!r}, "
        f"config.num_labels={labels}), but output_kind={kind!r} reads a one-column output only: "
        f"its {labels} columns would be read by their argmax, which is not its prediction. "
        f"Measure one output at a time, output=lambda o: o.logits[:, k] with {route}, or how "
        "far the outputs move with compare='l1'/'l2'"
    )


def threshold_of(kind: str, threshold: float | None = None) -> float:
    """The one-column class boundary of ``kind``: 0, 1/2 or ``threshold``."""
    check_kind(kind, threshold)
    if kind == "scores":
        return float(threshold)  # type: ignore[arg-type]  # check_kind: not None
    return 0.5 if kind == "probabilities" else 0.0


def _boundary(dtype: torch.dtype, t: float) -> tuple[float, bool]:
    """``(r, inclusive)``: ``t`` rounded to ``dtype`` (what ``out > t`` compared with, in the
    output's own dtype: 0.3 is 0.30078125 in bf16) and whether a value equal to ``r`` lies
    above ``t``. Rounding gives a neighbour of ``t``, so no ``dtype`` value lies between
    the two: ``x > t`` exactly iff ``x >= r`` (``r > t``) or ``x > r`` (else), with no copy in
    a wider dtype (MPS has no float64). ``r`` is the boundary the margins are taken from."""
    if dtype == torch.float64 or not dtype.is_floating_point:
        return t, False
    r = torch.tensor(t, dtype=dtype).item()
    return r, r > t


def _above(flat: Tensor, t: float) -> Tensor:
    """``flat > t`` for the real number ``t``, exact in ``flat``'s own dtype."""
    if not flat.is_floating_point():
        floor = math.floor(t)  # an integer above t is above its floor
        # a floor outside the dtype's range is cast into it (wrapped) by the comparison:
        # uint8 labels against a threshold of -0.5 compared with 255, none above it
        lo, hi = (0, 1) if flat.dtype == torch.bool else (torch.iinfo(flat.dtype).min,
                                                         torch.iinfo(flat.dtype).max)
        if floor < lo or floor >= hi:
            return torch.full_like(flat, floor < lo, dtype=torch.bool)
        return flat > floor
    r, inclusive = _boundary(flat.dtype, t)
    return flat >= r if inclusive else flat > r


def _column_range(out: Tensor) -> tuple[float, float, bool] | None:
    """(min, max, some value strictly inside (0, 1)) of a floating one-column output, with one
    host sync; None for any other output (several columns, labels, empty)."""
    if not is_scalar(out) or not out.is_floating_point() or out.numel() == 0:
        return None
    flat = out.reshape(-1)
    lo, hi, inside = torch.stack(
        [flat.min(), flat.max(), ((flat > 0) & (flat < 1)).any().to(flat.dtype)]).tolist()
    return lo, hi, inside > 0


def _in_unit(dtype: torch.dtype, lo: float, hi: float) -> bool:
    """Whether a floating column ranging over [lo, hi] lies in [0, 1] up to rounding: a few
    units in the last place of 1 in ``dtype`` either side. Probabilities summed in floating
    point leave [0, 1] by that much (an ensemble's weights 0.1 × 10 give 1.0000001 in
    float32), and a column read as logits then had every example in class 1: a false 0."""
    slack = 4 * torch.finfo(dtype).eps
    return -slack <= lo and hi <= 1.0 + slack


def _ambiguous(lo: float, hi: float, what: str) -> ValueError:
    return ValueError(
        f"{what} one column with every value in [0, 1] (min {lo:.3g}, max {hi:.3g}): "
        "probabilities or logits? Read as logits (class = sign) nothing would ever flip. Say "
        "which: output_kind='probabilities' (class 1 iff > 0.5), output_kind='logits', or "
        "output_kind='scores', threshold=t; a model can declare it with an attribute output_kind"
    )


def _labels(out: Tensor, lo: float, hi: float) -> bool:
    """Whether a floating column ranging over [lo, hi] holds class labels 0, 1, 2, ... as floats
    (whole numbers, none negative, some ≥ 2): one more host sync, only when lo ≥ 0 and hi ≥ 2.
    A float32 logit is a whole number by chance once in millions."""
    if lo < 0.0 or hi < 2.0:
        return False
    flat = out.reshape(-1)
    return bool((flat == flat.round()).all())


#: a bf16/fp16 column of whole numbers is taken for class labels only where logits of its
#: sizes would all be whole by a chance below 2**-LABEL_BITS (float32: one in millions)
LABEL_BITS = 20


def _whole_by_chance(out: Tensor) -> float:
    """log2 of the chance that logits in ``out``'s dtype, of the sizes of its entries (whole
    numbers, none negative), all round to whole numbers: at a value in [2ᵏ, 2ᵏ⁺¹) one
    representable number in 1/spacing is whole (bf16: 1 in 64 in [2, 4), every one from 128
    on); a 0 says nothing (a ReLU'd logit)."""
    flat = out.reshape(-1)
    step = spacing(flat[flat >= 1])
    return float(torch.log2(step).clamp(max=0).sum())


def _float_labels(lo: float, hi: float, what: str) -> ValueError:
    return ValueError(
        f"{what} one column of whole numbers from {lo:g} to {hi:g}: class labels as floats? "
        "Read as logits (class 1 iff > 0) labels 1, 2, ... would be one class and a change "
        "among them never counted. Return integer labels (.long()), which are compared as they "
        "are, or the logits; if these are logits, say so with output_kind='logits'"
    )


def resolve_kind(out: Tensor, kind: str | None, threshold: float | None = None) -> str:
    """The kind to read ``out`` (clean outputs of a batch) with; refuses the ambiguous case.

    ``kind`` None: logits, unless one floating column lies entirely in [0, 1] with some value
    strictly inside (a ValueError naming ``output_kind``): a sigmoid head, even one whose
    confident examples round to exactly 0 or 1 in float32. A column of exact 0s and 1s (hard
    decisions, or a sigmoid saturated on every example) is read as logits provisionally: pass
    :func:`inferred_from_zero_one` to :func:`check_perturbed_kind` on the perturbed outputs.
    ``kind`` None on a float32/float64 column of whole numbers, none negative and some ≥ 2
    (class labels as floats; in bf16/fp16, where so many whole numbers are logits by a chance
    below 2**-:data:`LABEL_BITS`), and ``"probabilities"`` on one column outside [0, 1] are errors
    too.
    """
    check_kind(kind, threshold)
    scalar = is_scalar(out)
    if kind == "scores" and not scalar and out.dim() == 2:
        raise ValueError(
            f"threshold= applies to one-column outputs, but the model returned shape "
            f"{tuple(out.shape)}: with {out.shape[1]} columns senslab reads the argmax, one "
            "class per example. For one class per example drop output_kind='scores'/"
            "threshold; for independent labels (multi-label, a sigmoid per column) measure "
            "one label at a time, output=lambda o: o[:, k], output_kind='scores', "
            f"threshold={threshold!r}, or how far the outputs move with compare='l1'/'l2'"
        )
    if kind not in (None, "probabilities"):
        return kind
    seen = _column_range(out)
    if seen is None:
        return kind or "logits"
    lo, hi, inside = seen
    if kind is None and _in_unit(out.dtype, lo, hi) and inside:
        raise _ambiguous(lo, hi, "the model returns")
    # bf16/fp16 logits are whole numbers far more often (bf16: every one from 128 on, one in
    # 64 in [2, 4)), so their column must be too whole for chance; labels 0..3 of 8 examples
    # as bf16 were read as logits, labels 1..3 one class: 0.031 measured for 0.094
    if kind is None and _labels(out, lo, hi) and (
            out.dtype in (torch.float32, torch.float64) or _whole_by_chance(out) <= -LABEL_BITS):
        raise _float_labels(lo, hi, "the model returns")
    if kind == "probabilities" and not _in_unit(out.dtype, lo, hi):
        raise ValueError(
            f"output_kind='probabilities' but the model's one column ranges over [{lo:.8g}, "
            f"{hi:.8g}], outside [0, 1]: these are not probabilities — use output_kind='logits' "
            "(class = sign) or output_kind='scores', threshold=t"
        )
    return kind or "logits"


def _hard(clean: Tensor) -> tuple[bool, bool]:
    """(one floating column of exact 0s and 1s with at least one 1, one of exact 0s alone),
    with one host sync."""
    seen = _column_range(clean)
    if seen is None or seen[2] or not _in_unit(clean.dtype, seen[0], seen[1]):
        return False, False
    # 1 up to rounding: a weighted sum of saturated sigmoids gives 1.0000001
    return seen[1] >= 1.0, seen[0] == seen[1] == 0.0


def inferred_from_zero_one(clean: Tensor, kind: str | None) -> bool:
    """True when no kind was given and the clean outputs ``clean`` are one floating column of
    exact 0s and 1s with at least one 1: :func:`resolve_kind` read them as logits, but a
    sigmoid saturated at 1.0 looks the same, so only the perturbed outputs can tell
    (:func:`check_perturbed_kind`). A column of exact 0s alone is a logit head (float32's
    sigmoid reaches 0.0 only past a logit of about −103, bf16's past about −92), except in
    float16, whose sigmoid is 0.0 past a logit of about −17 (its smallest number is 6e-8): a
    float16 batch of confident negatives is checked too. One host sync, once per batch."""
    if kind is not None:
        return False
    some_one, zeros = _hard(clean)
    # a column of exact 0s alone in float32/bf16 is a logit head (a zero-initialised one, say)
    # and is read as logits without a check; in float16, it was read as logits, and a copy's
    # sigmoid of 1e-6 (class 1 iff > 0) counted as a flip
    return some_one or (zeros and clean.dtype == torch.float16)


def check_perturbed_kind(out: Tensor, inferred_from_clean: bool,
                         when: str = "on perturbed inputs") -> None:
    """Refuse perturbed outputs ``out`` that show a logits reading was wrong.

    ``inferred_from_clean`` is :func:`inferred_from_zero_one` of the clean outputs. When it is
    True (no kind given, clean column all exact 0s and 1s) and ``out`` is one floating column
    lying in [0, 1] with some value strictly inside, the model is a saturated sigmoid read as
    logits — class = p > 0, which no perturbation ever changes: a false 0. That raises the
    "probabilities or logits?" ValueError of :func:`resolve_kind`, naming ``output_kind``.
    Whole numbers with some ≥ 2 (class labels as floats) raise too. Hard decisions (exact 0s
    and 1s in ``out`` too) and logits (values outside [0, 1], not all whole) pass.
    Nothing is computed when ``inferred_from_clean`` is False; else one host sync per call.
    ``when`` says what was perturbed, for the message (output sharpness perturbs weights).
    """
    if not inferred_from_clean:
        return
    seen = _column_range(out)
    if seen is None:
        return
    lo, hi, inside = seen
    if _in_unit(out.dtype, lo, hi) and inside:
        raise _ambiguous(
            lo, hi, "the model's clean outputs are one column of exact 0s and 1s (each exactly "
            f"0 or 1: a saturated sigmoid?), read as logits, but {when} it returns")
    if _labels(out, lo, hi):
        raise _float_labels(
            lo, hi, "the model's clean outputs are one column of exact 0s and 1s, read as "
            f"logits, but {when} it returns")


def predictions(out: Tensor, kind: str = "logits", threshold: float | None = None) -> Tensor:
    """Predicted classes of outputs ``out``: (B,) bool for one column (class 1 iff above the
    kind's boundary), (B,) long argmax for (B, C), labels as they are for integer (B,)."""
    if is_scalar(out):
        flat = out.reshape(-1)
        if not flat.is_floating_point() and kind != "scores":
            return flat  # class labels
        return _above(flat, threshold_of(kind, threshold))
    if out.dim() == 2:
        if not out.is_floating_point():
            raise ValueError(
                f"model output is an integer tensor of shape {tuple(out.shape)}: class labels "
                "are one per example, (batch,), and logits are floating (batch, classes), so "
                "its argmax is no prediction (token ids never change: 0 flips). Select the "
                "logits with output=, or use compare='l1'/'l2' for other outputs")
        return out.argmax(dim=1)
    raise ValueError(
        f"model output has shape {tuple(out.shape)}; compare='class' needs (batch,) or "
        "(batch, classes) outputs — select them with output= (an index, a key or a function "
        "of the raw output), or use compare='l1' or 'l2' for other outputs. A language model's "
        "(batch, positions, vocabulary) logits are read at the last real token when measured "
        "on Embedding tokens (Embedding(..., position=...) picks another position)"
    )


def margins(out: Tensor, ref: Tensor, kind: str = "logits",
            threshold: float | None = None) -> Tensor:
    """Margin of the clean class ``ref`` per row, in the output's own units (≥ 0 where the
    prediction is ``ref``): ±(value − boundary) for one column, the clean class's column minus
    the largest other column for several."""
    if is_scalar(out):
        flat = out.reshape(-1)
        # from the boundary as the output's dtype holds it: the sign agrees with predictions
        # (a value at a rounded-up boundary is above it: margin 0, still ≥ 0)
        z = flat - _boundary(flat.dtype, threshold_of(kind, threshold))[0]
        return torch.where(ref, z, -z)
    top = out.gather(1, ref[:, None]).squeeze(1)
    others = out.scatter(1, ref[:, None], float("-inf"))
    return top - others.max(dim=1).values


#: output dtypes whose rounding can tie two classes that a float32 forward tells apart
LOW_OUTPUTS = (torch.bfloat16, torch.float16)
#: a bf16/fp16 tied example's flips are decided by rounding when the noise moves its margin
#: by at most this many spacings (of the output dtype at the clean class's value), root mean
#: square over the draws
TIE_SPACINGS = 2


def spacing(p: Tensor) -> Tensor:
    """Float64 distance from each entry of ``p`` to the next larger value of its dtype."""
    _, exponent = torch.frexp(p.double())  # |p| = m·2^e, m in [0.5, 1)
    step = torch.finfo(p.dtype).eps * torch.exp2(exponent.double() - 1)
    return torch.where(p == 0, 0.0, step)


def clean_value(clean: Tensor, ref: Tensor) -> Tensor:
    """(B,) the clean class's value: the column itself, or the predicted class's column."""
    return clean.reshape(-1) if is_scalar(clean) else clean.gather(1, ref[:, None])[:, 0]


def tied(clean: Tensor, ref: Tensor, kind: str, threshold: float | None) -> Tensor:
    """(B,) bool: the examples whose clean class ``ref`` is a tie — its margin
    (:func:`margins`: the top column minus the next, or a column's distance from its class
    boundary) is exactly 0, or below the spacing of the output dtype at the clean class's
    value (closer than the outputs can tell apart). Class labels (integer outputs) tie
    nowhere, nor do hard decisions: a column of exact 0s and 1s, some 1 (a step's 0 is class
    0 and flips only when the step does, not at any noise level). Output sharpness and the
    token-wise estimator both say where they count such examples' flips (:func:`tie_breaks`)."""
    if not clean.is_floating_point() or _hard(clean)[0]:
        return torch.zeros(clean.shape[0], dtype=torch.bool, device=clean.device)
    m = margins(clean, ref, kind, threshold).double()
    return (m == 0) | (m < spacing(clean_value(clean, ref)))


def tie_breaks(clean: Tensor, ref: Tensor, ties: Tensor, flipped: Tensor, stuck: Tensor,
               away: Tensor, rms_move: Tensor) -> Tensor:
    """(B,) bool: the tied examples (``ties``, :func:`tied`) whose flips are the tie's, not
    the noise's. ``flipped``: some perturbed copy of the example flipped; ``stuck``: some copy
    sat exactly on the tie again (margin 0); ``away``: some copy moved off it to the clean
    class's side (margin > 0); ``rms_move``: the root mean square over its copies of the
    change of its margin (read only for bf16/fp16 outputs).

    **float32/float64 outputs.** Two columns equal to the last bit (or a column exactly on its
    class boundary) are a tie of the model's own — zero or equal head rows, a dead class, a
    saturated output, a blank input under a head without bias — and its clean class is the
    tie-break (argmax takes the first of equal columns; a column on its boundary reads as the
    lower class). Noise of any size that breaks the tie flips it about half the time, so the
    flip rate does not go to 0 with the noise. Said of the tied examples that flipped, unless
    they are clamped on their tie: a clamped output (a ReLU'd logit of 0 whose pre-activation
    is negative) sits on its boundary again in every copy that does not flip it, never on the
    clean class's side, and flips only where the noise overcomes the pre-activation — a flip
    of the noise's size, not a tie-break. So a tied example with a copy back on the tie is
    said only where another copy moved to the clean class's side: noise too small to move
    the outputs of some copies (1e-4 on one token of a small transformer left 1 copy of 16
    exactly on the tie, 8 on the clean class's side, 7 flipped) does not hide a tie.

    **bf16/fp16 outputs.** Two classes closer than the spacing (0.03 at a logit of 5 in bf16)
    round to a tie that a float32 forward tells apart. Where the noise moves their margin by
    several spacings, a tied example flips about as often as its float32 twin, and nothing is
    said; a tied example that flipped while the noise moved its margin by at most
    :data:`TIE_SPACINGS` spacings is said: its flips are decided by rounding, not by the
    noise."""
    if clean.dtype in LOW_OUTPUTS:  # tied, flipped, and moved within the rounding
        step = spacing(clean_value(clean, ref)).to(ties.device)
        return ties & flipped & (rms_move <= TIE_SPACINGS * step)
    # tied, flipped, and not clamped: never on the tie again, or moved to either side of it
    return ties & flipped & (~stuck | away)


def tie_warning(subject: str, noise: str | None, n: int, b: int, theirs: int, total: int,
                flipped: str, draws: str, rest: str, dtype: torch.dtype, fix: str,
                index: str = "") -> str:
    """The warning that ``subject`` (``"ShPred"``, ``"the sensitivity"``) counts the flips of
    ``n`` of ``b`` examples whose clean class is a tie (:func:`tie_breaks`), ``theirs`` of the
    ``total`` ``flipped`` (``"flipped predictions"``, ``"flipped copies"``), with ``draws``
    (what was drawn, at which ``noise`` level; None: a perturbation of no noise level, a
    replaced token), ``rest`` (the measure over the other examples,
    worded by the caller), ``fix`` (what to do with a float32 tie; a bf16/fp16 one's fix is
    a float32 copy) and ``index`` (" (index 0, 3)": which examples, where known). The cause,
    before the first ':', does not change with the numbers (``senslab._stack.said_once``)."""
    name = str(dtype).removeprefix("torch.")
    if dtype in LOW_OUTPUTS:
        what = (f"have two classes closer than the {name} outputs' spacing (one column: on "
                "the class boundary), so their clean class is decided by rounding, and they "
                f"flipped while the noise moved their margin by at most {TIE_SPACINGS} "
                "spacings (root mean square over the draws): flips decided by the outputs' "
                f"rounding, not by the noise. They made {theirs:,} of the {total:,} {flipped}")
        fix = ("measure a float32 copy (copy.deepcopy(model).float(), inputs cast to float32), "
               "whose outputs tell the tied classes apart")
    else:
        breaks = (f"any {noise} > 0, however small, flips it about half the time: {subject} "
                  f"does not go to 0 with {noise}" if noise is not None else
                  "any perturbation that breaks the tie flips it about half the time")
        what = ("have two classes with equal clean outputs (one column: exactly on the class "
                "boundary), so their clean class is the tie-break (argmax takes the first), and "
                f"{breaks}. They made {theirs:,} of the {total:,} {flipped}")
    return (
        f"{subject} counts flips of examples whose clean class is a tie: {n:,} of the {b:,} "
        f"examples{index} {what} ({draws}); {rest}. The result counts them as changed "
        f"predictions; {fix}. per_sample gives each example's flip rate")


def check_rows(out: Tensor, rows: int, what: str) -> None:
    """An error unless ``out`` has one row per example (``rows``), each with some value; for a
    batch of one it names ``.squeeze()``, which drops the batch axis of a batch of one alone (a
    model that measured larger batches fails on a last chunk of one copy)."""
    squeezed = (" A .squeeze() drops the batch axis of a batch of one: squeeze only the class "
                "axis (.squeeze(-1)) or keep it" if rows == 1 else "")
    if out.dim() == 0:
        raise ValueError(
            f"the model returned a single number for {rows} {what}; sensitivity needs one "
            f"output row per example, shape ({rows},) or ({rows}, classes) — does the model "
            f"reduce over the batch (a mean loss, a .sum())? Return per-example outputs.{squeezed}"
        )
    if out.shape[0] != rows:
        raise ValueError(
            f"the model returned {out.shape[0]} rows (output shape {tuple(out.shape)}) for "
            f"{rows} {what}; sensitivity needs one output row per example — does the model "
            "reduce or reshape over the batch axis, or does output= select the wrong element?"
            f"{squeezed}"
        )
    if 0 in out.shape[1:]:  # argmax and max over no entries raised from inside torch
        raise ValueError(
            f"the model returned no value per example (output shape {tuple(out.shape)}): "
            "there is nothing to compare — does output= slice past the last column (o[:, 1:] "
            "of a one-column output), or was the head built with no outputs? Select the logits "
            "with output=, or give the head its classes"
        )


def check_finite(out: Tensor, what: str, compare: str = "class") -> None:
    """Refuse outputs ``out`` on which sensitivity is undefined, naming the rows.

    With ``compare="class"`` a row's decision is defined unless it holds a NaN or its largest
    entry is not finite (``+inf``, or every entry ``-inf``): ``-inf`` for disallowed classes
    (a common masking idiom) leaves the argmax well defined and is let through; a column of
    one output flips at its boundary only if it is finite. A distance (``"l1"``/``"l2"``)
    needs every entry finite (``-inf - -inf`` is NaN). One host sync when all is well."""
    flat = out.reshape(len(out), -1)
    if not flat.is_floating_point():
        return
    if compare == "class":
        bad_rows = flat.isnan().any(dim=1) | ~torch.isfinite(flat.amax(dim=1)) \
            if flat.shape[1] else torch.zeros(len(flat), dtype=torch.bool, device=flat.device)
    else:
        bad_rows = (~torch.isfinite(flat)).any(dim=1)
    if not bool(bad_rows.any()):
        return
    bad = bad_rows.nonzero().flatten()
    masked = ("; -inf for disallowed classes is fine as long as every row keeps a finite "
              "largest entry (else clamp them: output=lambda o: o.clamp(min=-1e9))"
              if compare == "class" else
              f" (compare={compare!r} measures distances, which -inf entries make NaN: clamp "
              "them, output=lambda o: o.clamp(min=-1e9))")
    raise FloatingPointError(
        f"model output is NaN or infinite on {len(bad)} {what} (first at row "
        f"{bad[0].item()}); sensitivity is undefined there — check the model's weights and "
        f"the inputs{masked}"
    )
