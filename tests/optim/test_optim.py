"""NGD / SNGD, SPS and Polyak: exact step lengths, the cap, hand-computed Polyak steps,
convergence on a quadratic, closures, and a bit-identical state_dict round trip."""

from __future__ import annotations

import copy
import math
from collections.abc import Callable

import pytest
import torch
from torch import Tensor, nn

from senslab.optim import NGD, SNGD, SPS, Polyak, global_grad_norm


def _params(seed: int, *shapes: tuple[int, ...]) -> list[nn.Parameter]:
    g = torch.Generator().manual_seed(seed)
    return [nn.Parameter(torch.randn(*s, generator=g, dtype=torch.float64)) for s in shapes]


def _set_grads(params: list[nn.Parameter], seed: int, scale: float = 1.0) -> None:
    g = torch.Generator().manual_seed(seed)
    for p in params:
        p.grad = torch.randn(p.shape, generator=g, dtype=p.dtype) * scale


def _flat(params: list[nn.Parameter]) -> Tensor:
    return torch.cat([p.detach().flatten() for p in params])


# --------------------------------------------------------------------------- NGD
def test_ngd_step_has_length_lr_in_global_norm() -> None:
    params = _params(0, (3, 4), (5,))
    _set_grads(params, 1, scale=37.0)
    before = _flat(params)
    opt = NGD(params, lr=0.25)
    opt.step()
    moved = _flat(params) - before
    assert torch.linalg.vector_norm(moved).item() == pytest.approx(0.25, rel=1e-12)
    # The move is along −∇L (not e.g. per-tensor normalised): parallel to the flat gradient.
    grad = torch.cat([p.grad.flatten() for p in params])
    cos = -(moved @ grad) / (moved.norm() * grad.norm())
    assert cos.item() == pytest.approx(1.0, abs=1e-12)
    assert opt.last_step_size == pytest.approx(0.25 / grad.norm().item(), rel=1e-12)
    assert SNGD is NGD


def test_ngd_per_param_moves_each_tensor_by_lr() -> None:
    params = _params(0, (3, 4), (5,))
    _set_grads(params, 2, scale=5.0)
    before = [p.detach().clone() for p in params]
    NGD(params, lr=0.1, per_param=True).step()
    for p, b in zip(params, before, strict=True):
        assert (p.detach() - b).norm().item() == pytest.approx(0.1, rel=1e-12)


def test_ngd_cap_switches_to_plain_gradient_step_for_small_gradients() -> None:
    # η/‖g‖ = 0.5/‖g‖; with ‖g‖ tiny the cap η_max = 0.01 applies: W ← W − 0.01 g.
    params = _params(0, (4,))
    _set_grads(params, 3, scale=1e-3)
    g = params[0].grad.clone()
    before = params[0].detach().clone()
    opt = NGD(params, lr=0.5, eta_max=0.01)
    opt.step()
    torch.testing.assert_close(params[0].detach(), before - 0.01 * g, rtol=0, atol=1e-15)
    assert opt.last_step_size == pytest.approx(0.01)
    # A large gradient stays normalised: the cap does not bind.
    _set_grads(params, 4, scale=1e3)
    before = params[0].detach().clone()
    opt.step()
    assert (params[0].detach() - before).norm().item() == pytest.approx(0.5, rel=1e-12)
    assert opt.last_step_size < 0.01


def test_ngd_zero_gradient_and_missing_gradient_give_no_step() -> None:
    params = _params(0, (3,), (2,))
    params[0].grad = torch.zeros(3, dtype=torch.float64)  # zero gradient
    before = _flat(params)  # params[1] has no .grad at all
    opt = NGD(params, lr=1.0, eta_max=0.5)
    opt.step()
    assert torch.equal(_flat(params), before)
    assert opt.last_step_size == 0.0
    assert "step" not in opt.state[params[1]]


def test_ngd_param_groups_share_the_global_norm() -> None:
    a, b = _params(0, (3,), (4,))
    _set_grads([a, b], 5)
    total = math.hypot(a.grad.norm().item(), b.grad.norm().item())
    a0, b0 = a.detach().clone(), b.detach().clone()
    opt = NGD([{"params": [a]}, {"params": [b], "lr": 0.3}], lr=0.1)
    opt.step()
    # Each group takes lr_group · g_group / ‖g_global‖.
    assert (a - a0).norm().item() == pytest.approx(0.1 * a.grad.norm().item() / total)
    assert (b - b0).norm().item() == pytest.approx(0.3 * b.grad.norm().item() / total)
    assert opt.step_sizes() == pytest.approx([0.1 / total, 0.3 / total])
    assert global_grad_norm([a, b]).item() == pytest.approx(total)


def test_ngd_closure_is_evaluated_and_returned() -> None:
    (w,) = _params(0, (3,))
    opt = NGD([w], lr=0.1)

    def closure() -> Tensor:
        opt.zero_grad()
        loss = (w**2).sum()
        loss.backward()
        return loss

    before = w.detach().clone()
    loss = opt.step(closure)
    assert loss.item() == pytest.approx((before**2).sum().item())
    assert (w.detach() - before).norm().item() == pytest.approx(0.1)


