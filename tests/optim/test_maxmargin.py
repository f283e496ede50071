"""W_mm: feasibility, optimality (KKT and an independent dual bound), hand-solved toys,
infeasible inputs, the metrics, and GD/NGD on the attention model aligning with W_mm."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from scipy.optimize import minimize
from torch import Tensor

from senslab.data import create_dataset
from senslab.models import create_model
from senslab.optim import (
    NGD,
    alignment,
    attention_margins,
    attention_sparsity,
    check_max_margin,
    max_margin_attention,
    optimal_tokens,
)


def _random_instance(n: int = 6, T: int = 4, d: int = 5, seed: int = 0) -> tuple[Tensor, Tensor]:
    g = torch.Generator().manual_seed(seed)
    X = torch.randn(n, T, d, generator=g, dtype=torch.float64)
    opt = torch.randint(0, T, (n,), generator=g)
    return X, opt


def _features(X: Tensor, opt: Tensor) -> np.ndarray:
    """z_k = vec((x_opt − x_t) x₁ᵀ) by explicit loops: the slow reference."""
    rows = []
    for i in range(X.shape[0]):
        for t in range(X.shape[1]):
            if t != int(opt[i]):
                rows.append(torch.outer(X[i, opt[i]] - X[i, t], X[i, 0]).flatten().numpy())
    return np.array(rows)


def test_random_instance_is_feasible_tight_and_optimal() -> None:
    X, opt = _random_instance()
    W = max_margin_attention(X, opt)
    assert W.shape == (5, 5) and W.dtype == torch.float64
    Z = _features(X, opt)
    margins = Z @ W.flatten().numpy()
    assert margins.min() >= 1 - 1e-6
    assert np.isclose(margins, 1, atol=1e-8).any()  # at least one active constraint
    assert check_max_margin(X, opt, W) == pytest.approx(1.0, abs=1e-8)
    assert attention_margins(X, opt, 0.999 * W).min() < 1  # shrinking W breaks a constraint

    # Independent optimality proof by weak duality: any α ≥ 0 gives a lower bound
    # Σα − ½‖Zᵀα‖² ≤ ½‖W‖² for every feasible W. Maximise it with L-BFGS-B (a different
    # algorithm from ours) and check the bound meets ½‖W_mm‖².
    def neg_dual(a: np.ndarray) -> tuple[float, np.ndarray]:
        w = Z.T @ a
        return -(a.sum() - 0.5 * w @ w), -(1 - Z @ w)

    res = minimize(neg_dual, np.zeros(len(Z)), jac=True, method="L-BFGS-B",
                   bounds=[(0, None)] * len(Z), options={"ftol": 1e-15, "gtol": 1e-12,
                                                          "maxiter": 10000})
    half_norm_sq = 0.5 * float(W.norm() ** 2)
    assert -res.fun <= half_norm_sq + 1e-9  # weak duality (sanity of the reference)
    assert -res.fun == pytest.approx(half_norm_sq, rel=1e-5)


@pytest.mark.parametrize("scale", [1e-3, 1e3])
def test_the_solution_scales_with_the_tokens(scale: float) -> None:
    """Tokens scaled by s: W_mm(sX) = W_mm(X)/s² (and v_mm(sZ) = v_mm(Z)/s). The solver's
    thresholds were absolute, so at s = 1e-3 a feasible problem was called infeasible."""
    from senslab.optim.maxmargin import max_margin_direction

    X, opt = _random_instance()
    W = max_margin_attention(X, opt)
    assert torch.allclose(max_margin_attention(scale * X, opt), W / scale**2, rtol=1e-9)
    Z = torch.randn(8, 3, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    Z = Z * torch.sign(Z @ torch.tensor([1.0, 0.5, -0.2], dtype=torch.float64))[:, None]
    v = max_margin_direction(Z)
    assert torch.allclose(max_margin_direction(scale * 1e-4 * Z), v / (scale * 1e-4), rtol=1e-8)


def test_two_token_toy_has_hand_derived_solution() -> None:
    # One sample, query x_1 = e1, optimal token x_2 = e2: one constraint ⟨W, z⟩ ≥ 1 with
    # z = (e2 − e1) e1ᵀ, so W_mm = z / ‖z‖² = [[−½, 0], [½, 0]].
    X = torch.tensor([[[1.0, 0.0], [0.0, 1.0]]], dtype=torch.float64)
    W = max_margin_attention(X, torch.tensor([1]))
    torch.testing.assert_close(W, torch.tensor([[-0.5, 0.0], [0.5, 0.0]], dtype=torch.float64))

    # Add a second sample that is the first scaled by 2: its z is 4z, so its constraint is
    # implied (inactive, α = 0) and W_mm is unchanged.
    X2 = torch.cat([X, 2 * X])
    torch.testing.assert_close(max_margin_attention(X2, torch.tensor([1, 1])), W)
    assert attention_margins(X2, torch.tensor([1, 1]), W)[:, 0].tolist() == pytest.approx([1, 4])

    # Swap roles in a second sample (query e2, optimal token e1): z' = (e1 − e2) e2ᵀ ⟂ z,
    # both active with α = ½: W_mm = (z + z') / 2.
    X3 = torch.cat([X, X.flip(-1)])
    expected = torch.tensor([[-0.5, 0.5], [0.5, -0.5]], dtype=torch.float64)
    torch.testing.assert_close(max_margin_attention(X3, torch.tensor([1, 1])), expected)


def test_infeasible_inputs_raise_clear_errors() -> None:
    X, opt = _random_instance(n=3, T=4, d=3)
    X[1, (int(opt[1]) + 1) % 4] = X[1, opt[1]]  # a duplicate of the optimal token
    with pytest.raises(ValueError, match="sample 1.*equals the optimal token"):
        max_margin_attention(X, opt)
    # Same query, opposite preferences: (a − b)ᵀWq ≥ 1 and (b − a)ᵀWq ≥ 1 cannot both hold.
    q, a, b = torch.eye(3, dtype=torch.float64)
    X = torch.stack([torch.stack([q, a, b]), torch.stack([q, b, a])])
    with pytest.raises(ValueError, match="infeasible"):
        max_margin_attention(X, torch.tensor([1, 1]))
    with pytest.raises(ValueError, match="opt positions must lie in 0..2"):
        max_margin_attention(X, torch.tensor([1, 3]))
    with pytest.raises(ValueError, match=r"shape \(N, T, d\)"):
        max_margin_attention(X[0], torch.tensor([1]))


def test_check_rejects_feasible_but_suboptimal_matrices() -> None:
    X, opt = _random_instance(n=2, T=3, d=4, seed=1)  # 4 constraints on 16 entries
    W = max_margin_attention(X, opt)
    with pytest.raises(ValueError, match="no constraint is active"):
        check_max_margin(X, opt, 2 * W)
    # Add a direction orthogonal to every z_k: margins unchanged (still feasible, still active)
    # but W is longer, and KKT fails because W leaves the span of the constraints.
    Z = torch.from_numpy(_features(X, opt))
    E = torch.randn(16, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    E = E - Z.T @ torch.linalg.lstsq(Z.T, E).solution
    bad = W + E.reshape(4, 4) / E.norm()
    assert attention_margins(X, opt, bad).min() == pytest.approx(1.0)
    with pytest.raises(ValueError, match="not the minimum-norm"):
        check_max_margin(X, opt, bad)
    with pytest.raises(ValueError, match="infeasible"):
        check_max_margin(X, opt, 0.5 * W)


def test_optimal_tokens_and_metrics() -> None:
    ds = create_dataset("maxmargin_attention", num_samples=8, seq_len=5, dim=6, seed=3)
    opt = optimal_tokens(ds.inputs, ds.meta["y_pm"], ds.meta["v"])
    assert torch.equal(opt, ds.meta["opt"])
    with pytest.raises(ValueError, match="2 \\* t - 1"):
        optimal_tokens(ds.inputs, ds.targets, ds.meta["v"])  # {0, 1} targets, not ±1

    W = torch.randn(4, 4, generator=torch.Generator().manual_seed(0))
    assert alignment(W, W) == pytest.approx(1.0)
    assert alignment(-3 * W, W) == pytest.approx(-1.0)
    assert alignment(torch.zeros(4, 4), W) == 0.0
    E = torch.zeros(4, 4)
    E[0, 1] = 1.0
    assert alignment(E, E.T) == 0.0  # orthogonal in Frobenius product
    with pytest.raises(ValueError, match="one shape"):
        alignment(W, W[0])

    weights = torch.tensor([[0.1, 0.7, 0.2], [0.5, 0.25, 0.25]])
    assert attention_sparsity(weights, torch.tensor([1, 0])) == pytest.approx(0.6)


def test_attention_margins_match_loop() -> None:
    X, opt = _random_instance(n=3, T=4, d=3, seed=4)
    W = torch.randn(3, 3, generator=torch.Generator().manual_seed(5), dtype=torch.float64)
    m = attention_margins(X, opt, W)
    for i in range(3):
        for t in range(4):
            want = (X[i, opt[i]] - X[i, t]) @ W @ X[i, 0] if t != opt[i] else float("inf")
            assert float(m[i, t]) == pytest.approx(float(want))


def _train_alignment(make_opt, steps: int) -> tuple[float, float, float, float]:
    """Fixed-v attention model, full-batch logistic loss; alignment / sparsity before, after."""
    ds = create_dataset("maxmargin_attention", num_samples=8, seq_len=4, dim=8)
    X, y, v = ds.inputs, ds.meta["y_pm"], ds.meta["v"]
    opt = optimal_tokens(X, y, v)
    W_mm = max_margin_attention(X, opt)
    model = create_model("attention_model", dim=8, train_v=False, init_scale=0.01, seed=1)
    model.v.copy_(v)  # the data's v, so opt are the optimal tokens of this model
    optimizer = make_opt(model.parameters())
    start = alignment(model.W, W_mm), attention_sparsity(model.attention_weights(X), opt)
    for _ in range(steps):
        optimizer.zero_grad()
        F.softplus(-y * model(X)).mean().backward()  # logistic loss log(1 + e^{−yΦ})
        optimizer.step()
    with torch.no_grad():
        end = alignment(model.W, W_mm), attention_sparsity(model.attention_weights(X), opt)
    return start[0], end[0], start[1], end[1]


def test_gd_and_ngd_align_attention_with_w_mm() -> None:
    a0, gd, s0, gd_s = _train_alignment(lambda p: torch.optim.SGD(p, lr=1.0), 100)
    assert a0 < 0.2 and gd > 0.75  # from a random direction to well aligned
    assert gd_s > s0 + 0.3  # attention concentrates on the optimal token
    _, ngd, _, ngd_s = _train_alignment(lambda p: NGD(p, lr=0.5), 50)
    assert ngd > 0.95 and ngd > gd  # the paper's claim: NGD aligns faster than GD
    assert ngd_s > 0.99
