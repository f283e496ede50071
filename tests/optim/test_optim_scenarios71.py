"""NGD / SPS / Polyak and the max-margin solver used the way a researcher's own training loop
uses them: subnormal gradients late in a separable run, LR schedulers and hand edits of a param
group, checkpoints from another optimiser, resuming half-precision runs, and a nearly
infeasible max-margin problem."""

from __future__ import annotations

import copy
import re

import pytest
import torch
from torch import nn

from senslab.optim import NGD, SPS, max_margin_attention
from senslab.optim.maxmargin import check_max_margin


# --------------------------------------------------------------------------- subnormal ‖∇L‖
@pytest.mark.parametrize("dtype,entry", [(torch.float32, 1e-40), (torch.float64, 1e-310),
                                         (torch.bfloat16, 1e-39)])
def test_ngd_step_of_a_subnormal_gradient_has_length_lr_not_inf(dtype, entry) -> None:
    """η/‖g‖ overflowed for a subnormal ‖g‖ (a float32 logistic loss far into a separable run)
    and inf·g made every parameter −inf without a word."""
    p = nn.Parameter(torch.ones(8, dtype=dtype))
    p.grad = torch.full((8,), entry, dtype=dtype)
    opt = NGD([p], lr=0.1)
    opt.step()
    assert torch.isfinite(p.detach()).all()
    moved = float(torch.linalg.vector_norm(p.detach().double() - 1))
    assert moved == pytest.approx(0.1, rel=1e-2)  # bfloat16 rounds 1 − 0.035 to 3 digits
    assert float(opt.state[p]["grad_norm"]) > 0


def test_ngd_ordinary_step_is_bit_for_bit_the_product() -> None:
    """The overflow guard does not change an ordinary step by a single bit."""
    g = torch.Generator().manual_seed(3)
    p = nn.Parameter(torch.randn(5, generator=g))
    p.grad = torch.randn(5, generator=g)
    start, grad = p.detach().clone(), p.grad.clone()
    NGD([p], lr=0.3).step()
    norm = torch.linalg.vector_norm(grad / grad.abs().max()) * grad.abs().max()
    assert torch.equal(p.detach(), start - grad * (0.3 / norm))


# --------------------------------------------------------------------------- options at step time
def test_lr_set_by_a_scheduler_or_by_hand_is_checked_when_stepping() -> None:
    """A negative lr (LambdaLR, a hand edit) stepped uphill and a nan one made the parameters
    nan: only the constructor checked lr. An lr of 0 (the end of a schedule) is no step."""
    p = nn.Parameter(torch.zeros(2, dtype=torch.float64))
    opt = NGD([p], lr=0.2)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)
    p.grad = torch.tensor([3.0, 4.0], dtype=torch.float64)
    opt.step()
    sched.step()
    opt.step()  # lengths 0.2 then 0.1 along −g/‖g‖
    assert p.detach().tolist() == pytest.approx([-0.18, -0.24], abs=1e-15)
    for bad in (-0.1, float("nan"), float("inf")):
        opt.param_groups[0]["lr"] = bad
        before = p.detach().clone()
        with pytest.raises(ValueError, match="NGD param group 0: lr must be a positive number"):
            opt.step()
        assert torch.equal(p.detach(), before)
    opt.param_groups[0]["lr"] = 0.0
    before = p.detach().clone()
    opt.step()
    assert torch.equal(p.detach(), before)
    with pytest.raises(ValueError, match="lr must be a positive number"):
        NGD([p], lr=float("inf"))

    w = nn.Parameter(torch.ones(2, dtype=torch.float64))
    with pytest.raises(ValueError, match="c must be a positive number"):
        SPS([w], c=float("inf"))  # η_t = 0: it never stepped
    sps = SPS([w], eta_max=1.0)
    sps.param_groups[0]["f_star"] = float("nan")  # η_t was nan, taken as "no step"

    def closure() -> torch.Tensor:
        sps.zero_grad()
        loss = (w**2).sum()
        loss.backward()
        return loss

    with pytest.raises(ValueError, match="SPS param group 0: f_star must be a finite"):
        sps.step(closure)


