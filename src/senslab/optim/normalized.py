"""Normalised gradient descent (NGD) and its minibatch form SNGD (Vasudeva et al.;
docs/definitions.md#normalized-gradient-descent).

One NGD step moves the parameters by exactly ``lr`` in Euclidean norm, whatever the gradient's
size:

    W ← W − η ∇L / ‖∇L‖,        ‖∇L‖² = Σ_{p ∈ all parameters of the optimiser} ‖∇_p L‖²_F.

The norm is *global*: one number over every parameter of every param group, so the whole
parameter vector is treated as the W of the paper (a single matrix there, where global and
per-tensor norms coincide; parameters sharded across ranks, FSDP's flat parameters and DTensors,
are refused: the norm would be each rank's shard's, and DeepSpeed ZeRO's partitions, which carry
no mark, cannot be told apart — use DistributedDataParallel). ``per_param=True`` instead
divides each tensor's gradient by its own norm. SNGD is the same update on a minibatch
gradient; the class cannot tell the difference, so ``SNGD`` is simply another name for ``NGD``.

With ``eta_max`` the step size on the *raw* gradient is capped:

    W ← W − min(η / ‖∇L‖, η_max) ∇L,

i.e. a normalised step of length η while ‖∇L‖ ≥ η/η_max, and a plain gradient step with learning
rate η_max once the gradient is small (docs/definitions.md#normalized-gradient-descent; the same
cap as SPS_max). A zero gradient gives no step (and no division by zero); a gradient with nan or
inf entries is refused (``FloatingPointError``), and so is one of finite entries whose norm
is beyond its float type (saying so), as is a param group with an option NGD does not
have (``weight_decay``, ``momentum``, …: nothing would apply it), at construction and in a
checkpoint given to ``load_state_dict``. The options' values are checked again at every step (an
LR scheduler or a hand edit may change them): a negative or non-finite lr is refused, an lr of 0
(where a schedule may end) is no step. Parameters of different float types share a norm taken in
the widest of them; complex parameters are stepped like real ones. A nonzero gradient so small
that η/‖∇L‖ overflows (a subnormal ‖∇L‖), or so large that it underflows (below the type's
normal range, where it kept a few digits or none), is still stepped by exactly η, as
(∇L/‖∇L‖)·η.

Every updated parameter's state records ``step`` (number of steps taken), ``step_size`` (the
multiplier on the raw gradient, η/‖∇L‖ or the cap; 0 for a zero gradient, inf where η/‖∇L‖
overflowed, the rounded subnormal or 0 where it underflowed) and ``grad_norm`` (the norm it
was divided by), so they survive ``state_dict()``, in the precision they were computed in;
``last_step_size`` reads them back for logging.
"""

from __future__ import annotations

