"""Chunked evaluation of the perturbed copies of one batch (the estimator's inner loop)."""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from ..tokens.base import BoundTokens
from . import _chunks
from ._noise import NoiseStream
from .outputs import check_rows, predictions


def _check_finite(out: Tensor, what: str) -> None:
    if not torch.isfinite(out).all():
        bad = (~torch.isfinite(out.reshape(len(out), -1))).any(dim=1).nonzero().flatten()
        raise FloatingPointError(
            f"model output is NaN or infinite on {len(bad)} {what} (first at row {bad[0].item()}); "
            "sensitivity is undefined there — check the model's weights and the inputs"
        )


class ChunkRunner:
    """Evaluates the copies of one batch chunk by chunk; sizes the chunks on the first call
    (probe) when the chunk size is automatic, and keeps that size for later rounds.

    Use it as a context manager around all rounds of one batch: with ``compile=True`` the bound
    tokenization's model is swapped for the compiled one once the chunk size is known, and
    leaving the ``with`` block (also by an error) puts the original model back.
    """

    def __init__(
        self, metric: Any, bound: BoundTokens, stream: NoiseStream, ref: Tensor,
        whole: bool, device: torch.device, control: Any = None, per_copy: float | None = None,
    ) -> None:
        self.m, self.bound, self.stream, self.ref, self.whole = metric, bound, stream, ref, whole
        self.chunk = metric.chunk_size
        self.budget = metric.memory_budget or (
            _chunks.default_budget(device) if self.chunk is None else 0
        )
        self.compiled = False
        self._original: Any = None  #: ``bound.model`` before the compiled model replaced it
        self.control = control
        self.meter: _chunks.ActivationMeter | None = None
        self.input_bytes = 0
        #: bytes one copy costs: from an earlier probe on inputs of the same shape, or measured
        self.per_copy = per_copy

    def __enter__(self) -> ChunkRunner:
        return self

    def __exit__(self, *exc: object) -> None:
        self.restore()

    def restore(self) -> None:
        """Give the bound tokenization its own model back if the compiled one replaced it."""
        if self.compiled:
            self.bound.model = self._original  # type: ignore[attr-defined]
            self._original, self.compiled = None, False

    def run(self, src: Tensor, tok: Tensor, own: Tensor) -> Tensor:
        n = len(src)
        vals = torch.empty(n, dtype=torch.float32, device=self.ref.device)
        pos = 0
        if self.chunk is None and self.per_copy is not None:
            self.chunk = _chunks.chunk_from_probe(self.per_copy, 1, self.budget, n,
                                                  even=self.m.antithetic)
        while pos < n:
            if self.chunk is None:  # probe: evaluate a few copies while metering allocations
                sl = slice(pos, pos + _chunks.PROBE_COPIES)
                self.meter = _chunks.ActivationMeter(self.m.model, self.ref.device)
                vals[sl] = self._evaluate(src[sl], tok[sl], own[sl])
                evaluated = int(own[sl].sum())
                if evaluated:
                    # a callable without modules to hook: count its inputs (copies) twice
                    floor = 2 * self.input_bytes * evaluated
                    self.per_copy = max(self.meter.peak, floor) / evaluated
                    self.chunk = _chunks.chunk_from_probe(
                        self.per_copy, 1, self.budget, n, even=self.m.antithetic
                    )
                self.meter = None
            else:
                sl = slice(pos, pos + self.chunk)
                vals[sl] = self._evaluate(src[sl], tok[sl], own[sl])
            pos = min(sl.stop, n)
        return vals

    def _evaluate(self, src: Tensor, tok: Tensor, own: Tensor) -> Tensor:
        """Values of the copies of one chunk. Randomness is drawn for every copy of the chunk
        (so every shard consumes the stream alike); only ``own`` copies are evaluated."""
        m, stream, bound = self.m, self.stream, self.bound
        if m.replace_with is not None:
            vocab = m.replace_with.to(self.ref.device)
            pick = vocab[stream.randint(len(vocab), len(src))]
        elif m.antithetic:
            noise = stream.take_antithetic(len(src)).mul_(m.sigma)
        else:
            noise = stream.take(len(src)).mul_(m.sigma)
        out_vals = torch.zeros(len(src), dtype=torch.float32, device=self.ref.device)
        idx = None
        if not own.all():
            idx = own.nonzero().flatten()
            if len(idx) == 0:
                return out_vals
            src, tok = src[idx], tok[idx]
            if m.replace_with is not None:
                pick = pick[idx]
            else:
                noise = noise[idx]
        if m.replace_with is not None:
            clean = bound.tokens(src, tok)
            noise = pick.to(clean.dtype) - clean  # in the tokens' dtype: never rounded
        elif self.whole:
            noise = noise.view(len(src), -1, bound.dim)
        if m.compile and not self.compiled and self.chunk is not None:
            self._original = bound.model  # type: ignore[attr-defined]
            bound.model = m._compiled_model()  # type: ignore[attr-defined]
            self.compiled = True
        if self.meter is not None:
            self.input_bytes = max(noise[0].numel() * noise.element_size(), 1)
            with self.meter:
                out = bound.forward_perturbed(src, None if self.whole else tok, noise)
        else:
            out = bound.forward_perturbed(src, None if self.whole else tok, noise)
        vals = self._compare(out, src)
        if self.control is not None:
            vals = self.control.adjust(vals, src, tok, noise)
        if idx is None:
            return vals
        return out_vals.index_copy_(0, idx, vals)

    def _compare(self, out: Tensor, src: Tensor) -> Tensor:
        check_rows(out, len(src), "perturbed copies")
        _check_finite(out, "perturbed copies")
        ref = self.ref
        if self.m.compare == "class":
            return (predictions(out, self.m.kind, self.m.threshold) != ref[src]).float()
        if out[0].shape != ref[0].shape:
            raise ValueError(
                f"the model's output per example has shape {tuple(out.shape[1:])} on perturbed "
                f"copies but {tuple(ref.shape[1:])} on the clean inputs; compare='{self.m.compare}'"
                " needs outputs of one fixed shape"
            )
        diff = (out.float() - ref[src]).reshape(len(src), -1)
        return diff.abs().sum(1) if self.m.compare == "l1" else diff.norm(dim=1)
