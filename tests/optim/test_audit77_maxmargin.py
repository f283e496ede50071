"""Audit 77 (maxmargin): wrong numbers without a word in senslab.optim.maxmargin."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from scipy.optimize import minimize

from senslab.optim.maxmargin import (
    attention_margins,
    attention_sparsity,
    check_max_margin,
    max_margin_attention,
    optimal_tokens,
)


def _tokens(seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    X = torch.randn(3, 4, 5, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
    return X, torch.tensor([1, 2, 3])


def test_w_mm_matches_an_independent_solver() -> None:
    """Reference: scipy's SLSQP on the primal QP min ½‖w‖² s.t. ⟨w, z_k⟩ ≥ 1 (a check that the
    fixes below leave the solution alone)."""
    X, opt = _tokens(1)
    W = max_margin_attention(X, opt)
    Z = np.stack([np.outer(X[i, opt[i]] - X[i, t], X[i, 0]).ravel()
                  for i in range(3) for t in range(4) if t != opt[i]])
    ref = minimize(lambda w: 0.5 * w @ w, np.zeros(25), jac=lambda w: w, method="SLSQP",
                   constraints=[{"type": "ineq", "fun": lambda w: Z @ w - 1, "jac": lambda w: Z}],
                   options={"ftol": 1e-14, "maxiter": 500})
    assert ref.success
    np.testing.assert_allclose(W.numpy().ravel(), ref.x, rtol=1e-6, atol=1e-8)


@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_optimal_tokens_refuses_a_non_finite_v(bad: float) -> None:
    """A nan score was taken as the maximum: v = nan returned position 0 (the query) for every
    sequence, v = (0, inf, 0, …) too (0·inf = nan), without a word."""
    X, _ = _tokens()
    v = torch.zeros(5, dtype=torch.float64)
    v[1] = bad
    with pytest.raises(ValueError, match="nan or infinite"):
        optimal_tokens(X, torch.ones(3, dtype=torch.float64), v)


def test_optimal_tokens_refuses_a_tie() -> None:
    """Two distinct tokens with the same top score: the first was returned, and W_mm built on
    it (a direction GD does not take: the softmax keeps both tokens)."""
    X = torch.eye(3, dtype=torch.float64).unsqueeze(0)  # tokens e1 (query), e2, e3
    v = torch.tensor([0.0, 1.0, 1.0], dtype=torch.float64)  # γ = (0, 1, 1): e2 and e3 tie
    with pytest.raises(ValueError,
                       match=r"sample 0 has no unique optimal token: positions \[1, 2\]"):
        optimal_tokens(X, torch.ones(1, dtype=torch.float64), v)
    with pytest.raises(ValueError, match="no unique optimal token"):  # v = 0: every token ties
        optimal_tokens(X, torch.ones(1, dtype=torch.float64), torch.zeros(3, dtype=torch.float64))
    # a unique optimum is still returned as before
    v = torch.tensor([0.0, 1.0, 0.5], dtype=torch.float64)
    assert optimal_tokens(X, torch.ones(1, dtype=torch.float64), v).tolist() == [1]


def test_half_precision_w_mm_that_overflows_is_refused() -> None:
    """Tokens of scale 1e-3 in float16: W_mm (entries ~4e5, scaling as 1/‖x‖²) was cast to
    float16 and returned with inf entries, after passing the float64 check."""
    X, opt = _tokens()
    with pytest.raises(ValueError, match="does not fit X's dtype torch.float16.*not finite"):
        max_margin_attention((X * 1e-3).half(), opt)


def test_half_precision_w_mm_that_goes_subnormal_is_refused() -> None:
    """Tokens of scale 300 in float16: W_mm's entries (~1e-6) are subnormal in float16 and the
    returned W had margins down to 0.975 (2.5% off), failing its own check."""
    X, opt = _tokens()
    X16 = (X * 300).half()
    with pytest.raises(ValueError, match="does not fit X's dtype torch.float16"):
        max_margin_attention(X16, opt)
    W = max_margin_attention(X16.double(), opt)  # the advice: float64 works
    assert check_max_margin(X16, opt, W) == pytest.approx(1.0, abs=1e-6)


def test_half_precision_w_mm_in_range_is_still_returned() -> None:
    """Token scale 1 in float16 and bfloat16: W_mm fits, returned in X's dtype as documented."""
    X, opt = _tokens()
    for dtype in (torch.float16, torch.bfloat16, torch.float32):
        W = max_margin_attention(X.to(dtype), opt)
        assert W.dtype == dtype
        margins = attention_margins(X.to(dtype).double(), opt, W.double())
        assert float(margins.min()) == pytest.approx(1.0, abs=1e-2)


def test_attention_sparsity_refuses_rows_that_are_not_attention() -> None:
    """Scores passed instead of softmax rows gave a "mean mass on the optimal token" of 2.5
    (documented ∈ [0, 1]); no rows gave nan."""
    scores = torch.tensor([[0.5, 3.0, -1.0], [2.0, 0.1, 0.2]], dtype=torch.float64)
    opt = torch.tensor([1, 0])
    with pytest.raises(ValueError, match="row 0 is not a softmax row"):
        attention_sparsity(scores, opt)
    with pytest.raises(ValueError, match="N = 0"):
        attention_sparsity(scores[:0], opt[:0])
    expected = float((scores.softmax(1)[0, 1] + scores.softmax(1)[1, 0]) / 2)
    for dtype in (torch.float64, torch.float32, torch.float16, torch.bfloat16):
        got = attention_sparsity(scores.softmax(1).to(dtype), opt)
        assert got == pytest.approx(expected, abs=1e-2)
