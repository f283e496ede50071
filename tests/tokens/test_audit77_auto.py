"""Audit 77 of ``auto_tokens``: the module it picks must put out the vectors that enter the
model's first block (``embedding="block"``), or be refused where no module does, for text
architectures whose forward scales or projects the embeddings outside the rules' usual modules.
Random-init models from small configs (offline)."""

from __future__ import annotations

import warnings

import pytest
import torch

transformers = pytest.importorskip("transformers")

from senslab import Embedding, TokenSensitivity, auto_tokens  # noqa: E402

DECODER = dict(vocab_size=100, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
               intermediate_size=64, num_key_value_heads=2, pad_token_id=0,
               max_position_embeddings=32)


def seeded(make):
    torch.manual_seed(0)  # test-only: Hugging Face initialises from the global RNG
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return make().eval()


def ids(b: int = 2, t: int = 6) -> torch.Tensor:
    return torch.randint(5, 100, (b, t), generator=torch.Generator().manual_seed(0))


def picked_and_block_input(model, first_layer: torch.nn.Module, batch: torch.Tensor):
    """(output of the module auto_tokens picks, hidden states entering ``first_layer``)."""
    got: dict[str, torch.Tensor] = {}
    target = model.get_submodule(auto_tokens(model).module)
    h1 = target.register_forward_hook(lambda m, a, o: got.setdefault("tokens", o.clone()))

    def pre(m, args, kwargs):
        got.setdefault("block", kwargs.get("hidden_states", args[0] if args else None).clone())

    h2 = first_layer.register_forward_pre_hook(pre, with_kwargs=True)
    try:
        with torch.no_grad():
            model(input_ids=batch)
    finally:
        h1.remove()
        h2.remove()
    return got["tokens"], got["block"]


def granite(multiplier: float):
    if not hasattr(transformers, "GraniteForCausalLM"):
        pytest.skip("this transformers has no Granite")
    return seeded(lambda: transformers.GraniteForCausalLM(transformers.GraniteConfig(
        **DECODER, embedding_multiplier=multiplier)))


def test_an_embedding_multiplier_inside_the_forward_refuses_the_block_tokens():
    """Granite multiplies embed_tokens' output by embedding_multiplier (12 in its checkpoints)
    inside GraniteModel.forward. auto_tokens picked embed_tokens, so σ on it was 12σ on the
    vectors entering the first block, reported as σ: on two models computing the same
    function (multiplier 12; multiplier 1 with the embedding weights ×12) σ=0.1 gave a
    sensitivity of 0.167 and 0.042."""
    with pytest.raises(TypeError, match=r"embedding_multiplier=12.*embedding='word'.*divided"):
        auto_tokens(granite(12.0))
    assert auto_tokens(granite(1.0)).module == "model.embed_tokens"  # no scaling: as before


def test_the_named_fix_for_a_multiplier_measures_sigma_at_the_first_block():
    scaled = granite(12.0)
    plain = granite(1.0)  # the same function: its embedding weights carry the factor
    plain.load_state_dict(scaled.state_dict())
    with torch.no_grad():
        plain.model.embed_tokens.weight.mul_(12.0)
    batch = {"input_ids": ids(4, 6)}

    def rate(model, tokens, sigma):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            metric = TokenSensitivity(model, tokens, sigma=sigma, repeats=8, generator=0)
            metric.update(batch)
            return float(metric.compute())

    reference = rate(plain, auto_tokens(plain), 0.1)  # σ on the first block's input
    fix = rate(scaled, auto_tokens(scaled, embedding="word"), 0.1 / 12.0)
    before = rate(scaled, Embedding("model.embed_tokens"), 0.1)  # the old pick: 12σ there
    assert 0.0 < reference < before
    assert fix == pytest.approx(reference, abs=1e-9)


def test_fnet_gets_its_embeddings_block_output_after_the_projection():
    """FNetEmbeddings maps its LayerNorm's output through a Linear ``projection``; the
    LayerNorm was picked, so the noise reached the first block through that map (the vectors
    differed by 3.4, their norms by a factor 0.11)."""
    if not hasattr(transformers, "FNetForSequenceClassification"):
        pytest.skip("this transformers has no FNet")
    model = seeded(lambda: transformers.FNetForSequenceClassification(transformers.FNetConfig(
        vocab_size=100, hidden_size=32, num_hidden_layers=2, intermediate_size=64)))
    tokens, block = picked_and_block_input(model, model.fnet.encoder.layer[0], ids())
    assert auto_tokens(model).module == "fnet.embeddings"
    torch.testing.assert_close(tokens, block, rtol=0, atol=0)


def test_mobilebert_keeps_its_layernorm_whose_linear_map_comes_before_it():
    model = seeded(lambda: transformers.MobileBertModel(transformers.MobileBertConfig(
        vocab_size=100, hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
        intermediate_size=64, embedding_size=16, intra_bottleneck_size=32,
        true_hidden_size=32)))
    assert auto_tokens(model).module == "embeddings.LayerNorm"


def test_ctrl_gets_the_dropout_after_its_scaled_words_plus_positions():
    """CTRL multiplies its word vectors by sqrt(d_model) and adds sinusoidal positions inside
    CTRLModel.forward, then applies ``dropout``. The word embedding ``w`` was picked: its
    output was 1/sqrt(d) of what enters the first block, without positions (norm ratio 6.3)."""
    if not hasattr(transformers, "CTRLForSequenceClassification"):
        pytest.skip("this transformers has no CTRL")
    model = seeded(lambda: transformers.CTRLForSequenceClassification(transformers.CTRLConfig(
        vocab_size=100, n_embd=32, n_layer=2, n_head=2, dff=64, pad_token_id=0)))
    tokens, block = picked_and_block_input(model, model.transformer.h[0], ids())
    assert auto_tokens(model).module == "transformer.dropout"
    torch.testing.assert_close(tokens, block, rtol=0, atol=0)
