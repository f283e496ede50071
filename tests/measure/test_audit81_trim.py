"""Audit of padding-aware batching (senslab.measure._trim): trimming gives the padded inputs'
number or is switched off with a word."""

from __future__ import annotations

import warnings

import pytest
import torch
from torch import nn

from senslab.measure import TokenSensitivity, token_sensitivity
from senslab.tokens import Embedding

PAD = 1


def right_padded(seed: int) -> dict[str, torch.Tensor]:
    """8 examples of 16 token ids in [2, 50), right-padded with PAD to real lengths in [8, 14]
    (the first example full)."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(2, 50, (8, 16), generator=g)
    lengths = torch.randint(8, 15, (8,), generator=g)
    lengths[0] = 16
    mask = torch.arange(16)[None] < lengths[:, None]
    return {"input_ids": ids.masked_fill(~mask, PAD), "attention_mask": mask}


class TextCNN(nn.Module):
    """The common text CNN: embeddings zeroed on the padding (``* attention_mask``), a
    convolution, a max over time — over every position, padding included, unless
    ``masked_max``."""

    def __init__(self, seed: int, masked_max: bool = False) -> None:
        super().__init__()
        torch.manual_seed(seed)  # test-only: model init
        self.emb = nn.Embedding(50, 16, padding_idx=PAD)
        self.conv = nn.Conv1d(16, 4, 3, padding=1)
        self.head = nn.Linear(4, 3)
        self.masked_max = masked_max

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        m = attention_mask[..., None].to(self.emb.weight.dtype)
        h = torch.relu(self.conv((self.emb(input_ids) * m).transpose(1, 2)))
        if self.masked_max:
            h = h.masked_fill(~attention_mask.bool()[:, None, :], float("-inf"))
        return self.head(h.amax(dim=2))


OPTS = {"sigma": 2.0, "repeats": 8, "generator": 3}


def test_a_text_cnn_that_carries_its_last_token_into_the_padding_is_not_trimmed():
    """The first padding position's convolution reads the last real token, and the max over
    every position reads it; the padding's noise is zeroed by the mask and the clean maxima are
    at real positions, so both checks passed and trimming measured 0.2160 where the padded
    inputs give 0.2211 (two examples 0.25 for 0.2656, 0.2969 for 0.3125), without a word."""
    model, batch = TextCNN(9).double().eval(), right_padded(9)
    with torch.no_grad():  # the clean outputs hide it (examples 1–7 are at most 14 long)
        cut = {k: v[1:, :14] for k, v in batch.items()}
        assert torch.equal(model(**cut), model(**batch)[1:])
    plain = token_sensitivity(model, batch, Embedding("emb"), trim_padding=False, **OPTS)
    metric = TokenSensitivity(model, Embedding("emb"), **OPTS)
    with pytest.warns(RuntimeWarning, match="padding-aware batching is off.*carries the real "
                                            "tokens into the padding.*Mask the padding"):
        metric.update(batch)
    assert not metric.last_trimmed and metric.untrimmed_batches == 1
    result = metric.compute()
    assert torch.equal(result.per_sample, plain.per_sample)
    assert result.estimate == pytest.approx(0.2211, abs=5e-5)


def test_a_text_cnn_with_a_masked_max_is_still_trimmed_to_the_same_number():
    """The new check leaves a model that masks its padding before the max to trimming."""
    model, batch = TextCNN(9, masked_max=True).double().eval(), right_padded(9)
    plain = token_sensitivity(model, batch, Embedding("emb"), trim_padding=False, **OPTS)
    metric = TokenSensitivity(model, Embedding("emb"), **OPTS)
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        metric.update(batch)
    assert metric.last_trimmed
    assert torch.equal(metric.compute().per_sample, plain.per_sample)
    assert 0.0 < plain.estimate < 1.0


def test_a_callbacks_right_padded_additive_mask_is_not_called_left_padded():
    """An additive attention mask (0 on real tokens, −1e9 on padding), read as "nonzero is real",
    made right padding look left-padded: the callback refused its subset at construction, asking
    to pad on the right, although it was and ``mask=`` said which tokens are real (which the
    measurement reads instead of such an entry)."""
    pytest.importorskip("transformers")
    from senslab.integrations.hf import SensitivityCallback

    batch = right_padded(0)
    real = batch["attention_mask"]
    additive = {"input_ids": batch["input_ids"], "attention_mask": (~real).float() * -1e9}
    SensitivityCallback(additive, Embedding("emb"), mask=real, sigma=2.0)  # no refusal
    left = {"input_ids": batch["input_ids"], "attention_mask": real.flip(1).long()}
    with pytest.raises(ValueError, match="SensitivityCallback: the inputs are left-padded"):
        SensitivityCallback(left, Embedding("emb"), sigma=2.0)
