"""A seq2seq model's decoder logits, (batch, decoder positions, vocabulary), are no per-position
output of the inputs' tokens: they are compared whole (``compare='l1'``/``'l2'``), also on
copies cut to a width that happens to equal the decoder's length, which were read at one
position as a causal LM's logits are."""

from __future__ import annotations

import warnings

import pytest
import torch

from senslab.measure import TokenSensitivity, token_sensitivity
from senslab.tokens import Embedding

from .test_padding import right_padded

transformers = pytest.importorskip("transformers")


def bart():
    config = transformers.BartConfig(
        vocab_size=50, d_model=16, encoder_layers=1, decoder_layers=1,
        encoder_attention_heads=2, decoder_attention_heads=2, encoder_ffn_dim=32,
        decoder_ffn_dim=32, max_position_embeddings=32, pad_token_id=1, dropout=0.0,
        attention_dropout=0.0, activation_dropout=0.0)
    torch.manual_seed(0)  # test-only: HF initialises from the global RNG
    return transformers.BartForConditionalGeneration(config).double().eval()


@pytest.mark.parametrize("decoder_length", [2, 4])
def test_decoder_logits_of_a_cut_width_are_compared_whole_and_trimmed(decoder_length):
    """decoder_input_ids as long as some examples' real tokens: copies cut to that width were
    read at their last real token, (50,) against the clean (2, 50), and the padding-aware
    batching switched itself off with a warning that the model "seems to read positions that
    the mask marks as padding" — it does not. Now trimmed without a word, and the numbers are
    those of the copies at full width."""
    model, batch = bart(), right_padded()
    assert decoder_length in batch["attention_mask"].sum(1).tolist()  # a cut to that width
    batch["decoder_input_ids"] = batch["input_ids"][:, :decoder_length]
    tokens = Embedding("model.encoder.embed_tokens")
    options = {"sigma": 0.3, "compare": "l2", "generator": 1}
    metric = TokenSensitivity(model, tokens, **options)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        metric.update(batch)
    assert metric.last_trimmed
    trimmed = metric.compute()
    full = token_sensitivity(model, batch, tokens, trim_padding=False, **options)
    assert torch.allclose(trimmed.per_sample, full.per_sample, rtol=1e-9, atol=0)
    assert trimmed.num_forward == full.num_forward
    assert bool((full.per_sample > 0).all())
