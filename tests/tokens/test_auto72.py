"""What ``auto_tokens`` and the clean forward say about three kinds of model (session 72).

XLNet runs sequence-first, so ``auto_tokens`` refuses it and names a wrapper that embeds
batch-first, which then measures; a timm ViT or Swin fed images of another size than it was
built for gets an error naming that size and the fixes (not timm's bare ``AssertionError``);
a pyramid ViT whose first patch embedding is named otherwise than ``patch_embed`` (Twins,
CoaT) gets its first stage's patch, as Swin does. The shaped modules run everywhere; the
transformers and timm models skip where those do not import.
"""

from __future__ import annotations

import warnings

import optional
import pytest
import torch
from torch import nn

from senslab import Embedding, Patches, TokenSensitivity, auto_tokens, token_sensitivity
from senslab.tokens import DEFAULT_CNN_PATCH

EXACT = dict(precision="float32", generator=3)
IMAGENET = {"mean": (0.485, 0.456, 0.406), "std": (0.229, 0.224, 0.225)}


def images(n: int, size: int, seed: int = 1) -> torch.Tensor:
    return torch.randn(n, 3, size, size, generator=torch.Generator().manual_seed(seed))


# --------------------------------------------------------------------------- XLNet
def xlnet() -> nn.Module:
    transformers = pytest.importorskip("transformers")
    if not hasattr(transformers, "XLNetForSequenceClassification"):
        pytest.skip("this transformers has no XLNet")
    torch.manual_seed(0)  # test-only: Hugging Face initialises from the global RNG
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # config notes on token ids outside the toy vocabulary
        config = transformers.XLNetConfig(vocab_size=100, d_model=32, n_layer=2, n_head=2,
                                          d_inner=64, num_labels=2, pad_token_id=0)
        return transformers.XLNetForSequenceClassification(config).eval()


