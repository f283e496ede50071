"""Audit 81 of ``auto_tokens`` on Hugging Face text architectures not covered before: the module
picked must put out the vectors entering the first block, noise there reaching that block as it
is (σ in its units), or the model is refused with a fix that does so. Covers a final norm named
like an embedding norm (LFM2's ``embedding_norm``, BigBird-Pegasus' ``layernorm_embedding``), a
forward that multiplies the word vectors by a local √hidden_size (T5Gemma's encoder), and a
norm run both on the word vectors and after the last layer (NanoChat's ``norm``). Random-init
models from small configs (offline)."""

from __future__ import annotations

import pytest
import torch
from hf_blocks import block_noise, has, seeded

transformers = pytest.importorskip("transformers")

from senslab import auto_tokens  # noqa: E402


def ids(b: int = 2, t: int = 6) -> torch.Tensor:
    x = torch.randint(5, 100, (b, t), generator=torch.Generator().manual_seed(0))
    x[:, -1] = 2  # an eos, where a seq2seq classifier reads
    return x


# -- a final norm named like an embedding norm ------------------------------------------------

def lfm2():
    has("Lfm2ForCausalLM")
    return seeded(lambda: transformers.Lfm2ForCausalLM(transformers.Lfm2Config(
        vocab_size=100, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=2, num_key_value_heads=2, layer_types=["conv", "full_attention"],
        pad_token_id=0)))


def test_lfm2s_final_embedding_norm_is_not_taken_for_its_tokens():
    """Lfm2Model calls its ``embedding_norm`` after its last layer (its final norm): auto_tokens
    picked it by its name, and the noise went on the last hidden states, none of it reaching
    the first block (a model measured at its output, not at its tokens)."""
    model = lfm2()
    batch = {"input_ids": ids()}
    assert block_noise(model, "model.embedding_norm", model.model.layers[0], batch) == 0.0
    assert auto_tokens(model).module == "model.embed_tokens"
    assert block_noise(model, "model.embed_tokens", model.model.layers[0],
                       batch) == pytest.approx(1.0, rel=1e-5)


def test_bigbird_pegasus_final_layernorm_embedding_is_not_its_tokens():
    """BigBirdPegasusEncoder calls its ``layernorm_embedding`` after its layers (BART calls its
    own before them): it was picked, and the noise went on the encoder's output. The positions
    are added inline, as in Pegasus: refused, naming embedding='word'."""
    has("BigBirdPegasusForSequenceClassification")
    model = seeded(lambda: transformers.BigBirdPegasusForSequenceClassification(
        transformers.BigBirdPegasusConfig(
            vocab_size=100, d_model=32, encoder_layers=1, decoder_layers=1,
            encoder_attention_heads=2, decoder_attention_heads=2, encoder_ffn_dim=64,
            decoder_ffn_dim=64, max_position_embeddings=64, attention_type="original_full",
            pad_token_id=0, eos_token_id=2, bos_token_id=1, decoder_start_token_id=2)))
    batch = {"input_ids": ids(), "attention_mask": torch.ones(2, 6, dtype=torch.long)}
    first = model.model.encoder.layers[0]
    assert block_noise(model, "model.encoder.layernorm_embedding", first, batch) == 0.0
    with pytest.raises(TypeError, match=r"embed_positions.*embedding='word'"):
        auto_tokens(model)
    word = auto_tokens(model, embedding="word").module
    assert word == "model.encoder.embed_tokens"
    assert block_noise(model, word, first, batch) == pytest.approx(1.0, rel=1e-5)


# -- a local √hidden_size in the forward ------------------------------------------------------

