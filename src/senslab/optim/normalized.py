"""Normalised gradient descent (NGD) and its minibatch form SNGD (Vasudeva et al.;
docs/definitions.md#normalized-gradient-descent).

One NGD step moves the parameters by exactly ``lr`` in Euclidean norm, whatever the gradient's
size:

    W ← W − η ∇L / ‖∇L‖,        ‖∇L‖² = Σ_{p ∈ all parameters of the optimiser} ‖∇_p L‖²_F.

The norm is *global*: one number over every parameter of every param group, so the whole
parameter vector is treated as the W of the paper (a single matrix there, where global and
per-tensor norms coincide). ``per_param=True`` instead divides each tensor's gradient by its own
norm. SNGD is the same update on a minibatch gradient; the class cannot tell the difference, so
``SNGD`` is simply another name for ``NGD``.

With ``eta_max`` the step size on the *raw* gradient is capped:

    W ← W − min(η / ‖∇L‖, η_max) ∇L,

i.e. a normalised step of length η while ‖∇L‖ ≥ η/η_max, and a plain gradient step with learning
rate η_max once the gradient is small (docs/definitions.md#normalized-gradient-descent; the same
cap as SPS_max). A zero gradient gives no step (and no division by zero).

Every updated parameter's state records ``step`` (number of steps taken), ``step_size`` (the
multiplier on the raw gradient, η/‖∇L‖ or the cap; 0 for a zero gradient) and ``grad_norm`` (the
norm it was divided by), so they survive ``state_dict()``; ``last_step_size`` reads them back for
logging.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import torch
from torch import Tensor
from torch.optim import Optimizer

Params = Iterable[Tensor] | Iterable[dict[str, Any]]


def _params_with_grad(group: dict[str, Any]) -> list[Tensor]:
    params = [p for p in group["params"] if p.grad is not None]
    for p in params:
        if p.grad.is_sparse:
            raise RuntimeError(
                "normalised / Polyak steps need dense gradients; got a sparse gradient (e.g. from "
                "nn.Embedding(sparse=True)); build the module with sparse=False"
            )
    return params


def _scaled_norm(x: Tensor, dtype: torch.dtype) -> Tensor:
    """‖x‖ computed as m·‖x/m‖ with m = max |x|: the squares of tiny entries (below ≈1e-162 in
    float64, 1e-23 in float32) underflow to 0, which made a nonzero gradient's norm 0 and
    stopped the step; a huge one's overflow. ``dtype``: the precision it is taken in."""
    x = x.to(dtype)
    m = x.abs().amax() if x.numel() else torch.zeros((), dtype=dtype, device=x.device)
    safe = torch.where(m > 0, m, torch.ones_like(m))
    return torch.where(m > 0, safe * torch.linalg.vector_norm(x / safe), torch.zeros_like(m))


def global_grad_norm(params: Iterable[Tensor]) -> Tensor | None:
    """‖∇L‖ = sqrt(Σ_p ‖∇_p L‖²) over the parameters that have a gradient, as a 0-dim tensor on
    the first such parameter's device (``None`` when none has one). Norms are taken in at least
    float32 so half-precision gradients do not overflow, and rescaled by the largest entry so
    tiny gradients do not underflow to a norm of 0."""
    norms = [
        _scaled_norm(p.grad, torch.promote_types(p.grad.dtype, torch.float32))
        for p in params
        if p.grad is not None
    ]
    if not norms:
        return None
    device = norms[0].device
    return _scaled_norm(torch.stack([n.to(device) for n in norms]), norms[0].dtype)


def _check_positive(name: str, value: float | None, optional: bool = False) -> None:
    if value is None and optional:
        return
    if value is None or not value > 0:
        hint = " (or None for no cap)" if optional else ""
        raise ValueError(f"{name} must be a positive number{hint}, got {value!r}")


class _StepSizeLog:
    """Reads back the ``step_size`` the last step wrote into the optimiser state (for logging)."""

    state: Any
    param_groups: list[dict[str, Any]]

    @property
    def last_step_size(self) -> float | None:
        """Multiplier applied to the raw gradient in the most recent step, read from the first
        parameter (in param-group order) that has been updated; ``None`` before any step.
        With several groups or ``per_param=True`` the groups can differ: see ``step_sizes()``."""
        sizes = [s for s in self.step_sizes() if s is not None]
        return sizes[0] if sizes else None

    def step_sizes(self) -> list[float | None]:
        """The last step size of each param group (first updated parameter of the group)."""
        out: list[float | None] = []
        for group in self.param_groups:
            size = next(
                (float(self.state[p]["step_size"]) for p in group["params"]
                 if "step_size" in self.state.get(p, {})),
                None,
            )
            out.append(size)
        return out


def _record(state: dict[str, Any], step_size: Tensor, grad_norm: Tensor) -> None:
    # Stored as detached tensors: no host sync per step; float() only when someone logs them.
    state["step"] = state.get("step", 0) + 1
    state["step_size"] = step_size.detach().clone()
    state["grad_norm"] = grad_norm.detach().clone()


class NGD(_StepSizeLog, Optimizer):
    """Normalised gradient descent: W ← W − min(η/‖∇L‖, η_max) ∇L (module docstring).

    Args:
        params: parameters or param-group dicts, as for any ``torch.optim.Optimizer``; each group
            may override ``lr``, ``eta_max`` and ``per_param``.
        lr: η, the length of every uncapped step (> 0).
        eta_max: optional cap on the step size applied to the raw gradient (> 0, or None).
        per_param: divide each tensor's gradient by its own norm instead of the global norm
            (the global norm is then taken over the groups with ``per_param=False`` only).

    ``step(closure=None)``: the closure, if given, must zero the gradients, compute the loss,
    call ``backward()`` and return the loss; ``step`` returns it.

    Example::

        opt = NGD(model.parameters(), lr=0.1)
        loss_fn(model(x), y).backward()
        opt.step()          # parameters moved by exactly 0.1 in global norm
    """

    def __init__(
        self, params: Params, lr: float, eta_max: float | None = None, per_param: bool = False
    ) -> None:
        _check_positive("lr", lr)
        _check_positive("eta_max", eta_max, optional=True)
        super().__init__(params, {"lr": lr, "eta_max": eta_max, "per_param": per_param})

    @torch.no_grad()
    def step(self, closure: Callable[[], Tensor] | None = None) -> Tensor | None:  # type: ignore[override]
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        groups = [(g, _params_with_grad(g)) for g in self.param_groups]
        shared = global_grad_norm(p for g, ps in groups if not g["per_param"] for p in ps)
        for group, params in groups:
            for p in params:
                norm = global_grad_norm([p]) if group["per_param"] else shared
                assert norm is not None  # p has a gradient, so some norm exists
                norm = norm.to(p.device)
                # η/‖g‖ is inf for g = 0; the where() turns that into "no step".
                size = torch.where(norm > 0, group["lr"] / norm, torch.zeros_like(norm))
                if group["eta_max"] is not None:
                    size = size.clamp(max=group["eta_max"])
                # in the multiplier's precision: η/‖g‖ above 65504 is inf in float16
                p.sub_((p.grad.to(size.dtype) * size).to(p.dtype))
                _record(self.state[p], size, norm)
        return loss


SNGD = NGD
"""Stochastic NGD: ``NGD`` stepped on minibatch gradients (the update rule is identical)."""
