"""``auto_tokens`` on a model with ``default_tokens()`` (senslab's zoo): an option given is
applied or refused, never dropped.

Before, ``auto_tokens(create_model("roberta"), embedding="word")`` returned the zoo's default
``Embedding('embed_ln')`` (the LayerNorm after the lookup), and ``position=`` and ``patch_size=``
on a text model, ``embedding=``/``position=`` on an image model, were dropped the same way: the
measured number was that of the default tokens (0.0052 against the lookup's 0.0260 in the
audit's example). Every zoo model is built small here, so the whole file runs in seconds.
"""

from __future__ import annotations

import dataclasses
import warnings

import pytest
import torch
from torch import nn

from senslab import token_sensitivity
from senslab.models import create_model, list_models, model_config
from senslab.models.text import RobertaClassifier
from senslab.tokens import Embedding, Patches, auto_tokens

TEXT = dict(vocab_size=50, dim=16, heads=2, layers=1, max_len=16)
SMALL = {
    "attention_model": dict(dim=4),
    "boolean_transformer": dict(n_bits=6, dim=8, layers=1, heads=2, ff_dim=8),
    "cnn": dict(image_size=8, channels=(4, 4), hidden=8),
    "convmixer": dict(image_size=8, dim=8, depth=1),
    "densenet121": dict(image_size=8, growth_rate=4, blocks=(1, 1)),
    "gpt2": TEXT, "lstm": TEXT, "roberta": TEXT, "roberta_relu": TEXT,
    "mlp": dict(image_size=8, widths=(8,)),
    "mlp_sigmoid": dict(image_size=8, widths=(8,)),
    "modadd_transformer": dict(p=7, dim=8, heads=2, mlp_dim=8),
    "parity_transformer": dict(n_bits=6, dim=8, heads=2, layers=1, mlp_dim=8),
    "resnet18": dict(image_size=8, width=0.125, blocks=(1, 1, 1, 1)),
    "sparse_attention": dict(dim=4),
    "vit_simple": dict(image_size=8, dim=8, depth=1, heads=2, dim_head=4, mlp_dim=8),
    "vit_small": dict(image_size=8, dim=8, depth=1, heads=2, dim_head=4, mlp_dim=8),
}
EXACT = dict(precision="float32", generator=3)
#: a distance on the outputs: every copy counts, so tokens that differ give other numbers
L2 = dict(EXACT, compare="l2")

_TEXT_LOOKUP = {"embedding": "word"}
_POSITION = {"position": 0}
_PATCH = {"patch_size": 2}


def _refused(option: str) -> tuple[str, str]:
    return ("refused", option)


def _text(word: str, default: str) -> dict[str, object]:
    return {"embedding": Embedding(word), "position": Embedding(default, position=0),
            "patch_size": _refused("patch_size=2")}


_IMAGE = {"embedding": _refused("embedding='word'"), "position": _refused("position=0"),
          "patch_size": Patches(2)}
_VECTORS = {"embedding": _refused("embedding='word'"), "position": _refused("position=0"),
            "patch_size": _refused("patch_size=2")}

#: what each option gives on each zoo model: tokens, or a refusal naming the option
EXPECTED: dict[str, dict[str, object]] = {
    **{name: _text("embed", "embed_ln") for name in ("gpt2", "lstm", "roberta", "roberta_relu")},
    "modadd_transformer": _text("embed", "embed"),  # the default already is the lookup
    "parity_transformer": _text("embed", "embed"),
    "boolean_transformer": _text("bit_embed", "bit_embed"),
    **{name: _IMAGE for name in ("cnn", "convmixer", "densenet121", "mlp", "mlp_sigmoid",
                                 "resnet18", "vit_simple", "vit_small")},
    "attention_model": _VECTORS,
    "sparse_attention": _VECTORS,
}
OPTIONS = {"embedding": _TEXT_LOOKUP, "position": _POSITION, "patch_size": _PATCH}


def small(name: str) -> nn.Module:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return create_model(name, **SMALL[name]).eval()


