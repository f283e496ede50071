"""The estimator's random stream: Gaussian rows, or vocabulary picks, drawn in fixed blocks, so
that the numbers a copy receives do not depend on how the copies are chunked into forward
passes."""

from __future__ import annotations

import torch
from torch import Tensor

#: Noise is drawn from the generator in blocks of this many numbers, whatever the chunk size,
#: so chunked and unchunked evaluation consume the random stream identically. Vocabulary picks
#: (``replace_with``) are drawn in blocks of this many picks.
NOISE_BLOCK = 1 << 18

#: The dtype every draw is made in, whatever ``torch.get_default_dtype()`` says: a float64
#: default (``torch.set_default_dtype(torch.float64)``) drew other numbers from the same seed
#: (0.2031 for a sensitivity of 0.1667 at the float32 default), and a float64 model measured
#: under the float64 default other numbers than the same model under the float32 default.
DRAW_DTYPE = torch.float32


class NoiseStream:
    """Standard-normal rows of length ``row`` drawn in fixed-size blocks (see
    :data:`NOISE_BLOCK`); ``take(n)`` hands out the next ``n`` rows of one endless sequence.

    A metric with ``replace_with`` takes vocabulary picks instead (:meth:`randint`), drawn in
    blocks of :data:`NOISE_BLOCK` picks the same way. One stream hands out one kind or the other,
    never both, so ``buf`` holds what has been drawn but not handed out yet: float32 rows
    (k, ``row``) or int64 picks (k,). The generator's state and ``buf`` are the whole position
    of the stream, which is what a paired comparison (:mod:`.compare`) and a torchmetrics copy
    carry from one model or process to the next."""

    def __init__(self, generator: torch.Generator, row: int, device: torch.device) -> None:
        if row < 1:  # the metrics refuse such tokens first, by name (a bare ZeroDivisionError)
            raise ValueError(
                f"noise rows of {row} numbers: a token of no entries has no noise to draw; "
                "tokens need at least one feature")
        self.gen, self.row, self.device = generator, row, device
        self.rows_per_block = max(1, NOISE_BLOCK // row)
        self.buf = torch.empty(0, row, dtype=DRAW_DTYPE, device=device)
        #: the range of the picks in ``buf`` (None: not known, e.g. a copied stream's)
        self.high: int | None = None

    def _pending(self, picks: bool) -> Tensor:
        """``buf``, empty of the other kind if it held none of it."""
        if (self.buf.dtype == torch.int64) != picks:
            if len(self.buf):
                raise RuntimeError(
                    "NoiseStream: Gaussian rows and vocabulary picks asked of one stream; "
                    "a metric takes one kind only (this is a bug in senslab)")
            self.buf = (torch.empty(0, dtype=torch.int64, device=self.device) if picks
                        else torch.empty(0, self.row, dtype=DRAW_DTYPE, device=self.device))
        return self.buf

    def _to_device(self, block: Tensor) -> Tensor:
        # a copy to the CPU must not be asynchronous: the host reads the block at once, and
        # a non-blocking device-to-host copy may not have landed yet (a CUDA generator with a
        # model on the CPU); to an accelerator it overlaps with the drawing of the next block
        return block.to(self.device, non_blocking=self.device.type != "cpu")

    def take(self, n: int) -> Tensor:
        """The next ``n`` rows, shape (n, row), float32, on ``device``."""
        buf = self._pending(picks=False)
        parts = [buf]
        have = len(buf)
        while have < n:
            block = torch.randn(
                self.rows_per_block, self.row, generator=self.gen, device=self.gen.device,
                dtype=DRAW_DTYPE,
            )
            parts.append(self._to_device(block))
            have += self.rows_per_block
        allrows = torch.cat(parts) if len(parts) > 1 else buf
        out, self.buf = allrows[:n], allrows[n:]
        return out

    def take_antithetic(self, n: int) -> Tensor:
        """``n`` (even) rows ε₁, −ε₁, ε₂, −ε₂, …: ``n/2`` fresh rows, each followed by its
        negation (antithetic pairs)."""
        half = self.take(n // 2)
        return torch.stack([half, -half], dim=1).reshape(n, self.row)

    def randint(self, high: int, n: int) -> Tensor:
        """The next ``n`` of one endless sequence of uniform integers in [0, ``high``), drawn
        from the generator in blocks of :data:`NOISE_BLOCK` whatever ``n`` is.

        Drawn ``n`` at a time, as a chunk asked, the picks depended on the chunking wherever
        the generator's numbers depend on how a draw is split into calls (a CUDA generator
        gives each call its own offset into its stream): another ``chunk_size``, the automatic
        size, or padding-aware batching (``trim_padding``) put other vocabulary rows in the same
        copies, and two models of a paired comparison, chunked differently, were not paired.
        Fixed blocks make pick ``k`` of the stream a function of ``k`` alone. On the CPU,
        whose generator draws one number after another, the picks are those drawn ``n`` at a
        time."""
        buf = self._pending(picks=True)
        if self.high is not None and high != self.high and len(buf):
            raise RuntimeError(
                f"NoiseStream: picks in [0, {high}) asked of a stream holding picks in "
                f"[0, {self.high}) (this is a bug in senslab)")
        self.high = high
        parts = [buf]
        have = len(buf)
        while have < n:
            block = torch.randint(high, (NOISE_BLOCK,), generator=self.gen,
                                  device=self.gen.device)
            parts.append(self._to_device(block))
            have += NOISE_BLOCK
        picks = torch.cat(parts) if len(parts) > 1 else buf
        out, self.buf = picks[:n], picks[n:]
        return out