@pytest.mark.parametrize("kwargs", [{"lr": 0.0}, {"lr": -1.0}, {"lr": 0.1, "eta_max": 0.0}])
def test_ngd_rejects_bad_hyperparameters(kwargs: dict) -> None:
    with pytest.raises(ValueError, match="must be a positive number"):
        NGD(_params(0, (2,)), **kwargs)


# --------------------------------------------------------------------------- SPS / Polyak
def _quadratic(w: nn.Parameter, opt: torch.optim.Optimizer, D: Tensor) -> Callable[[], Tensor]:
    """L(w) = ½ wᵀ D w, minimum value 0 at w = 0."""

    def closure() -> Tensor:
        opt.zero_grad()
        loss = 0.5 * (w * D * w).sum()
        loss.backward()
        return loss

    return closure


def test_sps_step_size_matches_hand_computation() -> None:
    # w = (1, 2), D = diag(1, 3): L = ½(1 + 12) = 6.5, ∇L = (1, 6), ‖∇L‖² = 37.
    D = torch.tensor([1.0, 3.0], dtype=torch.float64)
    w = nn.Parameter(torch.tensor([1.0, 2.0], dtype=torch.float64))
    opt = SPS([w], c=0.5)
    loss = opt.step(_quadratic(w, opt, D))
    eta = 6.5 / (0.5 * 37)  # = 13/37
    assert loss.item() == 6.5
    assert opt.last_step_size == pytest.approx(eta, rel=1e-14)
    torch.testing.assert_close(w.detach(), torch.tensor([1 - eta, 2 - 6 * eta],
                                                        dtype=torch.float64))
    # With the cap η_max = 0.2 < 13/37 the step is 0.2 (SPS_max).
    w2 = nn.Parameter(torch.tensor([1.0, 2.0], dtype=torch.float64))
    capped = SPS([w2], c=0.5, eta_max=0.2)
    capped.step(_quadratic(w2, capped, D))
    assert capped.last_step_size == pytest.approx(0.2)
    torch.testing.assert_close(w2.detach(), torch.tensor([0.8, 0.8], dtype=torch.float64))


def test_sps_loss_below_f_star_gives_no_step() -> None:
    D = torch.tensor([1.0, 1.0], dtype=torch.float64)
    w = nn.Parameter(torch.tensor([0.1, 0.1], dtype=torch.float64))
    opt = SPS([w], f_star=1.0)  # L = 0.01 < f* would mean an ascent step: clamped to 0
    opt.step(_quadratic(w, opt, D))
    assert opt.last_step_size == 0.0
    assert w.detach().tolist() == [0.1, 0.1]


def test_polyak_step_that_overflows_gives_no_step() -> None:
    """A loss and a gradient that have both underflowed towards float64's smallest numbers
    (ib_fixed_v's excess loss at 1e-293 after a thousand Polyak steps, on an AVX2 machine) give
    a quotient past float64's range: the step was inf and the parameters became non-finite.
    Such a step is not defined: none is taken, as for a zero gradient."""
    w = nn.Parameter(torch.tensor([1.0, -2.0], dtype=torch.float64))
    opt = Polyak([w])

    def closure() -> Tensor:
        opt.zero_grad()
        w.grad = torch.tensor([3e-310, 0.0], dtype=torch.float64)  # subnormal, nonzero
        return torch.tensor(1e-290, dtype=torch.float64)

    opt.step(closure)
    assert opt.last_step_size == 0.0
    assert w.detach().tolist() == [1.0, -2.0]


def test_polyak_converges_on_convex_quadratic_with_zero_minimum() -> None:
    g = torch.Generator().manual_seed(0)
    D = torch.rand(6, generator=g, dtype=torch.float64) * 9 + 1  # condition number ≤ 10
    w = nn.Parameter(torch.randn(6, generator=g, dtype=torch.float64))
    opt = Polyak([w])
    closure = _quadratic(w, opt, D)
    first = opt.step(closure).item()
    for _ in range(200):
        opt.step(closure)
    assert closure().item() < 1e-8 * first
    # Polyak = SPS with c = 1, no cap, f* = 0.
    assert opt.param_groups[0]["c"] == 1.0 and opt.param_groups[0]["eta_max"] is None


@pytest.mark.parametrize("make", [lambda p: SPS(p), lambda p: Polyak(p)])
def test_polyak_steps_need_a_closure(make: Callable) -> None:
    (w,) = _params(0, (2,))
    w.grad = torch.ones(2, dtype=torch.float64)
    with pytest.raises(RuntimeError, match="step\\(closure\\)"):
        make([w]).step()


def test_sps_rejects_closure_returning_non_scalar() -> None:
    (w,) = _params(0, (2,))
    opt = SPS([w])

    def closure() -> Tensor:
        opt.zero_grad()
        loss = w**2
        loss.sum().backward()
        return loss  # (2,), not a scalar

    with pytest.raises(ValueError, match="scalar float loss"):
        opt.step(closure)


