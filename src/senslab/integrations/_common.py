"""What the integrations share: option checks, fresh random streams, moving a fixed subset to
the model and measuring it."""

from __future__ import annotations

import difflib
import hashlib
import inspect
from collections.abc import Callable, Mapping
from contextlib import ExitStack, nullcontext
from numbers import Integral, Real
from typing import Any

import torch
from torch import Tensor, nn

from ..measure import SensitivityResult, TokenSensitivity
from ..measure._options import float32_default
from ..tokens import Sequence, Tokenization
from ..tokens.base import Inputs, batch_size, model_device, select

#: options of :class:`TokenSensitivity` the integrations set themselves
_OWN = {"self", "model", "tokens", "generator", "shard"}
OPTIONS = tuple(p for p in inspect.signature(TokenSensitivity.__init__).parameters if p not in _OWN)


def _placeholder(x: Any) -> Any:  # stands in for the model while checking options
    return x


def check_options(tokens: Tokenization | None, options: dict[str, Any], where: str) -> None:
    """Refuse unknown option names (naming the closest valid one) and invalid values, at
    construction rather than at the first measurement."""
    for name in options:
        if name not in OPTIONS:
            close = difflib.get_close_matches(name, OPTIONS, n=1)
            hint = f"; did you mean {close[0]}=?" if close else ""
            if name == "shard":
                hint = ("; processes are handled by the integration itself (docs/integrations.md, "
                        "'torchmetrics and Lightning')")
            raise TypeError(f"{where} got an unknown option {name}={options[name]!r}{hint}")
    # the measure's own checks, with a stand-in model (no forward pass runs)
    TokenSensitivity(_placeholder, tokens if tokens is not None else Sequence(), **options)


def check_subset(inputs: Any, options: dict[str, Any], where: str) -> None:
    """Refuse at construction a subset the first measurement would refuse — one of no example,
    or a left-padded ``attention_mask`` with padding-aware batching on — rather than after an
    epoch of training (an empty subset stopped the training with the model's own error on an
    empty batch, BERT's "cannot reshape tensor of 0 elements")."""
    from ..measure._trim import left_padded_message, left_padded_row
    from ..tokens.base import MAIN_KEYS, batch_size

    _check_batched(inputs, where, MAIN_KEYS)
    try:
        n = batch_size(inputs)
    except (TypeError, ValueError):  # no tensor: refused, with its reason, before training
        n = None
    if n == 0:
        raise ValueError(
            f"{where} got a subset of 0 examples (its tensors' first dimension is 0): there is "
            "nothing to measure; pass at least one example, e.g. the first rows of the "
            "evaluation set")
    mask = inputs.get("attention_mask") if isinstance(inputs, Mapping) else None
    if options.get("trim_padding", True) is False or not isinstance(mask, Tensor) \
            or mask.dim() != 2:
        return
    row = left_padded_row(mask)
    if row is not None:
        raise ValueError(f"{where}: {left_padded_message(row, 'attention_mask')}")


def _check_batched(inputs: Any, where: str, main_keys: tuple[str, ...]) -> None:
    """Refuse a dict subset whose ``input_ids`` is one example without its batch axis (shape
    ``(tokens,)``, as ``dataset[0]`` gives it), or whose examples are a list of tensors (an
    unpadded ``dataset[:8]``): the first was taken as ``tokens`` examples and stopped the run at
    its start with the model's "not enough values to unpack (expected 2, got 1)"; the second
    with "inputs hold no tensor … return_tensors='pt'", which names no padding."""
    if not isinstance(inputs, Mapping):
        return
    ids = inputs.get("input_ids")
    if isinstance(ids, Tensor) and ids.dim() == 1:
        raise ValueError(
            f"{where} got input_ids of shape {tuple(ids.shape)}: one example without its batch "
            "axis (as dataset[0] gives it), which would be read as "
            f"{ids.shape[0]} examples. Pass a batch of (examples, tokens) tensors: several "
            "rows (dataset[:8] with dataset.set_format('torch')), or this one example as "
            "{k: v.unsqueeze(0) for k, v in subset.items()}")
    for key in main_keys:
        value = inputs.get(key)
        if isinstance(value, (list, tuple)) and value and \
                all(isinstance(v, Tensor) for v in value):
            sizes = sorted({tuple(v.shape) for v in value})
            raise ValueError(
                f"{where} got {key} as a {type(value).__name__} of {len(value)} tensors "
                f"(shapes {', '.join(map(str, sizes[:3]))}{', …' if len(sizes) > 3 else ''}), "
                "not one (examples, tokens) tensor: unpadded examples (dataset[:8] of a "
                "dataset tokenized without padding, say). Pad them into one batch: "
                "DataCollatorWithPadding(tokenizer)([dataset[i] for i in range(8)]), or "
                "tokenizer(texts, padding=True, return_tensors='pt')")


