"""Audit 80 (optim): a Polyak / SPS loss below f* said instead of silently never stepping;
token scores and margins of half-precision tokens computed in float32; the global gradient norm
of a sparse gradient."""

from __future__ import annotations

import warnings

import pytest
import torch
from torch import Tensor, nn

from senslab.optim import (
    SPS,
    Polyak,
    attention_margins,
    global_grad_norm,
    max_margin_attention,
    optimal_tokens,
)


def _shifted_quadratic(w: nn.Parameter, opt: torch.optim.Optimizer, shift: float):
    def closure() -> Tensor:
        opt.zero_grad()
        loss = ((w - 3.0) ** 2).sum() - shift  # minimum −shift at w = 3
        loss.backward()
        return loss

    return closure


def test_a_loss_below_f_star_is_said_once_not_stepped_silently() -> None:
    """A loss that can go negative under the default f* = 0: from w = 0 the loss is 9 − 10 = −1,
    the step size is clamped to 0 and w stayed at 0 for ever, without a word."""
    w = nn.Parameter(torch.zeros(1, dtype=torch.float64))
    opt = Polyak([w])
    closure = _shifted_quadratic(w, opt, shift=10.0)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(3):
            opt.step(closure)
    said = [str(c.message) for c in caught if issubclass(c.category, RuntimeWarning)]
    assert len(said) == 1  # once per optimiser, not once per step
    assert "below f_star = 0" in said[0] and "pass a smaller f_star" in said[0]
    assert caught[0].filename == __file__  # points at the caller of step()
    assert w.item() == 0.0 and opt.last_step_size == 0.0  # the behaviour itself is unchanged


def test_a_loss_at_or_above_f_star_is_not_said() -> None:
    """Steps on a loss that stays above f* (and one that lands on f* within rounding) say
    nothing."""
    w = nn.Parameter(torch.zeros(1, dtype=torch.float32))
    opt = SPS([w], c=0.5, f_star=-10.0, eta_max=0.1)
    closure = _shifted_quadratic(w, opt, shift=10.0)  # infimum −10 = f*
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for _ in range(50):
            opt.step(closure)
    assert w.item() == pytest.approx(3.0, abs=1e-3)


def test_bfloat16_tokens_are_not_refused_as_ties_they_are_not() -> None:
    """Scores in bfloat16 rounded distinct values together: 23 of these 2,000 sequences were
    refused as ties, though their scores (of the very same bfloat16 tokens) differ."""
    g = torch.Generator().manual_seed(0)
    X = torch.randn(2000, 16, 32, generator=g).bfloat16()
    v = torch.randn(32, generator=g).bfloat16()
    y = torch.where(torch.rand(2000, generator=g) > 0.5, 1.0, -1.0)
    exact = (y.double()[:, None] * (X.double() @ v.double())).argmax(dim=1)
    assert torch.equal(optimal_tokens(X, y, v), exact)


def test_margins_of_half_precision_tokens_are_those_of_the_tensors_given() -> None:
    """A margin is a difference of two scores: computed in bfloat16 (X's type) the margins of a
    float32 W on bfloat16 tokens were up to 0.02 off; in float16, tokens of scale 1e-3 (W_mm's
    entries near 7e5) gave inf / nan margins."""
    g = torch.Generator().manual_seed(0)
    X = torch.randn(20, 6, 8, generator=g, dtype=torch.float64)
    v = torch.randn(8, generator=g, dtype=torch.float64)
    y = torch.where(torch.rand(20, generator=g) > 0.5, 1.0, -1.0).double()
    opt = optimal_tokens(X, y, v)
    for X_half in (X.bfloat16(), (X * 1e-3).half()):
        W = max_margin_attention(X_half.double(), opt).float()
        margins = attention_margins(X_half, opt, W)
        exact = attention_margins(X_half.double(), opt, W.double())
        assert margins.dtype == torch.float32
        constrained = torch.isfinite(exact)
        assert torch.isfinite(margins[constrained]).all()
        torch.testing.assert_close(margins[constrained].double(), exact[constrained],
                                   rtol=1e-5, atol=1e-5)
        assert float(margins.min()) == pytest.approx(1.0, abs=1e-5)


def test_global_grad_norm_of_a_sparse_gradient() -> None:
    """A sparse embedding's gradient (row 1 listed twice) raised torch's NotImplementedError; its
    norm is the dense gradient's."""
    torch.manual_seed(0)
    sparse = nn.Embedding(10, 3, sparse=True)
    dense = nn.Embedding(10, 3)
    dense.weight.data.copy_(sparse.weight.data)
    ids = torch.tensor([1, 1, 2])
    for emb in (sparse, dense):
        emb(ids).pow(2).sum().backward()
    got = global_grad_norm(sparse.parameters())
    assert got is not None
    torch.testing.assert_close(got, dense.weight.grad.norm())
