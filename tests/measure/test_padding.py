"""Padding-aware batching (``trim_padding``, senslab.measure._trim): copies are evaluated on inputs
cut after their example's last real token, with exactly the flips of the padded evaluation."""

from __future__ import annotations

import math
import warnings

import pytest
import torch
from torch import nn

from senslab.measure import TokenSensitivity, _trim, compare_sensitivity, token_sensitivity
from senslab.measure._runner import VERIFY_BATCH, VERIFY_ROWS
from senslab.models import create_model
from senslab.tokens import Embedding

PAD = 1
OPTIONS = [
    {"repeats": 3},
    {"repeats": 4, "antithetic": True},
    {"repeats": 2, "mode": "whole"},
    {"repeats": 2, "num_tokens": 3, "chunk_size": 7},
    {"repeats": 2, "control_variate": "linear"},
    {"allocation": "linear", "budget": 2.0},
]


def right_padded(b: int = 10, t: int = 12, seed: int = 0) -> dict[str, torch.Tensor]:
    """Token ids in [2, 50) (never the pad id), real lengths mixed from 1 to t − 2."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(2, 50, (b, t), generator=g)
    lengths = torch.randint(1, t - 1, (b,), generator=g)
    lengths[0] = t - 2  # no example is full length: every example loses some padding
    mask = torch.arange(t)[None] < lengths[:, None]
    return {"input_ids": ids.masked_fill(~mask, PAD), "attention_mask": mask}


def zoo(name: str) -> nn.Module:
    # float64: the cut changes summation lengths, so outputs agree to ~1e-16 and no flip can
    # hinge on float32 rounding
    return create_model(name, vocab_size=50, max_len=16, dim=16, layers=2, heads=2,
                        dropout=0.0, seed=3).double()


def both(model, inputs, tokens, **options):
    """The result with and without trimming; trimming must really have happened."""
    metric = TokenSensitivity(model, tokens, generator=7, **options)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no fallback to full width
        metric.update(inputs)
    assert metric.last_trimmed
    plain = token_sensitivity(model, inputs, tokens, generator=7, trim_padding=False, **options)
    return metric.compute(), plain


def assert_same(a, b) -> None:
    assert torch.equal(a.per_sample, b.per_sample)
    assert torch.allclose(a.per_position, b.per_position, rtol=0, atol=0, equal_nan=True)
    assert a.estimate == b.estimate and a.stderr == b.stderr
    assert a.num_forward == b.num_forward


# -- the zoo's text models ---------------------------------------------------------------------


@pytest.mark.parametrize("name", ["roberta", "roberta_relu", "lstm", "gpt2"])
@pytest.mark.parametrize("options", OPTIONS, ids=lambda o: "-".join(map(str, o.values())))
def test_zoo_text_models_same_flips_with_and_without_trimming(name, options):
    model = zoo(name)
    # reuse_prefix=False: the LSTM and GPT-2 would otherwise resume from cached prefixes, which
    # already stop at the last real token; full forwards are the ones that carry the padding
    tokens = Embedding("embed_ln", reuse_prefix=False)
    sigma = 20.0 if name == "lstm" else 3.0
    trimmed, plain = both(model, right_padded(), tokens, sigma=sigma, **options)
    assert_same(trimmed, plain)
    assert 0.0 < plain.estimate < 1.0  # flips happen: the comparison is not vacuous


@pytest.mark.parametrize("name", ["lstm", "gpt2"])
def test_zoo_prefix_reuse_agrees_with_trimmed_full_forwards(name):
    model, batch = zoo(name), right_padded(seed=1)
    reuse = token_sensitivity(model, batch, Embedding("embed_ln"), sigma=20.0, repeats=2)
    full = token_sensitivity(model, batch, Embedding("embed_ln", reuse_prefix=False),
                             sigma=20.0, repeats=2)
    assert torch.equal(reuse.per_sample, full.per_sample)


def test_compare_sensitivity_is_unchanged_by_trimming():
    models = {"roberta": zoo("roberta"), "gpt2": zoo("gpt2")}
    opts = {"sigma": 3.0, "repeats": 2, "generator": 4}
    a = compare_sensitivity(models, right_padded(), Embedding("embed_ln", reuse_prefix=False),
                            **opts)
    b = compare_sensitivity(models, right_padded(), Embedding("embed_ln", reuse_prefix=False),
                            trim_padding=False, **opts)
    d, e = a.difference("roberta", "gpt2"), b.difference("roberta", "gpt2")
    assert d.estimate == e.estimate and d.stderr == e.stderr


# -- real Hugging Face architectures from small configs (no download) --------------------------


def hf_bert() -> nn.Module:
    transformers = pytest.importorskip("transformers")
    config = transformers.BertConfig(
        vocab_size=50, hidden_size=16, num_hidden_layers=2, num_attention_heads=2,
        intermediate_size=32, max_position_embeddings=32, hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0, pad_token_id=PAD,
    )
    torch.manual_seed(0)  # test-only: HF initialises from the global RNG
    return transformers.BertForSequenceClassification(config).double().eval()


def hf_gpt2() -> nn.Module:
    transformers = pytest.importorskip("transformers")
    config = transformers.GPT2Config(
        vocab_size=50, n_embd=16, n_layer=2, n_head=2, n_positions=32, pad_token_id=PAD,
        resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
    )
    torch.manual_seed(0)
    return transformers.GPT2ForSequenceClassification(config).double().eval()


@pytest.mark.parametrize("options", OPTIONS[:3], ids=lambda o: "-".join(map(str, o.values())))
def test_hf_bert_encoder_same_flips(options):
    batch = right_padded()
    batch["token_type_ids"] = torch.zeros_like(batch["input_ids"])  # cut along with the rest
    trimmed, plain = both(hf_bert(), batch, Embedding("bert.embeddings.LayerNorm"), sigma=2.0,
                          **options)
    assert_same(trimmed, plain)
    assert 0.0 < plain.estimate < 1.0


@pytest.mark.parametrize("options", OPTIONS[:3], ids=lambda o: "-".join(map(str, o.values())))
def test_hf_gpt2_decoder_same_flips(options):
    trimmed, plain = both(hf_gpt2(), right_padded(), Embedding("transformer.wte"), sigma=0.3,
                          **options)
    assert_same(trimmed, plain)
    assert 0.0 < plain.estimate < 1.0


def test_left_padding_is_refused_with_the_fix():
    batch = right_padded()
    left = {k: v.flip(1) for k, v in batch.items()}  # the same sentences, padded on the left
    with pytest.raises(ValueError, match=r"left-padded \(example 0 .*padding_side = 'right'"):
        token_sensitivity(hf_gpt2(), left, Embedding("transformer.wte"), sigma=0.3)
    # what the message offers: the left-padded inputs as they are, with the positions the
    # unpadded sentences have (GPT-2's are absolute), gives the right-padded flips
    width = batch["attention_mask"].sum(1)
    left = {k: torch.stack([v[i].roll(int(v.shape[1] - width[i])) for i in range(len(v))])
            for k, v in batch.items()}  # the same sentences, padded on the left
    left["position_ids"] = (left["attention_mask"].long().cumsum(-1) - 1).clamp(min=0)
    r = token_sensitivity(hf_gpt2(), left, Embedding("transformer.wte"), sigma=0.3,
                          trim_padding=False, generator=5)
    right = token_sensitivity(hf_gpt2(), batch, Embedding("transformer.wte"), sigma=0.3,
                              generator=5)
    assert torch.equal(r.per_sample, right.per_sample)
    assert 0.0 < r.estimate < 1.0


# -- trimming saves work, and never costs correctness ------------------------------------------


class PositionCounter:
    """Forward hook: token positions (rows × width) that the hooked module processed."""

    def __init__(self, module: nn.Module) -> None:
        self.positions = 0
        self.handle = module.register_forward_hook(self)

    def __call__(self, module, args, out) -> None:
        self.positions += out.shape[0] * out.shape[1]


@pytest.mark.parametrize("make", [lambda: zoo("roberta"), hf_bert])
def test_trimming_forwards_fewer_token_positions(make):
    model = make()
    name = "embed_ln" if hasattr(model, "embed_ln") else "bert.embeddings.LayerNorm"
    batch = right_padded(b=12, t=16)
    counts = {}
    for trim in (True, False):
        counter = PositionCounter(model.get_submodule(name))
        metric = TokenSensitivity(model, Embedding(name), sigma=2.0, repeats=2, generator=0,
                                  trim_padding=trim)
        metric.update(batch)
        counter.handle.remove()
        counts[trim] = counter.positions
    lengths = batch["attention_mask"].sum(1).double()
    copies = 2 * int(lengths.sum())
    # zero-noise copies of the first examples, evaluated twice, and the batch check's noisy
    # copies of them (together, then in two halves), at the width of the longer
    verify = 2 * VERIFY_ROWS + 2 * VERIFY_BATCH
    # clean batch, the verification copies and every perturbed copy at full width
    assert counts[False] == (12 + verify + copies) * 16
    # trimmed: the clean batch, one clean check per example at its length, the verification
    # copies at their lengths, and every copy at most 1/(1 − SLACK) of its own length wide
    bound = (12 * 16 + lengths.sum() + 2 * lengths[:VERIFY_ROWS].sum()
             + 2 * VERIFY_BATCH * lengths[:VERIFY_ROWS].max()
             + 2 * (lengths * (lengths / (1 - _trim.SLACK))).sum())
    assert counts[True] <= bound
    assert counts[True] < 0.8 * counts[False]


def test_trim_padding_false_and_full_length_batches_cut_nothing():
    model = zoo("roberta")
    full = {"input_ids": torch.randint(2, 50, (4, 8), generator=torch.Generator().manual_seed(0))}
    metric = TokenSensitivity(model, Embedding("embed_ln"), sigma=1.0)
    metric.update(full)
    assert not metric.last_trimmed  # no padding: nothing to cut
    metric = TokenSensitivity(model, Embedding("embed_ln"), sigma=1.0, trim_padding=False)
    metric.update(right_padded())
    assert not metric.last_trimmed
    with pytest.raises(TypeError, match="trim_padding must be True or False"):
        TokenSensitivity(model, Embedding("embed_ln"), sigma=1.0, trim_padding="yes")


def test_mask_that_is_not_the_models_padding_runs_at_full_width():
    """A tensor input with a ``mask`` that leaves real trailing tokens unperturbed (an end token,
    ``=``): the model reads them, the clean check notices, and the batch runs at full width."""
    model = zoo("roberta")
    batch = right_padded()
    ids = batch["input_ids"]
    lengths = batch["attention_mask"].sum(1)
    # perturb all real tokens but the last one; lengths ≥ 2 so every example has one left
    ids, lengths = ids[lengths >= 2], lengths[lengths >= 2]
    mask = torch.arange(ids.shape[1])[None] < (lengths - 1)[:, None]
    tokens = Embedding("embed_ln", reuse_prefix=False)
    metric = TokenSensitivity(model, tokens, sigma=3.0, repeats=2)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a mask may leave out real tokens: no warning
        metric.update(ids, mask)
    assert not metric.last_trimmed
    plain = token_sensitivity(model, ids, tokens, mask=mask, sigma=3.0, repeats=2,
                              trim_padding=False)
    assert torch.equal(metric.compute().per_sample, plain.per_sample)


@pytest.mark.parametrize("pad_id", [PAD, None])
def test_a_mask_that_leaves_out_a_causal_lms_last_tokens_is_refused(pad_id):
    """A causal LM's logits are read at each example's last real token, which — with token ids
    alone — ``mask=`` says. A mask that leaves out an end token (ids other than the pad id;
    without a pad id, ids that differ) is refused: the logits were read at the token before it
    without a word (0.61 against 0.07 on an example). The attention mask beside it, in a dict,
    says where examples end, and mask= then only limits the noise; a mask= that marks the
    padding (trailing pad ids) is measured as before."""
    transformers = pytest.importorskip("transformers")
    config = transformers.GPT2Config(vocab_size=50, n_embd=16, n_layer=1, n_head=2,
                                     n_positions=32, pad_token_id=pad_id)
    torch.manual_seed(0)  # test-only: HF initialises from the global RNG
    model = transformers.GPT2LMHeadModel(config).double().eval()
    batch = right_padded()
    ids, real = batch["input_ids"], batch["attention_mask"]
    but_last = real & (torch.arange(ids.shape[1])[None] < real.sum(1, keepdim=True) - 1)
    keep = but_last.any(1)  # examples of one token have nothing left to perturb
    ids, real, but_last = ids[keep], real[keep], but_last[keep]
    tokens, opts = Embedding("transformer.wte"), {"sigma": 0.5, "repeats": 2}
    with pytest.raises(ValueError, match=r"mask= leaves out the last token\(s\) of example"):
        token_sensitivity(model, ids, tokens, mask=but_last, **opts)
    subset = token_sensitivity(model, {"input_ids": ids, "attention_mask": real}, tokens,
                               mask=but_last, **opts)
    assert subset.per_sample.shape == (len(ids),)
    alone = token_sensitivity(model, ids, tokens, mask=real, **opts)
    with_mask = token_sensitivity(model, {"input_ids": ids, "attention_mask": real}, tokens,
                                  **opts)
    assert torch.equal(alone.per_sample, with_mask.per_sample)


def test_a_bf16_models_copies_are_compared_with_its_output_at_their_width():
    """A bf16 model (its own weights, no autocast) rounds differently at another width: each
    trimmed copy is compared with its example's clean output at the width it runs at, so the
    padded batch gives the unpadded batch's flips (before: a near-tie read at full width made
    one example's copies flip at 0.30 more than without the padding)."""
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(1)  # test-only: ids and HF init; this seed has a bf16 near-tie
    b, t, width = 32, 10, 16
    ids = torch.randint(5, 2000, (b, t))
    config = transformers.LlamaConfig(
        vocab_size=2000, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
        initializer_range=0.4, pad_token_id=0)
    model = transformers.LlamaForCausalLM(config).eval().to(torch.bfloat16)
    pad = torch.zeros(b, width - t, dtype=torch.long)
    padded = {"input_ids": torch.cat([ids, pad], 1),
              "attention_mask": torch.cat([torch.ones_like(ids), pad], 1)}
    plain = {"input_ids": ids, "attention_mask": torch.ones_like(ids)}
    tokens, opts = Embedding("model.embed_tokens"), {"sigma": 0.02, "repeats": 2, "generator": 0}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # bf16 token vectors: the noise's rounding is noted
        trimmed = token_sensitivity(model, padded, tokens, **opts)
        alone = token_sensitivity(model, plain, tokens, **opts)
    assert torch.equal(trimmed.per_sample, alone.per_sample)


