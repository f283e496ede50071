"""The sensitivity regularizer in a user's own training step: text models (noise on one real
embedding position per example), any task loss, the penalty alone; images keep their numbers."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from senslab.models import create_model
from senslab.tokens import Embedding, Patches, Sequence
from senslab.train.regularize import (
    random_patch_noise,
    sensitivity_penalty,
    sensitivity_regularized_loss,
)

PAD = 1


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _text_batch(lengths: tuple[int, ...] = (7, 4, 2, 5)) -> tuple[torch.Tensor, torch.Tensor]:
    g = _gen(0)
    t = max(lengths)
    ids = torch.randint(2, 40, (len(lengths), t), generator=g)
    mask = torch.arange(t)[None, :] < torch.tensor(lengths)[:, None]
    return ids.masked_fill(~mask, PAD), mask


def _roberta(num_classes: int) -> nn.Module:
    return create_model("roberta", vocab_size=40, max_len=16, dim=16, layers=1, heads=2,
                        pad_id=PAD, num_classes=num_classes, dropout=0.0).train()


def _by_hand(model: nn.Module, module: nn.Module, inputs: dict, mask: torch.Tensor,
             sigma: float, seed: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(clean, noisy, noise positions) written out: the same generator draws one real position
    per example (uniform over the mask) and then N(0, σ²) noise of the embedding's width."""
    clean = model(**inputs)
    g = _gen(seed)
    tok = torch.multinomial(mask.float(), 1, generator=g).squeeze(1)
    rows = torch.arange(len(tok))

    def add(mod: nn.Module, args: object, out: torch.Tensor) -> torch.Tensor:
        noise = sigma * torch.randn(out.shape[0], out.shape[2], generator=g)
        out = out.clone()
        out[rows, tok] += noise
        return out

    handle = module.register_forward_hook(add)
    try:
        noisy = model(**inputs)
    finally:
        handle.remove()
    return clean, noisy, tok


@pytest.mark.parametrize("loss_name", ["bce", "mse"])
def test_text_model_with_a_custom_loss_matches_a_manual_computation(loss_name):
    model = _roberta(num_classes=1)
    ids, mask = _text_batch()
    inputs = {"input_ids": ids, "attention_mask": mask}
    y = torch.tensor([[1.0], [0.0], [1.0], [0.0]])
    loss_fn = F.binary_cross_entropy_with_logits if loss_name == "bce" else F.mse_loss
    loss, parts = sensitivity_regularized_loss(
        model, inputs, y, alpha=0.4, sigma=0.8, generator=_gen(3), loss_fn=loss_fn,
        tokens=Embedding("embed_ln"))
    assert set(parts) == {"loss", "task", "mse"}
    loss.backward()
    got = {n: p.grad.clone() for n, p in model.named_parameters()}
    assert all(torch.isfinite(g).all() for g in got.values())
    for name in ("embed.weight", "embed_ln.weight", "blocks.0.attn.qkv.weight", "head.3.weight"):
        assert got[name].abs().sum() > 0, f"{name} gets no gradient"

    model.zero_grad()
    clean, noisy, _ = _by_hand(model, model.embed_ln, inputs, mask, 0.8, seed=3)
    by_hand = 0.6 * loss_fn(clean, y) + 0.4 * F.mse_loss(noisy, clean)
    torch.testing.assert_close(loss, by_hand, rtol=0, atol=0)
    by_hand.backward()
    for name, p in model.named_parameters():
        torch.testing.assert_close(got[name], p.grad, msg=name)
    assert parts["mse"] > 0


def test_text_noise_lands_on_one_real_position_per_example():
    model = _roberta(num_classes=2)
    ids, mask = _text_batch(lengths=(1, 3, 6, 2, 6, 1))
    seen: list[torch.Tensor] = []  # what enters the dropout: embed_ln(...) + positions
    model.drop.register_forward_pre_hook(lambda m, args: seen.append(args[0].detach()))
    for seed in range(20):
        seen.clear()
        sensitivity_penalty(model, {"input_ids": ids, "attention_mask": mask},
                            tokens=Embedding("embed_ln"), generator=_gen(seed))
        changed = (seen[1] - seen[0]).abs().sum(-1) > 0  # (B, T)
        assert changed.sum(1).tolist() == [1] * len(ids)
        assert not (changed & ~mask).any(), "noise landed on padding"
    # an explicit mask overrides the dict's attention mask
    only_first = torch.zeros_like(mask)
    only_first[:, 0] = True
    seen.clear()
    sensitivity_penalty(model, {"input_ids": ids, "attention_mask": mask},
                        tokens=Embedding("embed_ln"), generator=_gen(0), mask=only_first)
    changed = (seen[1] - seen[0]).abs().sum(-1) > 0
    assert changed[:, 0].all() and changed.sum() == len(ids)


