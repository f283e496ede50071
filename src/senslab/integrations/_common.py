"""What the integrations share: option checks, fresh random streams, moving a fixed subset to
the model and measuring it."""

from __future__ import annotations

import difflib
import inspect
from collections.abc import Mapping
from numbers import Integral
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
    """Refuse at construction a subset the first measurement would refuse — a left-padded
    ``attention_mask`` with padding-aware batching on — rather than after an epoch of
    training."""
    from ..measure._trim import left_padded_message, left_padded_row

    mask = inputs.get("attention_mask") if isinstance(inputs, Mapping) else None
    if options.get("trim_padding", True) is False or not isinstance(mask, Tensor) \
            or mask.dim() != 2:
        return
    row = left_padded_row(mask)
    if row is not None:
        raise ValueError(f"{where}: {left_padded_message(row, 'attention_mask')}")


class Seed:
    """An int seed or a ``torch.Generator`` frozen at construction: :meth:`fresh` hands out the
    same starting point every time, so every measurement of a fixed subset draws the same noise
    (changes between epochs are the model's, not the noise's)."""

    def __init__(self, generator: torch.Generator | int | None) -> None:
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


def check_every(name: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be a positive integer, got {value!r}; e.g. {name}=1")
    return value