class MeanOfAll(nn.Module):
    """Averages every position, padding included: it ignores its attention mask."""

    def __init__(self) -> None:
        super().__init__()
        self.embedding = nn.Embedding(50, 4)
        self.embed_ln = nn.LayerNorm(4)
        self.head = nn.Linear(4, 3)

    def forward(self, input_ids, attention_mask):
        return self.head(self.embed_ln(self.embedding(input_ids)).mean(1))


def test_model_that_reads_its_padding_falls_back_with_a_warning():
    torch.manual_seed(0)  # test-only: model init
    model, batch = MeanOfAll(), right_padded()
    with pytest.warns(RuntimeWarning, match="padding-aware batching is off.*changed its clean"):
        a = token_sensitivity(model, batch, Embedding("embed_ln"), sigma=3.0, repeats=2)
    b = token_sensitivity(model, batch, Embedding("embed_ln"), sigma=3.0, repeats=2,
                          trim_padding=False)
    assert torch.equal(a.per_sample, b.per_sample)


class MeanOfReal(MeanOfAll):
    """Averages the real positions only; under autocast its first logit moves with the
    input's width, as bf16's rounding can (MiniLM's logits moved by 0.0078 between a sentence
    padded to 55 tokens and cut to its own length)."""

    def forward(self, input_ids, attention_mask):
        m = attention_mask.unsqueeze(-1).float()
        out = self.head((self.embed_ln(self.embedding(input_ids)) * m).sum(1) / m.sum(1))
        if torch.is_autocast_enabled("cpu"):
            out = out + torch.tensor([0.01 * input_ids.shape[1], 0.0, 0.0])
        return out


