"""Audit 86 (trimint8): padding-aware trimming (senslab.measure._trim) and checked int8
(senslab.measure._int8)."""

from __future__ import annotations

import warnings

import pytest
import torch
from torch import nn

from senslab.measure import TokenSensitivity, token_sensitivity
from senslab.tokens import Embedding

PAD = 1
OPTS = {"sigma": 3.0, "repeats": 2, "generator": 0}


def right_padded(b: int = 10, t: int = 12, seed: int = 0) -> dict:
    """Token ids in [2, 50), real lengths mixed from 1 to t − 2, the first two unpadded."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(2, 50, (b, t), generator=g)
    lengths = torch.randint(1, t - 1, (b,), generator=g)
    lengths[:2] = t
    mask = torch.arange(t)[None] < lengths[:, None]
    return {"input_ids": ids.masked_fill(~mask, PAD), "attention_mask": mask}


class Masked(nn.Module):
    """Three classes and a fourth masked out with a finite constant ``fill``; ``reads``: the
    pooled mean takes every position, padding included (it ignores its attention mask)."""

    def __init__(self, fill: float, reads: bool, per_example: bool = False) -> None:
        super().__init__()
        g = torch.Generator().manual_seed(0)
        self.embedding = nn.Embedding(50, 4)
        self.embed_ln = nn.LayerNorm(4)
        self.head = nn.Linear(4, 3)
        with torch.no_grad():
            for p in self.parameters():
                p.copy_(torch.randn(p.shape, generator=g))
        self.fill, self.reads, self.per_example = fill, reads, per_example

    def forward(self, input_ids, attention_mask):
        h = self.embed_ln(self.embedding(input_ids))
        if self.reads:
            pooled = h.mean(1)
        else:
            m = attention_mask.unsqueeze(-1).to(h.dtype)
            pooled = (h * m).sum(1) / m.sum(1)
        out = torch.cat([self.head(pooled), torch.zeros_like(pooled[:, :1])], 1)
        masked = torch.zeros_like(out, dtype=torch.bool)
        masked[:, 3] = True
        if self.per_example:  # each example its own label set: odd first ids lose class 0
            masked[:, 0] = input_ids[:, 0] % 2 == 1
        return out.masked_fill(masked, self.fill)


@pytest.mark.parametrize("fill", [-1e9, torch.finfo(torch.float32).min, -1e4])
@pytest.mark.parametrize("per_example", [False, True])
def test_a_finite_masking_constant_does_not_hide_a_model_that_reads_its_padding(
        fill, per_example):
    """A class masked with a finite constant (-1e9, or torch.finfo(dtype).min as Hugging Face
    masks) set the row's size the cut check measures a change against: every tolerance became
    astronomical, so a model that reads its padding kept trimming on without a word — 0.52
    measured where the padded inputs give 0.34."""
    model, batch = Masked(fill, reads=True, per_example=per_example).eval(), right_padded()
    metric = TokenSensitivity(model, Embedding("embed_ln"), **OPTS)
    with pytest.warns(RuntimeWarning, match="padding-aware batching is off"):
        metric.update(batch)
    assert not metric.last_trimmed
    plain = token_sensitivity(model, batch, Embedding("embed_ln"), trim_padding=False, **OPTS)
    assert torch.equal(metric.compute().per_sample, plain.per_sample)


@pytest.mark.parametrize("fill", [-1e9, torch.finfo(torch.float32).min])
@pytest.mark.parametrize("per_example", [False, True])
def test_a_finite_masking_constant_still_trims_a_model_that_ignores_its_padding(
        fill, per_example):
    model = Masked(fill, reads=False, per_example=per_example).eval()
    batch = right_padded()
    metric = TokenSensitivity(model, Embedding("embed_ln"), **OPTS)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        metric.update(batch)
    assert metric.last_trimmed
    plain = token_sensitivity(model, batch, Embedding("embed_ln"), trim_padding=False, **OPTS)
    assert torch.equal(metric.compute().per_sample, plain.per_sample)