@pytest.mark.parametrize("name", list_models())
def test_zoo_defaults_unchanged_and_each_option_applied_or_refused(name: str) -> None:
    """Every model of the registry (one added later needs its rows in SMALL and EXPECTED). No
    option (or every option at its default): exactly the model's default_tokens(), as before.
    Each option given: the tokens it asks for, or a ValueError naming it, the model and the
    fix."""
    assert name in SMALL and name in EXPECTED, f"add {name!r} to SMALL and EXPECTED"
    model = small(name)
    declared = model.default_tokens()
    for tokens in (auto_tokens(model),
                   auto_tokens(model, embedding="block", patch_size=None, position="last",
                               sigma_space="input")):
        assert type(tokens) is type(declared) and tokens == declared
        assert repr(tokens) == repr(declared)
    for option, kwargs in OPTIONS.items():
        want = EXPECTED[name][option]
        if isinstance(want, tuple):
            with pytest.raises(ValueError) as err:
                auto_tokens(model, **kwargs)
            text = str(err.value)
            assert want[1] in text and type(model).__name__ in text, text
            assert "drop " in text or "pass tokens explicitly" in text, text
        else:
            got = auto_tokens(model, **kwargs)
            assert type(got) is type(want) and got == want, (option, got)


def _text_batch(b: int = 12, t: int = 10) -> torch.Tensor:
    return torch.randint(2, TEXT["vocab_size"], (b, t), generator=torch.Generator().manual_seed(1))


@pytest.mark.parametrize("name", ["roberta", "gpt2", "lstm"])
def test_embedding_word_on_a_zoo_text_model_measures_its_lookup(name: str) -> None:
    """The audit's case: embedding='word' is the lookup 'embed' (per-example numbers equal to
    Embedding('embed')'s), not the default LayerNorm 'embed_ln' (whose numbers differ; with
    flips the audit saw 0.0052 against 0.0260)."""
    model = small(name)
    ids = _text_batch()
    got = token_sensitivity(model, ids, auto_tokens(model, embedding="word"), sigma=0.3, **L2)
    word = token_sensitivity(model, ids, Embedding("embed"), sigma=0.3, **L2)
    default = token_sensitivity(model, ids, Embedding("embed_ln"), sigma=0.3, **L2)
    assert not torch.equal(word.per_sample, default.per_sample)  # the choice matters here
    assert torch.equal(got.per_sample, word.per_sample)
    assert got.estimate == word.estimate


class PerPositionRoberta(RobertaClassifier):
    """The zoo's RoBERTa with its head on every position: a (B, T, classes) per-position
    output, which ``position=`` reads."""

    def forward(self, input_ids: torch.Tensor,
                attention_mask: torch.Tensor | None = None) -> torch.Tensor:
        return self.head(self.hidden_states(input_ids, attention_mask))


def test_position_on_a_zoo_text_model_reads_that_position() -> None:
    config = dataclasses.replace(model_config("roberta"), **TEXT)
    model = PerPositionRoberta(config).eval()
    ids = _text_batch()
    tokens = auto_tokens(model, position=0)
    assert tokens == Embedding("embed_ln", position=0)
    got = token_sensitivity(model, ids, tokens, sigma=0.5, **L2)
    first = token_sensitivity(model, ids, Embedding("embed_ln", position=0), sigma=0.5, **L2)
    last = token_sensitivity(model, ids, Embedding("embed_ln"), sigma=0.5, **L2)
    assert not torch.equal(first.per_sample, last.per_sample)  # the position matters here
    assert torch.equal(got.per_sample, first.per_sample)
    # both options at once: the lookup, read at position 0
    assert auto_tokens(model, embedding="word", position=0) == Embedding("embed", position=0)


def test_patch_size_on_a_zoo_image_model_is_applied_or_refused_when_it_cuts_no_patches() -> None:
    model = small("cnn")  # 8×8 images
    x = torch.randn(6, 1, 8, 8, generator=torch.Generator().manual_seed(2))
    got = token_sensitivity(model, x, auto_tokens(model, patch_size=2), sigma=1.0, **L2)
    want = token_sensitivity(model, x, Patches(2), sigma=1.0, **L2)
    default = token_sensitivity(model, x, auto_tokens(model), sigma=1.0, **L2)
    assert not torch.equal(want.per_sample, default.per_sample)
    assert torch.equal(got.per_sample, want.per_sample)
    for size in (3, 16, 0):
        with pytest.raises(ValueError, match="patch_size") as err:
            auto_tokens(model, patch_size=size)
        if size:
            assert "does not divide the 8x8 images CNN takes" in str(err.value)
            assert "one of 1, 2, 4, 8" in str(err.value)


