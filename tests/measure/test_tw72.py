"""Left-padded inputs a model reads otherwise than right-padded ones: said where the measurement
goes on with them (``trim_padding=False``, a caller that binds the tokens itself), folded into
the refusal where padding-aware batching refuses them, with no warning before it. And
``compile=True`` on chunks of several sizes: one compilation, the uncompiled numbers."""

from __future__ import annotations

import warnings

import pytest
import torch

from senslab import Embedding, Patches, TokenSensitivity, auto_tokens, token_sensitivity

transformers = pytest.importorskip("transformers")

OPTIONS = dict(sigma=2.0, repeats=3, generator=0, precision="float32")
LEFT_READ = "another output than the same text alone, unpadded"
FEW_FLIPS = "the standard error rests on"


def seeded(make):
    torch.manual_seed(0)  # test-only: Hugging Face initialises from the global RNG
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # config notes on token ids outside the toy vocabulary
        return make().eval()


def distilbert():
    return seeded(lambda: transformers.DistilBertForSequenceClassification(
        transformers.DistilBertConfig(vocab_size=100, dim=32, n_layers=2, n_heads=2,
                                      hidden_dim=64, num_labels=2, pad_token_id=0)))


def gpt2():
    return seeded(lambda: transformers.GPT2ForSequenceClassification(
        transformers.GPT2Config(vocab_size=100, n_embd=32, n_layer=2, n_head=2, n_positions=32,
                                num_labels=2, pad_token_id=0)))


def llama():
    return seeded(lambda: transformers.LlamaForSequenceClassification(
        transformers.LlamaConfig(vocab_size=100, hidden_size=32, num_hidden_layers=2,
                                 num_attention_heads=2, num_key_value_heads=2,
                                 intermediate_size=64, num_labels=2, pad_token_id=0,
                                 max_position_embeddings=32)))


def left_padded(b: int = 6, t: int = 10) -> dict[str, torch.Tensor]:
    """Token ids in [5, 100) of lengths 3 to t − 1, their padding (id 0) first."""
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(5, 100, (b, t), generator=g)
    lengths = torch.randint(3, t - 1, (b,), generator=g)
    lengths[0] = t - 1
    real = torch.arange(t)[None] >= (t - lengths)[:, None]
    return {"input_ids": ids.masked_fill(~real, 0), "attention_mask": real.long()}


def said_measuring(model, batch, **options) -> tuple[list[str], object]:
    """The warnings' texts (but the few-flips note of a toy) of one measurement, and its result."""
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        result = token_sensitivity(model, batch, auto_tokens(model), **(OPTIONS | options))
    return [str(w.message) for w in said if FEW_FLIPS not in str(w.message)], result


@pytest.mark.parametrize("make, name", [(distilbert, "DistilBertForSequenceClassification"),
                                        (gpt2, "GPT2ForSequenceClassification")])
def test_refused_left_padding_is_not_warned_first_and_the_refusal_says_the_finding(make, name):
    """Under the default trim_padding=True the refusal comes with no warning before it (a
    warning that the model reads left padding otherwise came first, then the refusal); the
    refusal says what the clean forward found of this model."""
    model = make()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(ValueError, match=rf"left-padded.*Checked on this model: {name} "
                                             rf"gives example 0 {LEFT_READ}.*pad on the right"):
            token_sensitivity(model, left_padded(), auto_tokens(model), **OPTIONS)


@pytest.mark.parametrize("make, name", [(distilbert, "DistilBertForSequenceClassification"),
                                        (gpt2, "GPT2ForSequenceClassification")])
def test_left_padding_measured_as_it_is_is_warned_once(make, name):
    model = make()
    said, result = said_measuring(model, left_padded(), trim_padding=False)
    found = [s for s in said if LEFT_READ in s]
    assert len(found) == 1 and name in found[0], said
    assert result.num_examples == 6


def test_a_model_that_reads_left_padding_as_right_padding_is_silent():
    """Llama's classifier (rotary positions, read at its last non-pad token): no warning under
    trim_padding=False; the default's refusal says that trim_padding=False measures the texts."""
    model = llama()
    said, _ = said_measuring(model, left_padded(), trim_padding=False)
    assert said == []
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(ValueError, match=r"left-padded.*Checked on this model: "
                                             r"LlamaForSequenceClassification gives example 0 the "
                                             r"same output left-padded as its text alone"):
            token_sensitivity(model, left_padded(), auto_tokens(model), **OPTIONS)


class FixedLength(torch.nn.Module):
    """Mean of its real token vectors, through a head; it takes inputs of 10 tokens only."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)  # test-only: the layers initialise from the global RNG
        self.embed = torch.nn.Embedding(100, 8)
        self.ln = torch.nn.LayerNorm(8)
        self.head = torch.nn.Linear(8, 2)

    def forward(self, input_ids, attention_mask):
        if input_ids.shape[1] != 10:
            raise ValueError("this model takes 10 tokens")
        h = self.ln(self.embed(input_ids)) * attention_mask[..., None]
        return self.head(h.sum(1) / attention_mask.sum(1, keepdim=True))


def test_a_model_that_takes_no_shorter_input_is_judged_against_right_padding_and_says_so():
    """The text alone cannot be run: the finding compares with right padding, in those words."""
    with pytest.raises(ValueError, match=r"left-padded.*FixedLength gives example 0 the same "
                                         r"output padded on either side.*took no input cut"):
        token_sensitivity(FixedLength().eval(), left_padded(), Embedding("ln"), **OPTIONS)


class Forwards:
    """Counts the model's forwards."""

    def __init__(self, model: torch.nn.Module) -> None:
        self.n = 0
        model.register_forward_hook(self)

    def __call__(self, *_: object) -> None:
        self.n += 1


