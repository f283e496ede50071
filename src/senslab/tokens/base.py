"""How an input is cut into tokens and how one token (or all of them) is perturbed.

A :class:`Tokenization` is bound to a model and a batch inside a context manager. The bound object
runs the clean forward pass once, exposes the token layout (``num_tokens``, ``dim`` and a boolean
``valid`` mask of shape ``(B, T)``), and then evaluates the model on *perturbed copies*: copy ``n``
is example ``src[n]`` with ``noise[n]`` added to its token ``tok[n]``. All copies of a chunk are
built with tensor ops on the model's device and evaluated in one forward pass.
"""

from __future__ import annotations

import abc
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch
from torch import Tensor, nn

Inputs = Tensor | tuple | list | dict


def batch_size(inputs: Inputs) -> int:
    """Number of examples in ``inputs`` (the first dimension of its first tensor)."""
    for t in _tensors(inputs):
        return t.shape[0]
    raise TypeError("inputs hold no tensor: pass a Tensor, a tuple of Tensors or a dict of Tensors")


def _tensors(inputs: Inputs) -> Iterator[Tensor]:
    if isinstance(inputs, Tensor):
        yield inputs
    elif isinstance(inputs, dict):
        yield from (v for v in inputs.values() if isinstance(v, Tensor))
    elif isinstance(inputs, (tuple, list)):
        yield from (v for v in inputs if isinstance(v, Tensor))


def select(inputs: Inputs, index: Tensor) -> Inputs:
    """Rows ``index`` of every batch-shaped tensor in ``inputs`` (other values pass through)."""
    b = batch_size(inputs)

    def pick(v: Any) -> Any:
        if isinstance(v, Tensor) and v.dim() > 0 and v.shape[0] == b:
            return v.index_select(0, index.to(v.device))
        return v

    if isinstance(inputs, Tensor):
        return pick(inputs)
    if isinstance(inputs, dict):
        return {k: pick(v) for k, v in inputs.items()}
    return type(inputs)(pick(v) for v in inputs)


def call_model(model: nn.Module | Any, inputs: Inputs) -> Tensor:
    """Call ``model`` on ``inputs`` (tensor → positional, tuple → *args, dict → **kwargs) and
    return its output as a tensor (``.logits`` or the first element of a tuple output)."""
    if isinstance(inputs, Tensor):
        out = model(inputs)
    elif isinstance(inputs, dict):
        out = model(**inputs)
    else:
        out = model(*inputs)
    if isinstance(out, Tensor):
        return out
    if hasattr(out, "logits"):
        return out.logits
    if isinstance(out, (tuple, list)) and out and isinstance(out[0], Tensor):
        return out[0]
    raise TypeError(f"model returned {type(out).__name__}; expected a Tensor of outputs or logits")


def model_device(model: nn.Module | Any) -> torch.device | None:
    """Device of the model's first parameter or buffer (``None`` for a parameter-free callable)."""
    if isinstance(model, nn.Module):
        for t in model.parameters():
            return t.device
        for t in model.buffers():
            return t.device
    return None


def check_device(model: nn.Module | Any, inputs: Inputs) -> torch.device:
    """The device to compute on; an error if the inputs live elsewhere than the model."""
    dev = model_device(model)
    for t in _tensors(inputs):
        if dev is None:
            dev = t.device
        elif t.device != dev:
            raise ValueError(
                f"inputs are on {t.device} but the model is on {dev}; move them first, "
                f"e.g. inputs.to('{dev}')"
            )
    return dev if dev is not None else torch.device("cpu")


class BoundTokens(abc.ABC):
    """A tokenization bound to one model and one batch (see module docstring)."""

    clean_output: Tensor  #: model output on the unperturbed batch, shape (B, ...)
    valid: Tensor  #: (B, T) bool, the tokens that may be perturbed (padding excluded)
    dim: int  #: size of one token vector

    @property
    def num_tokens(self) -> int:
        return self.valid.shape[1]

    @abc.abstractmethod
    def tokens(self, src: Tensor, tok: Tensor) -> Tensor:
        """Clean vectors (N, D) of token ``tok[n]`` of example ``src[n]``."""

    @abc.abstractmethod
    def forward_perturbed(self, src: Tensor, tok: Tensor | None, noise: Tensor) -> Tensor:
        """Model output on copies of examples ``src`` (N,) with ``noise`` added.

        ``tok`` (N,) given: ``noise`` is (N, D), added to token ``tok[n]`` of copy ``n``.
        ``tok`` is None: ``noise`` is (N, T, D), added to every valid token (whole-input noise).
        """


class Tokenization(abc.ABC):
    """How to cut a model's input into tokens. Subclasses: :class:`Patches`, :class:`Embedding`,
    :class:`Sequence`."""

    #: default alignment of per-position profiles: "left" (token index) or "right" (from the end)
    align: str = "left"

    @abc.abstractmethod
    @contextmanager
    def bind(
        self, model: nn.Module | Any, inputs: Inputs, mask: Tensor | None = None
    ) -> Iterator[BoundTokens]:
        """Run the clean forward pass and yield a :class:`BoundTokens`."""


def valid_mask(mask: Tensor | None, b: int, t: int, device: torch.device) -> Tensor:
    """Check a user-given (B, T) mask of real tokens, or build an all-true one."""
    if mask is None:
        return torch.ones(b, t, dtype=torch.bool, device=device)
    if mask.shape != (b, t):
        raise ValueError(
            f"mask has shape {tuple(mask.shape)} but the batch has {b} examples of {t} tokens; "
            f"pass a (batch, tokens) = ({b}, {t}) mask that is true on real tokens"
        )
    mask = mask.to(device=device, dtype=torch.bool)
    return mask
