"""Inputs on which the optimisers and max-margin tools gave a wrong result without a word: param
groups with bad or ignored options, non-finite losses and gradients, a Python-float loss,
mixed and complex dtypes, a KKT check that passed any direction at large token scales, solvers
that failed or returned unverified answers on rows of different lengths, and malformed input."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from scipy.optimize import minimize
from torch import Tensor, nn

from senslab.optim import (
    NGD,
    SPS,
    Polyak,
    check_max_margin,
    max_margin_attention,
    max_margin_direction,
    optimal_tokens,
)


def _reference_min_norm(Z: np.ndarray) -> np.ndarray:
    """argmin ‖w‖ s.t. Z w ≥ 1 by SLSQP on the primal (a different algorithm from ours), each
    constraint divided by ‖z_k‖ so that rows of very different lengths do not stall it."""
    norms = np.linalg.norm(Z, axis=1)
    U, h = Z / norms[:, None], 1 / norms
    w0 = np.linalg.lstsq(U, 2 * h, rcond=None)[0]
    c = w0 @ w0  # objective of order 1: SLSQP's stopping rule is absolute
    res = minimize(lambda w: 0.5 * w @ w / c, w0, jac=lambda w: w / c, method="SLSQP",
                   constraints=[{"type": "ineq", "fun": lambda w: U @ w - h, "jac": lambda w: U}],
                   options={"ftol": 1e-13, "maxiter": 1000})
    assert res.success and (Z @ res.x).min() > 1 - 1e-8
    return res.x


def _features(X: Tensor, opt: Tensor) -> np.ndarray:
    """z_k = vec((x_opt − x_t) x₁ᵀ) by explicit loops."""
    return np.array([torch.outer(X[i, opt[i]] - X[i, t], X[i, 0]).flatten().numpy()
                     for i in range(X.shape[0]) for t in range(X.shape[1]) if t != int(opt[i])])


# --------------------------------------------------------------------------- param groups
def test_param_group_options_are_checked_like_the_constructors() -> None:
    """A group's own lr, eta_max, c and f* went unchecked (a negative lr stepped uphill, a
    negative c or a nan f* never stepped), and options the step ignores were accepted."""
    a = nn.Parameter(torch.zeros(2, dtype=torch.float64))
    b = nn.Parameter(torch.zeros(2, dtype=torch.float64))
    bad_ngd = [({"lr": -0.5}, "lr must be a positive number"),
               ({"eta_max": 0.0}, "eta_max must be a positive number"),
               ({"per_param": "yes"}, "per_param must be True or False"),
               ({"weight_decay": 0.1}, "no option 'weight_decay'"),
               ({"momentum": 0.9}, "no option 'momentum'")]
    for extra, message in bad_ngd:
        with pytest.raises(ValueError, match=message):
            NGD([{"params": [a]}, {"params": [b], **extra}], lr=0.1)
    bad_sps = [({"c": -1.0}, ValueError, "c must be a positive number"),
               ({"f_star": float("nan")}, ValueError, "f_star must be a finite"),
               ({"f_star": "0"}, TypeError, "f_star must be a number"),
               ({"lr": -0.1}, ValueError, "lr must be a positive number")]
    for extra, kind, message in bad_sps:
        with pytest.raises(kind, match=message):
            SPS([{"params": [a]}, {"params": [b], **extra}])
    with pytest.raises(ValueError, match="f_star must be a finite"):
        Polyak([a], f_star=float("-inf"))
    with pytest.raises(ValueError, match="lists a parameter twice"), \
            pytest.warns(UserWarning, match="duplicate parameters"):  # torch's own warning
        NGD([a, a], lr=0.1)  # stepped twice, counted twice in ‖∇L‖
    # a refused add_param_group leaves the optimiser as it was
    opt = NGD([a], lr=0.1)
    with pytest.raises(ValueError, match="lr must be a positive number"):
        opt.add_param_group({"params": [b], "lr": -1.0})
    assert len(opt.param_groups) == 1
    # what stays accepted: every option of the optimiser, per group
    NGD([{"params": [a], "lr": 0.3, "eta_max": 1.0, "per_param": True}, {"params": [b]}], lr=0.1)
    SPS([{"params": [a], "c": 1.0, "f_star": -1, "eta_max": None}, {"params": [b]}])


# --------------------------------------------------------------------------- non-finite values
def test_nan_or_inf_loss_or_gradient_is_refused() -> None:
    """NGD turned a nan gradient into a recorded ‖∇L‖ of 0 and nan parameters; SPS / Polyak
    took no step on a nan loss and carried on as if converged."""
    for bad in (float("nan"), float("inf")):
        p = nn.Parameter(torch.ones(3, dtype=torch.float64))
        p.grad = torch.tensor([1.0, bad, 0.0], dtype=torch.float64)
        with pytest.raises(FloatingPointError, match="nan or inf"):
            NGD([p], lr=0.1).step()
        assert p.detach().tolist() == [1.0, 1.0, 1.0]
        with pytest.raises(FloatingPointError, match="nan or inf"):
            NGD([p], lr=0.1, per_param=True).step()

        w = nn.Parameter(torch.ones(2, dtype=torch.float64))
        opt = SPS([w], eta_max=1.0)

        def nan_loss(opt: SPS = opt, w: nn.Parameter = w, bad: float = bad) -> Tensor:
            opt.zero_grad()
            w.grad = torch.ones(2, dtype=torch.float64)
            return torch.tensor(bad, dtype=torch.float64)

        with pytest.raises(FloatingPointError, match="the closure returned the loss"):
            opt.step(nan_loss)

        def bad_grad(opt: SPS = opt, w: nn.Parameter = w, bad: float = bad) -> Tensor:
            opt.zero_grad()
            w.grad = torch.tensor([bad, 1.0], dtype=torch.float64)
            return torch.tensor(1.0, dtype=torch.float64)

        with pytest.raises(FloatingPointError, match="nan or inf"):
            opt.step(bad_grad)
        assert w.detach().tolist() == [1.0, 1.0]


# --------------------------------------------------------------------------- precision
def test_polyak_reads_a_python_float_loss_in_float64() -> None:
    """A closure may return a Python float (torch.optim.LBFGS accepts one); it was rounded to
    float32, so L − f* = 1e-10 near the loss floor came out as 1.9e-9: a step 19× too long."""
    p = nn.Parameter(torch.zeros(1, dtype=torch.float64))
    f_star = math.log(2.0)
    opt = Polyak([p], f_star=f_star)

    def closure() -> float:
        p.grad = torch.tensor([1e-5], dtype=torch.float64)
        return f_star + 1e-10

    opt.step(closure)
    want = ((f_star + 1e-10) - f_star) / 1e-10  # η = (L − f*)/‖g‖², in float64
    assert opt.last_step_size == pytest.approx(want, rel=1e-12)


def test_float64_parameter_is_not_rounded_by_a_float32_neighbour() -> None:
    """The global norm was taken in the first parameter's type and the float64 gradient
    multiplied in float32: its step was off by 3e-8 relative, and the result depended on the
    order of the parameters."""
    results = []
    for order in ((0, 1), (1, 0)):
        a = nn.Parameter(torch.zeros(1, dtype=torch.float32))
        b = nn.Parameter(torch.zeros(1, dtype=torch.float64))
        a.grad = torch.tensor([1.0])
        b.grad = torch.tensor([1 / 3], dtype=torch.float64)
        pair = (a, b)
        NGD([pair[i] for i in order], lr=1.0).step()
        results.append(float(b.detach()))
    exact = -(1 / 3) / math.hypot(1.0, 1 / 3)
    assert results[0] == pytest.approx(exact, rel=1e-15, abs=0)
    assert results[0] == results[1]


def test_complex_parameters_keep_the_imaginary_part() -> None:
    """The update was cast to the real step size's type, which discarded the imaginary part
    of a complex gradient (with only a UserWarning): the parameter did not move at all."""
    c = nn.Parameter(torch.zeros(2, dtype=torch.complex128))
    c.grad = torch.tensor([3j, 4.0], dtype=torch.complex128)
    NGD([c], lr=1.0).step()  # W ← W − g/‖g‖ with ‖g‖ = 5
    torch.testing.assert_close(c.detach(), torch.tensor([-0.6j, -0.8], dtype=torch.complex128))

    w = nn.Parameter(torch.tensor([1 + 2j], dtype=torch.complex128))
    opt = Polyak([w])

    def closure() -> Tensor:  # L = |w|², ∇L = 2w: η = |w|²/(4|w|²) = ¼, w ← w/2
        opt.zero_grad()
        loss = (w.abs() ** 2).sum()
        loss.backward()
        return loss

    opt.step(closure)
    torch.testing.assert_close(w.detach(), torch.tensor([0.5 + 1j], dtype=torch.complex128))


# --------------------------------------------------------------------------- check_max_margin
def test_check_rejects_a_wrong_direction_at_any_token_scale() -> None:
    """The KKT residual was compared with tol·√k·max(1, ‖W‖): with tokens of norm ~1000, W_mm
    has norm 2e-7 and a W 45° away from it (same margins) passed the check."""
    g = torch.Generator().manual_seed(1)
    for scale in (1.0, 1e3):
        X = torch.randn(2, 3, 4, generator=g, dtype=torch.float64) * scale
        opt = torch.tensor([1, 2])
        W = max_margin_attention(X, opt)
        Z = torch.from_numpy(_features(X, opt))
        E = torch.randn(16, generator=g, dtype=torch.float64)
        E = E - Z.T @ torch.linalg.lstsq(Z.T, E).solution  # orthogonal to every z_k
        wrong = W + E.reshape(4, 4) / E.norm() * W.norm()
        assert check_max_margin(X, opt, W) == pytest.approx(1.0, abs=1e-8)
        with pytest.raises(ValueError, match="not the minimum-norm"):
            check_max_margin(X, opt, wrong)
    with pytest.raises(ValueError, match="tol must lie in"):
        check_max_margin(X, opt, 0.5 * W, tol=1.5)  # passed: margins ≥ 1 − 1.5
    with pytest.raises(ValueError, match="nan or inf"):
        check_max_margin(X, opt, torch.full_like(W, float("nan")))


# --------------------------------------------------------------------------- the solvers
def test_sequences_of_different_scales_are_solved_exactly() -> None:
    """Sequences whose tokens differ in scale by up to 100× give constraints of very different
    lengths; the short ones fell under the Gram cutoff and the solver raised its own check's
    'W is infeasible', or called a feasible problem infeasible."""
    g = torch.Generator().manual_seed(289)
    X = torch.randn(5, 3, 3, generator=g, dtype=torch.float64)
    X = X * 10.0 ** (2 * torch.rand(5, 1, 1, generator=g, dtype=torch.float64) - 1)
    opt = torch.randint(0, 3, (5,), generator=g)
    W = max_margin_attention(X, opt)
    assert check_max_margin(X, opt, W) == pytest.approx(1.0, abs=1e-8)
    want = _reference_min_norm(_features(X, opt))
    np.testing.assert_allclose(W.flatten().numpy(), want, rtol=1e-6, atol=1e-6 * np.abs(want).max())


def test_max_margin_direction_is_verified_and_refuses_malformed_input() -> None:
    """v_mm was returned unverified (rows of norms 0.01..100 gave a margin of 0.99995 < 1), an
    empty Z crashed the interpreter inside scipy's NNLS, and a 1-D Z was read as N rows of one
    dimension."""
    g = torch.Generator().manual_seed(336)
    Z = torch.randn(6, 3, generator=g, dtype=torch.float64)
    Z = Z * 10.0 ** (4 * torch.rand(6, 1, generator=g, dtype=torch.float64) - 2)
    v = max_margin_direction(Z)
    assert float((Z @ v).min()) >= 1 - 1e-9
    np.testing.assert_allclose(v.numpy(), _reference_min_norm(Z.numpy()), rtol=1e-6)
    for bad in (torch.zeros(0, 3), torch.ones(3), torch.ones(2, 3, dtype=torch.long)):
        with pytest.raises(ValueError, match="shape \\(N, d\\) with N ≥ 1"):
            max_margin_direction(bad)
    with pytest.raises(ValueError, match="row 1 of Z is zero"):
        max_margin_direction(torch.tensor([[1.0, 0.0], [0.0, 0.0]]))


def test_non_finite_or_empty_tokens_are_refused() -> None:
    """optimal_tokens picked a nan score as the optimum; max_margin_attention failed deep in
    LAPACK ('Eigenvalues did not converge') or in numpy (an empty X)."""
    X = torch.randn(3, 4, 5, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    X[1, 2, 0] = float("nan")
    y = torch.tensor([1.0, -1.0, 1.0], dtype=torch.float64)
    v = torch.ones(5, dtype=torch.float64)
    with pytest.raises(ValueError, match="nan or inf tokens"):
        optimal_tokens(X, y, v)
    with pytest.raises(ValueError, match="nan or inf tokens"):
        max_margin_attention(X, torch.tensor([1, 2, 3]))
    with pytest.raises(ValueError, match="N = 0"):
        max_margin_attention(X[:0], torch.zeros(0, dtype=torch.long))
    with pytest.raises(ValueError, match="integer tensor"):
        max_margin_attention(X[:1].nan_to_num(), torch.tensor([True]))  # not the position 1
