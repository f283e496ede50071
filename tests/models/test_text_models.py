"""Text classifiers: shapes, gradients, padding invariance, causality, ReLU attention, hooks."""

from __future__ import annotations

import math

import pytest
import torch

from senslab.models import create_model, list_models
from senslab.models._config import override_config
from senslab.models.text import SelfAttention, TextConfig, init_weights
from senslab.tokens import Embedding

NAMES = ["lstm", "roberta", "roberta_relu", "gpt2"]
PAD = 1
SMALL = dict(vocab_size=40, max_len=16, dim=16, layers=2, heads=2, pad_id=PAD)
LENGTHS = [8, 6, 3]


def make_batch(seed: int = 0, lengths: list[int] = LENGTHS) -> tuple[torch.Tensor, torch.Tensor]:
    """Right-padded ids (B, max length) with real tokens drawn from [2, vocab) and a bool mask."""
    g = torch.Generator().manual_seed(seed)
    length = max(lengths)
    ids = torch.randint(2, SMALL["vocab_size"], (len(lengths), length), generator=g)
    mask = torch.arange(length)[None, :] < torch.tensor(lengths)[:, None]
    return ids.masked_fill(~mask, PAD), mask


def small(name: str, **kw) -> torch.nn.Module:
    return create_model(name, **{**SMALL, **kw})


def lively(name: str) -> torch.nn.Module:
    """A small model with large weights. Under the 0.02 init of RoBERTa/GPT-2 every attention
    branch is tiny, so at init the CLS read-out barely sees the other tokens (logit changes
    ~1e-7), too close to float noise for a test to tell a working hook from a broken one."""
    model = small(name).eval()
    init_weights(model, torch.Generator().manual_seed(5), linear_std=0.3, embed_std=1.0)
    return model


def test_all_registered() -> None:
    assert set(NAMES) <= set(list_models())


@pytest.mark.parametrize("name", NAMES)
def test_shapes_and_finite_gradients(name: str) -> None:
    # train mode; dropout off so the check reads no global RNG
    model = small(name, num_classes=3, dropout=0.0).train()
    ids, mask = make_batch()
    out = model(ids, attention_mask=mask)
    assert out.shape == (3, 3)
    out.square().sum().backward()
    for pname, p in model.named_parameters():
        assert p.requires_grad, pname
        assert p.grad is not None, f"{pname} gets no gradient"
        assert torch.isfinite(p.grad).all(), pname
        # every tensor learns; the paper code never optimised the LSTM's embedding and head
        assert p.grad.abs().sum() > 0, f"{pname} has an all-zero gradient"


