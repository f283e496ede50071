"""Option checks and small helpers of the token-wise estimator."""

from __future__ import annotations

import math
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from torch import Tensor, nn

from ..tokens.base import Inputs


def _resolve_sigma(
    sigma: float | None, variance: float | None, replace_with: Tensor | None
) -> float | None:
    if replace_with is not None:
        if sigma is not None or variance is not None:
            raise ValueError("give either replace_with or a noise level (sigma/variance), not both")
        if replace_with.dim() != 2:
            raise ValueError("replace_with must be a (vocabulary, dim) tensor of token vectors")
        return None
    if (sigma is None) == (variance is None):
        raise ValueError(
            "give exactly one noise level: sigma= (standard deviation) or variance= (σ²); "
            "the paper quotes variances, e.g. variance=15 for text"
        )
    if variance is not None:
        if not variance > 0 or not math.isfinite(variance):
            raise ValueError(f"variance must be a positive finite number, got {variance}")
        return math.sqrt(variance)
    assert sigma is not None
    if not sigma > 0 or not math.isfinite(sigma):
        raise ValueError(f"sigma (noise standard deviation) must be positive, got {sigma}")
    return float(sigma)


def _shapes(inputs: Inputs) -> tuple[Any, ...]:
    """Shapes of the input tensors without the batch axis (a key for the probed copy size)."""
    if isinstance(inputs, Tensor):
        return (tuple(inputs.shape[1:]),)
    values = inputs.values() if isinstance(inputs, dict) else inputs
    return tuple(tuple(v.shape[1:]) for v in values if isinstance(v, Tensor))


def _check_positive(name: str, value: int) -> int:
    if not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be a positive integer, got {value!r}")
    return value


@contextmanager
def _eval(model: nn.Module) -> Iterator[None]:
    modes = {m: m.training for m in model.modules()}
    model.eval()
    try:
        yield
    finally:
        for m, training in modes.items():
            m.train(training)
