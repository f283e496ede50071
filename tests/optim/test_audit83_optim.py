"""Audit 83 (optim): ``global_grad_norm`` of a single tensor (as ``clip_grad_norm_`` takes it)
read ``None`` instead of its norm, and something other than tensors gave a raw AttributeError;
an NGD closure that never called backward() left every step a silent no-op."""

from __future__ import annotations

import warnings

import pytest
import torch
from torch import Tensor, nn

from senslab.optim import NGD, global_grad_norm


def _model_and_data() -> tuple[nn.Linear, Tensor, Tensor]:
    torch.manual_seed(0)
    return nn.Linear(3, 1), torch.randn(8, 3), torch.randn(8, 1)


def test_global_grad_norm_of_a_single_tensor_is_its_norm_not_none() -> None:
    torch.manual_seed(0)
    w = nn.Parameter(torch.randn(3, 2))
    (w * torch.arange(6.0).reshape(3, 2)).sum().backward()
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # iterating w read its rows' .grad (a torch warning)
        norm = global_grad_norm(w)
    assert norm is not None
    assert torch.allclose(norm, torch.arange(6.0).norm())
    assert torch.equal(norm, global_grad_norm([w]))


def test_global_grad_norm_refuses_param_groups_by_name() -> None:
    w = nn.Parameter(torch.ones(2))
    w.grad = torch.ones(2)
    opt = NGD([w], lr=0.1)
    with pytest.raises(TypeError, match="param_groups"):
        global_grad_norm(opt.param_groups)  # dicts, not tensors (was AttributeError)
    group_params = (p for g in opt.param_groups for p in g["params"])
    assert float(global_grad_norm(group_params)) == pytest.approx(2**0.5)


def test_an_ngd_closure_that_never_calls_backward_is_refused_not_a_silent_no_op() -> None:
    model, x, y = _model_and_data()
    opt = NGD(model.parameters(), lr=0.1)
    before = [p.detach().clone() for p in model.parameters()]
    with pytest.raises(RuntimeError, match=r"loss\.backward\(\)"):
        opt.step(lambda: ((model(x) - y) ** 2).mean())  # computes the loss only
    assert all(torch.equal(p, q) for p, q in zip(model.parameters(), before, strict=True))


def test_an_ngd_closure_that_calls_backward_steps_by_exactly_lr() -> None:
    model, x, y = _model_and_data()
    opt = NGD(model.parameters(), lr=0.1)
    before = torch.cat([p.detach().flatten().clone() for p in model.parameters()])

    def closure() -> Tensor:
        opt.zero_grad()
        loss = ((model(x) - y) ** 2).mean()
        loss.backward()
        return loss

    loss = opt.step(closure)
    assert loss is not None and loss.requires_grad
    after = torch.cat([p.detach().flatten() for p in model.parameters()])
    assert float((after - before).norm()) == pytest.approx(0.1, rel=1e-5)
    # a loss without a graph and no gradient (everything frozen) is still no step, no error
    for p in model.parameters():
        p.grad = None
    assert opt.step(lambda: torch.tensor(1.0)) is not None