@pytest.mark.parametrize(
    ("name", "kw"), [(n, {}) for n in NAMES] + [("roberta", {"norm": "pre"})]
)
def test_padding_does_not_change_logits(name: str, kw: dict) -> None:
    model = small(name, **kw).eval()
    ids, mask = make_batch()
    clean = model(ids, mask)
    # five more pads on the right, and garbage token ids under the existing padding
    g = torch.Generator().manual_seed(1)
    longer = torch.cat([ids, torch.full((3, 5), PAD)], dim=1)
    longer_mask = torch.cat([mask, torch.zeros(3, 5, dtype=torch.bool)], dim=1)
    garbage = torch.randint(2, SMALL["vocab_size"], longer.shape, generator=g)
    longer = torch.where(longer_mask, longer, garbage)
    torch.testing.assert_close(model(longer, longer_mask), clean, atol=1e-5, rtol=1e-5)
    # and the result equals running each sequence alone, unpadded
    for i, n in enumerate(LENGTHS):
        alone = model(ids[i : i + 1, :n])
        torch.testing.assert_close(alone[0], clean[i], atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("name", NAMES)
def test_mask_defaults_to_non_pad_tokens(name: str) -> None:
    model = small(name).eval()
    ids, mask = make_batch()
    torch.testing.assert_close(model(ids), model(ids, mask.long()))


@pytest.mark.parametrize("name", NAMES)
def test_bad_batches_are_refused(name: str) -> None:
    model = small(name).eval()
    ids, mask = make_batch()
    with pytest.raises(ValueError, match="right padding"):
        model(ids, mask.flip(1))  # left padding
    with pytest.raises(ValueError, match="max_len"):
        model(torch.full((1, 17), 3))
    with pytest.raises(ValueError, match="token ids"):
        model(ids.float())


def test_lstm_parameter_count() -> None:
    v, d, layers, c = 40, 16, 2, 2
    model = small("lstm", layers=layers)
    # per LSTM layer: 4 gates × (input weights + recurrent weights + two bias vectors)
    lstm = sum(4 * d * (d + d) + 8 * d for _ in range(layers))
    expected = v * d + 2 * d + lstm + d * c + c
    assert sum(p.numel() for p in model.parameters()) == expected


def test_gpt2_is_causal() -> None:
    model = small("gpt2").eval()
    ids, _ = make_batch(lengths=[8, 8])
    changed = ids.clone()
    changed[:, 5] = (ids[:, 5] - 2 + 1) % (SMALL["vocab_size"] - 2) + 2  # a different real token
    h, h2 = model.hidden_states(ids), model.hidden_states(changed)
    torch.testing.assert_close(h2[:, :5], h[:, :5], atol=1e-6, rtol=0)
    assert (h2[:, 5:] - h[:, 5:]).abs().amax(dim=-1).min() > 1e-4  # later positions all moved


def test_roberta_is_bidirectional() -> None:
    # the counterpart of the causal test: in the encoder a later token reaches position 0
    model = small("roberta").eval()
    ids, _ = make_batch(lengths=[8, 8])
    changed = ids.clone()
    changed[:, 5] = (ids[:, 5] - 2 + 1) % (SMALL["vocab_size"] - 2) + 2
    diff = model.hidden_states(changed)[:, 0] - model.hidden_states(ids)[:, 0]
    assert diff.abs().amax() > 1e-4


def test_relu_attention_differs_from_softmax() -> None:
    soft, relu = lively("roberta"), lively("roberta_relu")
    assert relu.config.attention == "relu" and soft.config.attention == "softmax"
    # same architecture and identical weights: only the attention function differs
    for (n, a), (_, b) in zip(soft.state_dict().items(), relu.state_dict().items(), strict=True):
        assert torch.equal(a, b), n
    ids, mask = make_batch()
    assert (soft(ids, mask) - relu(ids, mask)).abs().max() > 1e-2


@pytest.mark.parametrize("kind", ["softmax", "relu"])
def test_attention_matches_formula(kind: str) -> None:
    g = torch.Generator().manual_seed(2)
    attn = SelfAttention(4, 1, attention=kind).eval()
    init_weights(attn, g, linear_std=0.5)  # large weights: scores far from zero, some negative
    x = torch.randn(2, 5, 4, generator=g)
    key_mask = torch.tensor([[True] * 5, [True, True, True, False, False]])
    q, k, v = attn.qkv(x).split(4, dim=-1)
    scores = q @ k.transpose(1, 2) / math.sqrt(4)
    allowed = key_mask[:, None, :]
    if kind == "softmax":
        w = scores.masked_fill(~allowed, float("-inf")).softmax(-1)
    else:  # unnormalised: weights need not sum to 1
        w = torch.relu(scores) * allowed
    expected = attn.proj(w @ v)
    torch.testing.assert_close(attn(x, key_mask), expected, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("name", NAMES)
def test_embed_ln_hook_injects_noise(name: str) -> None:
    model = lively(name)
    ids, mask = make_batch()
    clean = model(ids, mask)

    # random, not constant: LayerNorms downstream erase a shift along the all-ones direction
    noise = torch.randn(3, SMALL["dim"], generator=torch.Generator().manual_seed(3))

    def replace(module, args, out):  # what the Embedding tokenization does: return a new output
        out = out.clone()
        out[:, 1] += noise
        return out

    handle = model.embed_ln.register_forward_hook(replace)
    try:
        noisy = model(ids, mask)
    finally:
        handle.remove()
    assert (noisy - clean).abs().amax(dim=1).min() > 1e-5  # every example moved
    torch.testing.assert_close(model(ids, mask), clean)  # hook gone, model unchanged


@pytest.mark.parametrize("name", NAMES)
def test_default_tokens_bind_to_embed_ln(name: str) -> None:
    model = lively(name)
    tokens = model.default_tokens()
    assert isinstance(tokens, Embedding) and tokens.module == "embed_ln"
    ids, mask = make_batch()
    with tokens.bind(model, {"input_ids": ids, "attention_mask": mask}) as bound:
        assert torch.equal(bound.valid, mask)  # padding is never a token
        assert bound.dim == SMALL["dim"]
        src, tok = torch.tensor([0, 1, 2]), torch.tensor([0, 2, 1])
        zero = bound.forward_perturbed(src, tok, torch.zeros(3, SMALL["dim"]))
        torch.testing.assert_close(zero, bound.clean_output)
        noise = torch.randn(3, SMALL["dim"], generator=torch.Generator().manual_seed(3))
        noisy = bound.forward_perturbed(src, tok, noise)
        assert (noisy - bound.clean_output).abs().amax(dim=1).min() > 1e-5


def test_overrides() -> None:
    model = create_model("roberta", dim=32, heads=4, norm="pre")
    assert model.config.dim == 32 and model.config.norm == "pre"
    assert model.embed_ln.normalized_shape == (32,)
    with pytest.raises(TypeError, match="'dimm'.*Did you mean 'dim'"):
        create_model("gpt2", dimm=32)
    with pytest.raises(TypeError, match="expects int"):
        create_model("lstm", dim="32")
    with pytest.raises(ValueError, match="attention must be one of"):
        create_model("roberta", attention="linear")
    with pytest.raises(ValueError, match="divisible"):
        create_model("gpt2", dim=30, heads=4)
    with pytest.raises(ValueError, match="pad_id"):
        override_config(TextConfig(), {"vocab_size": 10, "pad_id": 10})


@pytest.mark.parametrize("name", NAMES)
def test_seed_fixes_weights(name: str) -> None:
    a, b, c = small(name, seed=3), small(name, seed=3), small(name, seed=4)
    pa, pb, pc = (torch.cat([p.flatten() for p in m.parameters()]) for m in (a, b, c))
    assert torch.equal(pa, pb)
    assert not torch.equal(pa, pc)


def prefix_model(name: str) -> torch.nn.Module:
    """A 2-layer model whose predictions vary with its input (larger weights than at init)."""
    if name == "gpt2":
        return lively("gpt2")
    model = small(name, layers=2).eval()
    with torch.no_grad():  # at PyTorch's init this LSTM predicts one class
        for p in model.parameters():
            p.mul_(3)
    return model


@pytest.mark.parametrize("name", ["lstm", "gpt2"])
@pytest.mark.parametrize("options", [
    {"repeats": 3},
    {"repeats": 4, "antithetic": True, "num_tokens": 5},
    {"repeats": 2, "compare": "l2"},
])
def test_prefix_reuse_matches_full_forwards(name: str, options: dict) -> None:
    """A copy perturbed at token t resumed from the clean prefix (LSTM states, GPT-2 keys and
    values) gives the full forward's prediction (2 layers, right padding, an example of one
    real token)."""
    from senslab.measure import TokenSensitivity

    model = prefix_model(name)
    ids, mask = make_batch(lengths=[9, 4, 1, 7])
    batch = {"input_ids": ids, "attention_mask": mask}
    runs = {}
    for reuse in (False, True):
        m = TokenSensitivity(model, Embedding("embed_ln", reuse_prefix=reuse), sigma=2.0,
                             generator=3, **options)
        m.update(batch)
        runs[reuse] = m.compute()
    full, fast = runs[False], runs[True]
    assert full.num_forward == fast.num_forward
    if options.get("compare") == "l2":
        assert full.estimate > 0.01
        assert torch.allclose(full.per_sample, fast.per_sample, rtol=1e-4, atol=1e-6)
    else:
        assert 0.02 < full.estimate < 0.98
        assert torch.equal(full.per_sample, fast.per_sample)


def test_gpt2_suffix_reads_the_prefix_up_to_its_groups_latest_token() -> None:
    """GPT-2's suffix forward reads the clean keys only up to the latest perturbed token of a
    group: groups whose copies all perturb the first token (no prefix at all), or tokens spread
    over the sequence, give the logits of full forwards with the same noise — also 40 copies in
    one call, whose attention groups hold copies of several suffix lengths (padding slots)."""
    model = prefix_model("gpt2")
    ids, mask = make_batch(lengths=[9, 4, 1, 7])
    batch = {"input_ids": ids, "attention_mask": mask}
    seen = {}
    handle = model.embed_ln.register_forward_hook(lambda m, a, out: seen.update(t=out))
    with torch.no_grad():
        model(ids, mask)
    handle.remove()
    g = torch.Generator().manual_seed(7)
    with torch.no_grad():
        cache = model.prefix_cache(seen["t"], batch)
        many = torch.randint(0, 4, (40,), generator=g)
        many_tok = (torch.rand(40, generator=g) * mask.sum(1)[many]).long()  # a real token
        for src, tok in ((torch.tensor([0, 1, 2, 3, 0]), torch.zeros(5, dtype=torch.long)),
                         (torch.tensor([0, 0, 1, 3, 3, 2]), torch.tensor([0, 8, 3, 6, 2, 0])),
                         (many, many_tok)):
            noise = torch.randn(len(src), seen["t"].shape[-1], generator=g)
            fast = model.forward_suffix(cache, src, tok, noise)
            delta = torch.zeros(len(src), *seen["t"].shape[1:])
            delta[torch.arange(len(src)), tok] = noise
            handle = model.embed_ln.register_forward_hook(
                lambda m, a, out, delta=delta: out + delta)
            try:
                full = model(ids[src], mask[src])
            finally:
                handle.remove()
            assert torch.allclose(fast, full, rtol=1e-4, atol=1e-5)


def test_lstm_prefix_cache_equals_the_lstm_states() -> None:
    model = small("lstm", layers=2).eval()
    ids, mask = make_batch(lengths=[6, 3])
    batch = {"input_ids": ids, "attention_mask": mask}
    with torch.no_grad():
        tokens = model.embed_ln(model.embed(ids))
        out, (h, c) = model.lstm(tokens)
        cache = model.prefix_cache(tokens, batch)
    assert torch.allclose(cache["h"][:, -1].transpose(0, 1), out, atol=1e-6)  # top layer
    assert torch.allclose(cache["h"][-1], h, atol=1e-6) and torch.allclose(cache["c"][-1], c,
                                                                             atol=1e-6)
    assert cache["last"].tolist() == [5, 2]
    model.train()
    with pytest.raises(RuntimeError, match="eval mode"):
        model.prefix_cache(tokens, batch)


def test_prefix_reuse_off_in_train_mode_measurements() -> None:
    """``eval_mode=False`` on a model in train mode (dropout on) runs full forwards: the cache
    (which refuses train mode) is never built."""
    from senslab.measure import token_sensitivity

    model = small("lstm", dropout=0.0).train()
    ids, mask = make_batch()
    r = token_sensitivity(model, {"input_ids": ids, "attention_mask": mask},
                          Embedding("embed_ln"), sigma=1.0, eval_mode=False)
    assert r.num_forward == len(ids) + int(mask.sum())


@pytest.mark.parametrize(("name", "budget"), [("lstm", 16 << 10), ("gpt2", 32 << 10)])
def test_prefix_reuse_chunk_size_does_not_shrink_with_the_batch(name: str, budget: int) -> None:
    """The automatic chunk size counts what one copy costs — its activations and its example's
    rows of the clean cache — not the cache of the whole batch, which every chunk shares: a batch
    of 48 sentences gets the chunk size a batch of 3 gets (it once got far fewer)."""
    from senslab.measure import TokenSensitivity

    model = prefix_model(name)
    sizes = {}
    for n in (3, 48):
        ids, mask = make_batch(lengths=[8] * n)
        m = TokenSensitivity(model, Embedding("embed_ln"), sigma=2.0, generator=0,
                             memory_budget=budget)
        m.update({"input_ids": ids, "attention_mask": mask})
        sizes[n] = m.last_chunk_size
    assert sizes[48] == sizes[3] and 2 <= sizes[3] < 3 * 8  # the budget binds at both sizes
