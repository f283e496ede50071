"""The zoo's sequence models (LSTM, RoBERTa-style encoders, GPT-2-style decoder, ViTs) as measured
objects: their plain forward against hand-written reference computations, how they read padding,
and what they refuse (ids outside the vocabulary, masks that are not 0/1, empty sequences)."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from senslab.models import create_model
from senslab.models.text import SelfAttention, init_weights

PAD = 1
VOCAB = 30
SMALL = dict(vocab_size=VOCAB, max_len=12, dim=16, layers=2, heads=2, pad_id=PAD, dropout=0.0)
# (registry name, overrides, pooling the model documents)
TEXT = [
    ("lstm", {}, "last"),
    ("roberta", {}, "first"),
    ("roberta", {"norm": "pre"}, "first"),
    ("roberta_relu", {}, "first"),
    ("roberta_relu", {"norm": "pre"}, "first"),
    ("gpt2", {}, "last"),
]
IDS = [f"{n}-{kw.get('norm', 'default')}" for n, kw, _ in TEXT]


@pytest.fixture(autouse=True)
def _one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def lively(name: str, **kw) -> torch.nn.Module:
    """A tiny model with large weights, so that every position really moves the read-out (at the
    0.02 init the attention branches are too small for a test to see them)."""
    model = create_model(name, **{**SMALL, **kw}).eval()
    init_weights(model, torch.Generator().manual_seed(5), linear_std=0.3, embed_std=1.0)
    return model


def batch(lengths: list[int], width: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Right-padded ids whose real tokens include the pad id itself (it must count as a real
    token where the mask says so), and random ids (not the pad id) under the padding: only the
    mask tells padding here."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, VOCAB, (len(lengths), width), generator=g)
    ids[:, 0] = PAD  # the pad id as a real first token
    mask = torch.arange(width)[None] < torch.tensor(lengths)[:, None]
    garbage = torch.randint(2, VOCAB, ids.shape, generator=g)
    return torch.where(mask, ids, garbage), mask


def reference(model: torch.nn.Module, ids: torch.Tensor, pooling: str) -> torch.Tensor:
    """Logits of one unpadded sequence ``ids`` (n,), computed here from the model's weights:
    attention written out per head, softmax normalised over keys, ReLU *not* normalised (the
    documented relu(q·k/√d)), causal for the decoder, no mask needed since nothing is padding."""
    n = len(ids)
    if hasattr(model, "lstm"):
        out = model.lstm(model.embed_ln(model.embed(ids))[None])[0][0]
        return model.head(out[-1])
    cfg = model.config
    causal = pooling == "last"
    h = model.embed_ln(model.embed(ids)) + model.pos_embed.weight[:n]
    for blk in model.blocks:
        attn = blk.attn
        dh = cfg.dim // cfg.heads

        def mix(x: torch.Tensor, attn=attn, dh=dh) -> torch.Tensor:
            q, k, v = attn.qkv(x).view(n, 3, cfg.heads, dh).unbind(1)  # each (n, heads, dh)
            scores = torch.einsum("ihd,jhd->hij", q, k) / math.sqrt(dh)
            if causal:
                scores = scores.masked_fill(~torch.ones(n, n, dtype=torch.bool).tril(), -math.inf)
            w = scores.softmax(-1) if attn.attention == "softmax" else torch.relu(scores)
            return attn.proj(torch.einsum("hij,jhd->ihd", w, v).reshape(n, cfg.dim))

        if blk.norm == "pre":
            h = h + mix(blk.ln1(h))
            h = h + blk.mlp(blk.ln2(h))
        else:
            h = blk.ln1(h + mix(h))
            h = blk.ln2(h + blk.mlp(h))
    h = model.norm(h)
    return model.head(h[0] if pooling == "first" else h[-1])


# ----------------------------------------------------------------- (a) padding invariance
@pytest.mark.parametrize(("name", "kw", "pooling"), TEXT, ids=IDS)
def test_padded_batches_give_each_sequence_its_unpadded_reference_logits(name, kw, pooling):
    model = lively(name, **kw)
    lengths = [5, 1, 3, 5]  # a one-token row, and rows padded at their own length
    with torch.no_grad():
        ids, mask = batch(lengths, 5)
        own = model(ids, mask)
        # the same rows padded to 12: 7 more positions of garbage ids
        g = torch.Generator().manual_seed(9)
        extra = torch.randint(2, VOCAB, (len(lengths), 7), generator=g)
        ids_long = torch.cat([ids, extra], dim=1)
        mask_long = torch.cat([mask, torch.zeros(len(lengths), 7, dtype=torch.bool)], dim=1)
        longer = model(ids_long, mask_long)
        for i, n in enumerate(lengths):
            ref = reference(model, ids[i, :n], pooling)
            torch.testing.assert_close(own[i], ref, atol=2e-5, rtol=1e-5)
            torch.testing.assert_close(longer[i], ref, atol=2e-5, rtol=1e-5)
            alone = model(ids[i : i + 1, :n], torch.ones(1, n, dtype=torch.bool))  # batch of 1
            torch.testing.assert_close(alone[0], ref, atol=2e-5, rtol=1e-5)
        assert (own - own[1]).abs().amax() > 1e-3  # the rows really differ


@pytest.mark.parametrize(("name", "kw", "pooling"), TEXT, ids=IDS)
def test_masked_positions_contribute_exactly_nothing(name, kw, pooling):
    """At one width, changing every id under the padding leaves the logits bit for bit equal:
    masked keys have weight exactly 0 (ReLU attention multiplies them by 0, it never
    renormalises), and the LSTM and the decoder read no position after the last real token."""
    model = lively(name, **kw)
    with torch.no_grad():
        ids, mask = batch([4, 2, 7], 9)
        other = torch.where(mask, ids, (ids + 7) % VOCAB)
        assert not torch.equal(other, ids)
        assert torch.equal(model(other, mask), model(ids, mask))


@pytest.mark.parametrize(("name", "kw", "pooling"), TEXT, ids=IDS)
def test_all_padding_rows_and_left_padding_are_refused(name, kw, pooling):
    model = lively(name, **kw)
    ids, mask = batch([3, 2], 4)
    empty = mask.clone()
    empty[1] = False
    with pytest.raises(ValueError, match="row 1 starts with padding"):
        model(ids, empty)
    with pytest.raises(ValueError, match="right padding"):
        model(ids, mask.flip(1))  # left padding (the decoder does not claim support for it)


def test_relu_attention_is_unnormalised_and_softmax_is_normalised():
    """Two copies of the same keys: ReLU attention's mixture doubles (no renormalisation over
    keys), softmax's stays put; padding the copy instead changes neither."""
    g = torch.Generator().manual_seed(3)
    x = torch.randn(1, 3, 8, generator=g)
    twice = torch.cat([x, x], dim=1)
    for kind, factor in (("relu", 2.0), ("softmax", 1.0)):
        attn = SelfAttention(8, 2, attention=kind).eval()
        init_weights(attn, torch.Generator().manual_seed(4), linear_std=0.5)
        bias = attn.proj.bias
        with torch.no_grad():
            once = attn(x) - bias
            doubled = attn(twice)[:, :3] - bias
            padded = attn(twice, torch.tensor([[True] * 3 + [False] * 3]))[:, :3] - bias
        torch.testing.assert_close(doubled, factor * once, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(padded, once, atol=1e-5, rtol=1e-5)
        assert once.abs().amax() > 1e-2


# ----------------------------------------------------------------- (c) causality
def test_the_decoder_never_reads_a_later_token():
    model = lively("gpt2")
    ids, mask = batch([8, 6], 8)
    with torch.no_grad():
        clean = model.hidden_states(ids, mask)
        for t in range(6):
            changed = ids.clone()
            changed[:, t] = (ids[:, t] + 5) % VOCAB
            h = model.hidden_states(changed, mask)
            assert torch.equal(h[:, :t], clean[:, :t]), t
            assert (h[:, t] - clean[:, t]).abs().amax() > 1e-3, t


# ----------------------------------------------------------------- (d) positions
@pytest.mark.parametrize(("name", "kw", "pooling"), TEXT, ids=IDS)
def test_a_sequence_longer_than_the_positions_is_refused(name, kw, pooling):
    model = lively(name, **kw)
    full = torch.full((1, SMALL["max_len"]), 3)
    assert model(full).shape == (1, 2)  # exactly max_len: accepted
    with pytest.raises(ValueError, match=r"exceeds max_len 12.*max_len=13"):
        model(torch.full((1, SMALL["max_len"] + 1), 3))


# ----------------------------------------------------------------- (e) eval mode
@pytest.mark.parametrize(("name", "kw", "pooling"), TEXT, ids=IDS)
def test_eval_mode_turns_every_dropout_off(name, kw, pooling):
    """Dropout draws nothing from the init generator, so the same seed with dropout 0.5 and 0.0
    has the same weights: in eval mode both give the same logits, call after call."""
    ids, mask = batch([6, 3], 6)
    noisy = create_model(name, **{**SMALL, **kw, "dropout": 0.5}).eval()
    plain = create_model(name, **{**SMALL, **kw}).eval()
    with torch.no_grad():
        first = noisy(ids, mask)
        assert torch.equal(noisy(ids, mask), first)
        assert torch.equal(plain(ids, mask), first)
        torch.manual_seed(0)  # test-only: train-mode dropout draws from the global RNG
        assert not torch.equal(noisy.train()(ids, mask), first)  # the dropout is really there


# ----------------------------------------------------------------- refusals (fixed)
@pytest.mark.parametrize(("name", "kw", "pooling"), TEXT, ids=IDS)
def test_token_ids_outside_the_vocabulary_are_refused_naming_vocab_size(name, kw, pooling):
    """Before: torch's bare "index out of range in self" (on a GPU a device-side assert that ends
    the process); a tokenizer larger than the model's vocab_size is the usual cause."""
    model = lively(name, **kw)
    for bad in (VOCAB, -1):
        with pytest.raises(ValueError, match=rf"ids 0 to {VOCAB - 1} \(vocab_size {VOCAB}\)"):
            model(torch.tensor([[3, bad, 4]]))


@pytest.mark.parametrize(("name", "kw", "pooling"), TEXT, ids=IDS)
def test_an_attention_mask_that_is_not_zero_one_is_refused(name, kw, pooling):
    """Before: every non-zero entry read as a real token — a soft mask's 0.5 gave the logits of
    a full-weight token without a word, and an additive mask (0 real, −1e9 padding) was refused
    as "left-padded" with no word of the convention."""
    model = lively(name, **kw)
    ids = torch.tensor([[3, 4, 5]])
    with pytest.raises(ValueError, match=r"holds 0\.5.*attention_mask=\(mask == 0\)"):
        model(ids, torch.tensor([[1.0, 1.0, 0.5]]))
    with pytest.raises(ValueError, match="additive mask"):
        model(ids, torch.tensor([[0.0, 0.0, -1e9]]))
    with pytest.raises(ValueError, match="holds nan"):
        model(ids, torch.tensor([[1.0, 1.0, math.nan]]))
    # 0/1 in any dtype is the same mask
    ref = model(ids, torch.tensor([[True, True, False]]))
    for dtype in (torch.long, torch.float32, torch.uint8):
        assert torch.equal(model(ids, torch.tensor([[1, 1, 0]], dtype=dtype)), ref)


@pytest.mark.parametrize(("name", "kw", "pooling"), TEXT, ids=IDS)
def test_malformed_batches_get_an_error_naming_the_problem(name, kw, pooling):
    model = lively(name, **kw)
    with pytest.raises(ValueError, match="length 0"):  # before: IndexError on mask[:, 0]
        model(torch.zeros(2, 0, dtype=torch.long))
    with pytest.raises(ValueError, match="token ids"):  # before: "right padding"
        model(torch.tensor([[True, False]]))
    # the pad id inside a sequence without attention_mask (an end token that doubles as
    # padding): before, only "left-padded or empty rows are not supported"
    with pytest.raises(ValueError, match=r"row 0 has a real token at position 2.*pad_id 1.*"
                                         r"pass the attention_mask"):
        model(torch.tensor([[3, PAD, 4]]))
    # ... and with the mask it is a real token like any other
    with_pad = model(torch.tensor([[3, PAD, 4]]), torch.ones(1, 3, dtype=torch.bool))
    assert torch.isfinite(with_pad).all()


# ----------------------------------------------------------------- (f) ViTs
VIT = dict(image_size=8, patch_size=4, dim=16, depth=1, heads=2, dim_head=8, mlp_dim=16,
           num_classes=3)


@pytest.mark.parametrize("name", ["vit_small", "vit_simple"])
def test_vit_refuses_a_patch_that_does_not_divide_the_image(name):
    with pytest.raises(ValueError, match="patch size 3 does not divide image size 8x8"):
        create_model(name, **{**VIT, "patch_size": 3})
    model = create_model(name, **VIT).eval()
    with pytest.raises(ValueError, match=r"expects images of shape \(batch, 3, 8, 8\)"):
        model(torch.zeros(1, 3, 10, 10))


@pytest.mark.parametrize(("name", "pooling"), [("vit_small", "cls"), ("vit_simple", "mean")])
def test_vit_head_reads_the_documented_pooling(name, pooling):
    """ViT-small reads the class token (row 0), ViT-simple the mean over its patch tokens: the
    head's input equals that pooling of the last block's output, and the head alone gives the
    logits."""
    model = create_model(name, **VIT).eval()
    seen: dict[str, torch.Tensor] = {}
    model.blocks[-1].register_forward_hook(lambda m, a, out: seen.__setitem__("tokens", out))
    model.head.register_forward_pre_hook(lambda m, a: seen.__setitem__("pooled", a[0]))
    x = torch.randn(2, 3, 8, 8, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        logits = model(x)
        assert torch.equal(model(x), logits)
    tokens = seen["tokens"]
    assert tokens.shape[1] == (5 if pooling == "cls" else 4)  # 4 patches (+ the class token)
    expected = tokens[:, 0] if pooling == "cls" else tokens.mean(dim=1)
    torch.testing.assert_close(seen["pooled"], expected, atol=1e-6, rtol=1e-6)
    ln, linear = model.head
    torch.testing.assert_close(
        logits, F.linear(F.layer_norm(expected, ln.normalized_shape, ln.weight, ln.bias,
                                      ln.eps), linear.weight, linear.bias),
        atol=1e-5, rtol=1e-5)