import functools
import math
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
    stopped the step; a huge one's overflow. ``dtype``: the precision it is taken in. A nan or
    inf entry gives a nan norm (it gave 0)."""
    x = x.to(dtype)
    m = x.abs().amax() if x.numel() else torch.zeros((), dtype=x.abs().dtype, device=x.device)
    safe = torch.where(m > 0, m, torch.ones_like(m))
    return torch.where(m != 0, safe * torch.linalg.vector_norm(x / safe), torch.zeros_like(m))


def _dense_values(grad: Tensor) -> Tensor:
    """The entries whose norm is the gradient's: a sparse COO gradient's coalesced values (an
    index listed twice summed first, as the dense gradient would hold it)."""
    return grad.coalesce().values() if grad.is_sparse else grad


def global_grad_norm(params: Tensor | Iterable[Tensor]) -> Tensor | None:
    """‖∇L‖ = sqrt(Σ_p ‖∇_p L‖²) over the parameters that have a gradient, as a 0-dim tensor on
    the first such parameter's device (``None`` when none has one). Norms are taken in at least
    float32 so half-precision gradients do not overflow, the total in the widest of them (a
    float64 gradient is not rounded to float32 because a float32 one came first), and rescaled
    by the largest entry so tiny gradients do not underflow to a norm of 0. A sparse gradient
    (``nn.Embedding(sparse=True)``) counts by its coalesced values (it raised torch's
    NotImplementedError for ``amax``). A single tensor is taken as one parameter, as
    ``torch.nn.utils.clip_grad_norm_`` takes it (iterated, its rows have no gradient, and the
    norm read ``None``)."""
    params = [params] if isinstance(params, Tensor) else list(params)
    for p in params:
        if not isinstance(p, Tensor):
            raise TypeError(
                f"global_grad_norm takes parameters (tensors), got a {type(p).__name__} among "
                "them; pass model.parameters(), or for an optimiser's param groups "
                "(p for g in opt.param_groups for p in g['params'])")
    norms = [
        _scaled_norm(_dense_values(p.grad), torch.promote_types(p.grad.dtype, torch.float32))
        for p in params
        if p.grad is not None
    ]
    if not norms:
        return None
    device = norms[0].device
    dtype = functools.reduce(torch.promote_types, (n.dtype for n in norms))
    return _scaled_norm(torch.stack([n.to(device, dtype) for n in norms]), dtype)


def _check_finite_norms(name: str, norms: list[Tensor], params: Iterable[Tensor] = ()) -> None:
    """A gradient with a nan or inf entry has no defined step: refuse it (it gave size 0 and a
    recorded ‖∇L‖ of 0 while the nan spread into the parameters). ``params``: the parameters
    whose gradients the norms are of; where all their entries are finite, the norm itself
    overflowed (finite entries of 1e308 in float64, 3e38 in float32), and the error says so
    (it said "nan or inf entries", which the gradient did not hold)."""
    if not norms:
        return
    # in the widest type: a float64 norm above 3.4e38 was cast to a float32 first norm's type,
    # overflowed, and refused a finite gradient
    dtype = functools.reduce(torch.promote_types, (n.dtype for n in norms))
    stacked = torch.stack([n.to(norms[0].device, dtype) for n in norms])
    if not bool(torch.isfinite(stacked).all()):
        grads = [_dense_values(p.grad) for p in params if p.grad is not None]
        if grads and all(bool(torch.isfinite(g).all()) for g in grads):
            largest = max(float(g.abs().max()) for g in grads if g.numel())
            kind = str(dtype).removeprefix("torch.")
            raise FloatingPointError(
                f"{name}: every gradient entry is finite (the largest |entry| is "
                f"{largest:.3g}), but the gradient's norm ‖∇L‖ is beyond the largest {kind} "
                f"number ({torch.finfo(dtype).max:.3g}), so the step, which divides by ‖∇L‖, "
                "is not defined; the loss or the parameters have blown up: lower the step size "
                "(lr / eta_max), scale the loss down, or check the loss and the data"
                + ("" if dtype == torch.float64 else
                   ", or train in float64 (model.double()), where this norm is in range"))
        raise FloatingPointError(
            f"{name}: a gradient holds nan or inf entries, so its norm and the step are not "
            "defined; lower the step size (lr / eta_max), or check the loss and the data for "
            "overflow"
        )


def _apply(p: Tensor, size: Tensor, divisor: Tensor | None = None) -> None:
    """p ← p − size·(∇p / divisor) (divisor 1 when None), the product in the wider of the
    gradient's and the multiplier's types: a float64 gradient is not rounded to a float32
    multiplier's precision, a complex one keeps its imaginary part, and η/‖g‖ above 65504 does
    not overflow in float16. ``divisor`` serves a multiplier that would overflow (NGD.step)."""
    dtype = torch.promote_types(p.grad.dtype, size.dtype)
    grad = p.grad.to(dtype)
    if divisor is not None:
        grad = grad / divisor.to(dtype)  # exact where divisor is 1
    p.sub_((grad * size.to(dtype)).to(p.dtype))


def _check_positive(
    name: str, value: float | None, optional: bool = False, *, finite: bool = False,
    zero_ok: bool = False,
) -> None:
    """``value`` > 0 (≥ 0 with ``zero_ok``, finite with ``finite``; None allowed if
    ``optional``). An infinite lr or c passed before and gave inf / nan parameters or no step."""
    if value is None and optional:
        return
    ok = value is not None and not isinstance(value, bool) and (
        value >= 0 if zero_ok else value > 0)
    if ok and finite:
        ok = math.isfinite(float(value))  # type: ignore[arg-type]
    if not ok:
        hint = (" (or None for no cap)" if optional else
                " (finite; or 0 for no step, as an LR schedule may set it)" if zero_ok else
                " (finite)" if finite else "")
        raise ValueError(f"{name} must be a positive number{hint}, got {value!r}")


#: keys a param group may carry besides its optimiser's options: torch's own bookkeeping and
#: what torch's LR schedulers write into the groups (OneCycleLR: max_lr, min_lr)
_BOOKKEEPING = {"params", "param_names", "initial_lr", "max_lr", "min_lr", "swa_lr"}


def _check_group_keys(opt: Optimizer, group: dict[str, Any]) -> None:
    """Refuse what the step would silently ignore: an option this optimiser does not have
    (``weight_decay``, ``momentum``, ``maximize``, …), a parameter listed twice (stepped twice,
    its gradient counted twice in ‖∇L‖) and parameters sharded across ranks."""
    name = type(opt).__name__
    unknown = sorted(set(group) - set(opt.defaults) - _BOOKKEEPING)
    if unknown:
        raise ValueError(
            f"{name} has no option {', '.join(map(repr, unknown))} (its options: "
            f"{', '.join(sorted(opt.defaults))}; the step is the normalised or Polyak one "
            "alone); remove it from the param group, or use torch.optim.SGD / AdamW for momentum "
            "or weight decay"
        )
    if len({id(p) for p in group["params"]}) != len(group["params"]):
        raise ValueError(f"{name}: a param group lists a parameter twice (it would be stepped "
                         "twice); pass each parameter once")
    _refuse_sharded(name, group["params"])


def _refuse_sharded(name: str, params: Iterable[Any]) -> None:
    """Refuse parameters sharded across ranks: FSDP's flat parameters (``FullyShardedDataParallel``,
    ``use_orig_params`` or not) hold each rank's shard as a plain tensor, so ‖∇L‖ was each rank's
    own shard's norm (0.43 and 1.62 on two ranks for a global 1.68) and every rank took a
    different step without a word; DTensor parameters (FSDP2 ``fully_shard``) raised a raw error
    in the norm. Sharding that leaves no mark on the tensors (DeepSpeed ZeRO's partitions) cannot
    be seen here."""
    try:
        from torch.distributed.tensor import DTensor
    except ImportError:  # torch built without distributed
        DTensor = ()  # noqa: N806
    for p in params:
        if not isinstance(p, Tensor):
            continue  # a saved group's parameter indices (load_state_dict)
        if (isinstance(p, DTensor) or getattr(p, "_is_flat_param", False)
                or getattr(p, "_fsdp_flattened", False)):
            why = ("a DTensor (FSDP2 fully_shard, tensor parallel): the global gradient norm "
                   "‖∇L‖ is not taken over DTensors (a rank's empty shard raised a torch error)"
                   if isinstance(p, DTensor) else
                   "an FSDP flat parameter (FullyShardedDataParallel), sharded across ranks: "
                   "‖∇L‖ would be each rank's shard's norm, not the global one, and the ranks "
                   "would take different steps")
            raise ValueError(
                f"{name}: a parameter is {why}; train with DistributedDataParallel "
                "(every rank holds the whole parameters) or in one process")


class _StepSizeLog:
    """Reads back the ``step_size`` the last step wrote into the optimiser state (for logging),
    and checks the param groups a ``load_state_dict`` brings in."""

    state: Any
    param_groups: list[dict[str, Any]]

    def _check_options(self, group: dict[str, Any], *, at_step: bool) -> None:
        """Raise ``ValueError`` for a group option the step cannot use (subclasses)."""
        raise NotImplementedError

    def _check_groups_at_step(self) -> None:
        """The options as the step reads them: an LR scheduler, a hand edit or a checkpoint may
        have changed them since the constructor checked them (a negative lr stepped uphill, a
        nan one made every parameter nan)."""
        for k, group in enumerate(self.param_groups):
            try:
                self._check_options(group, at_step=True)
            except ValueError as err:
                raise ValueError(f"{type(self).__name__} param group {k}: {err}") from None
        # every step counts, one that moves nothing too (see :meth:`step_sizes`)
        self._stamp = self._latest_stamp() + 1

    def _latest_stamp(self) -> int:
        """The number of the optimiser's most recent step: counted by this object, else (just
        built or loaded) the latest one a parameter's state records."""
        known = getattr(self, "_stamp", None)
        if known is not None:
            return known
        return max((int(st.get("stamp", 0)) for st in self.state.values()), default=0)

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """``torch.optim.Optimizer.load_state_dict``, refusing a checkpoint whose param groups
        carry options this optimiser does not have (e.g. an SGD checkpoint's ``momentum`` and
        ``weight_decay``, which the step would ignore without a word) or values it cannot step
        with, before anything is loaded; and keeping the logged ``step_size`` / ``grad_norm`` in
        the precision they were computed in (torch casts them to a bfloat16 / float16
        parameter's type, so ``last_step_size`` changed on resume)."""
        groups = state_dict["param_groups"]
        for k, group in enumerate(groups):
            try:
                _check_group_keys(self, group)  # type: ignore[arg-type]
                self._check_options(group, at_step=True)
            except (TypeError, ValueError) as err:
                raise type(err)(f"{type(self).__name__}.load_state_dict: saved param group {k}: "
                                f"{err}; load a checkpoint of this optimiser") from None
        super().load_state_dict(state_dict)  # type: ignore[misc]
        self._stamp = None  # the loaded states say which step came last
        params = [p for g in self.param_groups for p in g["params"]]
        for index, p in zip((i for g in groups for i in g["params"]), params, strict=False):
            saved = state_dict["state"].get(index, {})
            for key in ("step_size", "grad_norm"):
                if isinstance(saved.get(key), Tensor):
                    self.state[p][key] = saved[key].detach().clone().to(p.device)

    @property
    def last_step_size(self) -> float | None:
        """Multiplier applied to the raw gradient in the most recent step, read from the first
        parameter (in param-group order) that step updated; ``None`` before any step and after
        a step that updated no parameter. With several groups or ``per_param=True`` the groups
        can differ: see ``step_sizes()``."""
        sizes = [s for s in self.step_sizes() if s is not None]
        return sizes[0] if sizes else None

    def step_sizes(self) -> list[float | None]:
        """The step size of each param group in the most recent step (its first parameter that
        step updated), ``None`` for a group it did not update: read from the first parameter
        ever updated, a group reported the size of an earlier step (1/2 where the last step,
        moving only another parameter, applied 1/4). States saved before steps were numbered
        carry no number: there, each group's first updated parameter, as before."""
        latest = self._latest_stamp()
        numbered = any("stamp" in st for st in self.state.values())
        out: list[float | None] = []
        for group in self.param_groups:
            size = next(
                (float(self.state[p]["step_size"]) for p in group["params"]
                 if "step_size" in self.state.get(p, {})
                 and (not numbered or self.state[p].get("stamp") == latest)),
                None,
            )
            out.append(size)
        return out


