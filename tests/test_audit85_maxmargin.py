"""Audit 85 (maxmargin): check_max_margin on W_mm in the type max_margin_attention returns it
in, and NGD steps of huge gradients."""

from __future__ import annotations

import pytest
import torch

from senslab.optim import (
    NGD,
    attention_margins,
    check_max_margin,
    max_margin_attention,
    optimal_tokens,
)


def _instance(dtype: torch.dtype, seed: int, offset: float) -> tuple[torch.Tensor, torch.Tensor]:
    """30 sequences of 6 tokens of size 8 with mean ``offset``, in ``dtype``, and their optimal
    tokens."""
    g = torch.Generator().manual_seed(seed)
    X = (torch.randn(30, 6, 8, generator=g) + offset).to(dtype)
    v = torch.randn(8, generator=g)
    y = torch.where(torch.rand(30, generator=g) < 0.5, -1.0, 1.0)
    return X, optimal_tokens(X, y, v)


@pytest.mark.parametrize("dtype,seed,offset", [
    (torch.float32, 6, 0.0),  # failed the KKT part: a rounded margin left the active set
    (torch.float32, 12, 3.0),  # failed feasibility: margin 0.999996
    (torch.float16, 0, 0.0),
    (torch.bfloat16, 0, 0.0),
])
def test_check_accepts_w_mm_in_the_type_max_margin_attention_returns(dtype, seed, offset):
    """max_margin_attention returns W_mm in X's type, "verified by check_max_margin"; checked
    again as returned, W_mm failed that check at the default tol (1e-6): float32 now and then
    (tokens of mean 3: 7 of 20 instances), float16 and bfloat16 always, by their rounding
    alone."""
    X, opt = _instance(dtype, seed, offset)
    W = max_margin_attention(X, opt)
    assert W.dtype == dtype
    assert check_max_margin(X, opt, W) == pytest.approx(1.0, abs=0.05)
    W64 = max_margin_attention(X.double(), opt)  # the same tokens, exactly
    assert check_max_margin(X, opt, W64) == pytest.approx(1.0, abs=1e-8)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_check_still_rejects_a_wrong_w_in_a_narrow_type(dtype):
    """The allowance is W's rounding, not more: 2% too short, 3% too long or 5% off in direction
    is still refused in float32 and float16."""
    X, opt = _instance(dtype, 3, 1.0)
    W = max_margin_attention(X, opt).double()
    E = torch.randn(8, 8, generator=torch.Generator().manual_seed(7), dtype=torch.float64)
    with pytest.raises(ValueError, match="infeasible"):
        check_max_margin(X, opt, (0.98 * W).to(dtype))
    with pytest.raises(ValueError, match="not minimal|not the minimum-norm"):
        check_max_margin(X, opt, (1.03 * W).to(dtype))
    with pytest.raises(ValueError):
        check_max_margin(X, opt, (W + 0.05 * W.norm() * E / E.norm()).to(dtype))


def test_check_names_where_a_narrow_w_falls_short():
    X, opt = _instance(torch.float16, 0, 0.0)
    W = max_margin_attention(X, opt).double()
    with pytest.raises(ValueError, match=r"margin 0\.9\d* < 1 at sample \d+, token \d+ "
                                         r"\(beyond torch.float16's rounding"):
        check_max_margin(X, opt, (0.98 * W).half())
    # the location named is a real constraint's, and its margin is the one reported
    margins = attention_margins(X.double(), opt, (0.98 * W).half().double())
    assert float(margins.min()) < 0.99


@pytest.mark.parametrize("dtype,entry,lr", [
    (torch.float32, 1e37, 1e-9),  # η/‖g‖ rounded to 0: no step at all
    (torch.float32, 3e37, 1e-7),  # η/‖g‖ subnormal: a step of 1.19 η
    (torch.float32, 1e37, 1e-4),
    (torch.float64, 1e305, 1e-10),
])
def test_ngd_step_of_a_huge_gradient_has_length_lr(dtype, entry, lr):
    """NGD's step is η whatever the gradient's size; for a huge ‖g‖, η/‖g‖ fell under the
    type's normal range and kept a few digits or none."""
    p = torch.nn.Parameter(torch.zeros(8, dtype=dtype))
    p.grad = torch.full((8,), entry, dtype=dtype)
    NGD([p], lr=lr).step()
    assert float(torch.linalg.vector_norm(p.detach().double())) == pytest.approx(lr, rel=1e-5)


def test_ngd_cap_below_a_huge_gradients_step_size_is_kept():
    """A cap that lowers the multiplier is a plain gradient step of rate η_max, as before."""
    p = torch.nn.Parameter(torch.zeros(4, dtype=torch.float64))
    p.grad = torch.full((4,), 2.0, dtype=torch.float64)
    NGD([p], lr=1.0, eta_max=1e-3).step()  # η/‖g‖ = 0.25 > η_max
    assert torch.equal(p.detach(), torch.full((4,), -2e-3, dtype=torch.float64))
