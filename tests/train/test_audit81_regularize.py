"""Audit 81 of the sensitivity regularizer: ``alpha=0`` trains exactly as the unregularized step
(the noisy forward, there only for the logged MSE, no longer updates a BatchNorm's running
statistics nor draws dropout masks), a term of weight 0 cannot turn the loss NaN, and a
per-example task loss is refused by name."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from senslab.tokens import Embedding, Sequence
from senslab.train.regularize import sensitivity_regularized_loss


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


class _Text(nn.Module):
    """Token embedding, a LayerNorm (the hooked stage), dropout, BatchNorm over the pooled
    features, a linear head."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(20, 8)
        self.ln = nn.LayerNorm(8)
        self.drop = nn.Dropout(0.3)
        self.bn = nn.BatchNorm1d(8)
        self.head = nn.Linear(8, 3)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.head(self.bn(self.drop(self.ln(self.embed(ids))).mean(1)))


class _Vectors(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(6, 8), nn.Dropout(0.3), nn.BatchNorm1d(8))
        self.head = nn.Linear(8, 3)

    def forward(self, v: torch.Tensor) -> torch.Tensor:
        return self.head(self.net(v.mean(1)))


def _image() -> nn.Module:
    return nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.BatchNorm2d(4), nn.ReLU(),
                         nn.Dropout(0.3), nn.Flatten(), nn.Linear(4 * 8 * 8, 3))


_CASES = {
    "image": (_image, lambda g: torch.randn(8, 3, 8, 8, generator=g), {}),
    "text": (_Text, lambda g: torch.randint(20, (8, 5), generator=g),
             {"tokens": Embedding("ln")}),
    "vectors": (_Vectors, lambda g: torch.randn(8, 5, 6, generator=g), {"tokens": Sequence()}),
}


@pytest.mark.parametrize("case", sorted(_CASES))
def test_alpha_zero_trains_exactly_as_the_unregularized_step(case: str) -> None:
    """Before: the noisy forward ran as a training forward at alpha=0 too, so a BatchNorm's
    running statistics took in the noisy batch (num_batches_tracked 6 after 3 steps, not 3)
    and dropout drew masks for it, moving every later step's masks: after 3 SGD steps of the
    image model its last-layer weights were 0.046 from the unregularized model's."""
    build, data, kw = _CASES[case]
    x, y = data(_gen(1)), torch.arange(8) % 3
    models = []
    for regularized in (True, False):
        torch.manual_seed(0)  # test-only: the init, then dropout's masks
        model = build().train()
        opt = torch.optim.SGD(model.parameters(), lr=0.5)
        g = _gen(2)
        torch.manual_seed(10)
        for _ in range(3):
            if regularized:
                loss, parts = sensitivity_regularized_loss(model, x, y, alpha=0.0, sigma=1.0,
                                                           generator=g, **kw)
                assert torch.isfinite(parts["mse"]) and parts["mse"] > 0  # still logged
                assert torch.equal(parts["loss"], parts["task"])
            else:
                loss = F.cross_entropy(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
        models.append(model)
    a, b = (m.state_dict() for m in models)
    assert a.keys() == b.keys()
    for k in a:
        assert torch.equal(a[k], b[k]), k  # weights, running statistics, batch counts


def test_alpha_above_zero_still_trains_both_branches() -> None:
    """The fix is alpha=0's alone: at alpha > 0 the noisy forward is a training forward as
    before (its gradient flows); a BatchNorm's running statistics count the clean batch alone
    (since 2026-12-07: the noisy batch no longer moves them)."""
    torch.manual_seed(0)  # test-only: init
    model = _image().train()
    x, y = torch.randn(8, 3, 8, 8, generator=_gen(1)), torch.arange(8) % 3
    loss, _ = sensitivity_regularized_loss(model, x, y, alpha=0.5, generator=_gen(2))
    assert int(model[1].num_batches_tracked) == 1
    loss.backward()
    assert model[-1].weight.grad.abs().sum() > 0


def test_a_weight_of_zero_cannot_make_the_loss_nan() -> None:
    """Before: loss = 1 * task + 0 * mse, and 0 × an overflowed (inf) MSE is NaN: a float16
    model whose noisy outputs overflowed returned loss NaN beside a task loss of 1764, and
    NaN gradients. Now the loss is the task loss, its gradient finite (at alpha=1 the MSE)."""
    torch.manual_seed(0)  # test-only: init
    model = nn.Sequential(nn.Flatten(), nn.Linear(3 * 8 * 8, 3)).half()
    with torch.no_grad():
        model[1].weight.mul_(300.0)
    x = (10 * torch.randn(8, 3, 8, 8, generator=_gen(1))).half()
    y = torch.arange(8) % 3
    loss, parts = sensitivity_regularized_loss(model, x, y, alpha=0.0, sigma=100.0,
                                               generator=_gen(2))
    assert torch.isinf(parts["mse"])  # the truth, logged
    assert torch.isfinite(loss) and torch.equal(loss.detach(), parts["task"])
    loss.backward()
    assert all(torch.isfinite(p.grad).all() for p in model.parameters())
    # alike at alpha=1: an infinite task loss (a log of 0) made 0 × inf = NaN of the loss
    model = nn.Sequential(nn.Flatten(), nn.Linear(3 * 8 * 8, 3))
    loss, parts = sensitivity_regularized_loss(
        model, x.float(), y, alpha=1.0, generator=_gen(2),
        loss_fn=lambda out, t: (out * 0).sum() + float("inf"))
    assert torch.isinf(parts["task"])
    assert torch.isfinite(loss) and torch.equal(loss.detach(), parts["mse"])


def test_a_per_example_task_loss_is_refused() -> None:
    """Before: loss_fn with reduction='none' returned one loss per example, each with the
    batch's whole MSE term added (its .sum() weighed that term 8 times against the summed task
    loss on a batch of 8) and a parts['task'] of shape (8,)."""
    torch.manual_seed(0)  # test-only: init
    model = nn.Sequential(nn.Flatten(), nn.Linear(3 * 4 * 4, 3))
    x, y = torch.randn(8, 3, 4, 4, generator=_gen(1)), torch.arange(8) % 3
    with pytest.raises(ValueError, match=r"shape \(8,\), not one number.*reduction='mean'"):
        sensitivity_regularized_loss(
            model, x, y, patch=2, generator=_gen(2),
            loss_fn=lambda out, t: F.cross_entropy(out, t, reduction="none"))
    with pytest.raises(TypeError, match="returned a float, not a tensor"):
        sensitivity_regularized_loss(model, x, y, patch=2, generator=_gen(2),
                                     loss_fn=lambda out, t: F.cross_entropy(out, t).item())