def _record(state: dict[str, Any], step_size: Tensor, grad_norm: Tensor, stamp: int) -> None:
    # Stored as detached tensors: no host sync per step; float() only when someone logs them.
    state["step"] = state.get("step", 0) + 1
    state["stamp"] = stamp  # the optimiser's step that wrote them
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
    call ``backward()`` and return the loss; ``step`` returns it. A closure whose loss has a
    graph while no parameter got a gradient (it never called ``backward()``) is refused.

    Example::

        opt = NGD(model.parameters(), lr=0.1)
        loss_fn(model(x), y).backward()
        opt.step()          # parameters moved by exactly 0.1 in global norm
    """

    def __init__(
        self, params: Params, lr: float, eta_max: float | None = None, per_param: bool = False
    ) -> None:
        _check_positive("lr", lr, finite=True)
        _check_positive("eta_max", eta_max, optional=True)
        super().__init__(params, {"lr": lr, "eta_max": eta_max, "per_param": per_param})

    def add_param_group(self, param_group: dict[str, Any]) -> None:
        """``torch.optim.Optimizer.add_param_group``, with the group's own ``lr``, ``eta_max``
        and ``per_param`` checked like the constructor's (a negative ``lr`` stepped uphill) and
        options NGD does not have refused (they were ignored without a word)."""
        super().add_param_group(param_group)
        group = self.param_groups[-1]
        try:
            _check_group_keys(self, group)
            self._check_options(group, at_step=False)
        except ValueError:
            self.param_groups.pop()
            raise

    def _check_options(self, group: dict[str, Any], *, at_step: bool) -> None:
        """lr > 0 and finite (at step time also 0: where an LR schedule may end), eta_max > 0
        or None, per_param a bool."""
        _check_positive("lr", group["lr"], finite=True, zero_ok=at_step)
        _check_positive("eta_max", group["eta_max"], optional=True)
        if not isinstance(group["per_param"], bool):
            raise ValueError(f"per_param must be True or False, got {group['per_param']!r}")

    @torch.no_grad()
    def step(self, closure: Callable[[], Tensor] | None = None) -> Tensor | None:  # type: ignore[override]
        self._check_groups_at_step()
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        groups = [(g, _params_with_grad(g)) for g in self.param_groups]
        if (isinstance(loss, Tensor) and loss.requires_grad
                and not any(params for _, params in groups)):
            # a closure that only computes the loss (``lambda: loss_fn(model(x), y)``) left every
            # step a no-op, without a word (as SPS refuses it)
            raise RuntimeError(
                f"{type(self).__name__}: the closure returned a loss that depends on parameters, "
                "but no parameter of this optimiser has a gradient, so nothing would move: the "
                "closure must zero the gradients, compute the loss, call loss.backward() and "
                "return the loss (and the loss must depend on the parameters given to the "
                "optimiser)")
        shared = global_grad_norm(p for g, ps in groups if not g["per_param"] for p in ps)
        norms = [
            [global_grad_norm([p]) if group["per_param"] else shared for p in params]
            for group, params in groups
        ]
        unique = {id(n): n for ns in norms for n in ns}  # the shared norm once, not per tensor
        _check_finite_norms(type(self).__name__, list(unique.values()),
                            [p for _, params in groups for p in params])
        for (group, params), group_norms in zip(groups, norms, strict=True):
            for p, norm in zip(params, group_norms, strict=True):
                assert norm is not None  # p has a gradient, so some norm exists
                norm = norm.to(p.device)
                # η/‖g‖ is inf for g = 0; the where() turns that into "no step".
                raw = torch.where(norm > 0, group["lr"] / norm, torch.zeros_like(norm))
                size = raw
                if group["eta_max"] is not None:
                    size = size.clamp(max=group["eta_max"])
                # η/‖g‖ overflows for a subnormal ‖g‖ (a float32 logistic loss far into a
                # separable run), and inf·g made the parameters −inf; for a huge ‖g‖ it falls
                # under the type's normal range (float32 ‖g‖ ≳ η·1e38), where it kept only a few
                # digits (a step of 1.19 η) or none (0: no step at all). Then step as (g/‖g‖)·η
                # instead, the same step of length η (the divisor is 1 otherwise: bit for bit
                # the product above). The recorded step size stays as rounded (inf, subnormal or
                # 0): it is beyond the type. A cap, which only lowers it, keeps its own product.
                lr = torch.as_tensor(group["lr"], dtype=norm.dtype, device=norm.device)
                under = (size < torch.finfo(size.dtype).tiny) & (size == raw) & (lr > 0)
                over = (norm > 0) & (torch.isinf(size) | under)
                divisor = torch.where(over, norm, torch.ones_like(norm))
                _apply(p, torch.where(over, lr, size), divisor)
                _record(self.state[p], size, norm, self._latest_stamp())
        return loss


SNGD = NGD
"""Stochastic NGD: ``NGD`` stepped on minibatch gradients (the update rule is identical)."""
