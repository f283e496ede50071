"""Inputs for which sharpness returned a wrong number without a word (audit sharp68): an
ambient autocast (its weight-cast cache hid every draw: ShOp 0), a low-precision loss whose
rounding biased every draw beyond the standard error, integer parameters, a bad ``scale``,
and an ``exclude`` that names a tied weight or one sharing memory with a perturbed one."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from senslab.measure.sharpness import loss_sharpness, output_sharpness


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _net() -> nn.Module:
    torch.manual_seed(1)  # test-only: layer init
    return nn.Sequential(nn.Linear(10, 64), nn.Tanh(), nn.Linear(64, 3))


# ------------------------------------------------------------------------------ autocast
@pytest.mark.parametrize("which", ["output", "loss"])
def test_a_call_inside_autocast_is_refused(which):
    """Under torch.autocast the cast of each weight is cached on the first (clean) forward and
    reused by every perturbed one: ShOp was exactly 0 (0.51 outside autocast)."""
    model, x = _net(), torch.randn(64, 10, generator=_gen(0))
    before = [p.detach().clone() for p in model.parameters()]
    with torch.autocast("cpu", dtype=torch.bfloat16), \
            pytest.raises(ValueError, match="autocast"):
        if which == "output":
            output_sharpness(model, x, generator=0)
        else:
            loss_sharpness(model, F.mse_loss, x, torch.zeros(64, 3), generator=0)
    assert model.training
    assert all(torch.equal(p, q) for p, q in zip(model.parameters(), before, strict=True))
    ref = output_sharpness(model, x, generator=0).shop.estimate
    assert ref > 0.1  # outside autocast: measured


# ------------------------------------------------------------------ low-precision loss
def _regression() -> tuple[nn.Module, torch.Tensor, torch.Tensor]:
    torch.manual_seed(1)  # test-only: layer init
    net = nn.Sequential(nn.Linear(10, 64), nn.Tanh(), nn.Linear(64, 1))
    return net, torch.randn(256, 10, generator=_gen(2)), torch.randn(256, 1, generator=_gen(3))


def test_a_bf16_loss_whose_rounding_exceeds_the_standard_error_is_refused():
    """A bf16 MSE near 1.08 is held to 2^-7: its clean value's rounding (up to 0.004) shifts
    every draw alike; the sharpness came out -0.00008 ± 0.0005 where the same bf16 model with
    a float32 loss gives 0.0020 ± 0.0005 (float32 model: 0.0020)."""
    net, x, y = _regression()
    bf = copy.deepcopy(net).bfloat16()
    xb, yb = x.bfloat16(), y.bfloat16()
    with pytest.raises(ValueError, match="float32"):
        loss_sharpness(bf, F.mse_loss, xb, yb, sigma=0.01, draws=200, generator=0)
    ok = loss_sharpness(bf, lambda o, t: F.mse_loss(o.float(), t.float()), xb, yb, sigma=0.01,
                        draws=200, generator=0)
    ref = loss_sharpness(net, F.mse_loss, x, y, sigma=0.01, draws=200, generator=0)
    assert abs(ok.estimate - ref.estimate) < ref.stderr


class _AtMinimum(nn.Module):
    """Outputs its 1000 weights (0): the loss 1 + ½‖θ‖² increases by ½σ²‖ε‖² per draw."""

    def __init__(self) -> None:
        super().__init__()
        self.theta = nn.Parameter(torch.zeros(1000))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.theta.expand(x.shape[0], -1)


def _at_minimum_loss(out: torch.Tensor, _target: object) -> torch.Tensor:
    return 1 + 0.5 * out[0].square().sum()


def test_a_float32_loss_at_a_sigma_below_its_resolution_is_refused():
    """float32 holds a loss near 1 to 1.2e-7: σ = 2e-5 gave 2.384e-7 ± 0; the truth (float64)
    is 2.04e-7 ± 0.02e-7."""
    x, sigma = torch.zeros(4, 1), 2e-5
    with pytest.raises(ValueError, match="spacing"):
        loss_sharpness(_AtMinimum(), _at_minimum_loss, x, None, sigma=sigma, generator=0)
    exact = loss_sharpness(_AtMinimum().double(), _at_minimum_loss, x.double(), None,
                           sigma=sigma, generator=0)
    assert exact.estimate == pytest.approx(0.5 * sigma**2 * 1000, rel=0.05)


def test_a_bf16_loss_that_rounds_every_change_away_is_refused():
    """bf16 holds a loss near 1 to 0.008: σ = 1e-3 raises it by 5e-4, which every draw rounded
    away (0 ± 0) while the outputs moved."""
    model, x = _AtMinimum().bfloat16(), torch.zeros(4, 1, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="no draw changed the loss"):
        loss_sharpness(model, _at_minimum_loss, x, None, sigma=1e-3, generator=0)
    res = loss_sharpness(model, lambda o, t: _at_minimum_loss(o.double(), t), x, None,
                         sigma=1e-3, generator=0)
    assert res.estimate == pytest.approx(5e-4, rel=0.05)


def test_a_loss_that_never_moves_is_zero_sharpness_in_float32():
    """Hard decisions: no draw changes the loss; that is an exact 0, not a rounding artefact."""

    class Step(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lin = nn.Linear(4, 1)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return (self.lin(x) > 0).float()

    torch.manual_seed(0)  # test-only: layer init
    x = torch.randn(32, 4, generator=_gen(1))
    res = loss_sharpness(Step(), F.mse_loss, x, torch.ones(32, 1), sigma=1e-4, draws=5,
                         generator=0)
    assert res.estimate == 0.0 and res.stderr == 0.0


# ----------------------------------------------------------------------- parameters
def test_an_integer_parameter_is_refused_naming_exclude():
    """Noise cast to int64 was truncated: 3 + 0.3ε became 2 or 3, a biased 'perturbation'."""

    class IntScale(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lin = nn.Linear(3, 2)
            self.k = nn.Parameter(torch.tensor([3, 4]), requires_grad=False)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.lin(x) * self.k

    model, x = IntScale(), torch.randn(8, 3, generator=_gen(0))
    with pytest.raises(ValueError, match=r"exclude=\['k'\]"):
        output_sharpness(model, x, sigma_w=0.3, generator=0)
    assert output_sharpness(model, x, sigma_w=0.3, exclude=["k"], generator=0).shop.estimate > 0


@pytest.mark.parametrize("scale", [float("nan"), float("inf"), -4.0, 0.0, True, "4"])
def test_a_scale_that_is_not_a_positive_number_is_refused(scale):
    """NaN/inf gave a NaN estimate, -4 a sign-flipped one, True was taken for 1."""
    model, x = _net(), torch.randn(16, 10, generator=_gen(0))
    with pytest.raises(ValueError, match="scale"):
        loss_sharpness(model, F.mse_loss, x, torch.zeros(16, 3), scale=scale, generator=0)


class _Tied(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(10, 8)
        self.head = nn.Linear(8, 10, bias=False)
        self.head.weight = self.emb.weight  # one Parameter under two names
        self.ln = nn.LayerNorm(8)

    def forward(self, t: torch.Tensor) -> torch.Tensor:
        return self.head(self.ln(self.emb(t))).mean(1)


def test_excluding_a_tied_weight_by_its_second_name_says_it_is_tied():
    torch.manual_seed(0)  # test-only: layer init
    with pytest.raises(ValueError, match="tied.*'emb.weight'"):
        output_sharpness(_Tied(), torch.randint(0, 10, (6, 5), generator=_gen(0)),
                         exclude=["head"], generator=0)


def test_an_excluded_parameter_sharing_memory_with_a_perturbed_one_is_refused():
    """``b`` excluded but on the same memory as ``a``: the in-place noise on ``a`` reached it,
    so the measured model was not the one asked for."""

    class Shared(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.a = nn.Parameter(torch.randn(4, 3, generator=_gen(0)))
            self.b = nn.Parameter(self.a.data)
            self.c = nn.Parameter(torch.ones(4))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return (x @ self.a.t() + x @ self.b.t()) * self.c

    model, x = Shared(), torch.randn(5, 3, generator=_gen(1))
    with pytest.raises(ValueError, match="'b'.*'a'"):
        output_sharpness(model, x, exclude=["b"], generator=0)
    # both excluded: only c moves, and ShOp is that of c alone
    only_c = output_sharpness(model, x, exclude=["a", "b"], generator=0).shop.estimate
    clean = model(x).detach()
    assert 0 < only_c < output_sharpness(model, x, generator=0).shop.estimate
    assert torch.equal(model(x).detach(), clean)


def test_disjoint_views_of_one_flat_buffer_may_be_excluded_apart():
    """Views of one storage that do not overlap (a flat parameter buffer) stay separable."""

    class Flat(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            buf = torch.randn(20, generator=_gen(0))
            self.w = nn.Parameter(buf[:12].view(4, 3))
            self.v = nn.Parameter(buf[12:].view(4, 2))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x @ self.w.t() + (x[:, :2] @ self.v.t())

    model, x = Flat(), torch.randn(5, 3, generator=_gen(1))
    before = model.v.detach().clone()
    assert output_sharpness(model, x, exclude=["v"], generator=0).shop.estimate > 0
    assert torch.equal(model.v.detach(), before)


def test_a_float32_error_rate_that_no_draw_changes_is_zero_sharpness():
    """A piecewise-constant loss: the outputs move, the error rate does not; an exact 0."""
    torch.manual_seed(0)  # test-only: layer init
    model, x = nn.Linear(4, 3), torch.randn(32, 4, generator=_gen(1))
    y = model(x).argmax(1).detach()

    def error_rate(out: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return (out.argmax(1) != target).float().mean() + 0.25

    res = loss_sharpness(model, error_rate, x, y, sigma=1e-6, draws=5, generator=0)
    assert res.estimate == 0.0 and res.reference == 0.25
