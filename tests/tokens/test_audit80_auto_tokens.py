"""Audit 80 of ``auto_tokens`` and ``Embedding`` on Hugging Face models as researchers hold them:
the noise must land on the vectors entering the first block in σ's units, or be refused with a
fix that does so. Covers a forward that scales the word vectors (RecurrentGemma's
``normalizer``, Gemma's on transformers 4.x), encoders and decoders sharing one embedding module
(transformers 4.x's T5, Marian; T5 and BART after ``resize_token_embeddings``), the fixes named
for models that add positions inline (OPT-350m's ``project_in``, Marian's ``embed_scale``), and
the pad-id checks for a model inside a wrapper. Random-init models from small configs
(offline)."""

from __future__ import annotations

import re
import warnings

import pytest
import torch
from hf_blocks import block_noise, has, seeded
from torch import nn

transformers = pytest.importorskip("transformers")

from senslab import Embedding, auto_tokens, token_sensitivity  # noqa: E402

DECODER = dict(vocab_size=100, hidden_size=64, num_hidden_layers=1, num_attention_heads=2,
               intermediate_size=64, num_key_value_heads=2, pad_token_id=0,
               max_position_embeddings=32)
SEQ2SEQ = dict(vocab_size=100, d_model=64, encoder_layers=1, decoder_layers=1,
               encoder_attention_heads=2, decoder_attention_heads=2, encoder_ffn_dim=64,
               decoder_ffn_dim=64, max_position_embeddings=32, pad_token_id=1, eos_token_id=2,
               decoder_start_token_id=1)
T5 = dict(vocab_size=100, d_model=32, d_kv=16, d_ff=64, num_layers=1, num_decoder_layers=1,
          num_heads=2, decoder_start_token_id=0, eos_token_id=1)
EXACT = dict(generator=0, precision="float32")


def ids(b: int = 2, t: int = 6) -> torch.Tensor:
    return torch.randint(5, 100, (b, t), generator=torch.Generator().manual_seed(0))


def rate(model, tokens, sigma, batch, **options) -> float:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return float(token_sensitivity(model, batch, tokens, sigma=sigma,
                                       **(dict(repeats=4) | EXACT | options)).estimate)


# -- a forward that multiplies the word vectors ---------------------------------------------

def recurrent_gemma():
    has("RecurrentGemmaForCausalLM")
    return seeded(lambda: transformers.RecurrentGemmaForCausalLM(
        transformers.RecurrentGemmaConfig(
            vocab_size=100, hidden_size=64, intermediate_size=64, num_hidden_layers=1,
            num_attention_heads=2, num_key_value_heads=1, lru_width=64, head_dim=32,
            attention_window_size=16, block_types=["attention"])))


def test_recurrent_gemmas_normalizer_refuses_the_block_tokens():
    """RecurrentGemmaModel.forward multiplies embed_tokens' output by its ``normalizer`` buffer
    (√hidden_size: 8 here, 50.6 for recurrentgemma-2b): auto_tokens picked embed_tokens, and
    noise of norm 1 there reached the first block with norm 8, reported as σ."""
    model = recurrent_gemma()
    assert block_noise(model, "model.embed_tokens", model.model.layers[0],
                       {"input_ids": ids()}) == pytest.approx(8.0, rel=1e-4)
    with pytest.raises(TypeError, match=r"normalizer=8 .*embedding='word'.*divided by 8"):
        auto_tokens(model)


def test_the_fix_for_the_normalizer_measures_sigma_at_the_first_block():
    scaled = recurrent_gemma()
    plain = recurrent_gemma()  # the same function, its embedding weights carrying the factor
    with torch.no_grad():
        plain.lm_head.weight = nn.Parameter(plain.lm_head.weight.clone())  # tied: keep the head
        plain.model.normalizer.fill_(1.0)
        plain.model.embed_tokens.weight.mul_(8.0)
        assert torch.allclose(plain(ids()).logits, scaled(ids()).logits, atol=1e-4)
    assert auto_tokens(plain).module == "model.embed_tokens"  # nothing scales: picked
    batch = {"input_ids": ids(4, 6)}
    reference = rate(plain, Embedding("model.embed_tokens", position=-1), 0.05, batch,
                     compare="l2")
    fix = rate(scaled, auto_tokens(scaled, embedding="word", position=-1), 0.05 / 8,
               batch, compare="l2")
    before = rate(scaled, Embedding("model.embed_tokens", position=-1), 0.05, batch,
                  compare="l2")
    assert fix == pytest.approx(reference, rel=1e-4)
    assert before > 4 * reference