def _hf_bert(layers: int, labels: int) -> nn.Module:
    """A tiny Hugging Face BERT classifier without dropout, in train mode."""
    transformers = pytest.importorskip("transformers")
    cfg = transformers.BertConfig(vocab_size=50, hidden_size=16, num_hidden_layers=layers,
                                  num_attention_heads=2, intermediate_size=32,
                                  max_position_embeddings=16, num_labels=labels,
                                  hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    torch.manual_seed(0)  # the HF init reads the global RNG; the noise does not
    return transformers.BertForSequenceClassification(cfg).train()


def test_huggingface_bert_from_config():
    model = _hf_bert(layers=1, labels=1)
    ids, mask = _text_batch()
    inputs = {"input_ids": ids, "attention_mask": mask.long()}
    y = torch.tensor([0.5, -1.0, 2.0, 0.0])

    def regression(logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return F.mse_loss(logits.squeeze(-1), target)

    # the ModelOutput's .logits is found by itself; noise after the embeddings' LayerNorm
    loss, parts = sensitivity_regularized_loss(
        model, inputs, y, alpha=0.5, sigma=1.0, generator=_gen(7), loss_fn=regression,
        tokens=Embedding("bert.embeddings.LayerNorm"))
    loss.backward()
    grads = {n: p.grad for n, p in model.named_parameters() if p.grad is not None}
    assert "bert.embeddings.word_embeddings.weight" in grads and "classifier.weight" in grads
    assert all(torch.isfinite(g).all() for g in grads.values())

    with torch.no_grad():
        clean, noisy, _ = _by_hand(lambda **kw: model(**kw).logits,
                                   model.bert.embeddings.LayerNorm, inputs, mask, 1.0, seed=7)
    torch.testing.assert_close(parts["mse"], F.mse_loss(noisy, clean))
    torch.testing.assert_close(parts["task"], regression(clean, y))


@pytest.mark.parametrize("reentrant", [False, True])
def test_noise_inside_an_activation_checkpoint_is_refused(reentrant):
    """A Hugging Face BERT with gradient checkpointing: noise after the embeddings (outside the
    checkpointed layers) gives the penalty and gradients of the model without checkpointing;
    noise inside a checkpointed layer is refused — the backward recomputes the layer without
    the noise, and the gradient was wrong without a word (unless no gradient is taken)."""
    model = _hf_bert(layers=2, labels=3)
    ids, mask = _text_batch()
    inputs = {"input_ids": ids, "attention_mask": mask.long()}
    outside = Embedding("bert.embeddings.LayerNorm")
    inside = Embedding("bert.encoder.layer.1.attention.output.LayerNorm")

    def grads(tokens: Embedding) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        model.zero_grad()
        penalty, _ = sensitivity_penalty(model, inputs, tokens=tokens, generator=_gen(3))
        penalty.backward()
        return penalty.detach(), {n: p.grad.clone() for n, p in model.named_parameters()
                                  if p.grad is not None}

    plain, plain_grads = grads(outside)
    enable = getattr(model, "activation_checkpointing_enable", None)  # the newer name
    (enable or model.gradient_checkpointing_enable)({"use_reentrant": reentrant})
    got, got_grads = grads(outside)
    torch.testing.assert_close(got, plain)
    assert got_grads.keys() == plain_grads.keys()
    for name, g in got_grads.items():
        torch.testing.assert_close(g, plain_grads[name], msg=name)
    with pytest.raises(ValueError, match="inside an activation checkpoint"):
        sensitivity_penalty(model, inputs, tokens=inside, generator=_gen(3))
    with torch.no_grad():  # no backward, nothing recomputed
        sensitivity_penalty(model, inputs, tokens=inside, generator=_gen(3))


class _Recompute(torch.autograd.Function):
    """Hand-written activation checkpointing (the pattern of DeepSpeed, fairscale, Megatron):
    the forward without a graph, the backward recomputes it."""

    @staticmethod
    def forward(ctx, block, h):  # noqa: ANN001, ANN205
        ctx.block = block
        ctx.save_for_backward(h)
        with torch.no_grad():
            return block(h)

    @staticmethod
    def backward(ctx, grad):  # noqa: ANN001, ANN205
        (h,) = ctx.saved_tensors
        with torch.enable_grad():
            h = h.detach().requires_grad_()
            out = ctx.block(h)
        return None, torch.autograd.grad(out, h, grad)[0]


class _RecomputeSetUp(_Recompute):
    """The same, its context set up apart (``setup_context``): a forward without ``ctx``."""

    @staticmethod
    def forward(block, h):  # noqa: ANN001, ANN205
        with torch.no_grad():
            return block(h)

    @staticmethod
    def setup_context(ctx, inputs, output):  # noqa: ANN001, ANN205
        ctx.block = inputs[0]
        ctx.save_for_backward(inputs[1])


class _Blocks(nn.Module):
    """Token ids → embedding → two (LayerNorm, Linear) blocks → mean → 3 logits; the blocks
    run through ``how``: plainly, checkpointed, or by a hand-written recomputing Function."""

    def __init__(self, how: str) -> None:
        super().__init__()
        torch.manual_seed(0)  # test-only: init
        self.emb = nn.Embedding(40, 8)
        self.blocks = nn.ModuleList(nn.Sequential(nn.LayerNorm(8), nn.Linear(8, 8), nn.Tanh())
                                    for _ in range(2))
        self.head, self.how = nn.Linear(8, 3), how
        if how == "composable":
            from torch.distributed._composable import checkpoint as composable

            for block in self.blocks:
                composable(block)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        h = self.emb(ids)
        for block in self.blocks:
            if self.how in ("function", "set-up"):
                h = (_Recompute if self.how == "function" else _RecomputeSetUp).apply(block, h)
            else:
                h = block(h)
        return self.head(h.mean(1))


@pytest.mark.parametrize("how", ["composable", "function", "set-up"])
def test_noise_inside_other_activation_checkpoints_is_refused(how):
    """The composable ``checkpoint(module)`` and a hand-written recomputing Function (the
    DeepSpeed/fairscale/Megatron pattern) are refused too (the gradient was wrong: the
    backward recomputed the block without the noise); noise on the embedding before them, and
    saved tensors offloaded to the CPU (``save_on_cpu``: nothing recomputed), are measured."""
    import warnings

    ids, _ = _text_batch()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the composable API is marked experimental
        model = _Blocks(how).train()
    with pytest.raises(ValueError, match="inside (an activation checkpoint|a custom autograd)"):
        sensitivity_penalty(model, ids, tokens=Embedding("blocks.1.0"), generator=_gen(3))
    penalty, _ = sensitivity_penalty(model, ids, tokens=Embedding("emb"), generator=_gen(3))
    plain, _ = sensitivity_penalty(_Blocks("plain").train(), ids, tokens=Embedding("emb"),
                                   generator=_gen(3))
    torch.testing.assert_close(penalty, plain)
    with torch.autograd.graph.save_on_cpu():
        sensitivity_penalty(_Blocks("plain").train(), ids, tokens=Embedding("blocks.1.0"),
                            generator=_gen(3))[0].backward()


def test_a_wrapped_models_modules_keep_their_names():
    """A model in nn.DataParallel (or DDP, or torch.compile) is hooked by the names its
    measurements take — "emb", not "module.emb" (before: refused, naming "module." names)."""
    ids, _ = _text_batch()
    model = _Blocks("plain").train()
    want, _ = sensitivity_penalty(model, ids, tokens=Embedding("emb"), generator=_gen(3))
    wrapped = nn.DataParallel(model)
    got, _ = sensitivity_penalty(wrapped, ids, tokens=Embedding("emb"), generator=_gen(3))
    torch.testing.assert_close(got, want)
    prefixed, _ = sensitivity_penalty(wrapped, ids, tokens=Embedding("module.emb"),
                                      generator=_gen(3))
    torch.testing.assert_close(prefixed, want)


def test_penalty_with_an_own_loss_and_image_numbers_unchanged():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Flatten(), nn.Linear(3 * 8 * 8, 16), nn.Tanh(), nn.Linear(16, 5))
    x = torch.randn(6, 3, 8, 8, generator=_gen(0))
    y = torch.tensor([0, 1, 2, 3, 4, 0])
    penalty, logits = sensitivity_penalty(model, x, patch=4, generator=_gen(2))
    noisy = random_patch_noise(x, 4, 1.0, _gen(2))
    assert torch.equal(penalty, F.mse_loss(model(noisy), model(x)))
    assert torch.equal(logits, model(x)) and penalty.requires_grad
    # tokens=Patches(4) is the default image path, draw for draw
    a, pa = sensitivity_regularized_loss(model, x, y, generator=_gen(4))
    b, pb = sensitivity_regularized_loss(model, x, y, generator=_gen(4), tokens=Patches(4))
    assert torch.equal(a, b) and torch.equal(pa["ce"], pa["task"])


def test_vector_sequences_and_errors():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Flatten(), nn.Linear(5 * 3, 2))
    x = torch.randn(4, 5, 3, generator=_gen(1))
    mask = torch.ones(4, 5, dtype=torch.bool)
    mask[:, 3:] = False
    loss, _ = sensitivity_regularized_loss(model, x, torch.tensor([0, 1, 0, 1]),
                                           tokens=Sequence(), mask=mask, generator=_gen(2))
    loss.backward()
    assert model[1].weight.grad.abs().sum() > 0
    with pytest.raises(ValueError, match="no real token"):
        sensitivity_penalty(model, x, tokens=Sequence(), mask=torch.zeros(4, 5, dtype=torch.bool),
                            generator=_gen(0))
    with pytest.raises(TypeError, match="torch.Generator"):
        sensitivity_penalty(model, x, tokens=Sequence(), generator=0)  # type: ignore[arg-type]
    text = _roberta(num_classes=2)
    ids, mask = _text_batch()
    with pytest.raises(ValueError, match="no submodule 'embed_lnn'"):
        sensitivity_penalty(text, (ids, mask), tokens=Embedding("embed_lnn"), generator=_gen(0))
    with pytest.raises(ValueError, match=r"Embedding\(.head.0.\) returned \(4, 16\)"):
        # the head's Linear is not a (batch, tokens, dim) stage
        sensitivity_penalty(text, (ids, mask), tokens=Embedding("head.0"), generator=_gen(0))


