"""Polyak step sizes: stochastic SPS_max and the deterministic Polyak step
(docs/definitions.md#polyak-step).

SPS_max (Loizou et al.; used by Vasudeva et al.) on the minibatch loss L_B:

    η_t = min{ (L_B(W_t) − f*) / (c ‖∇L_B(W_t)‖²),  η_max },      W_{t+1} = W_t − η_t ∇L_B(W_t),

with c = 0.5, f* = 0 in the paper. ``Polyak`` is the full-batch version with c = 1, no cap and
f* = L* = 0 (the infimum of the logistic loss on separable data):

    η_t = (L(W_t) − L*) / ‖∇L(W_t)‖².

‖∇L‖ is the global norm over every parameter of the optimiser, as in ``NGD`` (parameters sharded
across ranks, FSDP's, are refused: the norm would be each rank's shard's; DeepSpeed ZeRO's
partitions carry no mark and cannot be told apart, so do not step them with SPS).

With several ranks (``torch.distributed`` initialised, e.g. DistributedDataParallel) the closure
must return the loss averaged over the ranks, detached (``dist.all_reduce`` of a detached copy):
the gradient is averaged, and a rank's own minibatch loss gives each rank its own η_t (the replicas
drift apart). A loss returned with its graph, or as a Python number, is said once per optimiser in a
``RuntimeWarning`` (no collective is run to check it: ranks that do not step together would hang).

``lr`` (default 1, today's step exactly) multiplies the whole step, cap included:
W_{t+1} = W_t − lr·η_t ∇L_B (the same as c/lr and lr·η_max). It is there for torch's LR
schedulers (StepLR, CosineAnnealingLR, LambdaLR, OneCycleLR with ``cycle_momentum=False``, …),
which scale it: without it every scheduler failed with a raw ``KeyError: 'lr'``. An lr of 0 (where
a schedule may end) is no step; a negative or non-finite one is refused. Two edge cases are
ours: a loss below f* would make η_t negative (an ascent step), so η_t is clamped at 0; and a zero
gradient, or a quotient that overflows (loss and gradient both underflowed towards the float
type's smallest numbers: the step is no longer defined), gives no step. A loss below f* (beyond
rounding) is said once per optimiser in a ``RuntimeWarning``: f* is then no lower bound, and the
parameters would stay where they are without a word. A nan or inf loss or gradient is refused
(``FloatingPointError``), as are a non-finite c or f* and options SPS does not have in a param
group (``weight_decay``, ``momentum``, …), at construction, in a checkpoint given to
``load_state_dict`` and (values) at every step. A loss returned as a Python float is read in
float64. A closure that returns no loss (``None``: no ``return loss``), or a loss with a graph
while no parameter of the optimiser has a gradient (it never called ``backward()``: every step
was a no-op), is refused.

The step size needs the loss, so both are closure-based like ``torch.optim.LBFGS``::

    def closure():
        opt.zero_grad()
        loss = loss_fn(model(x), y)
        loss.backward()
        return loss

    opt = SPS(model.parameters(), c=0.5, eta_max=0.01)
    loss = opt.step(closure)

The state of every updated parameter records ``step``, ``step_size`` (lr·η_t) and ``grad_norm``;
``last_step_size`` reads lr·η_t back for logging.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable
from numbers import Real
from typing import Any

import torch
from torch import Tensor
from torch.optim import Optimizer

from .normalized import (
    Params,
    _apply,
    _check_finite_norms,
    _check_group_keys,
    _check_positive,
    _params_with_grad,
    _record,
    _StepSizeLog,
)
from .normalized import global_grad_norm as _global_grad_norm


def _check_f_star(f_star: Any) -> None:
    if not isinstance(f_star, Real) or isinstance(f_star, bool):
        raise TypeError(f"f_star must be a number (a lower bound on the loss), got {f_star!r}")
    if not math.isfinite(f_star):
        raise ValueError(f"f_star must be a finite lower bound on the loss (0 for the logistic "
                         f"or cross-entropy loss), got {f_star!r}: with it no step is defined")


class SPS(_StepSizeLog, Optimizer):
    """Stochastic Polyak step with cap: η_t = min{(L_B − f*)/(c‖∇L_B‖²), η_max}, stepped as
    W ← W − lr·η_t ∇L_B (module docstring).

    Args:
        params: parameters or param-group dicts; each group may override ``c``, ``f_star``,
            ``eta_max`` and ``lr`` (the loss and the gradient norm are shared by all groups).
        c: the constant c > 0 (0.5 in the paper's SPS_max).
        f_star: f*, a lower bound on the loss (0 for cross-entropy / logistic losses).
        eta_max: the cap η_max > 0, or None for no cap.
        lr: a factor > 0 on the whole step, cap included (1: the paper's SPS_max). It is what
            torch's LR schedulers scale: a schedule's factor multiplies every step, in the
            Polyak and in the capped regime alike.

    ``step(closure)`` requires a closure that zeroes the gradients, computes the loss, calls
    ``backward()`` and returns the loss; ``step`` returns that loss.
    """

    def __init__(
        self,
        params: Params,
        c: float = 0.5,
        f_star: float = 0.0,
        eta_max: float | None = None,
        lr: float = 1.0,
    ) -> None:
        _check_positive("c", c, finite=True)
        _check_positive("eta_max", eta_max, optional=True)
        _check_positive("lr", lr, finite=True)
        _check_f_star(f_star)
        super().__init__(params, {"c": c, "f_star": float(f_star), "eta_max": eta_max, "lr": lr})

    def __setstate__(self, state: dict[str, Any]) -> None:
        # a checkpoint saved before SPS had ``lr`` steps as it did then: lr = 1
        super().__setstate__(state)
        for group in self.param_groups:
            group.setdefault("lr", 1.0)

    def add_param_group(self, param_group: dict[str, Any]) -> None:
        """``torch.optim.Optimizer.add_param_group``, with the group's own ``c``, ``f_star`` and
        ``eta_max`` and ``lr`` checked like the constructor's (a negative c or a nan f* gave no
        step at all) and options SPS does not have (``weight_decay``, ``momentum``, …) refused:
        they were ignored without a word."""
        super().add_param_group(param_group)
        group = self.param_groups[-1]
        try:
            _check_positive("lr", group["lr"], finite=True)
            _check_group_keys(self, group)
            self._check_options(group, at_step=False)
        except (TypeError, ValueError):
            self.param_groups.pop()
            raise
        group["f_star"] = float(group["f_star"])

    def _check_options(self, group: dict[str, Any], *, at_step: bool) -> None:
        """c > 0 and finite (an infinite c gave η_t = 0: no step, ever), eta_max > 0 or None,
        f* a finite number, lr ≥ 0 and finite (a checkpoint saved before SPS had ``lr``: 1)."""
        _check_positive("lr", group.get("lr", 1.0), finite=True, zero_ok=True)
        _check_positive("c", group["c"], finite=True)
        _check_positive("eta_max", group["eta_max"], optional=True)
        _check_f_star(group["f_star"])

    def _warn_below_f_star(self, loss: float, eps: float) -> None:
        """Say, once per optimiser, that a loss below a group's f* stops the steps: η_t is
        clamped at 0, so a loss that can go negative (a Gaussian NLL, a loss with a subtracted
        term) under the default f* = 0 left the parameters where they were, step after step,
        without a word. A loss below f* by rounding alone (within a few ulps of f*, at the
        optimum) is not reported."""
        if getattr(self, "_said_below_f_star", False):
            return
        for k, group in enumerate(self.param_groups):
            f_star = group["f_star"]
            if f_star - loss > 4 * eps * abs(f_star):
                self._said_below_f_star = True
                warnings.warn(
                    f"{type(self).__name__}: the loss {loss:.6g} is below f_star = {f_star:.6g} "
                    f"(param group {k}), so the step size (L − f*)/(c‖∇L‖²) is negative and is "
                    "clamped to 0: no step is taken while the loss stays below f_star. f_star "
                    "must be a lower bound on the loss: pass a smaller f_star (the loss's "
                    "infimum; 0 only for a loss that cannot go negative, such as cross-entropy). "
                    "Said once per optimiser", RuntimeWarning,
                    stacklevel=5)  # the caller of step(), past torch's two wrappers
                return

    def _warn_distributed(self, loss: Any) -> None:
        """Say, once per optimiser, that with several ranks the step size reads each rank's own
        loss: under DistributedDataParallel the gradients are averaged over the ranks but the
        loss the closure returns is the rank's own minibatch's, so each rank took a different
        η_t and the replicas drifted apart without a word (0.89 apart after 3 steps on 2 ranks).
        No collective is run here (ranks that do not step together would hang), so a loss
        returned detached (as an all-reduced one is) is taken as averaged, and only a loss that
        still has its graph, or a Python number, is said."""
        if getattr(self, "_said_distributed", False):
            return
        if isinstance(loss, Tensor) and not loss.requires_grad:
            return
        dist = torch.distributed
        if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
            self._said_distributed = True
            warnings.warn(
                f"{type(self).__name__}: torch.distributed runs {dist.get_world_size()} ranks, "
                "and the step size (L − f*)/(c‖∇L‖²) uses the loss the closure returns: under "
                "DistributedDataParallel that is each rank's own minibatch loss while the "
                "gradient is averaged over the ranks, so the ranks step differently and the "
                "replicas drift apart. Return the loss averaged over the ranks from the closure "
                "(after backward: l = loss.detach().clone(); dist.all_reduce(l, "
                "op=dist.ReduceOp.AVG); return l: a loss returned detached is taken as averaged). "
                "Said once per optimiser", RuntimeWarning,
                stacklevel=5)  # the caller of step(), past torch's two wrappers

    @torch.no_grad()
    def step(self, closure: Callable[[], Tensor] | None = None) -> Tensor:  # type: ignore[override]
        if closure is None:
            raise RuntimeError(
                f"{type(self).__name__} needs the loss to set its step size: call "
                "optimizer.step(closure) with a closure that zeroes the gradients, computes the "
                "loss, calls loss.backward() and returns the loss (as for torch.optim.LBFGS)"
            )
        self._check_groups_at_step()
        with torch.enable_grad():
            loss = closure()
        # a Python float (as torch.optim.LBFGS accepts) stays float64: torch.as_tensor would
        # round it to float32, far coarser than L − f* near the optimum
        try:
            value = (torch.as_tensor(loss, dtype=torch.float64)
                     if isinstance(loss, Real) and not isinstance(loss, bool)
                     else torch.as_tensor(loss).detach())
        except (TypeError, RuntimeError, ValueError):
            # None (a closure without ``return loss``) raised torch's "Could not infer dtype"
            value = None
        if value is None or value.numel() != 1 or not value.is_floating_point():
            got = (f"{type(loss).__name__}" if value is None else
                   f"{type(loss).__name__} of shape {tuple(value.shape)}, dtype {value.dtype}")
            raise ValueError(
                "the closure must return the scalar float loss it called backward() on; got "
                f"{got}" + (" (does the closure end with `return loss`?)" if loss is None else "")
            )
        if not bool(torch.isfinite(value).all()):
            raise FloatingPointError(
                f"{type(self).__name__}: the closure returned the loss {float(value)}, so the "
                "step size (L − f*)/(c‖∇L‖²) is not defined; "
                "lower eta_max, or check the loss and the data for overflow"
            )
        self._warn_distributed(loss)
        groups = [(g, _params_with_grad(g)) for g in self.param_groups]
        norm = _global_grad_norm(p for _, ps in groups for p in ps)
        if norm is None:  # nothing has a gradient: nothing to do
            if isinstance(loss, Tensor) and loss.requires_grad:
                # a closure that only computes the loss (``lambda: loss_fn(model(x), y)``) left
                # every step a no-op, without a word
                raise RuntimeError(
                    f"{type(self).__name__}: the closure returned a loss that depends on "
                    "parameters, but no parameter of this optimiser has a gradient, so nothing "
                    "would move: the closure must zero the gradients, compute the loss, call "
                    "loss.backward() and return the loss (and the loss must depend on the "
                    "parameters given to the optimiser)")
            return loss
        _check_finite_norms(type(self).__name__, [norm], [p for _, ps in groups for p in ps])
        # L − f* in the wider of the loss's and the norm's types, then in the norm's: a float64
        # loss near f* would lose its excess if rounded to a float32 norm's type first
        loss_eps = torch.finfo(value.dtype).eps
        value = value.reshape(()).to(torch.promote_types(value.dtype, norm.dtype))
        self._warn_below_f_star(float(value), loss_eps)
        safe = torch.where(norm > 0, norm, torch.ones_like(norm))
        for group, params in groups:
            # (L − f*)/(c‖g‖²) as ((L − f*)/‖g‖)/(c‖g‖): ‖g‖² of a tiny gradient underflows to 0
            excess = (value - group["f_star"]).to(device=norm.device, dtype=norm.dtype)
            size = (excess / safe / (group["c"] * safe)).clamp(min=0)
            if group["eta_max"] is not None:
                size = size.clamp(max=group["eta_max"])
            size = size * group["lr"]  # exact for the default lr = 1
            # 0/0 or x/0 for a zero gradient: no step instead of NaN/inf; likewise where the
            # quotient overflows (a loss and a gradient that have both underflowed towards
            # float's smallest numbers: converged as far as the float type resolves)
            size = torch.where((norm > 0) & torch.isfinite(size), size, torch.zeros_like(size))
            for p in params:
                s = size.to(p.device)
                _apply(p, s)
                _record(self.state[p], s, norm.to(p.device), self._latest_stamp())
        return loss


class Polyak(SPS):
    """Deterministic Polyak step η_t = (L(W_t) − L*)/‖∇L(W_t)‖²: ``SPS`` with c = 1, no cap.

    Meant for full-batch losses; L* = ``f_star`` (0 by default, the infimum of the logistic loss).
    ``lr`` (default 1: the Polyak step itself) multiplies the step, W ← W − lr·η_t ∇L, as for
    ``SPS``; torch's LR schedulers scale it.
    """

    def __init__(self, params: Params, f_star: float = 0.0, lr: float = 1.0) -> None:
        super().__init__(params, c=1.0, f_star=f_star, eta_max=None, lr=lr)

    def _check_options(self, group: dict[str, Any], *, at_step: bool) -> None:
        """SPS's checks, and c = 1 with no cap: a group given another c or an ``eta_max``, or
        an SPS checkpoint loaded (the same option names), stepped as SPS_max without a word."""
        super()._check_options(group, at_step=at_step)
        if group["c"] != 1.0 or group["eta_max"] is not None:
            raise ValueError(
                f"Polyak is the step with c = 1 and no cap, but a parameter group has "
                f"c={group['c']!r}, eta_max={group['eta_max']!r} (given to the group, or from "
                "a loaded SPS checkpoint): for those use SPS(params, c=..., eta_max=...); for "
                "Polyak leave c and eta_max out")
