"""One step's pieces, shared by the training loop (:mod:`~senslab.train.loop`) and what it
measures at every evaluation (:mod:`~senslab.train.track`): moving a batch to the device, the
forward call, the loss, the decision rule, accuracy and loss over a dataset, the weight norm.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..data import ArrayDataset
from ..measure.outputs import is_scalar, predictions


def loss_function(kind: str, outputs: Tensor) -> Callable[[Tensor, Tensor], Tensor]:
    """The training loss; ``"auto"``: BCE-with-logits for one column (its sign is the class, the
    ``output_kind="logits"`` rule of :mod:`senslab.measure.outputs`), cross-entropy otherwise."""
    if kind == "auto":
        kind = "bce" if is_scalar(outputs) else "ce"
    if kind in ("bce", "mse") and not is_scalar(outputs):
        raise ValueError(
            f"train.loss={kind} trains one output column against a 0/1 label, but the model "
            f"returns {outputs.shape[-1]} columns (a score per class): use train.loss=ce (or "
            "auto) for it, or a model with one output on binary data")
    if kind == "ce":
        return lambda out, y: F.cross_entropy(out, y.long())
    if kind == "bce":
        return lambda out, y: F.binary_cross_entropy_with_logits(out.reshape(-1), y.float())
    if kind == "mse":
        return lambda out, y: F.mse_loss(out.reshape(len(y), -1).squeeze(1), y.float())
    raise ValueError(f"unknown loss {kind!r}; use auto, ce, bce or mse")


def output_rule(loss_kind: str, model: Any, outputs: Tensor) -> tuple[str, float | None]:
    """The decision rule (``output_kind``, ``threshold`` of :mod:`senslab.measure.outputs`) that
    matches how the loop trains ``model``: with ``loss="mse"`` a one-column output regresses
    the {0, 1} label, so its class boundary is 0.5; otherwise the model's declared kind, else
    logits (BCE-with-logits: one column's sign; cross-entropy: the argmax)."""
    if loss_kind == "mse" and is_scalar(outputs):
        return "scores", 0.5
    return getattr(model, "output_kind", None) or "logits", None


def correct(outputs: Tensor, y: Tensor, kind: str = "logits",
            threshold: float | None = None) -> Tensor:
    """Number of right predictions, by the one decision rule of :mod:`senslab.measure.outputs`
    (``kind``/``threshold`` from :func:`output_rule`)."""
    return (predictions(outputs, kind, threshold).long() == y.long()).sum()


def to_device(x: Any, device: torch.device) -> Any:
    if isinstance(x, dict):
        return {k: v.to(device, non_blocking=True) for k, v in x.items()}
    return x.to(device, non_blocking=True)


def forward(model: nn.Module, x: Any) -> Tensor:
    return model(**x) if isinstance(x, dict) else model(x)


def first_output(model: nn.Module, data: Any, device: torch.device) -> Tensor:
    """``model``'s output for ``data``'s first example, in eval mode (the mode restored): what
    a run's decision rule and its output checks read."""
    x, _ = data.batch(slice(0, 1))
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            return forward(model, to_device(x, device))
    finally:
        model.train(was_training)


@torch.no_grad()
def evaluate(model: nn.Module, data: ArrayDataset, loss_kind: str, device: torch.device,
             batch_size: int = 500, shard: tuple[int, int] | None = None) -> tuple[float, float]:
    """Mean loss and accuracy of ``model`` (in eval mode, mode restored) on ``data``; with
    ``shard=(rank, world)`` each process evaluates every world-th example and sums are reduced."""
    was_training = model.training
    model.eval()
    rank, world = shard or (0, 1)
    sums = torch.zeros(2, dtype=torch.float64)
    try:
        for lo in range(rank * batch_size, len(data), batch_size * world):
            x, y = data.batch(slice(lo, lo + batch_size))
            x, y = to_device(x, device), y.to(device)
            out = forward(model, x)
            sums[0] += loss_function(loss_kind, out)(out, y).item() * len(y)
            sums[1] += int(correct(out, y, *output_rule(loss_kind, model, out)))
    finally:
        model.train(was_training)
    if world > 1:
        import torch.distributed as dist

        dist.all_reduce(sums)
    return float(sums[0]) / len(data), float(sums[1]) / len(data)


def weight_norm(model: nn.Module) -> float:
    """‖θ‖₂ over every parameter: :func:`senslab.measure.sharpness.parameter_norm` with nothing
    excluded (complex parameters as |z|², memory shared by two parameters once, in float64)."""
    from ..measure.sharpness import parameter_norm

    return parameter_norm(model, exclude=())