def t5gemma():
    has("T5GemmaForSequenceClassification", "T5GemmaModuleConfig")
    part = dict(vocab_size=100, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                num_attention_heads=2, num_key_value_heads=1, head_dim=16,
                query_pre_attn_scalar=16, pad_token_id=0, eos_token_id=2, bos_token_id=1)
    return seeded(lambda: transformers.T5GemmaForSequenceClassification(
        transformers.T5GemmaConfig(encoder=transformers.T5GemmaModuleConfig(**part),
                                   decoder=transformers.T5GemmaModuleConfig(**part),
                                   vocab_size=100)))


def test_t5gemmas_encoder_normalizer_refuses_the_block_tokens():
    """T5GemmaEncoder.forward multiplies embed_tokens' output by a local √hidden_size (√32 =
    5.66 here, 48 for t5gemma-2b) on transformers 5 too: auto_tokens picked embed_tokens, and
    noise of norm 1 there reached the first block with norm 5.66, reported as σ."""
    model = t5gemma()
    batch = {"input_ids": ids(), "attention_mask": torch.ones(2, 6, dtype=torch.long)}
    first = model.model.encoder.layers[0]
    assert block_noise(model, "model.encoder.embed_tokens", first,
                       batch) == pytest.approx(32 ** 0.5, rel=1e-4)
    with pytest.raises(TypeError, match=r"sqrt\(config.hidden_size\)=5.65685 .*"
                                        r"embedding='word'.*divided by 5.65685"):
        auto_tokens(model)
    # the fix named: σ/√32 on the word embedding is σ at the first block
    word = auto_tokens(model, embedding="word").module
    assert word == "model.encoder.embed_tokens"
    assert block_noise(model, word, first, batch) / 32 ** 0.5 == pytest.approx(1.0, rel=1e-4)


# -- a norm run on the word vectors and again after the last layer ----------------------------

def test_nanochats_norm_before_its_layers_refuses_the_block_tokens():
    """NanoChatModel.forward runs its ``norm`` on the word vectors before the first block and
    again after the last layer: auto_tokens picked embed_tokens, whose noise reached the first
    block rescaled by that norm (3.1 times its size here), reported as σ. No module puts out the
    first block's input alone: refused, naming embedding='word'."""
    has("NanoChatForCausalLM")
    model = seeded(lambda: transformers.NanoChatForCausalLM(transformers.NanoChatConfig(
        vocab_size=100, hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
        num_key_value_heads=2, intermediate_size=64, pad_token_id=0)))
    noise = block_noise(model, "model.embed_tokens", model.model.layers[0],
                        {"input_ids": ids()})
    assert abs(noise - 1.0) > 0.5
    with pytest.raises(TypeError, match=r"model\.norm.*after its last layer.*"
                                        r"embedding='word'"):
        auto_tokens(model)
    assert auto_tokens(model, embedding="word").module == "model.embed_tokens"


# -- the rules that stay as they were ---------------------------------------------------------

@pytest.mark.parametrize("make, module", [
    (lambda: transformers.BartForSequenceClassification(transformers.BartConfig(
        vocab_size=100, d_model=32, encoder_layers=1, decoder_layers=1,
        encoder_attention_heads=2, decoder_attention_heads=2, encoder_ffn_dim=64,
        decoder_ffn_dim=64, max_position_embeddings=64, pad_token_id=0, eos_token_id=2)),
     "model.encoder.layernorm_embedding"),
    (lambda: transformers.BloomForSequenceClassification(transformers.BloomConfig(
        vocab_size=100, hidden_size=32, n_layer=1, n_head=2, pad_token_id=0)),
     "transformer.word_embeddings_layernorm"),
])
def test_an_embedding_norm_called_before_the_layers_is_still_picked(make, module):
    model = seeded(make)
    assert auto_tokens(model).module == module
    first = next(m for n, m in model.named_modules()
                 if n.endswith(("encoder.layers.0", "transformer.h.0")))
    batch = {"input_ids": ids(), "attention_mask": torch.ones(2, 6, dtype=torch.long)}
    assert block_noise(model, module, first, batch) == pytest.approx(1.0, rel=1e-5)