def test_a_gemma_whose_embedding_does_not_scale_is_refused():
    """On transformers 4.x GemmaModel.forward multiplies a plain nn.Embedding's output by
    √hidden_size (a local ``normalizer``, no attribute): σ on embed_tokens was √hidden·σ at the
    first block (×45 for gemma-2b), reported as σ. transformers 5 scales inside the embedding
    (its ``embed_scale``): still picked, the noise landing there as it is."""
    has("GemmaForCausalLM")
    model = seeded(lambda: transformers.GemmaForCausalLM(transformers.GemmaConfig(
        **DECODER, head_dim=32)))
    if getattr(model.model.embed_tokens, "embed_scale", None) is not None:
        assert auto_tokens(model).module == "model.embed_tokens"
        assert block_noise(model, "model.embed_tokens", model.model.layers[0],
                           {"input_ids": ids()}) == pytest.approx(1.0, rel=1e-4)
        # as transformers 4.x builds it: a plain embedding, the factor in GemmaModel.forward
        model.model.embed_tokens = nn.Embedding(100, 64, padding_idx=0)
    with pytest.raises(TypeError, match=r"sqrt\(config.hidden_size\)=8 .*divided by 8"):
        auto_tokens(model)


# -- encoder and decoder sharing one embedding module ----------------------------------------

def share(model: nn.Module) -> nn.Module:
    """``model`` with encoder, decoder and ``shared`` holding one module, as transformers 4.x
    builds T5 (``T5Stack(config, self.shared)``) and ``resize_token_embeddings`` leaves T5 and
    BART on any version."""
    base = getattr(model, "model", None) or getattr(model, "transformer", None) or model
    base.encoder.embed_tokens = base.shared
    base.decoder.embed_tokens = base.shared
    return model


def apply_fix(model: nn.Module, message: str) -> None:
    """Run the code the refusal names (after 'again: ')."""
    code = message.split("again: ", 1)[1]
    exec(code.replace("; ", "\n"), {"model": model})  # noqa: S102 -- the message's own fix


def t5_batch() -> dict:
    x = ids(2, 7)
    x[:, -1] = 1  # the eos the classifier reads
    return {"input_ids": x, "attention_mask": torch.ones_like(x)}


def test_t5s_shared_embedding_is_refused_with_a_fix_that_measures():
    """T5 on transformers 4.x (and after resize_token_embeddings on 5): auto_tokens picked
    ``transformer.shared``, which encoder and decoder both call; the measurement then refused a
    module run twice, advising "the token embedding", which it is — no fix. Now auto_tokens
    names one (an encoder embedding holding the same weights), and it measures what the
    unshared model measures."""
    has("T5ForSequenceClassification")
    make = lambda: transformers.T5ForSequenceClassification(transformers.T5Config(**T5))  # noqa: E731
    own = seeded(make)
    if own.transformer.encoder.embed_tokens is own.transformer.shared:  # transformers 4.x
        own.transformer.encoder.embed_tokens = nn.Embedding(100, 32)
        own.transformer.encoder.embed_tokens.weight = own.transformer.shared.weight
    shared = share(seeded(make))
    with pytest.raises(TypeError, match=r"share one word-embedding module") as err:
        auto_tokens(shared)
    with pytest.raises(ValueError, match="ran 2 times"):  # what the old pick, shared, gave
        rate(shared, Embedding("transformer.shared"), 1.0, t5_batch())
    apply_fix(shared, str(err.value))
    assert auto_tokens(shared).module == "transformer.encoder.embed_tokens"
    assert shared.transformer.encoder.embed_tokens.weight is shared.transformer.shared.weight
    measured = rate(shared, auto_tokens(shared), 1.0, t5_batch())
    assert measured == rate(own, auto_tokens(own), 1.0, t5_batch())


def test_resized_bart_keeps_its_encoders_layernorm_and_refuses_the_shared_word():
    """After resize_token_embeddings BART's encoder, decoder and ``model.shared`` are one
    module, which named_modules names ``model.shared``: auto_tokens read its parent, the whole
    BartModel, and picked ``model.shared`` itself (run twice, refused at the measurement)
    instead of the encoder's ``layernorm_embedding``."""
    has("BartForConditionalGeneration")
    model = seeded(lambda: transformers.BartForConditionalGeneration(
        transformers.BartConfig(**SEQ2SEQ)))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model.resize_token_embeddings(104)
    assert model.model.encoder.embed_tokens is model.model.decoder.embed_tokens
    assert auto_tokens(model).module == "model.encoder.layernorm_embedding"
    with pytest.raises(TypeError, match=r"share one word-embedding module") as err:
        auto_tokens(model, embedding="word")
    apply_fix(model, str(err.value))
    assert auto_tokens(model, embedding="word").module == "model.encoder.embed_tokens"
    batch = {"input_ids": ids(2, 6)}
    assert rate(model, auto_tokens(model, embedding="word"), 1.0, batch, compare="l2",
                output=lambda o: o.logits[:, -1]) > 0


# -- fixes named where positions are added inline --------------------------------------------