class Seed:
    """An int seed or a ``torch.Generator`` frozen at construction: :meth:`fresh` hands out the
    same starting point every time, so every measurement of a fixed subset draws the same noise
    (changes between epochs are the model's, not the noise's)."""

    def __init__(self, generator: torch.Generator | int | None) -> None:
        from ..measure._options import _check_generator

        if isinstance(generator, Integral) and not isinstance(generator, bool):
            # the measurement's own range check, here: a negative seed (or one of 2**64 or
            # more) was taken, and refused only by the first measurement, after an epoch
            # (eval_steps) of training that the crash lost
            _check_generator(int(generator))
        if isinstance(generator, torch.Generator):
            self.seed: int | None = None
            self.device = generator.device
            self.state: Tensor | None = generator.get_state()
            self.initial = generator.initial_seed()
        elif generator is None or (
            isinstance(generator, Integral) and not isinstance(generator, bool)
        ):
            self.seed, self.state = int(generator or 0), None
            self.initial = self.seed
        else:
            raise TypeError(
                f"generator must be a torch.Generator or an int seed, got {generator!r} "
                f"({type(generator).__name__}); e.g. generator=0"
            )

    def fresh(self) -> torch.Generator | int:
        """The starting point: the int seed, or a new generator in the frozen state."""
        if self.state is None:
            assert self.seed is not None
            return self.seed
        g = torch.Generator(device=self.device)
        g.set_state(self.state)
        return g

    def describe(self) -> str:
        """The starting point in words, equal for two seeds that draw the same noise."""
        if self.state is None:
            return f"seed {self.seed}"
        return (f"a torch.Generator on {self.device} (initial seed {self.initial}, state "
                f"{_digest(self.state)})")


def configuration(inputs: Any, tokens: Tokenization | None, mask: Tensor | None, seed: Seed,
                  options: dict[str, Any], batch: int | None) -> dict[str, str]:
    """What decides the number a callback logs on given weights — the subset (its tensors'
    values), the mask, the tokens, the options, the seed, the measuring batch — as plain strings
    (a checkpoint holds them: ``trainer_state.json``, ``torch.load(weights_only=True)``). A
    resumed run compares the checkpoint's with its own (:func:`config_difference`): results of
    another configuration are no earlier points of this callback's series."""
    return {
        "subset": _described(inputs),
        "mask": "none" if mask is None else _described(mask),
        "tokens": "default" if tokens is None else repr(tokens),
        "options": ", ".join(f"{k}={_plain(v)}" for k, v in sorted(options.items())) or "none",
        "generator": seed.describe(),
        "batch_size": "whole subset" if batch is None else str(batch),
    }


def config_difference(saved: Any, mine: dict[str, str]) -> str | None:
    """The fields in which a checkpoint's configuration (``saved``) differs from ``mine``, in
    words; None where they agree, or where the checkpoint holds none (saved by an older senslab:
    not known)."""
    if not isinstance(saved, Mapping):
        return None
    differ = [f"{key}: {saved.get(key, 'not recorded')!r} there, {value!r} here"
              for key, value in mine.items() if saved.get(key, value) != value]
    return "; ".join(differ) or None


def _digest(t: Tensor) -> str:
    """A short sha256 of a tensor's dtype, shape and bytes."""
    t = t.detach().cpu().contiguous().reshape(-1)
    h = hashlib.sha256(f"{t.dtype}".encode())
    h.update(t.view(torch.uint8).numpy().tobytes() if t.numel() else b"")
    return f"sha256 {h.hexdigest()[:16]}"


def _described(value: Any) -> str:
    """A subset (tensor, tuple/list or mapping of tensors) or mask: each tensor's shape and
    dtype (a difference a person can read) and one digest of all their values."""
    if isinstance(value, Tensor):
        return f"{tuple(value.shape)} {str(value.dtype).removeprefix('torch.')} {_digest(value)}"
    if isinstance(value, Mapping):
        items = [(str(k), v) for k, v in sorted(value.items(), key=lambda kv: str(kv[0]))]
    elif isinstance(value, (tuple, list)):
        items = [(str(i), v) for i, v in enumerate(value)]
    else:
        return _plain(value)
    return "{" + ", ".join(f"{k}: {_described(v)}" for k, v in items) + "}"


