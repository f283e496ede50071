"""Padding-aware batching and chunking must not change the number (senslab.measure._runner,
_trim): a model that reads its padding is found even when an output is -inf, a model that
fails only on cut inputs is measured at full width, and in reduced precision a trimmed copy runs
at the width its reference was computed at, whatever the chunk size."""

from __future__ import annotations

import warnings

import pytest
import torch
from torch import nn

from senslab.measure import TokenSensitivity, token_sensitivity
from senslab.tokens import Embedding

PAD = 1


def right_padded(b: int = 10, t: int = 12, seed: int = 0, full: int = 2) -> dict:
    """Token ids in [2, 50), real lengths mixed from 1 to t − 2; the first ``full`` examples
    have no padding (so the zero-noise check of the first examples sees no cut)."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(2, 50, (b, t), generator=g)
    lengths = torch.randint(1, t - 1, (b,), generator=g)
    lengths[:full] = t
    mask = torch.arange(t)[None] < lengths[:, None]
    return {"input_ids": ids.masked_fill(~mask, PAD), "attention_mask": mask}


class MeanOfAllMasked(nn.Module):
    """Averages every position, padding included (it ignores its attention mask), and returns a
    fourth class masked out with -inf, as a classifier over a restricted label set does."""

    def __init__(self) -> None:
        super().__init__()
        self.embedding = nn.Embedding(50, 4)
        self.embed_ln = nn.LayerNorm(4)
        self.head = nn.Linear(4, 3)

    def pooled(self, input_ids, attention_mask):
        return self.embed_ln(self.embedding(input_ids)).mean(1)

    def forward(self, input_ids, attention_mask):
        out = self.head(self.pooled(input_ids, attention_mask))
        return torch.cat([out, torch.full_like(out[:, :1], float("-inf"))], 1)


class MeanOfRealMasked(MeanOfAllMasked):
    """Averages the real positions only: it does not read its padding."""

    def pooled(self, input_ids, attention_mask):
        m = attention_mask.unsqueeze(-1).to(self.head.weight.dtype)
        return (self.embed_ln(self.embedding(input_ids)) * m).sum(1) / m.sum(1)


def test_a_minus_inf_output_does_not_hide_a_model_that_reads_its_padding():
    """A -inf logit made the cut check's floor infinite (and its NaN difference hid the other
    logits), so trimming stayed on for a model that reads its padding: 0.52 measured where the
    padded inputs give 0.34, without a word."""
    torch.manual_seed(0)  # test-only: model init
    model, batch = MeanOfAllMasked(), right_padded()
    opts = {"sigma": 3.0, "repeats": 2, "generator": 0}
    metric = TokenSensitivity(model, Embedding("embed_ln"), **opts)
    with pytest.warns(RuntimeWarning, match="padding-aware batching is off.*changed its clean"):
        metric.update(batch)
    assert not metric.last_trimmed
    plain = token_sensitivity(model, batch, Embedding("embed_ln"), trim_padding=False, **opts)
    assert torch.equal(metric.compute().per_sample, plain.per_sample)


def test_a_minus_inf_output_still_trims_a_model_that_ignores_its_padding():
    torch.manual_seed(0)  # test-only: model init
    model, batch = MeanOfRealMasked().double(), right_padded()
    opts = {"sigma": 3.0, "repeats": 2, "generator": 0}
    metric = TokenSensitivity(model, Embedding("embed_ln"), **opts)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        metric.update(batch)
    assert metric.last_trimmed
    plain = token_sensitivity(model, batch, Embedding("embed_ln"), trim_padding=False, **opts)
    result = metric.compute()
    assert torch.equal(result.per_sample, plain.per_sample)
    assert 0.0 < plain.estimate < 1.0  # flips happen: the comparison is not vacuous


class FixedLength(nn.Module):
    """A classifier over a fixed number of positions (a flattened head), which asserts it."""

    def __init__(self, t: int = 12) -> None:
        super().__init__()
        self.t = t
        self.embedding = nn.Embedding(50, 4)
        self.embed_ln = nn.LayerNorm(4)
        self.head = nn.Linear(4 * t, 3)

    def forward(self, input_ids, attention_mask):
        assert input_ids.shape[1] == self.t, f"expected {self.t} tokens"
        h = self.embed_ln(self.embedding(input_ids)) * attention_mask.unsqueeze(-1)
        return self.head(h.flatten(1))


def test_a_model_that_asserts_its_length_runs_at_full_width():
    """The user's padded inputs run; only the inputs senslab cut fail, by an AssertionError
    inside the model that escaped the cut check (it caught RuntimeError and a few others), so
    the measurement failed with the model's own message about a length the user never gave."""
    torch.manual_seed(0)  # test-only: model init
    model, batch = FixedLength(), right_padded(full=1)
    opts = {"sigma": 3.0, "repeats": 2, "generator": 0}
    metric = TokenSensitivity(model, Embedding("embed_ln"), **opts)
    with pytest.warns(RuntimeWarning, match="failed on inputs cut to .*AssertionError"):
        metric.update(batch)
    assert not metric.last_trimmed
    plain = token_sensitivity(model, batch, Embedding("embed_ln"), trim_padding=False, **opts)
    assert torch.equal(metric.compute().per_sample, plain.per_sample)
    assert 0.0 < plain.estimate < 1.0