# --------------------------------------------------------------------------- state_dict
def _model(seed: int) -> nn.Module:
    model = nn.Sequential(nn.Linear(3, 5), nn.Tanh(), nn.Linear(5, 1))
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():  # weights from our generator, not from nn.Linear's global-RNG init
        for p in model.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * 0.5)
    return model


def _groups(model: nn.Module) -> list[dict]:
    return [{"params": model[0].parameters()}, {"params": model[2].parameters(), "lr": 0.02}]


_MAKERS: dict[str, Callable[[nn.Module], torch.optim.Optimizer]] = {
    "sngd": lambda m: NGD(_groups(m), lr=0.05, eta_max=0.5),
    "sngd_per_param": lambda m: NGD(m.parameters(), lr=0.05, per_param=True),
    "sps": lambda m: SPS(m.parameters(), c=0.5, eta_max=0.3),
    "polyak": lambda m: Polyak(m.parameters()),
}


def _train(model: nn.Module, opt: torch.optim.Optimizer, steps: range) -> None:
    g = torch.Generator().manual_seed(7)
    x, y = torch.randn(64, 3, generator=g), torch.randn(64, 1, generator=g)
    for s in steps:  # minibatch s is fixed by s, so an interrupted run sees the same batches
        xb, yb = x[(8 * s) % 64:(8 * s) % 64 + 8], y[(8 * s) % 64:(8 * s) % 64 + 8]

        def closure(xb: Tensor = xb, yb: Tensor = yb) -> Tensor:
            opt.zero_grad()
            loss = ((model(xb) - yb) ** 2).mean()
            loss.backward()
            return loss

        opt.step(closure)


@pytest.mark.parametrize("name", sorted(_MAKERS))
def test_state_dict_round_trip_is_bit_identical(name: str) -> None:
    make = _MAKERS[name]
    straight = _model(0)
    opt = make(straight)
    _train(straight, opt, range(8))

    head = _model(0)
    head_opt = make(head)
    _train(head, head_opt, range(4))
    saved_model, saved_opt = copy.deepcopy(head.state_dict()), copy.deepcopy(head_opt.state_dict())

    resumed = copy.deepcopy(_model(1))  # different weights, overwritten by the load
    resumed.load_state_dict(saved_model)
    resumed_opt = make(resumed)
    for group in resumed_opt.param_groups:  # hyperparameters must come from the checkpoint
        group["eta_max" if "eta_max" in group else "lr"] = 123.0
    resumed_opt.load_state_dict(saved_opt)
    assert resumed_opt.last_step_size == head_opt.last_step_size
    _train(resumed, resumed_opt, range(4, 8))

    for a, b in zip(straight.parameters(), resumed.parameters(), strict=True):
        assert torch.equal(a, b)
    assert resumed_opt.step_sizes() == opt.step_sizes()
    assert [s["step"] for s in resumed_opt.state.values()] == [8] * len(resumed_opt.state)


@pytest.mark.parametrize("dtype,entry", [(torch.float64, 1e-163), (torch.float32, 1e-23),
                                         (torch.float64, 1e150)])
def test_every_ngd_step_has_length_lr_however_small_or_large_the_gradient(dtype, entry):
    """‖g‖ is taken rescaled by the largest entry: the squares of a tiny nonzero gradient
    underflowed to a norm of 0 (no step: the run froze while the gradient was not 0), a huge
    one's overflowed to inf."""
    p = torch.nn.Parameter(torch.ones(8, dtype=dtype))
    p.grad = torch.full((8,), entry, dtype=dtype)
    opt = NGD([p], lr=0.1)
    opt.step()
    assert float(torch.linalg.vector_norm((p.detach() - 1).double())) == pytest.approx(0.1,
                                                                                         rel=1e-5)
    assert float(opt.state[p]["grad_norm"]) == pytest.approx(entry * 8 ** 0.5, rel=1e-5)


def test_polyak_step_of_a_tiny_gradient_and_half_precision_parameters():
    p = torch.nn.Parameter(torch.zeros(4, dtype=torch.float64))

    def closure() -> torch.Tensor:  # L = 1e-149 + g·p with g = 1e-150 per entry
        p.grad = torch.full((4,), 1e-150, dtype=torch.float64)
        return torch.tensor(1e-149, dtype=torch.float64)

    Polyak([p]).step(closure)  # step size L/‖g‖² = 1e-149 / 4e-300 = 2.5e150
    assert torch.allclose(p.detach(), torch.full((4,), -2.5, dtype=torch.float64))
    h = torch.nn.Parameter(torch.tensor([1.0, 1.0, 1.0, 1.0], dtype=torch.float16))
    h.grad = torch.tensor([3e-6, 0.0, 3e-6, 3e-6], dtype=torch.float16)
    NGD([h], lr=1.0).step()  # η/‖g‖ ≈ 1.9e5: inf in float16
    assert torch.isfinite(h.detach()).all()
    assert float(torch.linalg.vector_norm(h.detach().float() - 1)) == pytest.approx(1.0, rel=2e-3)
