"""The zero-noise verification (``_runner.verify_copies``) runs on the first batch of each input
shape, and never again for that shape: later batches pay no extra forwards.

The model counts every row it evaluates; ``num_forward`` counts the clean rows and the perturbed
copies, so what the model saw beyond ``num_forward`` is the verification: ``2 × VERIFY_ROWS``
rows on a new shape, none on a shape already checked.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

from senslab.measure import TokenSensitivity
from senslab.measure._runner import VERIFY_ROWS
from senslab.tokens import Sequence


class RowCounter(nn.Module):
    """Two logits of a linear map of the tokens; counts the rows it is called on."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(3, 2)
        self.rows = 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.rows += len(x)
        return self.lin(x).sum(1)


def _extra(metric: TokenSensitivity, model: RowCounter, x: torch.Tensor) -> int:
    """The rows one ``update`` (after a ``reset``) evaluated beyond its ``num_forward``."""
    metric.reset()
    rows = model.rows
    metric.update(x)
    return (model.rows - rows) - metric.compute().num_forward


def test_verification_runs_once_per_input_shape():
    torch.manual_seed(0)
    model = RowCounter()
    metric = TokenSensitivity(model, Sequence(), sigma=1.0, generator=0, chunk_size=64,
                              precision="float32")
    g = torch.Generator().manual_seed(1)
    # _extra resets the metric before each update: a shape checked stays checked across reset
    assert _extra(metric, model, torch.randn(6, 4, 3, generator=g)) == 2 * VERIFY_ROWS
    assert _extra(metric, model, torch.randn(6, 4, 3, generator=g)) == 0  # same shape: no check
    assert _extra(metric, model, torch.randn(6, 5, 3, generator=g)) == 2 * VERIFY_ROWS  # new
    assert _extra(metric, model, torch.randn(6, 4, 3, generator=g)) == 0  # the first, again


def test_a_random_forward_is_refused_on_its_first_batch():
    class Noisy(RowCounter):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return super().forward(nn.functional.dropout(x, 0.5, training=True))

    metric = TokenSensitivity(Noisy(), Sequence(), sigma=1.0, generator=0)
    with pytest.raises(RuntimeError, match="changed between two evaluations"):
        metric.update(torch.randn(6, 4, 3))
