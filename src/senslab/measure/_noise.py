"""The estimator's random stream: Gaussian rows drawn in fixed blocks, so that the numbers a copy
receives do not depend on how the copies are chunked into forward passes."""

from __future__ import annotations

import torch
from torch import Tensor

#: Noise is drawn from the generator in blocks of this many numbers, whatever the chunk size,
#: so chunked and unchunked evaluation consume the random stream identically.
NOISE_BLOCK = 1 << 18


class NoiseStream:
    """Standard-normal rows of length ``row`` drawn in fixed-size blocks (see
    :data:`NOISE_BLOCK`); ``take(n)`` hands out the next ``n`` rows of one endless sequence."""

    def __init__(self, generator: torch.Generator, row: int, device: torch.device) -> None:
        self.gen, self.row, self.device = generator, row, device
        self.rows_per_block = max(1, NOISE_BLOCK // row)
        self.buf = torch.empty(0, row, device=device)

    def take(self, n: int) -> Tensor:
        """The next ``n`` rows, shape (n, row), on ``device``."""
        parts = [self.buf]
        have = len(self.buf)
        while have < n:
            block = torch.randn(
                self.rows_per_block, self.row, generator=self.gen, device=self.gen.device
            )
            parts.append(block.to(self.device, non_blocking=True))
            have += self.rows_per_block
        allrows = torch.cat(parts) if len(parts) > 1 else self.buf
        out, self.buf = allrows[:n], allrows[n:]
        return out

    def take_antithetic(self, n: int) -> Tensor:
        """``n`` (even) rows ε₁, −ε₁, ε₂, −ε₂, …: ``n/2`` fresh rows, each followed by its
        negation (antithetic pairs)."""
        half = self.take(n // 2)
        return torch.stack([half, -half], dim=1).reshape(n, self.row)

    def randint(self, high: int, n: int) -> Tensor:
        """``n`` uniform integers in [0, high) from the same generator."""
        return torch.randint(high, (n,), generator=self.gen, device=self.gen.device).to(
            self.device
        )
