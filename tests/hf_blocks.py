"""Shared by the auto_tokens tests on Hugging Face architectures: tiny models built from the
seeded global RNG, a skip for classes this transformers lacks, and a probe of how noise on a
module's output reaches the model's first block."""

from __future__ import annotations

import warnings

import pytest
import torch
from torch import nn


def seeded(make):
    torch.manual_seed(0)  # test-only: Hugging Face initialises from the global RNG
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return make().eval()


def has(*names: str) -> None:
    missing = [n for n in names if not hasattr(pytest.importorskip("transformers"), n)]
    if missing:
        pytest.skip(f"this transformers has no {', '.join(missing)}")


def block_noise(model: nn.Module, module: str, first_layer: nn.Module, batch: dict) -> float:
    """Norm of the change of the hidden states entering ``first_layer`` when noise of norm 1 is
    added to ``module``'s output (1 where the noise lands there as it is, 0 where it never
    reaches it)."""
    seen: list[torch.Tensor] = []

    def pre(m, args, kwargs):
        seen.append(kwargs.get("hidden_states", args[0] if args else None).clone())

    noise: dict[str, torch.Tensor] = {}

    def add(m, a, out):
        if "n" not in noise:
            n = torch.randn(out.shape, generator=torch.Generator().manual_seed(1))
            noise["n"] = n / n.norm()
            return out + noise["n"]
        return None

    h = first_layer.register_forward_pre_hook(pre, with_kwargs=True)
    try:
        with torch.no_grad():
            model(**batch)
            g = model.get_submodule(module).register_forward_hook(add)
            try:
                model(**batch)
            finally:
                g.remove()
    finally:
        h.remove()
    return float((seen[1] - seen[0]).norm())
