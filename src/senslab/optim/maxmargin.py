"""The max-margin attention matrix W_mm and the metrics that compare W_t with it
(docs/definitions.md#max-margin-attention).

For the model Φ(X) = vᵀ Xᵀ softmax(X W x₁) with labels y_i ∈ {±1}, the token scores are
γ_it = y_i vᵀ x_it and the optimal token is opt_i = argmax_t γ_it. Vasudeva et al. show that
(normalised) gradient descent drives W in the direction of

    W_mm = argmin_W ‖W‖_F   s.t.   (x_{i,opt_i} − x_it)ᵀ W x_i1 ≥ 1   for all i and t ≠ opt_i.

Each constraint is linear in W: (x_opt − x_t)ᵀ W x₁ = ⟨W, z_k⟩_F with z_k = (x_opt − x_t) x₁ᵀ, so
this is a bias-free hard-margin SVM on the K = N(T − 1) features z_k. Its dual is

    max_{α ≥ 0}  Σ_k α_k − ½ ‖Σ_k α_k z_k‖²_F,        W_mm = Σ_k α_k z_k,

and the KKT conditions say α_k > 0 only on *active* constraints (margin exactly 1).

How we solve it exactly: a minimum-norm point subject to linear inequalities is a least-distance
program, which Lawson & Hanson (ch. 23) reduce to one non-negative least-squares problem,
solved in finitely many steps by ``scipy.optimize.nnls`` (an active-set method, no step sizes or
tolerances to tune). Only the Gram matrix ⟨z_k, z_l⟩ = ⟨a_k, a_l⟩⟨q_k, q_l⟩ (a = x_opt − x_t,
q = x₁) is needed, so the cost is O(K² d + K³), independent of d². ``check_max_margin`` verifies
any claimed solution independently: feasibility, and the KKT conditions via a second NNLS.
"""

from __future__ import annotations

import numpy as np
import torch
from scipy.optimize import nnls
from torch import Tensor

__all__ = [
    "alignment",
    "attention_margins",
    "attention_sparsity",
    "check_max_margin",
    "max_margin_attention",
    "max_margin_direction",
    "optimal_tokens",
]


# --------------------------------------------------------------------------- input checks
def _check_tokens(X: Tensor) -> None:
    if not isinstance(X, Tensor) or X.dim() != 3 or not X.is_floating_point():
        got = f"{X.dtype} tensor of shape {tuple(X.shape)}" if isinstance(X, Tensor) else type(X)
        raise ValueError(f"X must be a float tensor of shape (N, T, d); got {got}")
    if X.shape[1] < 2:
        raise ValueError(f"need T ≥ 2 tokens per sequence (a query and a token); got T = "
                         f"{X.shape[1]}")


def _check_opt(X: Tensor, opt: Tensor) -> Tensor:
    n, T = X.shape[:2]
    opt = torch.as_tensor(opt)
    if opt.shape != (n,) or opt.is_floating_point() or opt.is_complex():
        raise ValueError(f"opt must be an integer tensor of shape ({n},) (one optimal position per "
                         f"sequence; see optimal_tokens); got {opt.dtype} {tuple(opt.shape)}")
    if n and (int(opt.min()) < 0 or int(opt.max()) >= T):
        raise ValueError(f"opt positions must lie in 0..{T - 1}; got range "
                         f"{int(opt.min())}..{int(opt.max())}")
    return opt.long().to(X.device)


def _check_matrix(W: Tensor, d: int) -> None:
    if not isinstance(W, Tensor) or W.shape != (d, d):
        got = tuple(W.shape) if isinstance(W, Tensor) else type(W)
        raise ValueError(f"W must be a ({d}, {d}) tensor for tokens of size {d}; got {got}")