@pytest.mark.parametrize(("name", "kwargs", "words"), [
    ("roberta", {"patch_size": 4}, ["patch_size=4", "RobertaClassifier",
                                    "Embedding('embed_ln')", "drop patch_size"]),
    ("lstm", {"std": 0.5}, ["std=/mean=", "drop them"]),
    ("gpt2", {"mean": 0.5}, ["std=/mean=", "drop them"]),
    ("resnet18", {"embedding": "word"}, ["embedding='word'", "ResNet", "Patches(4)",
                                         "drop embedding"]),
    ("vit_small", {"position": None}, ["position=None", "ViTSmall", "drop position"]),
    ("vit_simple", {"position": -1}, ["position=-1", "ViTSimple", "drop position"]),
    ("sparse_attention", {"embedding": "word"}, ["embedding='word'", "SparseAttention",
                                                 "input vectors", "Sequence()"]),
    ("attention_model", {"patch_size": 2}, ["patch_size=2", "AttentionModel",
                                            "drop patch_size"]),
    ("cnn", {"image_processor": object()}, ["image_processor=", "sigma_space='pixel'"]),
    ("roberta", {"image_processor": object()}, ["image_processor=", "sigma_space='pixel'"]),
])
def test_an_option_that_does_not_apply_is_refused_naming_it(name, kwargs, words) -> None:
    with pytest.raises(ValueError) as err:
        auto_tokens(small(name), **kwargs)
    for word in words:
        assert word in str(err.value), (word, str(err.value))


def test_std_on_a_zoo_image_model_without_pixel_space_is_refused_not_dropped() -> None:
    """As for a Hugging Face or timm image model: Patches refuses std= under sigma_space
    'input' (before, the zoo returned its default Patches and dropped std)."""
    with pytest.raises(ValueError, match="need sigma_space='pixel'"):
        auto_tokens(small("resnet18"), std=0.25)
    tokens = auto_tokens(small("resnet18"), sigma_space="pixel", std=0.25)
    assert tokens == Patches(4, sigma_space="pixel", std=0.25)


class OwnTokens(nn.Module):
    """A model of the user's with default_tokens() on a LayerNorm after its lookups."""

    def __init__(self, lookups: int, declare_input: bool = False) -> None:
        super().__init__()
        self.tok = nn.Embedding(10, 4)
        self.seg = nn.Embedding(2, 4) if lookups > 1 else None
        self.pos_table = nn.Embedding(8, 4)
        self.norm = nn.LayerNorm(4)
        self.head = nn.Linear(4, 2)
        self.declare_input = declare_input

    def default_tokens(self) -> Embedding:
        return Embedding("norm")

    def get_input_embeddings(self) -> nn.Module:
        if not self.declare_input:
            raise NotImplementedError
        return self.tok

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        h = self.tok(ids) + self.pos_table(torch.arange(ids.shape[1]))
        if self.seg is not None:
            h = h + self.seg(torch.zeros_like(ids))
        return self.head(self.norm(h).mean(1))


def test_embedding_word_on_a_model_of_ones_own_finds_the_lookup_or_refuses() -> None:
    assert auto_tokens(OwnTokens(1), embedding="word") == Embedding("tok")
    assert auto_tokens(OwnTokens(2, declare_input=True), embedding="word") == Embedding("tok")
    with pytest.raises(ValueError) as err:
        auto_tokens(OwnTokens(2), embedding="word")
    for word in ("embedding='word'", "OwnTokens", "(it has tok, seg)",
                 "Embedding('<name of the word-embedding module>')"):
        assert word in str(err.value), (word, str(err.value))


def test_text_options_on_a_cnn_are_refused() -> None:
    """The same rule outside the zoo: a plain CNN (auto_tokens: Patches(16)) has no word
    lookup and no per-position output; patch_size=0 was read as "not given"."""
    cnn = nn.Sequential(nn.Conv2d(3, 4, 3), nn.Flatten(), nn.LazyLinear(2))
    with pytest.raises(ValueError, match=r"embedding='word' does not apply to Sequential"):
        auto_tokens(cnn, embedding="word")
    with pytest.raises(ValueError, match=r"position=0 does not apply to Sequential"):
        auto_tokens(cnn, position=0)
    with pytest.raises(ValueError, match="patch size must be a positive integer"):
        auto_tokens(cnn, patch_size=0)
    assert auto_tokens(cnn, patch_size=4) == Patches(4)


def test_patch_size_on_a_hugging_face_text_model_is_refused() -> None:
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)  # test-only: HF initialises from the global RNG
    model = transformers.BertForSequenceClassification(transformers.BertConfig(
        hidden_size=16, num_hidden_layers=1, num_attention_heads=2, intermediate_size=24,
        vocab_size=60, max_position_embeddings=32)).eval()
    with pytest.raises(ValueError) as err:
        auto_tokens(model, patch_size=4)
    for word in ("patch_size=4", "BertForSequenceClassification",
                 "bert.embeddings.word_embeddings", "drop patch_size"):
        assert word in str(err.value), (word, str(err.value))
    assert auto_tokens(model).module == "bert.embeddings.LayerNorm"  # the default: unchanged