# --------------------------------------------------------------------------- checkpoints
def test_a_checkpoint_of_another_optimiser_is_refused_before_loading() -> None:
    """An SGD checkpoint loaded into NGD brought momentum and weight_decay the step ignores."""
    p = nn.Parameter(torch.ones(3))
    sgd = torch.optim.SGD([p], lr=0.5, momentum=0.9, weight_decay=1e-2)
    opt = NGD([p], lr=0.1)
    with pytest.raises(ValueError, match=r"load_state_dict: saved param group 0: .*'momentum'"):
        opt.load_state_dict(sgd.state_dict())
    assert opt.param_groups[0]["lr"] == 0.1 and "momentum" not in opt.param_groups[0]
    bad = copy.deepcopy(opt.state_dict())
    bad["param_groups"][0]["lr"] = -1.0
    with pytest.raises(ValueError, match="lr must be a positive number"):
        opt.load_state_dict(bad)


def test_a_checkpoint_with_a_one_cycle_schedule_loads() -> None:
    """OneCycleLR writes max_lr / min_lr into the groups: still a checkpoint of NGD."""
    p = nn.Parameter(torch.ones(3))
    opt = NGD([p], lr=0.1)
    torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=0.1, total_steps=10, cycle_momentum=False)
    other = NGD([p], lr=0.3)
    other.load_state_dict(opt.state_dict())
    assert other.param_groups[0]["lr"] == opt.param_groups[0]["lr"]


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_resume_keeps_the_logged_step_size_of_a_half_precision_run(dtype) -> None:
    """torch casts state tensors to the parameter's type on load: the float32 step size
    0.0200000014 came back as 0.0200195 in bfloat16 (and 1.9e5 as inf in float16)."""
    p = nn.Parameter(torch.ones(4, dtype=dtype))
    p.grad = torch.tensor([3.0, 4.0, 0.0, 0.0], dtype=dtype) * (1e-5 if dtype == torch.float16
                                                               else 1.0)
    opt = NGD([p], lr=0.1)
    opt.step()
    resumed = NGD([p], lr=0.1)
    resumed.load_state_dict(copy.deepcopy(opt.state_dict()))
    assert resumed.last_step_size == opt.last_step_size
    assert float(resumed.state[p]["grad_norm"]) == float(opt.state[p]["grad_norm"])
    assert resumed.state[p]["step"] == 1


# --------------------------------------------------------------------------- max margin
def test_nearly_infeasible_problem_is_not_blamed_on_token_scales() -> None:
    """Two samples with the same query and almost the same tokens but opposite optimal tokens:
    the solver's failure advised rescaling sequences whose scales were already equal."""
    g = torch.Generator().manual_seed(0)
    q, u, w = (torch.randn(4, generator=g, dtype=torch.float64) for _ in range(3))
    w2 = w + 1e-4 * torch.randn(4, generator=torch.Generator().manual_seed(1),
                                dtype=torch.float64)
    X = torch.stack([torch.stack([q, u, w]), torch.stack([q, u, w2])])
    opt = torch.tensor([1, 2])
    try:
        W = max_margin_attention(X, opt)
    except ValueError as e:  # refused: for what it is, not for the token scales
        assert re.search(r"(?s)‖W‖ = .* at unit token scale.*nearly contradict", str(e)), e
    else:
        # solved (which one happens rests on the NNLS solver's release and BLAS kernels): a
        # huge W that passes the optimality check, never a wrong one
        assert float(W.norm()) > 1e3
        assert check_max_margin(X, opt, W) == pytest.approx(1.0, abs=1e-6)


def test_a_huge_finite_float64_gradient_next_to_a_float32_group_is_stepped() -> None:
    """The finiteness check cast every norm to the first one's type: a float64 ‖g‖ = 1.4e300
    became inf in float32 and the step was refused as 'nan or inf entries'."""
    a = nn.Parameter(torch.ones(2))
    b = nn.Parameter(torch.ones(2, dtype=torch.float64))
    a.grad = torch.ones(2)
    b.grad = torch.full((2,), 1e300, dtype=torch.float64)
    NGD([{"params": [a], "per_param": True}, {"params": [b]}], lr=0.1).step()
    assert float((a.detach() - 1).norm()) == pytest.approx(0.1, rel=1e-6)
    assert float((b.detach() - 1).norm()) == pytest.approx(0.1, rel=1e-12)