# --------------------------------------------------------------------------- public helpers
def optimal_tokens(X: Tensor, y: Tensor, v: Tensor) -> Tensor:
    """opt_i = argmax_t γ_it with γ_it = y_i vᵀ x_it, shape (N,) long (ties go to the first).

    ``y`` holds ±1 labels (convert {0, 1} targets with ``2 * t - 1``); ``v`` is the (d,) decoder.
    """
    _check_tokens(X)
    y = torch.as_tensor(y).to(X)
    if y.shape != X.shape[:1] or not torch.all((y == 1) | (y == -1)):
        raise ValueError(f"y must hold {X.shape[0]} labels in {{-1, +1}} (convert {{0, 1}} "
                         f"targets with 2 * t - 1); got shape {tuple(y.shape)}")
    if v.shape != X.shape[-1:]:
        raise ValueError(f"v must be a ({X.shape[-1]},) vector; got shape {tuple(v.shape)}")
    gamma = y.unsqueeze(1) * (X @ v.to(X))
    return gamma.argmax(dim=1)


def attention_margins(X: Tensor, opt: Tensor, W: Tensor) -> Tensor:
    """Margins m_it = (x_{i,opt_i} − x_it)ᵀ W x_i1, shape (N, T), with +inf at t = opt_i (no
    constraint there), so ``.min()`` is the smallest constrained margin."""
    _check_tokens(X)
    opt = _check_opt(X, opt)
    _check_matrix(W, X.shape[-1])
    rows = torch.arange(X.shape[0], device=X.device)
    scores = X @ (W.to(X) @ X[:, 0].unsqueeze(-1))  # (N, T, 1): x_tᵀ W x₁
    scores = scores.squeeze(-1)
    margins = scores[rows, opt].unsqueeze(1) - scores
    margins[rows, opt] = float("inf")
    return margins


def alignment(W: Tensor, W_mm: Tensor) -> float:
    """⟨W, W_mm⟩_F / (‖W‖_F ‖W_mm‖_F) ∈ [−1, 1]: cosine of the angle between W and W_mm.

    Works for any two tensors of the same shape (e.g. v and its max-margin direction). A zero
    tensor has no direction; we return 0 for it (rather than NaN) so logs stay valid JSON.
    """
    if W.shape != W_mm.shape:
        raise ValueError(f"alignment needs tensors of one shape; got {tuple(W.shape)} and "
                         f"{tuple(W_mm.shape)}")
    a, b = W.detach().double().flatten(), W_mm.detach().to(W.device).double().flatten()
    denom = a.norm() * b.norm()
    return float(a @ b / denom) if denom > 0 else 0.0


def attention_sparsity(weights: Tensor, opt: Tensor) -> float:
    """Mean softmax weight on the optimal token, (1/N) Σ_i a_{i,opt_i} ∈ [0, 1]; tends to 1 as
    attention concentrates on opt. ``weights``: (N, T) attention rows (e.g.
    ``AttentionModel.attention_weights(X)``)."""
    if weights.dim() != 2:
        raise ValueError(f"weights must be (N, T) attention rows; got shape {tuple(weights.shape)}")
    opt = _check_opt(weights.unsqueeze(-1), opt)
    rows = torch.arange(weights.shape[0], device=weights.device)
    return float(weights.detach()[rows, opt].double().mean())


