"""Audit 85, chunk sizing (measure/_chunks.py): the probe's metering under autocast leaves
tensor subclasses' dispatch alone."""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils._pytree import tree_map

from senslab.measure import TokenSensitivity
from senslab.tokens import Sequence


class Wrapped(torch.Tensor):
    """A wrapper tensor subclass (as quantization libraries make): no data of its own, every
    operation run on the tensor it holds."""

    @staticmethod
    def __new__(cls, inner: torch.Tensor) -> Wrapped:
        return torch.Tensor._make_wrapper_subclass(cls, inner.shape, dtype=inner.dtype,
                                                   device=inner.device)

    def __init__(self, inner: torch.Tensor) -> None:
        self.inner = inner

    @classmethod
    def __torch_dispatch__(cls, func: Any, types: Any, args: Any = (),
                           kwargs: Any = None) -> Any:
        def unwrap(t: Any) -> Any:
            return t.inner if isinstance(t, Wrapped) else t
        return func(*tree_map(unwrap, args), **tree_map(unwrap, kwargs or {}))


class WrappedLinear(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        w = torch.randn(3, 8, generator=torch.Generator().manual_seed(0))
        self.register_buffer("weight", Wrapped(w))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x.mean(1), self.weight)


def test_the_probe_under_autocast_keeps_a_tensor_subclass_working():
    """Under autocast the probe chunk ran each call with all Python dispatch off, tensor
    subclasses' included: a wrapper-subclass weight then failed ("its data is not allocated
    yet") with the automatic chunk while chunk_size=8 ran. Both run now, with the same
    numbers."""
    model = WrappedLinear().eval()
    x = torch.randn(4, 1, 8, generator=torch.Generator().manual_seed(1))
    runs = {}
    for chunk in (None, 8):
        m = TokenSensitivity(model, Sequence(), sigma=0.5, repeats=8, generator=0,
                             chunk_size=chunk, autocast=torch.bfloat16)
        m.update(x)
        runs[chunk] = m.compute().per_sample
    assert torch.equal(runs[None], runs[8])
