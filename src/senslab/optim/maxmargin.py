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
any claimed solution independently: feasibility, and the KKT conditions via a second NNLS, with
a residual relative to ‖W‖. Every solution returned has passed it; one that does not (constraints
of very different lengths, from sequences of very different token scales, whose small Gram
eigenvalues fall under the cutoff) is solved again with every constraint rescaled to unit
length, and failing that the call says so. ``max_margin_direction`` is verified the same way.
"""

from __future__ import annotations

import math

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
    if X.shape[0] < 1:
        raise ValueError("X holds no sequence (N = 0): the max-margin problem needs at least one")
    if not bool(torch.isfinite(X).all()):
        raise ValueError("X holds nan or inf tokens: their scores, optimal tokens and margins are "
                         "not defined; remove those sequences")


def _check_opt(X: Tensor, opt: Tensor) -> Tensor:
    n, T = X.shape[:2]
    opt = torch.as_tensor(opt)
    if (opt.shape != (n,) or opt.is_floating_point() or opt.is_complex()
            or opt.dtype == torch.bool):
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


def _check_tol(tol: float) -> None:
    if isinstance(tol, bool) or not 0 < tol < 1:
        raise ValueError(f"tol must lie in (0, 1) (the allowed shortfall of a margin below 1 and "
                         f"relative KKT residual; 1e-6 by default), got {tol!r}")


def _score_dtype(X: Tensor, other: Tensor) -> torch.dtype:
    """The type scores and margins are computed in: the wider of X's and ``other``'s float
    types, and at least float32 (bfloat16 / float16 scores round distinct values together)."""
    dtype = torch.promote_types(X.dtype, torch.float32)
    return torch.promote_types(dtype, other.dtype) if other.is_floating_point() else dtype


# --------------------------------------------------------------------------- public helpers
def optimal_tokens(X: Tensor, y: Tensor, v: Tensor) -> Tensor:
    """opt_i = argmax_t γ_it with γ_it = y_i vᵀ x_it, shape (N,) long.

    ``y`` holds ±1 labels (convert {0, 1} targets with ``2 * t - 1``); ``v`` is the (d,) decoder.
    Raises ``ValueError`` when a score is nan or infinite (a nan was taken as the maximum, so a
    nan v returned position 0 for every sequence) or when two tokens of a sequence tie for the
    top score: the theory assumes a unique optimal token, and W_mm built on the first of a tie
    is not the direction GD takes (the softmax keeps both), so the alignment with it would be
    misread. (Ties first went to the first position, without a word.) The scores are computed
    in at least float32 (and in v's precision where it is wider): in bfloat16, scores that
    differ rounded to one value, and 23 of 2,000 random sequences were refused as ties they
    are not.
    """
    _check_tokens(X)
    dtype = _score_dtype(X, v)
    y = torch.as_tensor(y).to(device=X.device, dtype=dtype)
    if y.shape != X.shape[:1] or not torch.all((y == 1) | (y == -1)):
        raise ValueError(f"y must hold {X.shape[0]} labels in {{-1, +1}} (convert {{0, 1}} "
                         f"targets with 2 * t - 1); got shape {tuple(y.shape)}")
    if v.shape != X.shape[-1:]:
        raise ValueError(f"v must be a ({X.shape[-1]},) vector; got shape {tuple(v.shape)}")
    gamma = y.unsqueeze(1) * (X.to(dtype) @ v.to(device=X.device, dtype=dtype))
    finite = torch.isfinite(gamma)
    if not bool(finite.all()):
        i = int((~finite).any(dim=1).nonzero()[0])
        raise ValueError(f"token scores γ_it = y_i vᵀ x_it of sample {i} are nan or infinite "
                         f"(v holds nan or inf entries, or vᵀx overflows {dtype}): no optimal "
                         "token is defined; pass a finite v (or X in float64)")
    top = gamma == gamma.max(dim=1, keepdim=True).values
    tied = top.sum(dim=1) > 1
    if bool(tied.any()):
        i = int(tied.nonzero()[0])
        positions = top[i].nonzero().flatten().tolist()
        raise ValueError(f"sample {i} has no unique optimal token: positions {positions} tie "
                         f"for the top score γ = {float(gamma[i].max()):.6g} "
                         f"({int(tied.sum())} sample(s) tie); W_mm assumes one optimal token "
                         "per sequence. Perturb the tokens or v, remove those samples, or pass "
                         "the positions you mean to max_margin_attention yourself")
    return gamma.argmax(dim=1)


def attention_margins(X: Tensor, opt: Tensor, W: Tensor) -> Tensor:
    """Margins m_it = (x_{i,opt_i} − x_it)ᵀ W x_i1, shape (N, T), with +inf at t = opt_i (no
    constraint there), so ``.min()`` is the smallest constrained margin.

    Computed, and returned, in the wider of X's and W's float types and at least float32: a
    margin is a difference of two scores, and in bfloat16 (X's type, as before) margins near 1
    came out up to 0.025 off those of the very same tensors, and in float16 a W with entries
    above 65504 gave inf."""
    _check_tokens(X)
    opt = _check_opt(X, opt)
    _check_matrix(W, X.shape[-1])
    dtype = _score_dtype(X, W)
    X = X.to(dtype)
    rows = torch.arange(X.shape[0], device=X.device)
    scores = X @ (W.to(X) @ X[:, 0].unsqueeze(-1))  # (N, T, 1): x_tᵀ W x₁
    scores = scores.squeeze(-1)
    margins = scores[rows, opt].unsqueeze(1) - scores
    margins[rows, opt] = float("inf")
    return margins


def alignment(W: Tensor, W_mm: Tensor) -> float:
    """⟨W, W_mm⟩_F / (‖W‖_F ‖W_mm‖_F) ∈ [−1, 1]: cosine of the angle between W and W_mm.

    Works for any two tensors of the same shape (e.g. v and its max-margin direction). A zero
    tensor has no direction; we return 0 for it (rather than NaN) so logs stay valid JSON. A
    tensor with a NaN or infinite entry has none either: NaN (it read 0 for NaN). Each tensor
    is scaled by its largest entry first, so tiny and huge ones (1e-170, 1e160) keep their
    direction instead of underflowing to 0.
    """
    if W.shape != W_mm.shape:
        raise ValueError(f"alignment needs tensors of one shape; got {tuple(W.shape)} and "
                         f"{tuple(W_mm.shape)}")
    a, b = W.detach().double().flatten(), W_mm.detach().to(W.device).double().flatten()
    if not a.numel():
        return 0.0
    if not (bool(a.isfinite().all()) and bool(b.isfinite().all())):
        return math.nan
    a, b = a / a.abs().max().clamp(min=1e-300), b / b.abs().max().clamp(min=1e-300)
    denom = a.norm() * b.norm()
    return float(a @ b / denom) if denom > 0 else 0.0


def attention_sparsity(weights: Tensor, opt: Tensor) -> float:
    """Mean softmax weight on the optimal token, (1/N) Σ_i a_{i,opt_i} ∈ [0, 1]; tends to 1 as
    attention concentrates on opt. ``weights``: (N, T) attention rows (e.g.
    ``AttentionModel.attention_weights(X)``). Raises ``ValueError`` for rows that are not
    attention weights (an entry outside [0, 1], nan, or a row not summing to 1: scores or logits
    passed by mistake gave a "mass" of 2.5) and for no rows at all (the mean of none read nan).
    """
    if weights.dim() != 2:
        raise ValueError(f"weights must be (N, T) attention rows; got shape {tuple(weights.shape)}")
    if not len(weights):
        raise ValueError("weights hold no attention row (N = 0): the mean weight on the optimal "
                         "token of no sequence is not defined")
    w = weights.detach().double()
    # a row of T rounded weights sums to 1 within about T·eps of their dtype (float16: 1e-3)
    eps = torch.finfo(weights.dtype).eps if weights.is_floating_point() else 0.0
    slack = max(1e-6, weights.shape[1] * eps)
    row_sum = w.sum(dim=1)
    if not (bool(((w >= 0) & (w <= 1)).all()) and bool(((row_sum - 1).abs() <= slack).all())):
        i = int((((w < 0) | (w > 1) | w.isnan()).any(dim=1)
                 | ~((row_sum - 1).abs() <= slack)).nonzero()[0])
        raise ValueError(f"weights row {i} is not a softmax row (entries in [0, 1] summing to 1; "
                         f"it sums to {float(row_sum[i]):.6g}, entries {float(w[i].min()):.3g}"
                         f"..{float(w[i].max()):.3g}): pass the attention weights "
                         "(model.attention_weights(X)), not its scores or logits")
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
    zero_q = ~Q.any(axis=1)
    zero = zero_q | ~A.any(axis=1)
    if zero.any():
        k = int(np.argmax(zero))
        i, t = where[k]
        why = "its query x_1 is zero" if zero_q[k] else f"token {t} equals the optimal token"
        raise ValueError(
            f"max-margin problem infeasible: in sample {i}, {why}, so the constraint "
            f"(x_opt − x_{t})ᵀ W x_1 ≥ 1 reads 0 ≥ 1. Remove duplicate tokens (or that sample), "
            "or pick a different optimal token"
        )


def _solve_dual(A: np.ndarray, Q: np.ndarray, h: np.ndarray | None = None) -> np.ndarray:
    """Dual variables α ≥ 0 of min ‖w‖ s.t. ⟨w, z_k⟩ ≥ h_k (h_k = 1 when ``h`` is None), via
    Lawson & Hanson's LDP → NNLS; W = Σ α_k z_k.

    Let R (K × r) have rows r_k with R Rᵀ = G = Gram(z) (an isometric copy of the z_k). Solve
    NNLS min_{u ≥ 0} ‖E u − e‖ with E = [Rᵀ; hᵀ], e = (0, …, 0, 1). The residual ρ = E u − e has
    last entry hᵀu − 1 < 0 when the problem is feasible, and then α = u / (1 − hᵀu); ρ = 0 means
    no feasible W exists.
    """
    G = (A @ A.T) * (Q @ Q.T)
    lam, U = np.linalg.eigh(G)
    keep = lam > lam.max() * 1e-13 * len(lam)  # drop the numerically null directions of G
    R = U[:, keep] * np.sqrt(lam[keep])
    E = np.vstack([R.T, np.ones((1, len(G))) if h is None else h[None, :]])
    e = np.zeros(len(E))
    e[-1] = 1.0
    u, _ = nnls(E, e, maxiter=50 * E.shape[1])
    slack = 1.0 - (u.sum() if h is None else h @ u)
    if slack <= 1e-12:
        raise ValueError(
            "max-margin problem infeasible: no W satisfies every (x_opt − x_t)ᵀ W x_1 ≥ 1, or "
            "only one of norm ≥ 1e6 at unit token scale (the constraints contradict each other, "
            "or nearly: e.g. two samples with the same query but opposite preferences). Check "
            "the optimal tokens, or use fewer samples / more dimensions"
        )
    return u / slack


def _solve_rescaled(A: np.ndarray, Q: np.ndarray) -> np.ndarray:
    """W_mm (d × d) from the same program with every constraint divided by ‖z_k‖: unit
    features ẑ_k and right-hand sides h_k = 1/‖z_k‖. Constraints of very different lengths
    (sequences of very different token scales) make G's small eigenvalues, which carry the short
    ones, fall under the cutoff; unit features keep them."""
    na, nq = np.linalg.norm(A, axis=1), np.linalg.norm(Q, axis=1)
    A, Q = A / na[:, None], Q / nq[:, None]
    h = 1.0 / (na * nq)
    top = h.max()  # solved with h/top ≤ 1 (absolute thresholds), W = top · W'
    alpha = _solve_dual(A, Q, h / top)
    return (A * alpha[:, None]).T @ Q * top


def max_margin_attention(X: Tensor, opt: Tensor, *, tol: float = 1e-6) -> Tensor:
    """W_mm = argmin ‖W‖_F s.t. (x_{i,opt_i} − x_it)ᵀ W x_i1 ≥ 1 ∀ i, t ≠ opt_i (module docstring).

    Args:
        X: (N, T, d) finite float tokens; position 0 of each sequence is the query x_1.
        opt: (N,) integer optimal positions (``optimal_tokens(X, y, v)``).
        tol: feasibility / KKT tolerance of the final ``check_max_margin``, in (0, 1).

    Returns:
        W_mm as a (d, d) tensor with X's dtype and device, verified by ``check_max_margin``.
        Raises ``ValueError`` when no W is feasible (e.g. a token equal to the optimal one), or
        when no solution passing the check was found (then it says so), or when W_mm does not
        fit X's dtype (a float16 / bfloat16 cast that overflows or loses its precision).

    Example::

        opt = optimal_tokens(X, y, v)
        W_mm = max_margin_attention(X, opt)
        alignment(model.W, W_mm)
    """
    _check_tokens(X)
    opt = _check_opt(X, opt)
    _check_tol(tol)
    A, Q, where = _constraints(X, opt)
    _raise_degenerate(A, Q, where)
    X64, opt64 = X.detach().to("cpu", torch.float64), opt.cpu()
    # solved at unit scale (the solver's thresholds are absolute): with a = A/sa, q = Q/sq the
    # solution of ⟨W', a qᵀ⟩ ≥ 1 is W' = sa·sq·W
    sa, sq = float(np.abs(A).max()), float(np.abs(Q).max())
    A, Q = A / sa, Q / sq
    try:
        alpha = _solve_dual(A, Q)
        W = torch.from_numpy((A * alpha[:, None]).T @ Q / (sa * sq))  # Σ_k α_k a_k q_kᵀ, float64
        # Checked before the cast to X's dtype, so float32 rounding cannot fail a correct solution.
        check_max_margin(X64, opt64, W, tol=tol)
    except ValueError:
        # A wrong "infeasible" or a solution failing the check: constraints of very different
        # lengths. Solved again with unit constraints; "infeasible" from this solve stands.
        W = torch.from_numpy(_solve_rescaled(A, Q) / (sa * sq))
        try:
            check_max_margin(X64, opt64, W, tol=tol)
        except ValueError as err:
            # the advice named unequal token scales only; a nearly infeasible problem (‖W_mm‖
            # ≳ 1e5 at unit scale, two near-contradictory samples) fails here too
            unit_norm = float(W.norm()) * sa * sq
            raise ValueError(
                f"max_margin_attention found no solution passing its own check at tol={tol} "
                f"({err}); the problem is too ill-conditioned for float64: the candidate has "
                f"‖W‖ = {unit_norm:.3g} at unit token scale (≳ 1e5: the constraints nearly "
                "contradict each other, e.g. two samples with almost the same query and tokens "
                "but opposite optimal tokens), or the tokens' scales differ too much across "
                "sequences. Check the optimal tokens, rescale the sequences to similar norms, "
                "or pass a larger tol"
            ) from err
    out = W.to(device=X.device, dtype=X.dtype)
    # W_mm scales as 1/‖x‖², so at small or large token scales a float16/bfloat16 cast
    # overflowed to inf or fell to subnormal (2.5% off) without a word, after the float64 check
    lost = float((out.detach().to("cpu", torch.float64) - W).norm() / W.norm())
    if not math.isfinite(lost) or lost > 4 * torch.finfo(X.dtype).eps:
        raise ValueError(
            f"W_mm does not fit X's dtype {X.dtype}: its entries reach "
            f"{float(W.abs().max()):.3g} (W_mm scales as 1/‖x‖²), and cast to {X.dtype} it is "
            f"{'not finite' if not math.isfinite(lost) else f'{lost:.2g} off (relative)'}; "
            "pass X in float32 or float64 (X.double())")
    return out


def _ldp(F: np.ndarray, h: np.ndarray) -> np.ndarray | None:
    """min ‖w‖ s.t. F w ≥ h (Lawson & Hanson, ch. 23): u = NNLS(E, e) with E = [Fᵀ; hᵀ],
    e = (0, …, 0, 1); the residual r = E u − e gives w = −r[:d] / r[d] (r[d] < 0 iff feasible).
    ``None`` when infeasible."""
    E = np.vstack([F.T, h[None, :]])
    e = np.zeros(len(E))
    e[-1] = 1.0
    u, _ = nnls(E, e, maxiter=50 * E.shape[1])
    r = E @ u - e
    return None if r[-1] > -1e-12 else -r[:-1] / r[-1]


def _cone_residual(F: np.ndarray, w: np.ndarray) -> float:
    """min_{α ≥ 0} ‖w − Σ_k α_k f_k‖ / ‖w‖ over the rows f_k of F (NNLS on unit rows: rows of
    very different lengths do not spoil it; relative, so no scale of w passes by its size)."""
    Fn = F / np.linalg.norm(F, axis=1, keepdims=True)
    _, residual = nnls(Fn.T, w / np.linalg.norm(w), maxiter=50 * len(Fn))
    return float(residual)


def _verify(F: np.ndarray, w: np.ndarray, tol: float) -> str | None:
    """Why w is not argmin ‖w‖ s.t. F w ≥ 1 (None: it is, within ``tol``): feasibility, every
    margin ≥ 1 − tol, and KKT, w a non-negative combination of the active rows (margin ≤ 1 + tol)
    with relative residual ≤ tol·√(#active)."""
    m = F @ w
    if not np.isfinite(w).all():
        return "it holds nan or inf entries"
    if m.min() < 1 - tol:
        return f"infeasible, margin {m.min():.6g} < 1 at row {int(m.argmin())}"
    active = m <= 1 + tol
    if not active.any():
        return f"no constraint is active (smallest margin {m.min():.6g} > 1)"
    residual = _cone_residual(F[active], w)
    if residual > tol * np.sqrt(active.sum()):
        return (f"not a non-negative combination of its {int(active.sum())} active constraints "
                f"(relative KKT residual {residual:.3g})")
    return None


def max_margin_direction(Z: Tensor, *, tol: float = 1e-6) -> Tensor:
    """v_mm = argmin ‖v‖ s.t. z_iᵀ v ≥ 1 for every row z_i of Z (a bias-free hard-margin SVM).

    With joint training, attention concentrates on the optimal tokens, so Φ → vᵀx_{i,opt} and
    the decoder follows the max-margin separator of the points y_i x_{i,opt}. Solved exactly as a
    least-distance program (Lawson & Hanson, ch. 23): u = NNLS(E, e) with E = [Zᵀ; 1ᵀ],
    e = (0, …, 0, 1); the residual r = E u − e gives v = −r[:d] / r[d] (r[d] < 0 iff feasible).
    The result is verified like ``check_max_margin``'s (feasibility and KKT within ``tol``);
    should that fail (rows of very different lengths), it is solved again with unit rows.
    ``Z``: an (N, d) finite float tensor, N ≥ 1. Returns a float64 tensor of shape (d,); raises
    ``ValueError`` when no v is feasible.
    """
    if not isinstance(Z, Tensor) or Z.dim() != 2 or not Z.is_floating_point() or not len(Z):
        got = f"{Z.dtype} tensor of shape {tuple(Z.shape)}" if isinstance(Z, Tensor) else type(Z)
        raise ValueError(f"Z must be a float tensor of shape (N, d) with N ≥ 1 (one row "
                         f"y_i x_(i,opt) per sample); got {got}")
    _check_tol(tol)
    Zn = Z.detach().cpu().double().numpy()
    if not np.isfinite(Zn).all():
        raise ValueError("Z holds nan or inf entries; remove those rows")
    infeasible = ValueError("no decoder v separates the optimal tokens (z_iᵀ v ≥ 1 is "
                            "infeasible, or feasible only for ‖v‖ ≥ 1e6 at unit scale of Z); "
                            "use fewer samples or more dimensions")
    norms = np.linalg.norm(Zn, axis=1)
    if not norms.all():
        raise ValueError(f"no decoder v separates the optimal tokens: row {int(np.argmin(norms))} "
                         "of Z is zero, so z_iᵀ v ≥ 1 reads 0 ≥ 1; remove that sample")
    scale = float(np.abs(Zn).max())
    v = _ldp(Zn / scale, np.ones(len(Zn)))  # at unit scale (absolute thresholds); v = v' / scale
    if v is not None and _verify(Zn, v / scale, tol) is None:
        return torch.from_numpy(v / scale)
    # rows of very different lengths: unit rows, right-hand sides 1/‖z_i‖ (scaled to max 1)
    h = 1.0 / norms
    v = _ldp(Zn / norms[:, None], h / h.max())
    if v is None:
        raise infeasible
    v = v * h.max()
    why = _verify(Zn, v, tol)
    if why is not None:
        raise ValueError(f"max_margin_direction found no solution passing its check at tol={tol} "
                         f"({why}); the rows' norms differ too much for float64: rescale them to "
                         "similar norms, or pass a larger tol")
    return torch.from_numpy(v)


def _rounding_slack(W: Tensor, A: np.ndarray, Q: np.ndarray) -> tuple[np.ndarray, float]:
    """How far W's own rounding may move each margin a_kᵀ W q_k, and its relative Frobenius
    norm: one unit in the last place of W's type per entry (a subnormal's spacing where the
    entry is that small). Zero for float64 at this tolerance's scale, where W is W_mm only up to
    float64 rounding anyway; an integer W is exact."""
    if not W.is_floating_point() or W.dtype == torch.float64:
        return np.zeros(len(A)), 0.0
    info = torch.finfo(W.dtype)
    Wd = W.detach().to("cpu", torch.float64).abs().numpy()
    ulp = info.eps * Wd + info.eps * info.tiny  # the spacing of W's type at each entry
    slack = np.einsum("ka,ab,kb->k", np.abs(A), ulp, np.abs(Q))
    relative = float(np.linalg.norm(ulp) / max(np.linalg.norm(Wd), 1e-300))
    return slack, relative


def check_max_margin(X: Tensor, opt: Tensor, W: Tensor, *, tol: float = 1e-6) -> float:
    """Verify that W solves the max-margin QP; return its minimum margin (≈ 1 when it does).

    Checks, with tolerance ``tol`` in (0, 1): (1) feasibility, every margin ≥ 1 − tol; (2) KKT —
    W is a non-negative combination Σ α_k z_k of the *active* constraints (margin ≤ 1 + tol)
    alone, found by NNLS, with residual ≤ tol·√(#active)·‖W‖ (this is stationarity + dual
    feasibility + complementary slackness; for a convex QP they prove optimality). The residual
    is relative to ‖W‖ at every scale of the tokens (W_mm scales as 1/‖x‖²). A W in a type
    narrower than float64 (``max_margin_attention`` returns W_mm in X's type) is checked as
    W_mm rounded to that type: each margin may also fall short by what one unit in the last
    place of every entry of W moves it, and the residual by that unit relative to ‖W‖ (float32
    W_mm of tokens of mean 3 had margins 0.999999 and failed; every float16 / bfloat16 one
    did). Raises ``ValueError`` naming the failed condition.
    """
    _check_tokens(X)
    opt = _check_opt(X, opt)
    _check_matrix(W, X.shape[-1])
    _check_tol(tol)
    Wd = W.detach().to("cpu", torch.float64)
    if not bool(torch.isfinite(Wd).all()):
        raise ValueError("W holds nan or inf entries: it solves no max-margin problem")
    margins = attention_margins(X.detach().to("cpu", torch.float64), opt.cpu(), Wd)
    smallest = float(margins.min())
    A, Q, where = _constraints(X, opt)
    m = margins.numpy()[np.arange(X.shape[1])[None, :] != opt.cpu().numpy()[:, None]]
    slack, rounding = _rounding_slack(W, A, Q)
    short = 1 - tol - slack - m  # > 0: short of 1 beyond the tolerance and W's rounding
    if short.max() > 0:
        k = int(short.argmax())
        i, t = where[k]
        beyond = f" (beyond {W.dtype}'s rounding of W, {slack[k]:.2g})" if slack[k] else ""
        raise ValueError(f"W is infeasible: margin {m[k]:.6g} < 1 at sample {i}, token {t}"
                         f"{beyond}")
    active = m <= 1 + tol + slack
    if not active.any():
        raise ValueError(f"W is not minimal: no constraint is active (smallest margin "
                         f"{smallest:.6g} > 1), so W / {smallest:.6g} is feasible and shorter")
    Z = np.einsum("ka,kb->kab", A[active], Q[active]).reshape(int(active.sum()), -1)
    w = Wd.numpy().reshape(-1)
    # before: an absolute residual ≤ tol·√k·max(1, ‖W‖), which let any W of norm ≪ tol·√k
    # (tokens of norm ≳ 30) pass, whatever its direction
    relative = _cone_residual(Z, w)
    if relative > tol * np.sqrt(active.sum()) + rounding:
        raise ValueError(
            f"W is feasible but not the minimum-norm solution: it is not a non-negative "
            f"combination of its {int(active.sum())} active constraints (KKT residual "
            f"{relative * np.linalg.norm(w):.3g}, relative {relative:.3g})"
        )
    return smallest