# --------------------------------------------------------------------------- the QP
def _constraints(X: Tensor, opt: Tensor) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Row k of A is x_{i,opt} − x_it, row k of Q is x_i1 (so z_k = a_k q_kᵀ), in float64,
    with the (i, t) of each constraint; sample-major order, t ≠ opt_i."""
    x = X.detach().to("cpu", torch.float64).numpy()
    n, T, _ = x.shape
    o = opt.cpu().numpy()
    i, t = np.nonzero(np.arange(T)[None, :] != o[:, None])
    A = x[i, o[i]] - x[i, t]
    Q = x[i, 0]
    return A, Q, np.stack([i, t], axis=1)


def _raise_degenerate(A: np.ndarray, Q: np.ndarray, where: np.ndarray) -> None:
    """z_k = 0 makes ⟨W, z_k⟩ ≥ 1 impossible: say which sample and why."""
    zero = (np.linalg.norm(A, axis=1) * np.linalg.norm(Q, axis=1)) == 0
    if zero.any():
        i, t = where[np.argmax(zero)]
        why = ("its query x_1 is zero" if not Q[np.argmax(zero)].any()
               else f"token {t} equals the optimal token")
        raise ValueError(
            f"max-margin problem infeasible: in sample {i}, {why}, so the constraint "
            f"(x_opt − x_{t})ᵀ W x_1 ≥ 1 reads 0 ≥ 1. Remove duplicate tokens (or that sample), "
            "or pick a different optimal token"
        )


def _solve_dual(A: np.ndarray, Q: np.ndarray) -> np.ndarray:
    """Dual variables α ≥ 0 of min ‖w‖ s.t. ⟨w, z_k⟩ ≥ 1, via Lawson & Hanson's LDP → NNLS.

    Let R (K × r) have rows r_k with R Rᵀ = G = Gram(z) (an isometric copy of the z_k). Solve
    NNLS min_{u ≥ 0} ‖E u − e‖ with E = [Rᵀ; 1ᵀ], e = (0, …, 0, 1). The residual ρ = E u − e has
    last entry 1ᵀu − 1 < 0 when the problem is feasible, and then α = u / (1 − 1ᵀu); ρ = 0 means
    no feasible W exists.
    """
    G = (A @ A.T) * (Q @ Q.T)
    lam, U = np.linalg.eigh(G)
    keep = lam > lam.max() * 1e-13 * len(lam)  # drop the numerically null directions of G
    R = U[:, keep] * np.sqrt(lam[keep])
    E = np.vstack([R.T, np.ones((1, len(G)))])
    e = np.zeros(len(E))
    e[-1] = 1.0
    u, _ = nnls(E, e, maxiter=50 * E.shape[1])
    slack = 1.0 - u.sum()
    if slack <= 1e-12:
        raise ValueError(
            "max-margin problem infeasible: no W satisfies every (x_opt − x_t)ᵀ W x_1 ≥ 1 "
            "(the constraints contradict each other, e.g. two samples with the same query but "
            "opposite preferences). Check the optimal tokens, or use fewer samples / more "
            "dimensions"
        )
    return u / slack


def max_margin_attention(X: Tensor, opt: Tensor, *, tol: float = 1e-6) -> Tensor:
    """W_mm = argmin ‖W‖_F s.t. (x_{i,opt_i} − x_it)ᵀ W x_i1 ≥ 1 ∀ i, t ≠ opt_i (module docstring).

    Args:
        X: (N, T, d) float tokens; position 0 of each sequence is the query x_1.
        opt: (N,) integer optimal positions (``optimal_tokens(X, y, v)``).
        tol: feasibility / KKT tolerance of the final ``check_max_margin``.

    Returns:
        W_mm as a (d, d) tensor with X's dtype and device. Raises ``ValueError`` when no W is
        feasible (e.g. a token equal to the optimal one).

    Example::

        opt = optimal_tokens(X, y, v)
        W_mm = max_margin_attention(X, opt)
        alignment(model.W, W_mm)
    """
    _check_tokens(X)
    opt = _check_opt(X, opt)
    A, Q, where = _constraints(X, opt)
    _raise_degenerate(A, Q, where)
    # solved at unit scale (the solver's thresholds are absolute): with a = A/sa, q = Q/sq the
    # solution of ⟨W', a qᵀ⟩ ≥ 1 is W' = sa·sq·W
    sa, sq = float(np.abs(A).max()), float(np.abs(Q).max())
    A, Q = A / sa, Q / sq
    alpha = _solve_dual(A, Q)
    W = torch.from_numpy((A * alpha[:, None]).T @ Q / (sa * sq))  # Σ_k α_k a_k q_kᵀ, float64
    # Checked before the cast to X's dtype, so float32 rounding cannot fail a correct solution.
    check_max_margin(X.detach().to("cpu", torch.float64), opt.cpu(), W, tol=tol)
    return W.to(device=X.device, dtype=X.dtype)


def max_margin_direction(Z: Tensor) -> Tensor:
    """v_mm = argmin ‖v‖ s.t. z_iᵀ v ≥ 1 for every row z_i of Z (a bias-free hard-margin SVM).

    With joint training, attention concentrates on the optimal tokens, so Φ → vᵀx_{i,opt} and
    the decoder follows the max-margin separator of the points y_i x_{i,opt}. Solved exactly as a
    least-distance program (Lawson & Hanson, ch. 23): u = NNLS(E, e) with E = [Zᵀ; 1ᵀ],
    e = (0, …, 0, 1); the residual r = E u − e gives v = −r[:d] / r[d] (r[d] < 0 iff feasible).
    Returns a float64 tensor of shape (d,).
    """
    Zn = Z.detach().cpu().double().numpy()
    scale = float(np.abs(Zn).max()) if Zn.size else 0.0
    scale = scale if scale > 0 else 1.0
    Zn = Zn / scale  # at unit scale (absolute thresholds); v = v' / scale
    E = np.vstack([Zn.T, np.ones((1, len(Zn)))])
    e = np.zeros(len(E))
    e[-1] = 1.0
    u, _ = nnls(E, e, maxiter=50 * E.shape[1])
    r = E @ u - e
    if r[-1] > -1e-12:
        raise ValueError("no decoder v separates the optimal tokens (z_iᵀ v ≥ 1 is infeasible); "
                         "use fewer samples or more dimensions")
    return torch.from_numpy(-r[:-1] / r[-1] / scale)


def check_max_margin(X: Tensor, opt: Tensor, W: Tensor, *, tol: float = 1e-6) -> float:
    """Verify that W solves the max-margin QP; return its minimum margin (≈ 1 when it does).

    Checks, with tolerance ``tol``: (1) feasibility, every margin ≥ 1 − tol; (2) KKT — W is a
    non-negative combination Σ α_k z_k of the *active* constraints (margin ≤ 1 + tol) alone, found
    by NNLS, with relative residual ≤ tol·√(#active) (this is stationarity + dual feasibility +
    complementary slackness; for a convex QP they prove optimality). Raises ``ValueError`` naming
    the failed condition.
    """
    _check_tokens(X)
    opt = _check_opt(X, opt)
    _check_matrix(W, X.shape[-1])
    Wd = W.detach().to("cpu", torch.float64)
    margins = attention_margins(X.detach().to("cpu", torch.float64), opt.cpu(), Wd)
    smallest = float(margins.min())
    if smallest < 1 - tol:
        i, t = divmod(int(margins.argmin()), X.shape[1])
        raise ValueError(f"W is infeasible: margin {smallest:.6g} < 1 at sample {i}, token {t}")
    A, Q, _ = _constraints(X, opt)
    m = margins.numpy()[np.arange(X.shape[1])[None, :] != opt.cpu().numpy()[:, None]]
    active = m <= 1 + tol
    if not active.any():
        raise ValueError(f"W is not minimal: no constraint is active (smallest margin "
                         f"{smallest:.6g} > 1), so W / {smallest:.6g} is feasible and shorter")
    Z = np.einsum("ka,kb->abk", A[active], Q[active]).reshape(-1, int(active.sum()))
    w = Wd.numpy().reshape(-1)
    _, residual = nnls(Z, w, maxiter=50 * Z.shape[1])
    if residual > tol * np.sqrt(active.sum()) * max(1.0, np.linalg.norm(w)):
        raise ValueError(
            f"W is feasible but not the minimum-norm solution: it is not a non-negative "
            f"combination of its {int(active.sum())} active constraints (KKT residual "
            f"{residual:.3g}, relative {residual / np.linalg.norm(w):.3g})"
        )
    return smallest