class _PrefixedEncoder(nn.Module):
    """Prepends a token inside the model: its embedding stage has T + 1 positions, so the
    input's (B, T) attention_mask does not describe them."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)  # test-only: model init
        self.embedding = nn.Embedding(40, 8)
        self.embed_ln = nn.LayerNorm(8)
        self.head = nn.Linear(8, 2)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        h = self.embedding(input_ids)
        h = torch.cat([h.mean(1, keepdim=True), h], 1)
        h = self.embed_ln(h)
        m = torch.cat([torch.ones(len(h), 1), attention_mask.float()], 1)[..., None]
        return self.head((h * m).sum(1) / m.sum(1))


def test_a_mask_that_does_not_fit_the_hooked_stage_is_refused_not_ignored():
    """The (B, T) attention_mask against T + 1 hooked positions was silently dropped, and the
    noise then landed on padding too; refused as the measurement refuses it, and with a fitting
    mask= the penalty runs."""
    ids, mask = _text_batch()
    model = _PrefixedEncoder()
    inputs = {"input_ids": ids, "attention_mask": mask}
    with pytest.raises(ValueError, match=r"mask has shape \(4, 7\) but the batch has 4 "
                                         r"examples of 8"):
        sensitivity_penalty(model, inputs, tokens=Embedding("embed_ln"), sigma=0.5,
                            generator=_gen(0))
    fitting = torch.cat([torch.ones(4, 1, dtype=torch.bool), mask], 1)
    penalty, _ = sensitivity_penalty(model, inputs, tokens=Embedding("embed_ln"), sigma=0.5,
                                     generator=_gen(0), mask=fitting)
    assert torch.isfinite(penalty) and penalty.item() >= 0


def test_a_tuple_input_keeps_the_noise_off_its_padding():
    """``(input_ids, attention_mask)``, as the model's forward takes them positionally: the mask
    is read from the argument it binds to, as from the dict's entry."""
    model = _roberta(num_classes=2)
    ids, mask = _text_batch(lengths=(1, 3, 6, 2, 6, 1))
    seen: list[torch.Tensor] = []
    model.drop.register_forward_pre_hook(lambda m, args: seen.append(args[0].detach()))
    for seed in range(10):
        seen.clear()
        sensitivity_penalty(model, (ids, mask), tokens=Embedding("embed_ln"),
                            generator=_gen(seed))
        changed = (seen[1] - seen[0]).abs().sum(-1) > 0
        assert changed.sum(1).tolist() == [1] * len(ids)
        assert not (changed & ~mask).any(), "noise landed on padding"


