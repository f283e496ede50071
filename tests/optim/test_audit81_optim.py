"""Audit 81 (optim): an SPS / Polyak closure without ``return loss`` refused with a clear error
(it raised torch's "Could not infer dtype of NoneType"), and one that never called backward()
refused instead of leaving every step a silent no-op."""

from __future__ import annotations

import pytest
import torch
from torch import Tensor, nn

from senslab.optim import SPS, Polyak


def _model_and_data() -> tuple[nn.Linear, Tensor, Tensor]:
    torch.manual_seed(0)
    return nn.Linear(3, 1), torch.randn(8, 3), torch.randn(8, 1)


@pytest.mark.parametrize("make", [lambda ps: SPS(ps, eta_max=0.1), lambda ps: Polyak(ps)])
def test_a_closure_that_returns_nothing_is_refused_by_name(make) -> None:
    model, x, y = _model_and_data()
    opt = make(model.parameters())

    def closure() -> None:  # forgot `return loss`
        opt.zero_grad()
        ((model(x) - y) ** 2).mean().backward()

    with pytest.raises(ValueError, match="return loss"):
        opt.step(closure)


def test_a_closure_that_never_calls_backward_is_refused_not_a_silent_no_op() -> None:
    model, x, y = _model_and_data()
    opt = SPS(model.parameters(), eta_max=0.1)
    before = [p.detach().clone() for p in model.parameters()]
    with pytest.raises(RuntimeError, match=r"loss\.backward\(\)"):
        opt.step(lambda: ((model(x) - y) ** 2).mean())  # computes the loss only
    assert all(torch.equal(p, q) for p, q in zip(model.parameters(), before, strict=True))


def test_a_closure_that_calls_backward_still_steps_and_a_constant_loss_is_no_step() -> None:
    model, x, y = _model_and_data()
    opt = SPS(model.parameters(), eta_max=0.1)
    w0 = model.weight.detach().clone()

    def closure() -> Tensor:
        opt.zero_grad()
        loss = ((model(x) - y) ** 2).mean()
        loss.backward()
        return loss

    opt.step(closure)
    assert not torch.equal(model.weight.detach(), w0)
    assert opt.last_step_size is not None and 0 < opt.last_step_size <= 0.1 + 1e-6

    def constant() -> Tensor:  # no graph: nothing to step, as before
        opt.zero_grad()
        return torch.tensor(1.0)

    w1 = model.weight.detach().clone()
    opt.step(constant)
    assert torch.equal(model.weight.detach(), w1)
