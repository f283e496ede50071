"""Polyak step sizes: stochastic SPS_max and the deterministic Polyak step
(docs/definitions.md#polyak-step).

SPS_max (Loizou et al.; used by Vasudeva et al.) on the minibatch loss L_B:

    η_t = min{ (L_B(W_t) − f*) / (c ‖∇L_B(W_t)‖²),  η_max },      W_{t+1} = W_t − η_t ∇L_B(W_t),

with c = 0.5, f* = 0 in the paper. ``Polyak`` is the full-batch version with c = 1, no cap and
f* = L* = 0 (the infimum of the logistic loss on separable data):

    η_t = (L(W_t) − L*) / ‖∇L(W_t)‖².

‖∇L‖ is the global norm over every parameter of the optimiser, as in ``NGD``. Two edge cases are
ours: a loss below f* would make η_t negative (an ascent step), so η_t is clamped at 0; and a zero
gradient, or a quotient that overflows (loss and gradient both underflowed towards the float
type's smallest numbers: the step is no longer defined), gives no step.

The step size needs the loss, so both are closure-based like ``torch.optim.LBFGS``::

    def closure():
        opt.zero_grad()
        loss = loss_fn(model(x), y)
        loss.backward()
        return loss

    opt = SPS(model.parameters(), c=0.5, eta_max=0.01)
    loss = opt.step(closure)

The state of every updated parameter records ``step``, ``step_size`` (η_t) and ``grad_norm``;
``last_step_size`` reads η_t back for logging.
"""

from __future__ import annotations

from collections.abc import Callable
from numbers import Real

import torch
from torch import Tensor
from torch.optim import Optimizer

from .normalized import Params, _check_positive, _params_with_grad, _record, _StepSizeLog
from .normalized import global_grad_norm as _global_grad_norm


class SPS(_StepSizeLog, Optimizer):
    """Stochastic Polyak step with cap: η_t = min{(L_B − f*)/(c‖∇L_B‖²), η_max} (module docstring).

    Args:
        params: parameters or param-group dicts; each group may override ``c``, ``f_star`` and
            ``eta_max`` (the loss and the gradient norm are shared by all groups).
        c: the constant c > 0 (0.5 in the paper's SPS_max).
        f_star: f*, a lower bound on the loss (0 for cross-entropy / logistic losses).
        eta_max: the cap η_max > 0, or None for no cap.

    ``step(closure)`` requires a closure that zeroes the gradients, computes the loss, calls
    ``backward()`` and returns the loss; ``step`` returns that loss.
    """

    def __init__(
        self,
        params: Params,
        c: float = 0.5,
        f_star: float = 0.0,
        eta_max: float | None = None,
    ) -> None:
        _check_positive("c", c)
        _check_positive("eta_max", eta_max, optional=True)
        if not isinstance(f_star, Real):
            raise TypeError(f"f_star must be a number (a lower bound on the loss), got {f_star!r}")
        super().__init__(params, {"c": c, "f_star": float(f_star), "eta_max": eta_max})

    @torch.no_grad()
    def step(self, closure: Callable[[], Tensor] | None = None) -> Tensor:  # type: ignore[override]
        if closure is None:
            raise RuntimeError(
                f"{type(self).__name__} needs the loss to set its step size: call "
                "optimizer.step(closure) with a closure that zeroes the gradients, computes the "
                "loss, calls loss.backward() and returns the loss (as for torch.optim.LBFGS)"
            )
        with torch.enable_grad():
            loss = closure()
        value = torch.as_tensor(loss).detach()
        if value.numel() != 1 or not value.is_floating_point():
            raise ValueError(
                "the closure must return the scalar float loss it called backward() on; got "
                f"{type(loss).__name__} of shape {tuple(value.shape)}, dtype {value.dtype}"
            )
        groups = [(g, _params_with_grad(g)) for g in self.param_groups]
        norm = _global_grad_norm(p for _, ps in groups for p in ps)
        if norm is None:  # nothing has a gradient: nothing to do
            return loss
        value = value.reshape(()).to(device=norm.device, dtype=norm.dtype)
        safe = torch.where(norm > 0, norm, torch.ones_like(norm))
        for group, params in groups:
            # (L − f*)/(c‖g‖²) as ((L − f*)/‖g‖)/(c‖g‖): ‖g‖² of a tiny gradient underflows to 0
            size = ((value - group["f_star"]) / safe / (group["c"] * safe)).clamp(min=0)
            if group["eta_max"] is not None:
                size = size.clamp(max=group["eta_max"])
            # 0/0 or x/0 for a zero gradient: no step instead of NaN/inf; likewise where the
            # quotient overflows (a loss and a gradient that have both underflowed towards
            # float's smallest numbers: converged as far as the float type resolves)
            size = torch.where((norm > 0) & torch.isfinite(size), size, torch.zeros_like(size))
            for p in params:
                s = size.to(p.device)
                p.sub_((p.grad.to(s.dtype) * s).to(p.dtype))
                _record(self.state[p], s, norm.to(p.device))
        return loss


class Polyak(SPS):
    """Deterministic Polyak step η_t = (L(W_t) − L*)/‖∇L(W_t)‖²: ``SPS`` with c = 1, no cap.

    Meant for full-batch losses; L* = ``f_star`` (0 by default, the infimum of the logistic loss).
    """

    def __init__(self, params: Params, f_star: float = 0.0) -> None:
        super().__init__(params, c=1.0, f_star=f_star, eta_max=None)