def _plain(value: Any) -> str:
    """An option's value as a string equal for equal values: a number by its value (``sigma=2``
    and ``sigma=2.0`` are one noise), a tensor by its digest, a function by its name (its repr
    holds an address that differs in every process)."""
    if isinstance(value, bool) or value is None:
        return repr(value)
    if isinstance(value, Real):
        number = float(value)
        return str(int(number)) if number.is_integer() else repr(number)
    if isinstance(value, Tensor):
        return _described(value)
    if isinstance(value, (tuple, list)):
        return "(" + ", ".join(_plain(v) for v in value) + ")"
    if callable(value) and hasattr(value, "__qualname__"):
        return f"{getattr(value, '__module__', '')}.{value.__qualname__}"
    return repr(value)


def keep_aside(callback: Any, series: list[Any]) -> None:
    """Append ``series`` (a run's ``(step or epoch, result)`` pairs) to ``callback.set_aside``
    as one entry of its own: the earlier series stay apart (kept as one flat list, the trials of
    a ``hyperparameter_search`` read as steps 2, 4, 2, 4 with nothing to tell them apart). An
    empty series is not kept."""
    if series:
        callback.set_aside.append(list(series))


def refuse_mixed_series(callback: Any, saved: Mapping[str, Any], loaded: list[Any],
                        what: str, unit: str) -> bool:
    """Whether a checkpoint's results (``loaded``) were measured with another configuration than
    ``callback``'s (its ``config()``): then they, and the results the callback held, go to
    ``callback.set_aside``, ``results`` starts empty, and a warning names the difference. A
    resumed run with another sigma, subset or seed had continued the checkpoint's series with
    its own values, and the jump between them read as the training's (sigma=8 on 8 examples,
    0.064 at step 4, then sigma=2 on 4 examples, 0.016 at step 6)."""
    said = config_difference(saved.get("config"), callback.config())
    if said is None:
        return False
    import warnings

    keep_aside(callback, callback.results)
    keep_aside(callback, loaded)
    callback.results = []
    warnings.warn(
        f"SensitivityCallback({callback.name!r}): {what} results ({unit} "
        f"{[s for s, _ in loaded]}) were measured with another configuration than this "
        f"callback's ({said}), so they are not continued: this callback's results start anew, "
        "and the checkpoint's are kept in callback.set_aside (the logged series holds both; "
        "compare only points of one configuration). To continue the series, resume with the "
        "callback built as before",
        UserWarning, stacklevel=4,
    )
    return True


def set_aside_earlier_run(callback: Any, start: int, unit: str, how: str) -> bool:
    """Whether ``callback`` holds results of another run than the one starting now at ``start``
    (a step or epoch): a result beyond it was not measured on this run's way there (a second
    ``trainer.train()`` of one Trainer, a trial of ``hyperparameter_search``, the callback given
    to a second Trainer). Then they go to ``callback.set_aside``, ``results`` starts empty, and a
    warning says so. Kept, the two runs made one series whose steps started over (2, 4, 2, 4),
    and this run's checkpoints held the other run's values as its own. Results at or before
    ``start`` (an evaluation at step 0 before the first ``train()``) are this run's way there,
    and stay; so do a resumed checkpoint's (none beyond the step it resumes at). ``how``: how to
    continue a run instead."""
    held = [s for s, _ in callback.results]
    if not any(s > start for s in held):
        return False
    import warnings

    keep_aside(callback, callback.results)
    callback.results = []
    warnings.warn(
        f"SensitivityCallback({callback.name!r}): a new run starts at {unit[:-1]} {start}, and "
        f"this callback holds results of an earlier run ({unit} {held}): they are kept in "
        "callback.set_aside, and results start anew with this run's (one series per run: "
        f"{unit} that start over read as one series, and this run's checkpoints would hold the "
        f"earlier run's values). {how}",
        UserWarning, stacklevel=4,
    )
    return True


def to_device(inputs: Any, device: torch.device) -> Inputs:
    """``inputs`` (a tensor, tuple/list or mapping — a ``BatchEncoding`` too) on ``device``;
    mappings become plain dicts."""
    def move(v: Any) -> Any:
        return v.to(device) if isinstance(v, Tensor) else v

    if isinstance(inputs, Tensor):
        return move(inputs)
    if isinstance(inputs, Mapping):
        return {k: move(v) for k, v in inputs.items()}
    if isinstance(inputs, (tuple, list)):
        return type(inputs)(move(v) for v in inputs)
    raise TypeError(
        f"the subset to measure must be a tensor, a tuple of tensors or a dict of tensors, got "
        f"{type(inputs).__name__}"
    )


