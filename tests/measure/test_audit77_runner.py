"""Audit of padding-aware batching and chunking (senslab.measure._runner, _chunks, _trim): the
number must not depend on trim_padding or chunk_size."""

from __future__ import annotations

import warnings

import pytest
import torch
from torch import nn

from senslab.measure import TokenSensitivity, token_sensitivity
from senslab.tokens import Embedding

PAD = 1


def right_padded(b: int, t: int, seed: int, shortest: int = 4) -> dict[str, torch.Tensor]:
    """Token ids in [2, 50) (never the pad id), right-padded with PAD to real lengths drawn
    from [shortest, t − 2]."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(2, 50, (b, t), generator=g)
    lengths = torch.randint(shortest, t - 1, (b,), generator=g)
    mask = torch.arange(t)[None] < lengths[:, None]
    return {"input_ids": ids.masked_fill(~mask, PAD), "attention_mask": mask}


class MaxPooledCNN(nn.Module):
    """A text CNN pooled by a max over every position, padding included (its attention mask is
    taken and ignored): the padding's values (ReLU of the bias) lose to the real ones on the
    clean inputs, so cutting the padding leaves every clean output as it is, but a noisy copy
    whose real values drop below them reads the padding at full width."""

    def __init__(self) -> None:
        super().__init__()
        self.embedding = nn.Embedding(50, 8, padding_idx=PAD)
        self.conv = nn.Conv1d(8, 4, 3, padding=1)
        with torch.no_grad():
            self.conv.bias.fill_(0.1)
        self.head = nn.Linear(4, 3)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        h = self.embedding(input_ids).transpose(1, 2)
        return self.head(torch.relu(self.conv(h)).amax(-1))


def test_a_model_that_reads_its_paddings_content_is_not_trimmed():
    """The cut check compared clean outputs only, which this model keeps when cut, so trimming
    stayed on: 0.19085 measured where the padded inputs give 0.19280 (compare='l2', seed 2),
    without a word. Noise on the padding of the most padded examples finds it."""
    torch.manual_seed(2)  # test-only: model init
    model = MaxPooledCNN().double().eval()
    batch = right_padded(8, 16, seed=2)
    cut = {k: v[:, :int(batch["attention_mask"].sum(1).max())] for k, v in batch.items()}
    assert torch.equal(model(**cut), model(**batch))  # the clean outputs hide it
    opts = {"sigma": 1.0, "repeats": 4, "generator": 0, "compare": "l2"}
    plain = token_sensitivity(model, batch, Embedding("embedding"), trim_padding=False, **opts)
    metric = TokenSensitivity(model, Embedding("embedding"), **opts)
    with pytest.warns(RuntimeWarning, match="padding-aware batching is off.*noise on the padding"):
        metric.update(batch)
    assert not metric.last_trimmed
    assert metric.compute().estimate == plain.estimate
    assert torch.equal(metric.compute().per_sample, plain.per_sample)


class MaskedMean(nn.Module):
    """Token vectors through a per-position MLP, averaged over the real positions only: it
    ignores its padding, content and all."""

    def __init__(self) -> None:
        super().__init__()
        self.embedding = nn.Embedding(50, 8, padding_idx=PAD)
        self.mlp = nn.Sequential(nn.Linear(8, 8), nn.ReLU())
        self.head = nn.Linear(8, 3)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        h = self.mlp(self.embedding(input_ids))
        m = attention_mask.unsqueeze(-1).to(h.dtype)
        return self.head((h * m).sum(1) / m.sum(1))


@pytest.mark.parametrize("chunk_size", [None, 1, 3, 10_000])
def test_a_model_that_ignores_its_padding_is_still_trimmed_to_the_same_number(chunk_size):
    """The padding check does not switch trimming off for a model that masks its padding, and
    the number is the padded one whatever the chunk size."""
    torch.manual_seed(2)  # test-only: model init
    model = MaskedMean().double().eval()
    batch = right_padded(8, 16, seed=2)
    opts = {"sigma": 1.0, "repeats": 2, "generator": 0, "compare": "l2"}
    plain = token_sensitivity(model, batch, Embedding("embedding"), trim_padding=False, **opts)
    metric = TokenSensitivity(model, Embedding("embedding"), chunk_size=chunk_size, **opts)
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        metric.update(batch)
    assert metric.last_trimmed
    assert torch.equal(metric.compute().per_sample, plain.per_sample)