class BatchFirst(nn.Module):
    """The wrapper the refusal describes: it embeds the ids batch-first and hands the vectors
    to the model as ``inputs_embeds``."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None):
        vectors = self.model.get_input_embeddings()(input_ids)
        return self.model(inputs_embeds=vectors, attention_mask=attention_mask).logits


def texts(left: bool, b: int = 6, t: int = 10) -> dict[str, torch.Tensor]:
    """Ids in [5, 100) of lengths 3 to t − 1, padded with 0 on the right (or the left)."""
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(5, 100, (b, t), generator=g)
    lengths = torch.randint(3, t - 1, (b,), generator=g)
    lengths[0] = t - 1
    real = torch.arange(t)[None] < lengths[:, None]
    if left:
        shift = (t - lengths)[:, None]
        ids = ids.gather(1, (torch.arange(t)[None] - shift) % t)
        real = real.gather(1, (torch.arange(t)[None] - shift) % t)
    return {"input_ids": ids.masked_fill(~real, 0), "attention_mask": real.long()}


def measured(model: nn.Module, batch: dict, tokens, **options):
    """(result, the warnings' texts but the few-flips notes of a toy)."""
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        metric = TokenSensitivity(model, tokens, sigma=2.0, repeats=3, generator=0,
                                  precision="float32", **options)
        metric.update(batch)
        result = metric.compute()
    return result, [str(w.message) for w in said
                    if "the standard error rests on" not in str(w.message)]


def test_xlnet_is_refused_by_auto_tokens_naming_the_batch_first_wrapper():
    """The module auto_tokens named before (transformer.word_embedding) puts out (tokens,
    batch, dim), so every measurement was refused later as "not batch-first"."""
    model = xlnet()
    for embedding in ("block", "word"):
        with pytest.raises(TypeError) as err:
            auto_tokens(model, embedding=embedding)
        for words in ("XLNetForSequenceClassification runs sequence-first",
                      "(transformer.word_embedding)", "inputs_embeds=",
                      "tokens=Embedding('model.transformer.word_embedding')",
                      "pad on the left", "trim_padding=False"):
            assert words in str(err.value), (words, str(err.value))
    with pytest.raises(TypeError, match="runs sequence-first"):  # tokens=None: the same
        token_sensitivity(model, texts(left=True), sigma=2.0, **EXACT)


def test_the_named_wrapper_measures_xlnet():
    """Right padding: XLNet reads its last position, padding there, so trimming switches
    itself off with its warning and equals trim_padding=False; left padding (XLNet's own)
    measures under trim_padding=False, and the model reads those examples as unpadded."""
    model = xlnet()
    wrapper = BatchFirst(model).eval()
    tokens = Embedding("model.transformer.word_embedding")
    right = texts(left=False)
    trimmed, said = measured(wrapper, right, tokens)
    full, said_full = measured(wrapper, right, tokens, trim_padding=False)
    assert any("padding-aware batching is off" in s for s in said), said
    assert not said_full
    assert torch.equal(trimmed.per_sample, full.per_sample)
    assert trimmed.num_forward == full.num_forward
    left = texts(left=True)
    result, said = measured(wrapper, left, tokens, trim_padding=False)
    assert 0 < result.estimate <= 1
    # XLNet reads left padding as its text alone: no warning that advises right padding, and
    # the default's refusal says what was found (it advised padding on the right, which XLNet
    # misreads)
    assert not [s for s in said if "left-padded" in s], said
    with pytest.raises(ValueError, match=r"left-padded.*BatchFirst gives "
                                         r"example \d+ the same output left-padded as its text "
                                         r"alone.*trim_padding=False measures") as err:
        measured(wrapper, left, tokens)
    assert "Pad on the right instead" not in str(err.value)  # the generic advice, first before
    assert "Pass trim_padding=False" in str(err.value)
    lengths = left["attention_mask"].sum(1)
    with torch.no_grad():
        alone = torch.cat([model(input_ids=left["input_ids"][i:i + 1, -n:]).logits
                           for i, n in enumerate(lengths.tolist())])
        padded = wrapper(**left)
    torch.testing.assert_close(padded, alone, atol=1e-5, rtol=0)


# --------------------------------------------------------------------------- timm input size
class Asserts(nn.Module):
    """Not timm: raises timm's message from its own code, which is not wrapped."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        raise AssertionError(f"Input height ({x.shape[-2]}) doesn't match model (224).")


def test_a_size_message_from_outside_timm_is_raised_as_it_is():
    with pytest.raises(AssertionError, match=r"^Input height \(32\) doesn't match model"):
        token_sensitivity(Asserts(), images(2, 32), Patches(16), sigma=1.0, **EXACT)


def timm_model(name: str, **kwargs) -> nn.Module:
    timm = optional.timm()
    torch.manual_seed(0)  # test-only: timm initialises from the global RNG
    return timm.create_model(name, pretrained=False, num_classes=10, **kwargs).eval()


@pytest.mark.filterwarnings("ignore:the standard error rests on few flips")
def test_real_timm_vit_of_another_size_names_its_size_and_the_fixes():
    model = timm_model("vit_tiny_patch16_224", depth=1)
    with pytest.raises(ValueError) as err:
        token_sensitivity(model, images(2, 32), auto_tokens(model), sigma=1.0, **EXACT)
    for words in ("(2, 3, 32, 32) are 32×32 pixels", "built for 224×224 (PatchEmbed.img_size)",
                  "Input height (32) doesn't match model (224)", "size=(224, 224)",
                  "timm.create_model('vit_tiny_patch16_224', img_size=(32, 32)",
                  "model.set_input_size(img_size=(32, 32))", "dynamic_img_size=True"):
        assert words in str(err.value), (words, str(err.value))
    assert isinstance(err.value.__cause__, AssertionError)
    model.set_input_size(img_size=(32, 32))  # a fix it names
    result = token_sensitivity(model, images(2, 32), auto_tokens(model), sigma=1.0,
                               compare="l2", **EXACT)
    assert result.num_forward == 2 * 4 + 2  # 2×2 patches of 16 pixels per image


def test_real_timm_swin_names_the_size_it_was_built_for_not_its_cfg():
    """Built with img_size=56, a Swin keeps pretrained_cfg's 224; the size named is 56."""
    model = timm_model("swin_tiny_patch4_window7_224", img_size=56, depths=(1, 1, 1, 1))
    with pytest.raises(ValueError, match=r"are 64×64 pixels, but the model was built for "
                                         r"56×56 \(PatchEmbed.img_size\)") as err:
        token_sensitivity(model, images(1, 64), auto_tokens(model), sigma=1.0, **EXACT)
    assert "Input height (64) doesn't match model (56)" in str(err.value.__cause__)


def test_real_timm_patches_the_model_cannot_cut_name_a_multiple():
    model = timm_model("vit_tiny_patch16_224", depth=1, dynamic_img_size=True)
    with pytest.raises(ValueError) as err:  # Patches(8) divides 56, the model's 16 does not
        token_sensitivity(model, images(1, 56), Patches(8), sigma=1.0, **EXACT)
    for words in ("cannot cut into 16×16 patches", "a multiple of 16", "48×48",
                  "dynamic_img_pad=True"):
        assert words in str(err.value), (words, str(err.value))


def test_real_timm_other_size_errors_are_raised_as_they_are():
    """LeViT's size failure is no patch-embedding check: its RuntimeError is left alone."""
    model = timm_model("levit_128s")
    with pytest.raises(RuntimeError, match="must match the size of tensor"):
        token_sensitivity(model, images(1, 32), auto_tokens(model), sigma=1.0, **EXACT)


# --------------------------------------------------------------------------- pyramid patches
class Attn(nn.Module):
    """Named as timm's ``*Attn`` classes are (Twins' ``LocallyGroupedAttn``)."""

    def forward(self, t: torch.Tensor) -> torch.Tensor:
        return t + t.mean(1, keepdim=True)


class Mix(nn.Module):
    def forward(self, t: torch.Tensor) -> torch.Tensor:
        return t + t.mean(1, keepdim=True)


class Embed(nn.Module):
    def __init__(self, cin: int, p: int) -> None:
        super().__init__()
        self.patch_size = (p, p)
        self.proj = nn.Conv2d(cin, 4, p, stride=p)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(x)


class PyramidShaped(nn.Module):
    """Not timm: Twins' shape, one patch embedding per stage (``patch_embeds.0`` cuts 4×4
    patches, ``.1`` merges 2×2 of them), attention over each stage's tokens. ``branches``
    puts two embeddings on the image instead (CrossViT)."""

    def __init__(self, attention: type[nn.Module] = Attn, branches: bool = False) -> None:
        super().__init__()
        self.patch_embeds = nn.ModuleList([Embed(3, 4), Embed(3 if branches else 4, 2)])
        self.attn = attention()
        self.head = nn.Linear(4, 5)
        self.pretrained_cfg = dict(IMAGENET)
        self.branches = branches

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        first = self.patch_embeds[0](x)
        t = self.attn(first.flatten(2).transpose(1, 2))
        if self.branches:
            second = self.patch_embeds[1](x)
        else:
            second = self.patch_embeds[1](t.transpose(1, 2).reshape(first.shape))
        return self.head(self.attn(second.flatten(2).transpose(1, 2)).mean(1))


def test_a_pyramid_gets_its_first_stage_patch_however_its_embedding_is_named():
    """Twins and CoaT got 16 while Swin got 4: their embeddings are not named patch_embed,
    and their attention classes end in Attn."""
    assert auto_tokens(PyramidShaped()) == Patches(4)
    assert auto_tokens(PyramidShaped(attention=Mix)) == Patches(DEFAULT_CNN_PATCH)  # a CNN
    assert auto_tokens(PyramidShaped(branches=True)) == Patches(DEFAULT_CNN_PATCH)
    result = token_sensitivity(PyramidShaped().eval(), images(2, 16), auto_tokens(
        PyramidShaped()), sigma=1.0, compare="l2", **EXACT)
    assert result.num_forward == 2 * 16 + 2  # 4×4 patches of 4 pixels per 16×16 image


@pytest.mark.parametrize("name,patch", [
    ("twins_svt_small", 4), ("twins_pcpvt_small", 4), ("coat_lite_tiny", 4), ("coat_tiny", 4),
    ("swin_tiny_patch4_window7_224", 4), ("nest_tiny", 4),
    ("pvt_v2_b0", DEFAULT_CNN_PATCH),  # an overlapping 7×7 stride-4 embedding cuts no patches
    ("crossvit_tiny_240", DEFAULT_CNN_PATCH),  # two branches, 12 and 16: no one patch
    ("edgenext_xx_small", DEFAULT_CNN_PATCH),  # a ConvNeXt stem, no declared patch size
])
def test_real_timm_pyramid_patches(name, patch):
    timm = optional.timm()
    with torch.device("meta"):  # the structure is all auto_tokens reads
        model = timm.create_model(name, pretrained=False)
    assert auto_tokens(model) == Patches(patch)


def test_real_timm_twins_measures_on_its_4_pixel_patches():
    model = timm_model("twins_svt_small", depths=(1, 1, 1, 1))
    result = token_sensitivity(model, images(2, 32), auto_tokens(model), sigma=1.0,
                               compare="l2", **EXACT)
    assert result.num_forward == 2 * 64 + 2


def test_hf_pvt_gets_its_first_stage_patch():
    transformers = pytest.importorskip("transformers")
    if not hasattr(transformers, "PvtForImageClassification"):
        pytest.skip("this transformers has no PVT")
    with torch.device("meta"):
        model = transformers.PvtForImageClassification(transformers.PvtConfig())
    assert auto_tokens(model) == Patches(4)