def test_opt_with_a_projection_is_told_to_hook_project_in():
    """OPT-350m maps its word vectors into the hidden size (``project_in``) before adding the
    positions. The refusal advised embedding='word', whose noise reached the first block
    through that map (norm 1 → 0.12 here), in other units than σ; it now names project_in,
    whose noise lands there as it is."""
    has("OPTForCausalLM")
    model = seeded(lambda: transformers.OPTForCausalLM(transformers.OPTConfig(
        vocab_size=100, hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
        ffn_dim=64, word_embed_proj_dim=16)))
    with pytest.raises(TypeError, match=r"Embedding\('model.decoder.project_in'\)") as err:
        auto_tokens(model)
    assert "embedding='word')" not in str(err.value)  # no longer the fix named
    first, batch = model.model.decoder.layers[0], {"input_ids": ids()}
    assert block_noise(model, "model.decoder.project_in", first, batch) == \
        pytest.approx(1.0, rel=1e-4)
    assert block_noise(model, "model.decoder.embed_tokens", first, batch) < 0.5


def test_marians_embed_scale_is_named_with_the_factor_to_divide_sigma_by():
    """Marian (and Pegasus) multiply the word vectors by ``embed_scale`` (√d_model: 8 here,
    22.6 for opus-mt) before adding the positions; the refusal advised embedding='word' with
    σ as it is, so 8σ reached the first block."""
    has("MarianMTModel")
    model = seeded(lambda: transformers.MarianMTModel(transformers.MarianConfig(
        **SEQ2SEQ, scale_embedding=True)))
    with pytest.raises(TypeError, match=r"embedding='word'\) with σ divided by 8"):
        auto_tokens(model)
    batch = {"input_ids": ids(), "decoder_input_ids": ids()[:, :3]}
    try:
        word = auto_tokens(model, embedding="word").module
    except TypeError as err:  # transformers 4.x: encoder and decoder share the embedding
        apply_fix(model, str(err))
        word = auto_tokens(model, embedding="word").module
    assert block_noise(model, word, model.model.encoder.layers[0], batch) == \
        pytest.approx(8.0, rel=1e-4)


# -- a Hugging Face model inside a wrapper ---------------------------------------------------

class Wrapper(nn.Module):
    """A LightningModule-style wrapper: ``self.model``, a forward that passes the mask on."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, input_ids, attention_mask=None):
        return self.model(input_ids=input_ids, attention_mask=attention_mask).logits


def padded(pad: int) -> dict:
    g = torch.Generator().manual_seed(0)
    x = torch.randint(5, 100, (8, 10), generator=g)
    real = torch.arange(10)[None] < torch.randint(3, 8, (8,), generator=g)[:, None]
    return {"input_ids": x.masked_fill(~real, pad), "attention_mask": real.long()}


def gpt2_classifier():
    has("GPT2ForSequenceClassification")
    return seeded(lambda: transformers.GPT2ForSequenceClassification(transformers.GPT2Config(
        vocab_size=100, n_embd=32, n_layer=1, n_head=2, pad_token_id=0, num_labels=2)))


def test_a_wrapped_decoder_classifier_has_its_pad_id_checks():
    """The pad-id checks read the measured model's own config, and a wrapper has none: a GPT-2
    classifier in a wrapper, fed padded ids without a mask, measured 0.072 where it measures
    0.143 (refused unwrapped), and fed padding of another id than its pad id, 0.0 (the model
    reads its padding; refused unwrapped). Both are now refused for the wrapper too, naming
    the wrapped model's config."""
    model = gpt2_classifier()
    wrapped = Wrapper(model).eval()
    options = dict(sigma=3.0, repeats=4)
    batch = padded(0)
    assert rate(wrapped, auto_tokens(wrapped), 3.0, batch, repeats=4) == \
        rate(model, auto_tokens(model), 3.0, batch, repeats=4) > 0
    with pytest.raises(ValueError, match=r"pad id 0 \(model\.config\.pad_token_id\)"):
        token_sensitivity(wrapped, {"input_ids": batch["input_ids"]}, auto_tokens(wrapped),
                          **(options | EXACT))
    with pytest.raises(ValueError, match=r"model\.model\.config\.pad_token_id = "):
        token_sensitivity(wrapped, padded(7), auto_tokens(wrapped), **(options | EXACT))


def test_a_wrapper_of_a_classifier_without_a_pad_id_names_where_to_set_it():
    """Named from the wrapper (``model.model.config``), and said for transformers 4.x's GPT-2 too,
    whose refusal was an AssertionError that came through raw."""
    model = gpt2_classifier()
    model.config.pad_token_id = None
    wrapped = Wrapper(model).eval()
    batch = padded(0)
    with pytest.raises(ValueError, match=re.escape("model.model.config.pad_token_id = "
                                                   "tokenizer.pad_token_id")):
        token_sensitivity(wrapped, batch, auto_tokens(wrapped), sigma=1.0, repeats=2, **EXACT)
    one = {k: v[:1, :4] for k, v in batch.items()}  # one unpadded example: its copies refused
    with pytest.raises(ValueError, match=re.escape("model.model.config.pad_token_id = ")):
        token_sensitivity(wrapped, one, auto_tokens(wrapped), sigma=1.0, repeats=2, **EXACT)