def _llama(seed: int, dtype: torch.dtype):
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(seed)  # test-only: ids and HF init
    ids = torch.randint(5, 2000, (4, 16))
    config = transformers.LlamaConfig(
        vocab_size=2000, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
        initializer_range=0.4, pad_token_id=0)
    model = transformers.LlamaForCausalLM(config).eval().to(dtype)
    # lengths 16 and 14, padded to 20: within the 1/8 of padding a float32 chunk may mix
    mask = torch.arange(20)[None] < torch.tensor([16, 14, 16, 14])[:, None]
    ids = torch.cat([ids, torch.zeros(4, 4, dtype=torch.long)], 1).masked_fill(~mask, 0)
    return model, {"input_ids": ids, "attention_mask": mask.long()}


@pytest.mark.parametrize("seed", [2, 4, 6])
def test_a_bf16_models_trimmed_flips_do_not_depend_on_the_chunk_size(seed):
    """Each trimmed copy of a bf16 model is compared with its example's clean output at the
    example's own width; a chunk that also held longer examples ran it at their width, where
    bf16 rounds otherwise, so a near-tie flipped by width: 0.165 at the automatic chunk size,
    0.138 with chunk_size=2 (seed 2). Now a chunk holds one width in reduced precision."""
    model, batch = _llama(seed, torch.bfloat16)
    tokens, opts = Embedding("model.embed_tokens"), {"sigma": 0.02, "repeats": 2, "generator": 0}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # bf16 token vectors: the noise's rounding is noted
        metric = TokenSensitivity(model, tokens, **opts)
        metric.update(batch)
        results = [metric.compute()] + [
            token_sensitivity(model, batch, tokens, chunk_size=c, **opts) for c in (2, 6)]
    assert metric.last_trimmed
    assert metric.last_chunk_size > 30  # the automatic chunk holds both widths' copies
    for r in results[1:]:
        assert torch.equal(r.per_sample, results[0].per_sample)


class MeanLabels(nn.Module):
    """Returns class labels (argmax over 1000 classes, the likely ones 900 to 909, as token ids
    of a language model crowd together), pooled over every position (``real=False``: it reads
    its padding) or over the real ones."""

    def __init__(self, real: bool) -> None:
        super().__init__()
        self.real = real
        self.embedding = nn.Embedding(50, 16)
        self.embed_ln = nn.LayerNorm(16)
        self.head = nn.Linear(16, 1000)
        with torch.no_grad():
            self.head.bias[900:910] += 50.0

    def forward(self, input_ids, attention_mask):
        h = self.embed_ln(self.embedding(input_ids))
        m = attention_mask.unsqueeze(-1).to(h.dtype) if self.real else torch.ones_like(h[..., :1])
        return self.head((h * m).sum(1) / m.sum(1)).argmax(1)


def test_class_labels_that_change_on_cut_inputs_switch_trimming_off():
    """Labels were compared with a tolerance relative to their value (5% of 905), so a model
    that reads its padding, whose labels moved from 906 to 901 on cut inputs, kept trimming on:
    0.31 measured where the padded inputs give 0.10, without a word."""
    torch.manual_seed(0)  # test-only: model init
    model, batch = MeanLabels(real=False), right_padded()
    labels = model(**batch)
    assert bool((labels >= 900).all() and (labels < 910).all())  # the labels are close
    opts = {"sigma": 0.3, "repeats": 4, "generator": 0}
    metric = TokenSensitivity(model, Embedding("embed_ln"), **opts)
    with pytest.warns(RuntimeWarning, match="padding-aware batching is off.*changed its clean"):
        metric.update(batch)
    assert not metric.last_trimmed
    plain = token_sensitivity(model, batch, Embedding("embed_ln"), trim_padding=False, **opts)
    assert torch.equal(metric.compute().per_sample, plain.per_sample)
    assert 0.0 < plain.estimate < 1.0


def test_class_labels_of_a_model_that_ignores_its_padding_are_still_trimmed():
    torch.manual_seed(0)  # test-only: model init
    model, batch = MeanLabels(real=True).double(), right_padded()
    opts = {"sigma": 0.3, "repeats": 4, "generator": 0}
    metric = TokenSensitivity(model, Embedding("embed_ln"), **opts)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        metric.update(batch)
    assert metric.last_trimmed
    plain = token_sensitivity(model, batch, Embedding("embed_ln"), trim_padding=False, **opts)
    assert torch.equal(metric.compute().per_sample, plain.per_sample)
    assert 0.0 < plain.estimate < 1.0