def measure_subset(
    model: nn.Module | Any,
    inputs: Inputs,
    tokens: Tokenization | None,
    *,
    mask: Tensor | None,
    batch: int | None,
    seed: Seed,
    options: dict[str, Any],
    said: set[str] | None = None,
) -> SensitivityResult:
    """Token sensitivity of ``model`` on a fixed subset, from the seed's starting point, in
    batches of ``batch`` examples (None: one batch — then it equals ``token_sensitivity``),
    with the noise drawn in float32 also inside a step of a ``"bf16-true"`` Trainer
    (:func:`float32_default`). ``said``: the causes a callback's earlier evaluations warned
    of, shared with this one's metric (a metric says a cause once; a new metric per evaluation
    would say it again in every one)."""
    device = model_device(model) or torch.device("cpu")
    inputs = to_device(inputs, device)
    metric = TokenSensitivity(model, tokens, generator=seed.fresh(), **options)
    if said is not None:
        metric._said = said
    n = batch_size(inputs)
    step = batch or n
    with float32_default():
        for start in range(0, n, step):
            if step >= n:
                metric.update(inputs, None if mask is None else mask.to(device))
                break
            rows = torch.arange(start, min(n, start + step), device=device)
            part_mask = None if mask is None else mask.to(device)[rows]
            metric.update(select(inputs, rows), part_mask)
    return metric.compute()


#: examples of the subset that :func:`check_before_training` runs through the model (one
#: forward, no gradient)
CHECKED_EXAMPLES = 8


def check_before_training(
    model: nn.Module | Any,
    inputs: Inputs,
    tokens: Tokenization | None,
    *,
    mask: Tensor | None,
    batch: int | None,
    options: dict[str, Any],
    where: str,
    any_failed: Callable[[bool], bool] | None = None,
    modes_known: bool = False,
    seed: Seed | None = None,
    look: Callable[[Tensor, set[nn.Module]], None] | None = None,
) -> None:
    """Refuse before training what the first measurement would refuse at its start, after
    ``eval_steps`` or an epoch of training (lost where the run crashes): the measurement's checks
    of the model (its tokens, its head) and of one clean forward of the subset's first
    :data:`CHECKED_EXAMPLES` examples (at most the first measuring batch) — which output is the
    prediction (``output=``), one row per example, finite values, a kind it can be read as — in
    the measurement's mode (``eval()`` unless ``eval_mode=False``; the model's modes, its buffers
    and the global random state restored after it), without gradients, nothing counted. Under
    several processes every process checks, and all stop if one fails (``any_failed``: whether
    any process failed, default :func:`any_process`), so none waits for the others at its next
    collective. What depends on the trained weights (an output that becomes NaN) is still found
    by the measurement.

    ``modes_known``: the model's modes now are those the measurements will find (Lightning
    measures at the end of a training epoch, in the modes the fit trains in); with
    ``eval_mode=False`` the check then refuses what the measurement would in them (BatchNorm on
    batch statistics, a forward that dropout makes random). Otherwise such a refusal waits for
    the measurement, whose mode may differ.

    ``seed``: the callback's :class:`Seed`, made into the generator the measurement draws
    from, on the model's device (a CPU refuses a seed of 2**32 or more, :func:`._seeded`).

    ``look``: called with the clean output that would be read as class scores and the
    submodules that ran in that forward — where ``compare="class"`` and no ``output=`` was
    given — to say what the output suggests (a head left out of ``forward``), not to refuse."""
    failure: Exception | None = None
    try:
        _first_forward(model, inputs, tokens, mask=mask, batch=batch, options=options,
                       modes_known=modes_known, seed=seed, look=look)
    except Exception as err:  # noqa: BLE001 - raised again below, after the processes agree
        failure = err
    failed = (any_failed or any_process)(failure is not None)
    if failure is not None:
        if hasattr(failure, "add_note"):
            failure.add_note(
                f"({where}: found before training, in one forward of the subset's first "
                "examples; the measurement at every evaluation makes this check, and would "
                "stop the training there)")
        raise failure
    if failed:
        raise RuntimeError(
            f"{where}: the check before training failed on another process (its error says "
            "why); this process stops too, before training, rather than wait for it"
        )


def any_process(failed: bool) -> bool:
    """Whether ``failed`` is true on any process of the default ``torch.distributed`` group
    (one ``all_reduce``; without a group, ``failed`` itself)."""
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() < 2:
        return failed
    backend = str(dist.get_backend())
    if "gloo" in backend or not torch.cuda.is_available():
        device = torch.device("cpu")
    else:  # NCCL takes tensors on the process's own GPU
        device = torch.device("cuda", torch.cuda.current_device())
    flag = torch.tensor([int(failed)], device=device)
    dist.all_reduce(flag, op=dist.ReduceOp.MAX)
    return bool(flag.item())


