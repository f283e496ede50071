"""Small models shared by the metric tests."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager

import torch
from torch import nn


class Text(nn.Module):
    """Token ids → embedding → two same-shaped LayerNorms (``norm``, ``norm2``) → mean → 2
    logits: two layers whose descriptions are equal, for telling layers apart."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)  # test-only: init
        self.emb, self.norm, self.norm2 = nn.Embedding(10, 8), nn.LayerNorm(8), nn.LayerNorm(8)
        self.head = nn.Linear(8, 2)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.head(self.norm2(self.norm(self.emb(ids))).mean(1))


class Meter:
    """Counts forwards running at once (``most``). The first forward waits (up to a second)
    for a second one to enter, so two threads that may measure at the same time do so every
    time, not by chance."""

    def __init__(self) -> None:
        self.guard, self.other = threading.Lock(), threading.Event()
        self.inside = self.most = 0
        self.waited = False

    @contextmanager
    def running(self) -> Iterator[None]:
        with self.guard:
            self.inside += 1
            self.most = max(self.most, self.inside)
            if self.inside > 1:
                self.other.set()
            wait, self.waited = not self.waited, True
        if wait:
            self.other.wait(1.0)
        try:
            yield
        finally:
            with self.guard:
                self.inside -= 1


def patch_net() -> nn.Module:
    """A linear classifier of 1×4×4 images into 3 classes (seeded)."""
    torch.manual_seed(0)  # test-only: init
    return nn.Sequential(nn.Flatten(), nn.Linear(16, 3))


def patch_batches(n: int) -> torch.Tensor:
    """``n`` batches of 16 random 1×4×4 images, (n, 16, 1, 4, 4)."""
    return torch.randn(n, 16, 1, 4, 4, generator=torch.Generator().manual_seed(1))


class Logit:
    """One logit z = Σ_t w_t·x_t + b per example (class 1 iff z > 0)."""

    output_kind = "logits"

    def __init__(self, w: torch.Tensor, bias: float) -> None:
        self.w, self.bias = w, bias

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return (x * self.w).sum((1, 2)) + self.bias
