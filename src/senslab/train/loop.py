"""The training loop: plain functions over any registered model and dataset.

``fit(cfg, run_dir)`` trains with sensitivity tracked and writes a run directory. Re-running it
on an existing directory resumes from the last good checkpoint: model, optimizer, scheduler, RNG
states and the position in the epoch's data order are restored, metrics logged after that
checkpoint are dropped and redone, so the final weights and metrics are bit-identical to an
uninterrupted run with the same seed.

The configuration is validated before anything is written, the run directory is locked against
a second writer for the whole run (:meth:`~senslab.train.rundir.RunDir.writing`), and a run
interrupted by Ctrl-C raises :class:`TrainingInterrupted`, which says how to resume.

Under ``torchrun`` (DDP) rank r trains on rows r, r + world, … of every batch; its loss is
scaled by its share of the batch so that DDP's equal-weight gradient average is the batch-mean
gradient of one process, uneven shares included. Each rank draws its own regularizer noise and
dropout masks (rank 0 the single process's streams), and checkpoints keep every rank's streams.
"""

from __future__ import annotations

import dataclasses
import math
import time
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from .._sigint import SigintWatch
from ..data import ArrayDataset, create_dataset
from ..measure.outputs import is_scalar
from ..models import create_model, list_models, model_config
from ._provenance import check_reused, write_env
from .config import LOGGING_ONLY, RunConfig, config_differences, defaults_of, validate
from .progress import Progress
from .report_to import Reporters, clear
from .report_to import check as check_reporters
from .rundir import RunDir, checkpoint_step, environment, load_model_state, notice
from .steps import (
    correct,
    evaluate,
    first_output,
    forward,
    loss_function,
    output_rule,
    to_device,
    weight_norm,
)
from .track import Tracker

# The step pieces (forward, loss, decision rule, evaluation) live in :mod:`.steps`, shared with
# the tracker; they stay importable from here.
__all__ = [
    "TrainingInterrupted", "build_model", "build_optimizer", "build_scheduler", "check_config",
    "check_dir", "check_model_fits_data", "correct", "distributed", "epoch_order", "evaluate",
    "fit", "forward", "load_data", "loss_function", "output_rule", "rank_device",
    "rank_rows", "resolve_device", "to_device", "weight_norm",
]

# -- building blocks ---------------------------------------------------------------------------