def test_under_autocast_whether_the_model_reads_its_padding_is_asked_in_float32(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Under ``autocast=`` the cut is checked in float32: bf16's rounding, which moves with the
    width, had switched padding-aware batching off for a model that does not read its padding
    (MiniLM on real sentences: twice the token positions). A model that reads its padding is
    still found."""
    torch.manual_seed(0)  # test-only: model init
    batch = right_padded(40)
    metric = TokenSensitivity(MeanOfReal(), Embedding("embed_ln"), sigma=3.0, repeats=2,
                              autocast=torch.bfloat16, generator=0)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        metric.update(batch)
    assert metric.last_trimmed
    # each copy is compared with its example's clean output at its own width: noise too small
    # to change a class flips nothing, although the width moves the first logit. Such noise is
    # refused under autocast (bf16's grid rounds it away: tests/tokens/test_autocast_grid72.py);
    # here the widths are under test, not the noise, so that check is lifted
    with pytest.raises(ValueError, match="under autocast=torch.bfloat16"):
        token_sensitivity(MeanOfReal(), batch, Embedding("embed_ln"), sigma=1e-4, repeats=2,
                          autocast=torch.bfloat16, generator=0)
    from senslab.tokens import _grid
    monkeypatch.setattr(_grid, "ROUNDING_RTOL", math.inf)
    monkeypatch.setattr(_grid, "ROUNDING_WARN", math.inf)
    monkeypatch.setattr(_grid, "ROUNDING_MAX_UNCHANGED", 1.0)
    torch.manual_seed(0)
    quiet = token_sensitivity(MeanOfReal(), batch, Embedding("embed_ln"), sigma=1e-4,
                              repeats=2, autocast=torch.bfloat16, generator=0)
    assert quiet.estimate == 0.0
    torch.manual_seed(0)
    reads = TokenSensitivity(MeanOfAll(), Embedding("embed_ln"), sigma=3.0, repeats=2,
                             autocast=torch.bfloat16, generator=0)
    with pytest.warns(RuntimeWarning, match="padding-aware batching is off.*changed its clean"):
        reads.update(batch)
    assert not reads.last_trimmed


def test_the_tangent_pass_is_trimmed_too():
    """The control variate's and the allocation's forward and backward pass per example runs
    on inputs cut like the copies (longest first, each chunk as wide as its longest example)."""
    model = zoo("roberta")
    batch = right_padded(b=12, t=16)
    widths = {}
    for trim in (True, False):
        seen: list[int] = []

        def hook(module, args, out, seen=seen):
            if torch.is_grad_enabled():  # only the tangent pass runs with gradients
                seen.extend([out.shape[1]] * out.shape[0])

        handle = model.get_submodule("embed_ln").register_forward_hook(hook)
        metric = TokenSensitivity(model, Embedding("embed_ln"), sigma=2.0, generator=0,
                                  allocation="linear", budget=0.5, trim_padding=trim)
        metric.update(batch)
        handle.remove()
        assert metric.last_trimmed == trim
        widths[trim] = seen
    lengths = batch["attention_mask"].sum(1)
    assert widths[False] == [16] * 12
    assert len(widths[True]) == 12 and max(widths[True]) == int(lengths.max()) < 16


class PaddingMaskModel(nn.Module):
    """Takes a ``padding_mask`` that is True on padding (PyTorch's and fairseq's convention)
    and averages the real positions only."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)  # test-only: model init
        self.embedding = nn.Embedding(50, 4)
        self.embed_ln = nn.LayerNorm(4)
        self.head = nn.Linear(4, 3)

    def forward(self, input_ids, padding_mask):
        h = self.embed_ln(self.embedding(input_ids))
        real = (~padding_mask).unsqueeze(-1).to(h.dtype)
        return self.head((h * real).sum(1) / real.sum(1))


@pytest.mark.parametrize("key", ["padding_mask", "key_padding_mask"])
def test_a_padding_mask_of_either_convention_is_never_guessed(key):
    """A ``padding_mask`` entry may mean padding (True) or real tokens: read the wrong way the
    noise would land on the padding only, which the model ignores (a false 0). Without mask=
    it is refused with both fixes; with mask= the user's real tokens count, trimmed or not."""
    batch = right_padded()
    model = PaddingMaskModel()
    inputs = {"input_ids": batch["input_ids"], key: ~batch["attention_mask"]}
    if key != "padding_mask":  # the model's own argument is named padding_mask
        model.forward = lambda input_ids, key_padding_mask: PaddingMaskModel.forward(
            model, input_ids, key_padding_mask)
    with pytest.raises(ValueError, match=rf"{key}.*mask=~inputs\['{key}'\]"):
        token_sensitivity(model, inputs, Embedding("embed_ln"), sigma=3.0, repeats=2)
    real = ~inputs[key]
    metric = TokenSensitivity(model, Embedding("embed_ln"), sigma=3.0, repeats=2, generator=0)
    metric.update(inputs, mask=real)
    a = metric.compute()
    b = token_sensitivity(model, inputs, Embedding("embed_ln"), mask=real, sigma=3.0, repeats=2,
                          generator=0, trim_padding=False)
    assert metric.last_trimmed
    assert torch.equal(a.per_sample, b.per_sample)
    assert a.estimate > 0.05  # flips on the real tokens (read the other way round: exactly 0)


class _Thin(nn.Module):
    """A user's wrapper whose forward names nothing: ``forward(*args, **kwargs)``."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, *args, **kwargs):
        return self.model(*args, **kwargs)


@pytest.mark.heavy  # torch.compile traces each chunk shape
def test_a_tuple_input_keeps_its_mask_through_dataparallel_and_compile():
    """(input_ids, attention_mask) as a tuple is read through the forward's signature; inside
    DataParallel/DDP (``.module``) or torch.compile (``._orig_mod``) that signature is the
    wrapper's (*args, **kwargs), so the mask was lost and the padding measured as tokens (a
    BERT through DDP: 0.0391 for 0.0658, and the regularizer's noise on padding in 101 of 320
    rows). A wrapper that cannot be seen through is refused unless mask= is given."""
    model, batch = zoo("roberta"), right_padded()
    x = (batch["input_ids"], batch["attention_mask"])
    want = token_sensitivity(model, x, Embedding(model.embed_ln), sigma=2.0, repeats=2,
                             generator=0)
    for wrapped in (nn.DataParallel(model), torch.compile(model, backend="eager")):
        got = token_sensitivity(wrapped, x, Embedding(model.embed_ln), sigma=2.0, repeats=2,
                                generator=0)
        assert torch.equal(got.per_sample, want.per_sample), type(wrapped).__name__
    thin = _Thin(model)
    with pytest.raises(ValueError, match=r"as \*args, without names(?s:.*)mask="):
        token_sensitivity(thin, x, Embedding(model.embed_ln), sigma=2.0, repeats=2, generator=0)
    given = token_sensitivity(thin, x, Embedding(model.embed_ln), sigma=2.0, repeats=2,
                              generator=0, mask=batch["attention_mask"].bool())
    assert torch.equal(given.per_sample, want.per_sample)


def test_a_forward_that_names_the_mask_before_its_varargs_keeps_it():
    """``forward(input_ids, attention_mask=None, *args)``: an extra positional argument goes to
    *args, the mask keeps its name (the first version of the *args refusal dropped every name
    once anything went to *args)."""
    model, batch = zoo("roberta"), right_padded()

    class Named(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.model = model

        def forward(self, input_ids, attention_mask=None, *args):
            return self.model(input_ids, attention_mask)

    x = (batch["input_ids"], batch["attention_mask"])
    want = token_sensitivity(model, x, Embedding(model.embed_ln), sigma=2.0, repeats=2,
                             generator=0)
    extra = (*x, torch.zeros(len(x[0])))
    got = token_sensitivity(Named(), extra, Embedding(model.embed_ln), sigma=2.0, repeats=2,
                            generator=0)
    assert torch.equal(got.per_sample, want.per_sample)