def test_an_empty_batch_is_refused_not_a_nan_loss():
    """The mean over no examples is NaN: an empty batch (a last shard of a sampler, a filter
    that kept nothing) is refused with the fix, on images, vector sequences and text alike."""
    images = nn.Sequential(nn.Flatten(), nn.Linear(3 * 8 * 8, 5))
    with pytest.raises(ValueError, match="empty batch.*drop_last"):
        sensitivity_regularized_loss(images, torch.randn(0, 3, 8, 8),
                                     torch.zeros(0, dtype=torch.long), patch=4,
                                     generator=_gen(0))
    vectors = nn.Sequential(nn.Flatten(), nn.Linear(4 * 6, 5))
    with pytest.raises(ValueError, match="empty batch"):
        sensitivity_penalty(vectors, torch.randn(0, 4, 6), tokens=Sequence(), generator=_gen(0))
    model = _roberta(3)
    ids, mask = _text_batch()
    with pytest.raises(ValueError, match="empty batch"):
        sensitivity_penalty(model, {"input_ids": ids[:0], "attention_mask": mask[:0]},
                            tokens=Embedding("embed_ln"), generator=_gen(0))
    # a batch of one still gives a finite loss
    loss, _ = sensitivity_regularized_loss(images, torch.randn(1, 3, 8, 8),
                                           torch.zeros(1, dtype=torch.long), patch=4,
                                           generator=_gen(0))
    assert torch.isfinite(loss)