def test_the_refusal_judges_in_two_forwards_besides_the_clean_one():
    model = distilbert()
    forwards = Forwards(model)
    with pytest.raises(ValueError, match=LEFT_READ):
        token_sensitivity(model, left_padded(), auto_tokens(model), **OPTIONS)
    # the clean batch, the first left-padded example's text alone, and (as it differs) the
    # same example padded on the right, for the advice
    assert forwards.n == 3


def test_a_model_that_reads_left_padding_as_the_text_judges_in_one_forward():
    model = llama()
    forwards = Forwards(model)
    with pytest.raises(ValueError, match="same output left-padded as its text alone"):
        token_sensitivity(model, left_padded(), auto_tokens(model), **OPTIONS)
    assert forwards.n == 2  # the clean batch and the text alone: no right padding needed


def test_a_caller_that_binds_the_tokens_itself_is_warned_at_the_bind_in_one_forward():
    """Embedding.bind outside a measurement (an integration's check before training binds so)
    warns in its clean forward, as before; the finding is judged once per bind."""
    model = distilbert()
    tokens = auto_tokens(model)
    assert isinstance(tokens, Embedding)
    forwards = Forwards(model)
    with warnings.catch_warnings(record=True) as said, torch.no_grad():
        warnings.simplefilter("always")
        with tokens.bind(model, left_padded()) as bound:
            assert forwards.n == 3
            assert LEFT_READ in (bound.left_padding_read() or "")
            bound.warn_left_padding_read()
            assert forwards.n == 3  # read from the finding, no forward again
    texts = [str(w.message) for w in said if LEFT_READ in str(w.message)]
    assert len(texts) == 2 and "DistilBertForSequenceClassification" in texts[0]


def test_right_padding_is_never_judged():
    """No left padding: no forward besides the clean one, nothing to say."""
    model = distilbert()
    batch = left_padded()
    right = {k: torch.stack([torch.roll(r, -int((m == 0).sum())) for r, m in
                             zip(v, batch["attention_mask"], strict=True)])
             for k, v in batch.items()}
    assert bool(right["attention_mask"][:, 0].all())
    forwards = Forwards(model)
    with torch.no_grad(), auto_tokens(model).bind(model, right) as bound:
        assert bound.left_padding_read() is None
    assert forwards.n == 1
    metric = TokenSensitivity(model, auto_tokens(model), **OPTIONS)
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        metric.update(right)
    assert [str(w.message) for w in said if LEFT_READ in str(w.message)] == []


def _graphs(monkeypatch, model, tokens, batches, chunk_size, backend):
    """(per-example sensitivities, Dynamo's graphs compiled) of compile=True over ``batches``,
    compiled by ``backend``."""
    import functools

    from torch._dynamo.utils import counters

    from senslab.measure import _compiled

    torch._dynamo.reset()
    counters.clear()
    monkeypatch.setattr(_compiled.torch, "compile",
                        functools.partial(torch.compile, backend=backend))
    m = TokenSensitivity(model, tokens, sigma=1.0, repeats=3, generator=0,
                         chunk_size=chunk_size, compile=True, precision="float32")
    for x in batches:
        m.update(x)
    return m.compute().per_sample, int(counters["stats"]["unique_graphs"])


def _eager(model, tokens, batches, chunk_size):
    m = TokenSensitivity(model, tokens, sigma=1.0, repeats=3, generator=0,
                         chunk_size=chunk_size, precision="float32")
    for x in batches:
        m.update(x)
    return m.compute().per_sample


def _lively_cnn() -> torch.nn.Module:
    """The zoo CNN on 16×16 images, its weights doubled: some patches flip the class at σ = 1."""
    from senslab.models import create_model

    model = create_model("cnn", seed=0, image_size=16, channels=(4, 8), hidden=16).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(2)
    return model


def _cnn_batches(*sizes: int) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return [torch.randn(n, 1, 16, 16, generator=g) for n in sizes]


@pytest.mark.parametrize("reuse", [True, False])
def test_chunks_of_other_sizes_run_one_compiled_graph(monkeypatch, reuse):
    """The zoo CNN, compiled (Dynamo traces for real; the eager backend builds no C++): a round's
    shorter last chunk, and a batch of fewer images, ran graphs compiled again for their sizes
    (two for one batch, through the call or the local-reuse path); with the copies' axis
    dynamic from the first call one graph serves them all, and the numbers are eager's."""
    model = _lively_cnn()
    tokens = Patches(4, reuse_local=reuse)
    # 144, 144 and 96 copies in chunks of 40: last chunks of 24 and 16. Not fewer than 16: a
    # CPU convolution takes another backend below 16 images, which Dynamo compiles apart, as
    # eager runs it apart
    batches = _cnn_batches(3, 3, 2)
    got, graphs = _graphs(monkeypatch, model, tokens, batches, 40, "eager")
    assert float(got.mean()) > 0
    assert torch.equal(got, _eager(model, tokens, batches, 40))
    # the local-reuse path fills its cache's channels-last stores in a batch's first chunk (a
    # dict the graph reads): one more graph for a cache already filled (there were 5 and 2)
    assert graphs == (2 if reuse else 1), graphs


@pytest.mark.slow  # compiling C++ takes about a minute on 2 CPU cores
def test_inductor_compiles_one_graph_for_every_chunk_size_with_eager_numbers(monkeypatch):
    model = _lively_cnn()
    tokens = Patches(4, reuse_local=False)
    batches = _cnn_batches(3, 2)
    got, graphs = _graphs(monkeypatch, model, tokens, batches, 40, "inductor")
    assert graphs == 1
    assert float(got.mean()) > 0
    assert torch.equal(got, _eager(model, tokens, batches, 40))