def resolve_device(name: str) -> torch.device:
    """``auto`` → CUDA when available, else the CPU; an error naming the fix when the device
    asked for is not on this machine."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(name)
    except RuntimeError:
        raise ValueError(f"unknown device {name!r}; use auto, cpu, cuda, cuda:N or mps") from None
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise ValueError(f"device={name}, but CUDA is not available on this machine; use "
                             "device=cpu, or device=auto (CUDA when there is one)")
        count = torch.cuda.device_count()
        if device.index is not None and device.index >= count:
            raise ValueError(f"device={name}, but this machine has {count} GPU(s) (cuda:0 to "
                             f"cuda:{count - 1}); use one of them, or device=auto")
    if device.type == "mps" and not (torch.backends.mps.is_available()):
        raise ValueError(f"device={name}, but MPS is not available on this machine; use "
                         "device=cpu, or device=auto")
    return device


def load_data(cfg: RunConfig) -> tuple[ArrayDataset, ArrayDataset]:
    d = cfg.data
    kwargs = dict(d.options, root=d.root, download=d.download)
    train = create_dataset(d.name, d.train_split, **kwargs)
    test = create_dataset(d.name, d.test_split, **kwargs)
    if d.train_subset is not None and d.train_subset < len(train):
        g = torch.Generator().manual_seed(cfg.seed + 12345)
        train = train.first(d.train_subset, generator=g)
    elif d.train_subset is not None and d.train_subset > len(train):
        warnings.warn(f"data.train_subset={d.train_subset}, but the {d.train_split} split of "
                      f"{d.name} has {len(train):,} examples: the run trains on all "
                      f"{len(train):,} (set data.train_subset={len(train)} or none to say so)",
                      stacklevel=2)
    return train, test


def _check_labels(data: ArrayDataset, name: str, split: str) -> None:
    """Refuse what the loop cannot score: an empty split, or real-valued targets (accuracy and
    the class-flip sensitivity need class labels; ``.long()`` would truncate 0.7 to class 0)."""
    if len(data) == 0:
        raise ValueError(f"data {name!r} split {split!r} has no examples: check the data folder "
                         "(data.root / SENSLAB_DATA) holds this dataset's files")
    y = data.targets
    if isinstance(y, Tensor) and y.is_floating_point() and not bool((y == y.round()).all()):
        raise ValueError(
            f"data {name!r} split {split!r} has real-valued targets (a regression, e.g. boolean "
            "with function=mean), but this loop scores class labels: its accuracy and "
            "class-flip sensitivity would truncate each target to an integer. MEAN is trained, "
            "with its real-valued sensitivity, by the Hahn-Rofin experiments' loop (senslab "
            "run hr_sharpness_vs_length); for another regression, measure the model with "
            "senslab.token_sensitivity and a decision rule of your own (output_kind/threshold)")


def _check_outputs(cfg: RunConfig, model: nn.Module, train: ArrayDataset, test: ArrayDataset,
                   device: torch.device) -> None:
    """Refuse a model whose outputs cannot score the labels of ``train`` and ``test``, read on
    the first training example (eval mode, mode restored): one column (BCE's or MSE's 0/1
    label) against labels outside {0, 1} — a 1-column MLP on digits trained BCE against labels
    up to 9 to a train/loss of -1.86 and a train/acc of 0.10, without a word —, cross-entropy
    on one column, fewer columns than classes (torch's IndexError, a device-side assert on
    CUDA), or labels below 0."""
    out = first_output(model, train, device)
    ys = [d.targets for d in (train, test) if isinstance(d.targets, Tensor) and d.targets.numel()]
    if not ys or not (out.dim() == 1 or out.dim() == 2):
        return  # other outputs: the loss says what it cannot read
    low, high = min(int(y.min()) for y in ys), max(int(y.max()) for y in ys)
    kind = cfg.train.loss
    if kind == "auto":
        kind = "bce" if is_scalar(out) else "ce"
    loss_function(kind, out)  # bce or mse on several columns: refused, naming the fix
    name, data = cfg.model.name, cfg.data.name
    if low < 0:
        raise ValueError(
            f"{data} has labels down to {low}, but the loop scores class indices 0, 1, … (a "
            f"column per class; one column: a 0/1 label): map the labels to 0..{high - low} "
            "(±1 labels: (y + 1) / 2)")
    if is_scalar(out):
        if kind == "ce":
            raise ValueError(
                f"train.loss=ce reads a score per class, but {name} returns one output column: "
                "use train.loss=auto (BCE-with-logits on one column, for 0/1 labels), or a "
                "model with a column per class")
        if high > 1:
            raise ValueError(
                f"{name} returns one output column (a binary score, trained by "
                f"train.loss={kind} against a 0/1 label), but {data} has {high + 1} classes "
                f"(labels 0 to {high}): its loss and accuracy would read labels it cannot "
                f"output. Use a model with a column per class (model.overrides.num_classes="
                f"{high + 1}, or drop model.overrides.num_classes: it is read from the data)")
    elif high >= out.shape[1]:
        raise ValueError(
            f"{name} returns {out.shape[1]} output columns (a score per class), but {data} has "
            f"labels up to {high} ({high + 1} classes): set model.overrides.num_classes="
            f"{high + 1}, or drop it (it is read from the data)")


def _rank_batch(rows: int, world: int) -> int:
    """The fewest rows a rank trains of a batch of ``rows`` (:func:`rank_rows`: a rank left
    without a row takes one, with share 0)."""
    return max(rows // world, 1)


def _check_batch_of_one(cfg: RunConfig, model: nn.Module, train: ArrayDataset,
                        device: torch.device, world: int) -> None:
    """Refuse, before a step is taken, a run that would hand a BatchNorm layer one value per
    channel in training mode: a batch of one example (``train.batch_size=1``, or the short
    last batch of an epoch: 1,281 examples in batches of 128 end each epoch with one; under
    torchrun a rank's share) where that layer sees one value per channel per example (ResNet-18
    on 8×8 digits, whose last block is 1×1). torch stops the step with "Expected more than 1
    value per channel when training", at the end of the first epoch, after that epoch's steps
    were trained and then lost, and a resume stops there again. Which layers see one value per
    example is read from one example's forward in eval mode (no statistics updated, no random
    number drawn); a layer that sees more trains batches of one without trouble."""
    n, bs = len(train), cfg.train.batch_size
    n_batches = math.ceil(n / bs)
    last = n - (n_batches - 1) * bs
    total_steps = cfg.train.epochs * n_batches
    if cfg.train.max_steps is not None:
        total_steps = min(total_steps, cfg.train.max_steps)
    sizes = {"full": _rank_batch(min(bs, n), world)}
    if total_steps >= n_batches:  # the epoch's short last batch is trained
        sizes["last"] = _rank_batch(last, world)
    if min(sizes.values()) > 1:
        return
    norms = {name: m for name, m in model.named_modules()
             if isinstance(m, nn.modules.batchnorm._BatchNorm)}
    if not norms:
        return
    seen: dict[str, tuple[int, ...]] = {}

    def hook(name: str) -> Any:
        def record(module: nn.Module, args: tuple[Any, ...]) -> None:
            if args and isinstance(args[0], Tensor):
                seen.setdefault(name, tuple(args[0].shape))
        return record

    handles = [m.register_forward_pre_hook(hook(name)) for name, m in norms.items()]
    try:
        first_output(model, train, device)
    finally:
        for handle in handles:
            handle.remove()
    single = [(name, shape) for name, shape in seen.items()
              if len(shape) >= 2 and shape[0] == 1 and math.prod(shape[2:]) == 1]
    if not single:
        return
    name, shape = single[0]
    per_rank = f" (a rank's share of it under torchrun's {world} processes)" if world > 1 else ""
    if sizes["full"] == 1:
        where = f"train.batch_size={bs}{per_rank}, from the first step"
    else:
        where = (f"the last batch of every epoch{per_rank}, as {n:,} training examples in "
                 f"batches of {bs} leave {last} for it (step {n_batches}, after the first "
                 "epoch's other steps)")
    other = next((b for d in range(1, n + 1) for b in (bs - d, bs + d)
                  if 2 <= b and _rank_batch(min(b, n), world) > 1
                  and _rank_batch(n - (math.ceil(n / b) - 1) * b, world) > 1), None)
    fix = (f"set train.batch_size={other} (no batch{' share' if world > 1 else ''} of one)"
           if other is not None else "train on more examples")
    raise ValueError(
        f"{cfg.model.name}'s BatchNorm layer {name!r} sees one value per channel for each example "
        f"(its input is {shape} for one), so in training mode it cannot normalise a batch of "
        f"one example, and this run trains one: {where}. torch would stop that step with "
        f"\"Expected more than 1 value per channel when training\", losing the steps since the "
        f"last checkpoint, and a resume would stop there again: {fix}, or use a model without "
        f"BatchNorm there")


def _non_finite_rows(inputs: Any) -> Tensor:
    """The rows (examples) of ``inputs`` (a tensor, or a dict of them) holding a NaN or ±inf
    in a floating-point tensor, as indices."""
    xs = inputs.values() if isinstance(inputs, dict) else [inputs]
    bad: Tensor | None = None
    for x in xs:
        if isinstance(x, Tensor) and x.is_floating_point() and x.dim():
            rows = ~torch.isfinite(x.detach()).reshape(len(x), -1).all(1).cpu()
            bad = rows if bad is None else bad | rows
    return bad.nonzero().flatten() if bad is not None else torch.zeros(0, dtype=torch.long)


def _examples(rows: Tensor) -> str:
    """``rows`` (indices) in words: the first few, and how many."""
    shown = ", ".join(str(int(i)) for i in rows[:5])
    if len(rows) == 1:
        return f"example {shown}"
    return f"examples {shown}, … ({len(rows):,} in all)" if len(rows) > 5 else f"examples {shown}"


def _untrained_diverged(cfg: RunConfig, err: FloatingPointError, train: ArrayDataset,
                        test: ArrayDataset) -> FloatingPointError:
    """The error for the evaluation before the first step finding a loss that is not finite
    (:func:`~senslab.train.track.diverged`): no step was taken, so the learning rate it advises
    lowering is not the cause; the inputs that hold NaN or ±inf are named, else the initial
    model."""
    what = str(err).partition(": ")[0]  # "evaluation loss became nan (train/loss=nan, ...)"
    name = cfg.data.name
    held = [(split, rows) for split, data in ((cfg.data.train_split, train),
                                              (cfg.data.test_split, test))
            if len(rows := _non_finite_rows(data.inputs))]
    if held:
        said = " and ".join(f"{_examples(rows)} of the {split} split" for split, rows in held)
        cause = (f"{name} holds NaN or ±inf inputs ({said}), so no learning rate can help: "
                 "drop or repair those examples")
    else:
        cause = (f"{name}'s inputs are finite, so the untrained {cfg.model.name}'s outputs "
                 "overflow: check its initialisation (model.overrides) and the scale of the "
                 "inputs")
    return FloatingPointError(f"{what} before any training step: {cause}")


def _check_regularizer(cfg: RunConfig, name: str, inputs: Any) -> None:
    """Refuse a ``train.regularizer`` that cannot put its noise on these inputs (``inputs``: the
    training inputs, or ``"text"`` for a registered text set known by name), naming why and what
    to do: token ids (a text set's dict of ``input_ids``, an integer tensor) take no Gaussian
    noise (``.float()`` makes numbers that name no token), and ``patch_mse`` perturbs a patch of
    an image (batch, channels, height, width), which other inputs do not have."""
    reg = cfg.train.regularizer
    if reg == "none":
        return
    ids = (isinstance(inputs, (str, dict))
           or (isinstance(inputs, Tensor) and not inputs.is_floating_point()))
    if ids:
        raise ValueError(
            f"train.regularizer={reg} adds Gaussian noise to the model's inputs, but {name} "
            "holds token ids (integers): noise on an id names no token, and converting the ids "
            "to float would not change that, so no step could be taken. Train it with "
            "train.regularizer=none (dropping train.reg_*); to lower a text model's sensitivity, "
            "put the noise on its embeddings in a training loop of your own: "
            "senslab.train.regularize.sensitivity_regularized_loss(model, batch, labels, "
            "tokens=Embedding(name), generator=...), naming the token embedding or the "
            "LayerNorm after it (docs/integrations.md#regularize-in-your-own-loop)")
    if reg == "patch_mse" and isinstance(inputs, Tensor) and inputs.dim() != 4:
        p = cfg.train.reg_patch
        raise ValueError(
            f"train.regularizer=patch_mse adds noise to one {p}x{p} patch of each image "
            f"(batch, channels, height, width), but {name} holds inputs of shape "
            f"{tuple(inputs.shape)}, which have no patches: use train.regularizer=noise (noise "
            "on every entry; it reads train.reg_sigma only, so drop train.reg_alpha and "
            "train.reg_patch) or none; in a loop of your own, "
            "senslab.train.regularize.sensitivity_regularized_loss(..., tokens=Sequence()) "
            "puts the noise on one vector of (batch, tokens, dim) sequences")


def _truncation(cfg: RunConfig, train: ArrayDataset, test: ArrayDataset,
                warn: bool = True) -> dict[str, Any] | None:
    """What the cut of a text set to its maximum length took from the examples this run trains
    on (after ``data.train_subset``) and is tested on, for summary.json: ``{"max_len": L,
    "train": {"examples", "truncated_rows", "truncated_tokens", "longest"}, "test": {...}}``
    (``longest``: the longest example's length before the cut); None for data that does not
    count it (meta ``truncated_per_row``, the text sets'). With ``warn``, a cut that removed
    anything is a warning that says how much and how to keep the examples whole."""
    out: dict[str, Any] = {}
    max_len = train.meta.get("max_len")
    for split, data in (("train", train), ("test", test)):
        lost = data.meta.get("truncated_per_row")
        if not isinstance(lost, Tensor) or len(lost) != len(data) or max_len is None:
            continue
        rows = int((lost > 0).sum())
        out[split] = {"examples": len(data), "truncated_rows": rows,
                      "truncated_tokens": int(lost.sum()),
                      "longest": int(max_len + lost.max()) if rows else None}
    if not out:
        return None
    cut = {s: r for s, r in out.items() if r["truncated_rows"]}
    if warn and cut:
        name = cfg.data.name
        said = " and ".join(
            f"{r['truncated_rows']:,} of the {r['examples']:,} "
            f"{'training' if s == 'train' else 'test'} examples lost tokens "
            f"({r['truncated_tokens']:,} in all)" for s, r in cut.items())
        longest = max(r["longest"] for r in cut.values())
        warnings.warn(
            f"{name} is cut to max_len={max_len} tokens: {said}, so the model trains and is "
            f"measured on the cut text. Set data.options.max_len={longest} to keep every "
            "example whole (the longest has that many tokens), if the model's positions allow "
            "it; summary.json records the counts (truncated)", UserWarning, stacklevel=3)
    return {"max_len": max_len, **out}


def _data_fields(data: ArrayDataset) -> dict[str, Any]:
    """Model config fields that the data determines (only those the model has are used)."""
    out: dict[str, Any] = {"num_classes": max(data.num_classes, 2)}
    if isinstance(data.inputs, Tensor) and data.inputs.dim() == 4:
        _, c, h, w = data.inputs.shape
        out.update(in_channels=c, image_size=h)
    meta = data.meta
    for key in ("vocab_size", "pad_id"):
        if key in meta:
            out[key] = meta[key]
    if isinstance(data.inputs, dict) and "input_ids" in data.inputs:
        out["max_len"] = data.inputs["input_ids"].shape[1]
    return out


def _token_vector_fields(cfg: RunConfig, defaults: Any, data: ArrayDataset) -> dict[str, Any]:
    """``{"dim": d}`` for a token-vector model (``sparse_attention``, ``attention_model``: their
    ``dim`` is the length of a token vector) on data of float token vectors (N, L, d), else
    ``{}``. Filled like the other data-determined fields, so it is not recorded in config.json.
    ``model.overrides.dim`` set to another length: a ValueError naming both lengths and the fix
    (the model would fail on its first input)."""
    from ..models.small import AttentionModelConfig, SparseAttentionConfig

    x = data.inputs
    if (not isinstance(defaults, (SparseAttentionConfig, AttentionModelConfig))
            or not isinstance(x, Tensor) or x.dim() != 3 or not x.is_floating_point()):
        return {}
    length = x.shape[-1]
    given = cfg.model.overrides.get("dim", length)
    if given != length:
        name = getattr(data, "name", None) or cfg.data.name
        raise ValueError(
            f"{cfg.model.name} is built for token vectors of length {given} "
            f"(model.overrides.dim) and {name} holds token vectors of length {length}: set "
            f"model.overrides.dim={length}, or leave it unset (it is read from the data)")
    return {"dim": length}


# -- which models take which data ---------------------------------------------------------------

#: the input kinds a model or dataset is told apart by (a model's by the base class of its config,
#: a dataset's by its loader's keywords) → (a model of the kind, what a set of it holds, a set of
#: it); anything else (the Boolean, synthetic and attention tasks, a model or loader registered
#: elsewhere) has no kind and is not checked
_KINDS = {"image": ("an image model", "images", "an image set"),
          "text": ("a text model", "text", "a text set")}


def model_kind(name: str) -> str | None:
    """``"image"`` or ``"text"`` for registered model ``name`` (by its config's class: the image
    classifiers' ``ImageConfig``, the text models' ``TextConfig``), else None — also for a name
    not registered (its own error comes later, where it is built)."""
    from ..models.text import TextConfig
    from ..models.vision import ImageConfig

    try:
        config = model_config(name)
    except Exception:  # unknown, or a factory that cannot build with its defaults: not ours
        return None
    if isinstance(config, ImageConfig):
        return "image"
    if isinstance(config, TextConfig):
        return "text"
    return None


def data_kind(name: str) -> str | None:
    """``"image"`` or ``"text"`` for registered dataset ``name`` (by its loader's keywords: the
    text sets take a ``tokenizer``, the image sets a ``normalize`` mode), else None."""
    from ..data._registry import takes

    if takes(name, "tokenizer"):
        return "text"
    if takes(name, "normalize"):
        return "image"
    return None


def _inputs_kind(data: ArrayDataset) -> str | None:
    """``"image"`` or ``"text"`` for what a loaded dataset holds (a (N, C, H, W) tensor, or a
    dict with ``input_ids``), else None."""
    x = data.inputs
    if isinstance(x, Tensor) and x.dim() == 4:
        return "image"
    if isinstance(x, dict) and "input_ids" in x:
        return "text"
    return None


def _mismatch(model: str, kind: str, data: str, held: str) -> str:
    """The one-line error for model ``model`` (of ``kind``) on data ``data`` holding ``held``:
    the registered sets of the model's kind and the registered models of the data's."""
    from ..data import list_datasets

    sets = ", ".join(n for n in list_datasets() if data_kind(n) == kind)
    models = ", ".join(n for n in list_models() if model_kind(n) == held)
    return (f"{model} is {_KINDS[kind][0]} and {data} holds {_KINDS[held][1]}: use "
            f"{_KINDS[kind][2]} ({sets}) or {_KINDS[held][0]} ({models})")


def check_model_fits_data(cfg: RunConfig) -> None:
    """Refuse, before anything is loaded or written, an image model on a text set or a text
    model on an image set (``cfg.model.name`` and ``cfg.data.name`` as registered): a ValueError
    naming both and what would fit. Other pairs (the synthetic tasks' models and data) pass."""
    model, data = model_kind(cfg.model.name), data_kind(cfg.data.name)
    if model is not None and data is not None and model != data:
        raise ValueError(_mismatch(cfg.model.name, model, cfg.data.name, data))


def build_model(cfg: RunConfig, data: ArrayDataset) -> nn.Module:
    """``create_model`` with data-determined fields filled in unless overridden, seeded. An image
    model given text (or a text model given images) is a ValueError naming the mismatch."""
    model, held = model_kind(cfg.model.name), _inputs_kind(data)
    if model is not None and held is not None and model != held:
        raise ValueError(_mismatch(cfg.model.name, model, getattr(data, "name", None)
                                   or cfg.data.name, held))
    defaults = model_config(cfg.model.name)  # which config fields does this model have?
    names = {f.name for f in dataclasses.fields(defaults)} if defaults is not None else set()
    auto = {k: v for k, v in _data_fields(data).items() if k in names}
    if "num_classes" in auto and data.num_classes == 2 and defaults.num_classes == 1:
        auto.pop("num_classes")  # a scalar-logit model stays scalar on binary data
    auto.update(_token_vector_fields(cfg, defaults, data))
    if "seed" in names:
        auto["seed"] = cfg.seed
    # the CPU generator alone, and the model built on the CPU (callers move it): torch.manual_seed
    # also seeds CUDA's generators, which fork_rng(devices=[]) does not restore
    with torch.random.fork_rng(devices=[]), torch.device("cpu"):
        torch.default_generator.manual_seed(cfg.seed)
        return create_model(cfg.model.name, **{**auto, **cfg.model.overrides})


def build_optimizer(cfg: RunConfig, model: nn.Module) -> torch.optim.Optimizer:
    o = cfg.optim
    params = [p for p in model.parameters() if p.requires_grad]
    if o.name == "sgd":
        return torch.optim.SGD(params, lr=o.lr, momentum=o.momentum, weight_decay=o.weight_decay)
    if o.name == "adam":
        return torch.optim.Adam(params, lr=o.lr, weight_decay=o.weight_decay)
    if o.name == "adamw":
        return torch.optim.AdamW(params, lr=o.lr, weight_decay=o.weight_decay)
    if o.name in ("ngd", "sngd", "sps"):
        from .. import optim as so

        if o.name == "sps":  # optim.lr unused (validate); a schedule scales SPS's factor lr=1
            return so.SPS(params, eta_max=o.eta_max, lr=1.0)
        return so.NGD(params, lr=o.lr, eta_max=o.eta_max)
    raise ValueError(f"unknown optimizer {o.name!r}; use sgd, adam, adamw, ngd, sngd or sps")


def build_scheduler(cfg: RunConfig, opt: torch.optim.Optimizer) -> Any:
    o = cfg.optim
    if o.schedule == "constant":
        return None
    if o.schedule == "step":
        return torch.optim.lr_scheduler.StepLR(opt, step_size=o.step_epochs, gamma=o.gamma)
    if o.schedule == "cosine":
        return torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=cfg.train.epochs)
    raise ValueError(f"unknown schedule {o.schedule!r}; use constant, step or cosine")


def epoch_order(seed: int, epoch: int, n: int) -> Tensor:
    """The data order of one epoch: a function of (seed, epoch) only, so resume can replay it."""
    return torch.randperm(n, generator=torch.Generator().manual_seed(seed * 100_003 + epoch))


# -- the loop ----------------------------------------------------------------------------------


@dataclass
class _Position:
    epoch: int = 0  # the epoch being run
    batch: int = 0  # next batch index inside it
    step: int = 0  # optimizer steps so far
    interrupted: bool = False  # Ctrl-C seen (:func:`_interrupts`)


def _interrupts(pos: _Position) -> SigintWatch:
    """Ctrl-C during training is never lost (:class:`senslab._sigint.SigintWatch`): a
    KeyboardInterrupt swallowed in a finalizer (the tracked sensitivity's memory bookkeeping,
    for one) still marks ``pos.interrupted``, which the loop checks after every step."""
    return SigintWatch(lambda: setattr(pos, "interrupted", True))


class TrainingInterrupted(KeyboardInterrupt):
    """Training stopped by Ctrl-C (SIGINT); ``step`` is where, ``checkpoint`` the step a re-run
    resumes from (None: it starts over). The run directory's lock is released. Every trainer's
    run directory resumes (``fit``'s and :class:`~senslab.train.looprun.LoopRun`'s), so every
    trainer raises it. ``epoch``: for a loop that knows its position once per epoch only
    (:func:`senslab.train.loops._common.run_epochs`), the epoch in progress — ``step`` is then
    the steps done before it, and the message says so rather than claim an exact step."""

    def __init__(self, step: int, checkpoint: int | None, epoch: int | None = None) -> None:
        where = (f"resumes from the checkpoint at step {checkpoint}" if checkpoint is not None
                 else "starts over: no checkpoint was written yet")
        at = f"at step {step}" if epoch is None else f"in epoch {epoch}, after step {step}"
        super().__init__(f"interrupted {at}; re-run the same command to resume (it {where})")
        self.step, self.checkpoint, self.epoch = step, checkpoint, epoch


def fit(cfg: RunConfig, run_dir: str | Path, progress: bool | None = None) -> dict[str, Any]:
    """Train as configured, tracking metrics; resume if ``run_dir`` holds a run of ``cfg``.

    Returns the summary (label and final metrics). The global torch RNG (dropout) is seeded from
    ``cfg.seed`` inside a fork, so the caller's RNG state is left untouched. An invalid
    configuration is an error before anything is written; Ctrl-C raises
    :class:`TrainingInterrupted`. ``cfg.track.report_to`` sends every metrics.jsonl record to
    TensorBoard and/or W&B as well (:mod:`senslab.train.report_to`).
    """
    import torch.distributed as dist

    check_config(cfg)
    cfg = _own_copy(cfg)

    owns_group = dist.is_available() and not dist.is_initialized()
    devices = list(range(torch.cuda.device_count())) if torch.cuda.is_available() else []
    try:
        with torch.random.fork_rng(devices=devices):
            torch.manual_seed(cfg.seed + DROPOUT_SEED_OFFSET)  # ranks > 0: offset in _train
            summary = _fit(cfg, run_dir, progress)
    except BaseException:
        if owns_group and dist.is_initialized():
            dist.destroy_process_group()  # no barrier: the other ranks may never reach it
        raise
    # A process group this call created is shut down once every rank has finished: a rank that
    # exits while the group still lives can abort at interpreter exit ("terminate called
    # without an active exception", seen with gloo). Rarely a gloo rank still aborts that way
    # in the interpreter's teardown, after this returns and every output is written (no
    # Python object of the group survives here); a script that must exit 0 under torchrun can
    # end with os._exit(0).
    if owns_group and dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()
    return summary


def distributed(device: torch.device) -> tuple[int, int]:
    """(rank, world size); initialises the process group when started by torchrun (NCCL when
    training on GPUs, gloo on CPUs — also on a GPU machine told ``device=cpu``)."""
    import os

    import torch.distributed as dist

    if int(os.environ.get("WORLD_SIZE", "1")) > 1 and not dist.is_initialized():
        dist.init_process_group("nccl" if device.type == "cuda" else "gloo")
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def rank_device(device: torch.device, world: int) -> torch.device:
    """This process's device: under torchrun on GPUs, the GPU of its local rank — an error
    naming the fix when the node has fewer GPUs than processes."""
    import os

    if world == 1 or device.type != "cuda":
        return device
    local, gpus = int(os.environ.get("LOCAL_RANK", "0")), torch.cuda.device_count()
    if local >= gpus:
        raise RuntimeError(
            f"torchrun started local rank {local} but this machine has {gpus} GPU(s): launch "
            f"with --nproc_per_node={gpus} (one process per GPU), or set device=cpu"
        )
    torch.cuda.set_device(local)  # NCCL's communicators then use this GPU too
    return torch.device("cuda", local)


def _same_buffers(model: nn.Module, world: int) -> None:
    """Give every rank rank 0's buffers (BatchNorm's running statistics). DDP broadcasts them
    at the start of each training forward, so after the last one each rank holds statistics
    updated on its own rows: the ranks' shards of an evaluation read different models, none
    of them the one rank 0 checkpoints (ResNet-18 on digits, 2 ranks: train/loss 7.843 logged
    for a checkpoint whose train/loss is 7.625)."""
    if world > 1:
        import torch.distributed as dist

        for buffer in model.buffers():
            dist.broadcast(buffer, 0)


def _barrier(world: int) -> None:
    if world > 1:
        import torch.distributed as dist

        dist.barrier()


def _fit(cfg: RunConfig, run_dir: str | Path, progress: bool | None) -> dict[str, Any]:
    device = resolve_device(cfg.device)
    rank, world = distributed(device)
    rd = RunDir(run_dir, readonly=rank != 0)
    pos = _Position()
    try:
        # ranks > 0 (read-only) take no lock; reporters close before the lock is released
        with _interrupts(pos), rd.writing(), Reporters() as reporters:
            return _train(cfg, rd, device, rank, world, progress, pos, reporters)
    except KeyboardInterrupt as err:
        if isinstance(err, TrainingInterrupted):
            raise
        saved = rd.checkpoints()
        raise TrainingInterrupted(pos.step, checkpoint_step(saved[-1]) if saved else None) from None


def check_config(cfg: RunConfig) -> None:
    """What :func:`fit` refuses before anything is written or loaded: an invalid value, an image
    model on text (or back), a noise regularizer on a text set, a reporter whose package is
    missing, a model or dataset name that is not registered (its error named the name only after
    the run directory was made, which a corrected command then found holding a failed start)."""
    from ..data._registry import DATASETS
    from ..models._registry import MODELS

    validate(cfg)
    MODELS.get(cfg.model.name)  # the registry's KeyError, with the closest names
    DATASETS.get(cfg.data.name)
    check_model_fits_data(cfg)
    if data_kind(cfg.data.name) == "text":  # by name: refused before anything is written
        _check_regularizer(cfg, cfg.data.name, "text")
    check_reporters(cfg.track.report_to)


def _own_copy(cfg: RunConfig) -> RunConfig:
    """The run's own copy of ``cfg``, label resolved and the data folder found (config.json
    holds them filled in, so a resume on another copy of the data is refused); the caller's is
    kept."""
    cfg = dataclasses.replace(cfg, label=cfg.label or cfg.model.name,
                              data=dataclasses.replace(cfg.data))
    locate_data(cfg)
    return cfg


def check_dir(cfg: RunConfig, run_dir: str | Path) -> None:
    """Refuse, taking no lock and writing nothing, what :func:`fit` of ``cfg`` into ``run_dir``
    refuses before it trains (the trainer's ``check_dir``, which an experiment calls for every
    run before it sets an earlier verdict aside): a directory it cannot write
    (:meth:`~senslab.train.rundir.RunDir.check_target`), a run of another configuration that
    trained there, a finished run whose summary its metric log contradicts, a checkpoint of a
    newer senslab. (A checkpoint's contents are checked when the run loads it.)"""
    cfg = _own_copy(cfg)
    rd = RunDir(run_dir)
    rd.check_target()
    if not rd.exists() or _other_run(rd, cfg):
        return  # a fresh start, or over a run that stopped before its first checkpoint
    if (rd.path / "summary.json").exists():
        rd.read_json("summary.json")  # reused: refused when its metric log disagrees
    else:
        rd.check_formats()  # resumed


def _other_run(rd: RunDir, cfg: RunConfig) -> list[str]:
    """The keys in which the run in ``rd`` (which has a config.json) differs from ``cfg``
    (:func:`config_changes`); a ValueError when they differ and that run trained (a checkpoint,
    or finished): it is kept, never replaced."""
    old = rd.read_json("config.json")
    changed = config_changes(old, cfg)
    if changed and (rd.checkpoints() or (rd.path / "summary.json").exists()):
        from .trainers import held_run

        what = held_run(rd.path, old, set(cfg.to_dict()),
                        ", not of `senslab train` (trainer 'fit')")
        raise ValueError(
            f"{rd.path} holds {what} (differs in {', '.join(changed)}); use another --out "
            "directory, or delete it to start over")
    return changed


def config_changes(old: dict[str, Any], cfg: RunConfig) -> list[str]:
    """The keys in which a run directory's config.json ``old`` differs from ``cfg``; ``[]``: it
    holds this run. A field added since ``old`` was written counts only when ``cfg`` sets it off
    its default; logging-only settings (``track.report_to``) never count."""
    return config_differences(old, cfg.to_dict(), defaults_of(RunConfig), LOGGING_ONLY)


def _train(cfg: RunConfig, rd: RunDir, device: torch.device, rank: int, world: int,
           progress: bool | None, pos: _Position, reporters: Reporters) -> dict[str, Any]:
    report_to = cfg.track.report_to if rank == 0 else []
    if rd.exists():
        if _other_run(rd, cfg):
            if rank == 0:  # nothing was trained yet: the start failed, or was cut short
                notice(f"{rd.path} holds a run that stopped before its first checkpoint; "
                       "starting it over with the new configuration")
            rd.reset()
        elif (rd.path / "summary.json").exists():
            # read first: a summary its metric log disagrees with is refused (RunDir.read_json)
            # before a reporter is sent anything
            summary = rd.read_json("summary.json")
            if rank == 0:
                check_reused(rd.path)
            reporters.open(report_to, rd, cfg.to_dict(), cfg.name)  # sends what they lack
            return summary
    device = rank_device(device, world)
    train, test = load_data(cfg)
    for split, data in ((cfg.data.train_split, train), (cfg.data.test_split, test)):
        _check_labels(data, cfg.data.name, split)  # what the loop scores (measuring does not)
    _check_regularizer(cfg, getattr(train, "name", None) or cfg.data.name, train.inputs)
    truncated = _truncation(cfg, train, test, warn=rank == 0)
    model = build_model(cfg, train).to(device)
    _check_outputs(cfg, model, train, test, device)
    _check_batch_of_one(cfg, model, train, device, world)
    net: nn.Module = model
    if world > 1:  # gradients averaged across ranks; `model` stays the plain module
        net = nn.parallel.DistributedDataParallel(model)
    opt = build_optimizer(cfg, model)
    sched = build_scheduler(cfg, opt)
    # each rank draws its own regularizer noise (rank 0 the single process's stream): one seed
    # for all ranks gave every rank's row i the same patch and the same noise
    reg_gen = torch.Generator().manual_seed(cfg.seed + 777 + REG_RANK_STRIDE * rank)
    if rank:  # and its own dropout masks: fit seeds every rank's global RNG alike, so rank 1's
        # rows got rank 0's masks (ViT on 2 ranks: the first masks identical); rank 0 keeps
        # the single process's stream
        torch.manual_seed(cfg.seed + DROPOUT_SEED_OFFSET + REG_RANK_STRIDE * rank)
    start_time = 0.0

    found = rd.load_latest(resume=True) if rd.exists() else None
    state = found[1] if found is not None else None
    if state is not None:
        load_model_state(model, state["model"], found[0])
        opt.load_state_dict(state["optimizer"])
        if sched is not None:
            sched.load_state_dict(state["scheduler"])
        _restore_rngs(state, reg_gen, rank, world)
        for key, value in state["position"].items():
            # a Ctrl-C belongs to the sitting that saw it: restored from a checkpoint that
            # stored it (saved after a swallowed one), it stopped every resume after one step
            if key != "interrupted":
                setattr(pos, key, value)
        start_time = state["time"]
        rd.truncate_metrics(pos.step)
        if rank == 0:
            notice(f"resuming {rd.path} from step {pos.step} (checkpoint {found[0].name})")
    else:
        rd.write_json("config.json", cfg.to_dict())
        rd.metrics_path.unlink(missing_ok=True)
        clear(rd)
    write_env(rd, environment(device) | {"world_size": world},
              pos.step if state is not None else None, warn=rank == 0)
    _barrier(world)  # ranks > 0 read the run directory only once rank 0 has set it up
    reporters.open(report_to, rd, cfg.to_dict(), cfg.name)  # metrics.jsonl as kept, first

    tracker = Tracker(cfg, model, train, test, device, shard=(rank, world) if world > 1 else None)
    loss_kind = cfg.train.loss
    clock = time.perf_counter() - start_time
    n = len(train)
    bs = cfg.train.batch_size
    n_batches = math.ceil(n / bs)
    total_steps = cfg.train.epochs * n_batches
    if cfg.train.max_steps is not None:
        total_steps = min(total_steps, cfg.train.max_steps)
    if rank == 0 and cfg.train.max_steps is not None and total_steps < cfg.train.max_steps:
        # train.max_steps caps train.epochs, it does not override it (as Hugging Face's
        # max_steps does): said, since config.json keeps the steps asked for
        need = math.ceil(cfg.train.max_steps / n_batches)
        warnings.warn(
            f"train.max_steps={cfg.train.max_steps}, but train.epochs={cfg.train.epochs} of "
            f"{n_batches} steps each ({n:,} training examples in batches of {bs}) end the run "
            f"at step {total_steps}: train.max_steps only stops a run early, it never trains "
            "past train.epochs. "
            f"Set train.epochs={need} for {cfg.train.max_steps} steps, or drop train.max_steps "
            f"(or set it to {total_steps}) to say so", UserWarning, stacklevel=4)
    said = _schedule_cut(cfg, n_batches, total_steps) if rank == 0 else None
    if said is not None:
        warnings.warn(said, UserWarning, stacklevel=4)
    bar = Progress(total_steps, enabled=progress if rank == 0 else False, desc=cfg.name,
                   initial=pos.step)

    def checkpoint() -> None:
        regs = globals_ = None
        if world > 1:  # every rank's noise and dropout streams, so that a resume continues each
            import torch.distributed as dist

            regs, globals_ = [None] * world, [None] * world
            dist.all_gather_object(regs, reg_gen.get_state())
            dist.all_gather_object(globals_, _global_rng())
        rd.save_checkpoint(
            {
                "model": model.state_dict(),
                "optimizer": opt.state_dict(),
                "scheduler": sched.state_dict() if sched is not None else None,
                "torch_rng": torch.get_rng_state(),
                "cuda_rng": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None,
                "reg_rng": reg_gen.get_state(),
                **({"reg_rngs": regs} if regs is not None else {}),
                **({"torch_rngs": [g[0] for g in globals_], "cuda_rngs": [g[1] for g in globals_]}
                   if globals_ is not None else {}),
                # where the loop is; not whether this sitting was interrupted (see the resume)
                "position": {k: v for k, v in dataclasses.asdict(pos).items()
                             if k != "interrupted"},
                "time": time.perf_counter() - clock,
            },
            pos.step,
            keep=cfg.train.keep_checkpoints,
        )

    def log_eval() -> dict[str, Any]:
        _same_buffers(model, world)  # every rank measures the model rank 0 checkpoints
        record = {"step": pos.step, "epoch": pos.epoch + pos.batch / n_batches}
        record.update(tracker.measure(loss_kind))
        record["time"] = round(time.perf_counter() - clock, 3)
        rd.log(record)
        try:
            reporters.log(record)
        except Exception:
            # a reporter's failure (W&B's network, a full disk under tensorboard/) ended the run
            # before this step's checkpoint: the steps since the last one were trained again on
            # the resume. The record is in metrics.jsonl, which the reporters catch up from;
            # one process only (every rank takes part in a checkpoint)
            if world == 1 and pos.step > 0 and not any(
                    checkpoint_step(p) == pos.step for p in rd.checkpoints()):
                checkpoint()
            raise
        bar.set_postfix(record)
        return record

    if pos.step == 0 and pos.batch == 0 and pos.epoch == 0 and not rd.metrics():
        try:
            last = log_eval()
        except FloatingPointError as err:  # not the learning rate's doing: nothing trained yet
            if not str(err).startswith("evaluation loss became"):  # another measurement's
                raise
            raise _untrained_diverged(cfg, err, train, test) from None
    else:
        last = rd.metrics()[-1] if rd.metrics() else log_eval()
    done = _reached(cfg, last) or pos.step >= total_steps
    model.train()
    while not done and pos.epoch < cfg.train.epochs:
        order = epoch_order(cfg.seed, pos.epoch, n)
        while pos.batch < n_batches:
            whole = order[pos.batch * bs : (pos.batch + 1) * bs]
            idx, share = rank_rows(whole, rank, world)
            x, y = train.batch(idx)
            x, y = to_device(x, device), y.to(device)
            try:
                loss = _train_step(cfg, net, opt, x, y, loss_kind, reg_gen, share)
            except FloatingPointError as err:
                rows = _non_finite_rows(x)
                if not len(rows):
                    raise
                cut = (f", counted in the {n:,} examples of data.train_subset"
                       if cfg.data.train_subset is not None else "")
                # the batch's own inputs: a lower learning rate, which the error advises, would
                # stop at this step again
                raise FloatingPointError(
                    f"{str(err).partition(';')[0]} at step {pos.step + 1}: its batch holds NaN "
                    f"or ±inf inputs ({_examples(idx[rows.to(idx.device)])} of the "
                    f"{cfg.data.train_split} split of {cfg.data.name}{cut}), so no learning "
                    "rate can help: drop or repair those examples") from None
            pos.batch += 1
            pos.step += 1
            if pos.interrupted:  # a Ctrl-C whose KeyboardInterrupt was swallowed
                raise KeyboardInterrupt
            bar.update(1, loss=loss)
            if pos.step >= total_steps:
                break
            # log before checkpointing: a crash in between redoes the record, never loses it
            if cfg.track.unit == "step" and pos.step % cfg.track.every == 0:
                last = log_eval()
                if _reached(cfg, last):  # stop at this record (the summary's, the checkpoint's)
                    break
            every = cfg.train.checkpoint_every
            if every and pos.step % every == 0 and pos.batch < n_batches:
                checkpoint()
        epoch_done = pos.batch >= n_batches
        if epoch_done:
            pos.epoch += 1
            pos.batch = 0
            if sched is not None:
                sched.step()
        at_end = pos.step >= total_steps or pos.epoch >= cfg.train.epochs
        if cfg.track.unit == "epoch" and (pos.epoch % cfg.track.every == 0 or at_end):
            last = log_eval()
        elif at_end and last.get("step") != pos.step:
            last = log_eval()
        done = at_end or _reached(cfg, last)
        checkpoint()
    bar.close()
    # a run stopped before its first step (the untrained model reached train.target_train_acc)
    # saves its final model all the same: `senslab measure --checkpoint` found no checkpoint
    # and sent the user to re-run a run that was finished
    if pos.step == 0:
        checkpoint()
    summary = {
        "label": cfg.label,
        "name": cfg.name,
        "final": {k: v for k, v in last.items() if not isinstance(v, list)},
        "steps": pos.step,
        "epochs": pos.epoch,
        "seconds": round(time.perf_counter() - clock, 3),
        "stopped": "target_train_acc" if _reached(cfg, last) else "budget",
        **({"truncated": truncated} if truncated is not None else {}),
    }
    rd.write_json("summary.json", summary)
    return summary


def _schedule_cut(cfg: RunConfig, n_batches: int, total_steps: int) -> str | None:
    """The warning for a learning-rate schedule this run does not train as its config says, else
    None. The schedules change the rate once per epoch (cosine over ``train.epochs``), so a run
    that never reaches a second epoch (``train.epochs=1``), or the epoch of a step's first
    decay, trains at a constant rate, and one that ``train.max_steps`` stops before its last
    epoch ends a cosine far from 0 — each recorded as the schedule asked for, without a word."""
    o, epochs = cfg.optim, cfg.train.epochs
    last = (total_steps - 1) // n_batches  # the last epoch trained (0-based)
    cosine = o.schedule == "cosine" and last < max(epochs - 1, 1)
    if not (cosine or o.schedule == "step" and last < o.step_epochs):
        return None
    cut = total_steps < epochs * n_batches
    # sps has no learning rate (optim.lr is unused): the schedule scales its step by a factor
    # from 1
    rate, base, start = (("the step-size factor", 1.0, "1") if o.name == "sps" else
                         ("the learning rate", o.lr, f"optim.lr={o.lr:g}"))
    if cosine:
        what = f"anneals {rate} once per epoch over train.epochs={epochs}"
    else:
        what = (f"multiplies {rate} by optim.gamma={o.gamma:g} every "
                f"optim.step_epochs={o.step_epochs} epochs")
    if last == 0 or not cosine:
        ends = f"it stays at {start} throughout, as with optim.schedule=constant"
        fix = (f"optim.step_epochs={last} or less" if last else
               "train.epochs=2 or more" + (f" and train.max_steps above {n_batches}"
                                           if cut else ""))
    else:
        at = base * (1 + math.cos(math.pi * last / epochs)) / 2
        ends = f"its last epoch trains at {at:.3g}, not near 0"
        fix = f"train.epochs={last + 1} (the epochs it trains)"
    steps = (f"{total_steps} steps (train.max_steps={cfg.train.max_steps})" if cut
             else f"{total_steps} steps")
    return (f"optim.schedule={o.schedule} {what}, but this run trains {steps} of {n_batches} "
            f"per epoch, in {last + 1} epoch{'s' if last else ''}: {ends}. Set {fix} for the "
            "schedule to act, or optim.schedule=constant to say that the rate is constant")


def _reached(cfg: RunConfig, record: dict[str, Any]) -> bool:
    target = cfg.train.target_train_acc
    return target is not None and record.get("train/acc", 0.0) >= target


def rank_rows(whole: Tensor, rank: int, world: int) -> tuple[Tensor, float]:
    """The rows of the batch ``whole`` (indices) that rank ``rank`` of ``world`` trains on, and
    its share: rows rank, rank + world, … (disjoint, covering the batch), weighted by their
    number × world / the batch's. DDP averages the ranks' gradients with equal weights, so a
    rank's mean loss weighs its share of the batch, and uneven shares (15 on 2 ranks, a short
    last batch) give the batch-mean gradient, as one process does. A rank left without a row (a
    batch smaller than the world: 1,001 examples in batches of 100 on 2 ranks end with a batch
    of 1) takes the batch's first row with share 0, so that it joins DDP's gradient average
    adding nothing; its mean loss over no rows was NaN, which stopped the run as diverged
    ("lower optim.lr")."""
    idx = whole[rank::world]
    if len(idx):
        return idx, len(idx) * world / len(whole)
    return whole[:1], 0.0


#: the regularizer's seed offset between ranks (rank r: seed + 777 + r × this); the global RNG's
#: (dropout) likewise: rank r draws from seed + DROPOUT_SEED_OFFSET + r × this
REG_RANK_STRIDE = 1_000_003
#: the global RNG (dropout) of a run of seed s is seeded with s + this (rank 0; see above)
DROPOUT_SEED_OFFSET = 1_000_003


def _global_rng() -> tuple[Tensor, list[Tensor] | None]:
    """This process's global RNG states: the CPU stream and every visible GPU's (or None)."""
    return (torch.get_rng_state(),
            torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None)


def _restore_rngs(state: dict[str, Any], reg_gen: torch.Generator, rank: int,
                  world: int) -> None:
    """Set the global RNG (dropout) and the regularizer's noise generator ``reg_gen`` from
    checkpoint ``state``: under torchrun each rank its own streams (``torch_rngs``,
    ``reg_rngs``); rank 0's for every rank made their masks, and their regularizer's patches
    and noise, the same after a resume. A checkpoint without one per rank (written by an older
    senslab, or by another number of ranks) gives rank 0 its streams and leaves the others on
    the fresh ones seeded for them, with one warning (rank 0's) that the resume is not the
    uninterrupted run's; one process resuming a checkpoint of several ranks takes rank 0's
    streams, with a warning too."""
    cpu, gpu = state["torch_rng"], state.get("cuda_rng")
    reg = state["reg_rng"]
    if world > 1:
        short = {what: len(streams) if streams else 1
                 for what, streams in (("dropout", state.get("torch_rngs")),
                                       ("regularizer noise", state.get("reg_rngs")))
                 if streams is None or len(streams) != world}
        if "dropout" not in short:
            cpu, gpu = state["torch_rngs"][rank], state.get("cuda_rngs", [None] * world)[rank]
        if "regularizer noise" not in short:
            reg = state["reg_rngs"][rank]
        if short and rank == 0:
            held = " and ".join(f"{n} {what} stream(s)" for what, n in short.items())
            warnings.warn(
                f"this checkpoint holds {held} for the {world} ranks now running (written by "
                f"an older senslab, or by another number of ranks): ranks > 0 continue on "
                f"fresh streams of their own, so the resumed run's "
                f"{' and '.join(short)} draws are not the uninterrupted run's; resume on the "
                f"number of ranks that wrote the checkpoint, or start over in a new run "
                f"directory, for an exact run",
                UserWarning, stacklevel=4)
        if rank and "dropout" in short:
            cpu = gpu = None
        if rank and "regularizer noise" in short:
            reg = None
    else:
        wrote = max(len(state.get("torch_rngs") or ()), len(state.get("reg_rngs") or ()))
        if wrote > 1:  # the streams of ranks > 0 are dropped: their rows draw rank 0's now
            warnings.warn(
                f"this checkpoint was written by {wrote} ranks and is resumed in one process: "
                f"it continues on rank 0's dropout and regularizer streams, so the rows ranks "
                f"> 0 trained get other draws and the resumed run is not the uninterrupted "
                f"run's; resume with torchrun --nproc_per_node={wrote}, or start over in a new "
                f"run directory, for an exact run", UserWarning, stacklevel=4)
    if reg is not None:
        reg_gen.set_state(reg)
    if cpu is not None:
        torch.set_rng_state(cpu)
    if gpu is not None and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(gpu)


def _train_step(cfg: RunConfig, model: nn.Module, opt: torch.optim.Optimizer, x: Any, y: Tensor,
                loss_kind: str, reg_gen: torch.Generator, share: float = 1.0) -> float:
    """One optimizer step on the batch ``(x, y)``; ``share``: this rank's weight in DDP's
    average (its examples × world size / the batch's), which scales the gradient only (the
    loss returned is the rank's own mean). An SPS step reads the whole batch's mean loss,
    averaged over the ranks as DDP averages the gradient: with each rank's own, the ranks took
    different steps and their models drifted apart."""
    import torch.distributed as dist

    t = cfg.train
    closure_needed = cfg.optim.name == "sps"
    world = dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1
    own: list[Tensor] = []

    def compute_loss() -> Tensor:
        if t.regularizer == "none":
            out = forward(model, x)
            return loss_function(loss_kind, out)(out, y)
        from . import regularize

        if t.regularizer == "noise":
            xn = regularize.gaussian_noise_augment(x, t.reg_sigma, reg_gen)
            out = forward(model, xn)
            return loss_function(loss_kind, out)(out, y)
        if t.regularizer == "patch_mse":
            loss, _ = regularize.sensitivity_regularized_loss(
                model, x, y, alpha=t.reg_alpha, patch=t.reg_patch, sigma=t.reg_sigma,
                generator=reg_gen,  # the task loss is train.loss's, as without the regularizer
                loss_fn=lambda out, target: loss_function(loss_kind, out)(out, target),
            )
            return loss
        raise ValueError(f"unknown regularizer {t.regularizer!r}; use none, noise or patch_mse")

    def closure() -> Tensor:
        opt.zero_grad(set_to_none=True)
        loss = compute_loss()
        (loss if share == 1.0 else loss * share).backward()
        if world == 1 or not closure_needed:
            return loss
        own.append(loss)
        whole = loss.detach() * share  # Σ over ranks of share × mean = world × the batch mean
        dist.all_reduce(whole)
        return whole / world

    if closure_needed:
        loss = opt.step(closure)
        loss = own[-1] if own else loss
    else:
        loss = closure()
        opt.step()
    value = float(loss.detach())
    if not math.isfinite(value):
        rate = (f"optim.eta_max (now {cfg.optim.eta_max}; sps sets its own step size)"
                if cfg.optim.name == "sps" else f"optim.lr (now {cfg.optim.lr})")
        raise FloatingPointError(f"training loss became {value}; lower {rate} or check the data")
    return value


def locate_data(cfg: RunConfig) -> None:
    """Find ``cfg``'s dataset by the one rule of :mod:`senslab.data._roots` (explicit
    ``data.root``, else ``$SENSLAB_DATA/<name>``, else an installed package's copy), raising its
    error — every place looked in, the files, the fixes — before any training. A folder found in
    the data home is recorded in ``cfg.data.root`` (absolute), so that config.json says which
    copy was read; a package's copy and a download are left to the loader."""
    from ..data import locate

    d = cfg.data
    if d.root:  # config.json records the folder read (``--set data.root=~/x`` is not expanded)
        d.root = str(Path(d.root).expanduser())
    found = locate(d.name, d.root, download=d.download)
    if found is not None and found.step == "data home":
        d.root = str(found.path.resolve())
