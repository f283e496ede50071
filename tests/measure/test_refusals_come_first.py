"""Hugging Face models senslab cannot measure as given are refused with why and what to do,
before anything else is said: a GPT-2 classifier without ``config.pad_token_id`` (it cannot
find its examples' last real tokens), and a seq2seq model whose output holds no class (the
padding-aware batching's warning came first)."""

from __future__ import annotations

import warnings

import pytest
import torch

from senslab.measure import token_sensitivity
from senslab.tokens import Embedding

from .test_padding import right_padded

transformers = pytest.importorskip("transformers")

FIX = (r"config\.pad_token_id is None.*last token that is not padding.*"
       r"model\.config\.pad_token_id = tokenizer\.pad_token_id")


def gpt2(pad_token_id=None):
    config = transformers.GPT2Config(
        vocab_size=50, n_embd=16, n_layer=2, n_head=2, n_positions=32, resid_pdrop=0.0,
        embd_pdrop=0.0, attn_pdrop=0.0, initializer_range=0.5, pad_token_id=pad_token_id)
    torch.manual_seed(0)  # test-only: HF initialises from the global RNG
    return transformers.GPT2ForSequenceClassification(config).double().eval()


def measure(model, batch, **options):
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the refusal comes first: no warning before it
        warnings.filterwarnings("ignore", "the standard error rests on")  # a toy's few flips
        return token_sensitivity(model, batch, Embedding("transformer.wte"), sigma=1.0,
                                 generator=1, **options)


@pytest.mark.parametrize("options", [{}, {"trim_padding": False}, {"chunk_size": 1}])
def test_a_gpt2_classifier_without_a_pad_id_is_refused_with_the_fix(options):
    """Several examples, padded or not: Hugging Face's own "Cannot handle batch sizes > 1 if no
    padding token is defined" said nothing of what to set."""
    padded = right_padded()
    unpadded = {"input_ids": padded["input_ids"].clamp(min=2),
                "attention_mask": torch.ones_like(padded["attention_mask"])}
    for batch in (padded, unpadded):
        with pytest.raises(ValueError, match=FIX):
            measure(gpt2(), batch, **options)


def test_one_padded_example_without_a_pad_id_is_refused_not_read_at_its_padding():
    """One example is a batch GPT-2 takes without a pad id, but it then reads the logits at the
    last position, padding here: one copy per forward in float32 measured 0 where the example's
    tokens flip 3 times in 4, without a word, and by default a warning about the padding came
    first. Refused; with the pad id set, as the message says, the padded example is measured as
    the unpadded one."""
    one = {k: v[1:2] for k, v in right_padded().items()}
    assert not bool(one["attention_mask"][0, -1])
    for options in ({}, {"chunk_size": 1, "precision": "float32", "trim_padding": False}):
        with pytest.raises(ValueError, match=FIX):
            measure(gpt2(), one, **options)
    width = int(one["attention_mask"].sum())
    unpadded = measure(gpt2(), {k: v[:, :width] for k, v in one.items()}, chunk_size=1,
                       precision="float32")
    fixed = measure(gpt2(pad_token_id=1), one)  # right_padded pads with id 1
    assert torch.equal(fixed.per_sample, unpadded.per_sample)
    assert fixed.estimate > 0.5


def test_a_seq2seq_models_output_of_no_class_is_refused_before_the_padding_warning():
    """BART fed decoder_input_ids returns (batch, decoder positions, vocabulary) logits, which
    hold no class per example: refused, and before the padding-aware batching's check, whose
    warning ("the output has shape (50,) per example on inputs cut to 2 tokens") came first
    where a cut width equalled the decoder's length."""
    config = transformers.BartConfig(
        vocab_size=50, d_model=16, encoder_layers=1, decoder_layers=1,
        encoder_attention_heads=2, decoder_attention_heads=2, encoder_ffn_dim=32,
        decoder_ffn_dim=32, max_position_embeddings=32, pad_token_id=1, dropout=0.0,
        attention_dropout=0.0, activation_dropout=0.0)
    torch.manual_seed(0)
    model = transformers.BartForConditionalGeneration(config).eval()
    batch = right_padded()
    assert 2 in batch["attention_mask"].sum(1).tolist()  # a cut to the decoder's length
    batch["decoder_input_ids"] = batch["input_ids"][:, :2]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(ValueError, match=r"shape \(10, 2, 50\); compare='class' needs"):
            token_sensitivity(model, batch, Embedding("model.encoder.embed_tokens"), sigma=0.3)