def _first_forward(
    model: nn.Module | Any, inputs: Inputs, tokens: Tokenization | None, *,
    mask: Tensor | None, batch: int | None, options: dict[str, Any],
    modes_known: bool = False, seed: Seed | None = None,
    look: Callable[[Tensor, set[nn.Module]], None] | None = None,
) -> None:
    """:func:`check_before_training`'s checks, in the order the measurement makes them
    (``TokenSensitivity.update`` up to the reading of the clean outputs)."""
    from ..measure._options import _eval, _kept_buffers, _seeded
    from ..measure._runner import verify_deterministic
    from ..measure.outputs import check_finite, check_rows, predictions, resolve_kind
    from ..measure.tokenwise import (
        _own_forward,
        _refuse_batch_statistics,
        _refuse_own_autocast,
        _refuse_padding_without_pad_id,
    )
    from ..tokens.base import check_device
    from ..tokens.embedding import NO_PAD_TOKEN, no_pad_id_message

    device = model_device(model) or torch.device("cpu")
    inputs = to_device(inputs, device)
    n = batch_size(inputs)
    if seed is not None:  # the generator the measurement makes, on the model's device
        _seeded(seed.fresh(), device)
    # the whole mask, not only the rows checked below: one of other rows than the subset's
    # examples passed this check and was refused by the first measurement, after training
    if mask is not None and (not isinstance(mask, Tensor) or mask.dim() != 2
                             or mask.shape[0] != n):
        shape = (f"has shape {tuple(mask.shape)}" if isinstance(mask, Tensor)
                 else f"is a {type(mask).__name__}")
        raise ValueError(
            f"mask {shape} but the subset has {n} examples; pass a (examples, "
            f"tokens) bool mask with one row per example of the subset ({n} rows), true on "
            "real tokens")
    k = min(n, batch or n, CHECKED_EXAMPLES)
    if k < n:
        inputs = select(inputs, torch.arange(k, device=device))
    part_mask = None if mask is None else mask[:k].to(device)
    # its own checks of the model (tokens=None: the model's default tokens; its head)
    metric = TokenSensitivity(model, tokens, **options)
    device = check_device(model, inputs)
    module = isinstance(model, nn.Module)
    # eval_mode=False: the mode at the evaluation may differ, unless the caller knows it
    known = module and not metric.eval_mode and modes_known
    if module and (metric.eval_mode or known):
        _refuse_batch_statistics(model, metric.eval_mode)
    with ExitStack() as stack:
        # a forward that draws (dropout with eval_mode=False) must not move the training's
        # random streams: the run would train differently with the callback than without
        cuda = [device.index if device.index is not None else torch.cuda.current_device()] \
            if device.type == "cuda" else []
        stack.enter_context(torch.random.fork_rng(devices=cuda))
        stack.enter_context(torch.no_grad())
        stack.enter_context(float32_default())
        if module and metric.eval_mode:
            stack.enter_context(_eval(model))
        if module:
            stack.enter_context(_kept_buffers(model))
        ran: set[nn.Module] = set()
        if module and look is not None:  # which submodules the forward runs
            try:
                for sub in model.modules():
                    handle = sub.register_forward_pre_hook(lambda m, _args: ran.add(m))
                    stack.callback(handle.remove)
            except (RuntimeError, TypeError, AttributeError):  # a scripted submodule, say:
                look = None  # not seen which ran, so nothing said
        stack.enter_context(_own_forward(model))
        stack.enter_context(metric._autocast(device))
        probe = (_refuse_own_autocast(model, device) if metric.autocast is None
                 else nullcontext())
        try:
            with probe:
                bound = stack.enter_context(
                    metric.tokens.bind(model, inputs, part_mask, output=metric.output))
        except ValueError as err:
            if NO_PAD_TOKEN not in str(err):
                raise
            raise ValueError(no_pad_id_message(model)) from err
        clean = bound.clean_output
        check_rows(clean, k, "examples")
        check_finite(clean, "clean examples", metric.compare)
        real = bound.valid if bound.padding is None else bound.padding | bound.valid
        _refuse_padding_without_pad_id(model, bound, real, device)
        if metric.compare == "class":
            predictions(clean, resolve_kind(clean, metric.output_kind, metric.threshold),
                        metric.threshold)
            if look is not None and module and metric.output is None:
                look(clean, ran)
        if known:  # the measurement's check of a forward random in that mode
            verify_deterministic(bound, clean, metric.mode == "whole", None,
                                 metric.autocast is not None, alone=True)


def check_every(name: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be a positive integer, got {value!r}; e.g. {name}=1")
    return value
