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


def test_eval_mode_false_refuses_dropout_and_batch_statistics_in_train_mode():
    """In the model's own mode a train-mode dropout is random: its draws would be counted as
    flips (two runs with one seed gave different numbers), so it is refused. Train-mode
    BatchNorm normalises each chunk of copies by its own statistics — the number moved with
    chunk_size (0.70 at chunks of 2, 0.04 at 64 here) — so it is refused too, before any
    forward; with its BatchNorm in eval() the rest of the model keeps its mode and is measured,
    the same at every chunk size."""
    torch.manual_seed(0)  # test-only: model init
    drop = nn.Sequential(nn.Flatten(), nn.Linear(12, 16), nn.Dropout(0.3), nn.Linear(16, 3))
    x = torch.randn(5, 4, 3, generator=torch.Generator().manual_seed(1))
    with pytest.raises(RuntimeError, match="eval_mode=False.*eval_mode=True"):
        TokenSensitivity(drop.train(), Sequence(), sigma=1e-6, eval_mode=False).update(x)
    assert drop.training
    calm = TokenSensitivity(drop.eval(), Sequence(), sigma=1e-6, eval_mode=False, generator=0)
    calm.update(x)  # dropout off: deterministic
    assert calm.compute().estimate == 0.0
    norm = nn.Sequential(nn.Flatten(), nn.Linear(12, 16), nn.BatchNorm1d(16), nn.Linear(16, 3))
    norm.train()
    before = {k: v.clone() for k, v in norm.state_dict().items()}
    with pytest.raises(ValueError, match=r"BatchNorm layers that normalise by batch statistics "
                                         r"\(2: .*depend on chunk_size.*eval_mode=True"):
        TokenSensitivity(norm, Sequence(), sigma=1.0, eval_mode=False).update(x)
    assert all(torch.equal(before[k], v) for k, v in norm.state_dict().items())
    norm[2].eval()  # the rest in train mode
    rates = []
    for chunk in (2, 64):
        m = TokenSensitivity(norm, Sequence(), sigma=1.0, eval_mode=False, generator=0,
                             chunk_size=chunk)
        m.update(x)
        rates.append(m.compute().per_sample)
    assert torch.equal(rates[0], rates[1]) and norm.training and not norm[2].training


def test_a_callers_autocast_does_not_change_the_decisions():
    """Called inside a bf16 autocast region (a bf16-mixed validation step) without autocast=,
    the measurement still runs in float32: the same flips as outside it. With autocast= the
    precision is the caller's choice."""
    torch.manual_seed(0)  # test-only: model init
    model = nn.Sequential(nn.Flatten(), nn.Linear(12, 64), nn.Tanh(), nn.Linear(64, 2)).eval()
    with torch.no_grad():  # two nearly tied classes: bf16's rounding changes some decisions
        model[3].weight[1] = model[3].weight[0] + 0.002 * torch.randn(64)
        model[3].bias.zero_()
    x = torch.randn(16, 4, 3, generator=torch.Generator().manual_seed(2))
    plain = TokenSensitivity(model, Sequence(), sigma=0.5, repeats=8, generator=0)
    plain.update(x)
    inside = TokenSensitivity(model, Sequence(), sigma=0.5, repeats=8, generator=0)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        inside.update(x)
        assert torch.is_autocast_cpu_enabled()  # the caller's region is left as it was
    assert torch.equal(inside.compute().per_sample, plain.compute().per_sample)
    low = TokenSensitivity(model, Sequence(), sigma=0.5, repeats=8, generator=0,
                           autocast=torch.bfloat16)
    low.update(x)
    assert not torch.equal(low.compute().per_sample, plain.compute().per_sample)


class Scaled(nn.Module):
    """A linear model whose forward multiplies by a registered buffer (saved for backward)."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)  # test-only: model init
        self.lin = nn.Linear(12, 3)
        self.register_buffer("scale", torch.full((3,), 2.0))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.lin(x.flatten(1)) * self.scale


def test_measuring_between_a_loss_and_its_backward_leaves_the_graph_usable():
    """A loss computed before measuring with eval_mode=False (a per-step metric in a training
    step) still backpropagates: buffers the measurement did not change are not written back
    (a write bumped their version, and backward failed with torch's in-place error)."""
    model = Scaled().train()
    x = torch.randn(5, 4, 3, generator=torch.Generator().manual_seed(1))
    loss = model(x).square().mean()
    TokenSensitivity(model, Sequence(), sigma=1.0, eval_mode=False, generator=0).update(x)
    loss.backward()
    assert model.lin.weight.grad is not None and model.scale._version == 0
