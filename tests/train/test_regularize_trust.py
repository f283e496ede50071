"""The sensitivity regularizer refuses what it would get wrong without a word: a sequence-first
embedding stage, padding it cannot tell from tokens, settings it would ignore (``patch=`` beside
``tokens=``, an ``Embedding``'s ``position``), and noise rounded away on low-precision tokens."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from senslab.models import create_model
from senslab.tokens import Embedding, Patches, Sequence
from senslab.train.regularize import (
    gaussian_noise_augment,
    random_patch_noise,
    sensitivity_penalty,
    sensitivity_regularized_loss,
)

PAD = 1


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _padded_ids() -> tuple[torch.Tensor, torch.Tensor]:
    """(4, 7) token ids, right-padded with PAD, and their mask of real tokens."""
    lengths = torch.tensor([7, 4, 2, 5])
    ids = torch.randint(2, 40, (4, 7), generator=_gen(0))
    mask = torch.arange(7)[None, :] < lengths[:, None]
    return ids.masked_fill(~mask, PAD), mask


def _roberta() -> nn.Module:
    return create_model("roberta", vocab_size=40, max_len=16, dim=16, layers=1, heads=2,
                        pad_id=PAD, num_classes=2, dropout=0.0).train()


class _SeqFirst(nn.Module):
    """Token ids (B, T) → embedding → transposed to (T, B, D) → LayerNorm → mean → logits:
    the LayerNorm's output is sequence-first, as in a ``batch_first=False`` encoder."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)  # test-only: init
        self.emb, self.ln, self.head = nn.Embedding(40, 8), nn.LayerNorm(8), nn.Linear(8, 3)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.head(torch.tanh(self.ln(self.emb(ids).transpose(0, 1))).mean(0))


def test_a_sequence_first_embedding_stage_is_refused():
    """A (T, B, D) stage was read as (B, T, D): the noise went to one "example" per position,
    so some examples got several noisy tokens and others none, without a word."""
    ids = torch.randint(2, 40, (3, 6), generator=_gen(1))
    with pytest.raises(ValueError, match=r"returned \(6, 3, 8\).*not batch-first"):
        sensitivity_penalty(_SeqFirst(), ids, tokens=Embedding("ln"), generator=_gen(0))


class _Prefixed(nn.Module):
    """Prepends a summary token inside its forward: its LayerNorm puts out T + 1 positions."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)  # test-only: init
        self.emb, self.ln, self.head = nn.Embedding(40, 8), nn.LayerNorm(8), nn.Linear(8, 2)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        h = self.emb(ids)
        return self.head(self.ln(torch.cat([h.mean(1, keepdim=True), h], 1)).mean(1))


def test_padding_that_no_mask_marks_is_refused():
    """Token ids padded with the model's pad id and no mask: the zoo's model finds its padding
    by that id and ignores it, and the noise landed there (on about a third of the draws here),
    so the penalty counted those examples as unchanged. Refused as the measurement refuses it;
    with the mask, the noise is on real tokens only."""
    model = _roberta()
    ids, mask = _padded_ids()
    with pytest.raises(ValueError, match="pad id 1 .*attention_mask"):
        sensitivity_penalty(model, ids, tokens=Embedding("embed_ln"), generator=_gen(0))
    seen: list[torch.Tensor] = []
    model.drop.register_forward_pre_hook(lambda m, args: seen.append(args[0].detach()))
    for seed in range(10):
        seen.clear()
        sensitivity_penalty(model, ids, tokens=Embedding("embed_ln"), mask=mask,
                            generator=_gen(seed))
        changed = (seen[1] - seen[0]).abs().sum(-1) > 0
        assert not (changed & ~mask).any() and changed.sum(1).tolist() == [1] * 4
    # a stage with more positions than token ids: which are real, no input says
    ids = torch.randint(2, 40, (3, 5), generator=_gen(2))
    with pytest.raises(ValueError, match="puts out 6 positions per example for 5 token ids"):
        sensitivity_penalty(_Prefixed(), ids, tokens=Embedding("ln"), generator=_gen(0))
    penalty, _ = sensitivity_penalty(_Prefixed(), ids, tokens=Embedding("ln"),
                                     mask=torch.ones(3, 6, dtype=torch.bool), generator=_gen(0))
    assert penalty.item() > 0


def test_patch_beside_tokens_is_refused_not_ignored():
    """``patch=`` sets the patch size only where ``tokens`` is None; beside ``tokens`` it was
    dropped without a word (patch=2 with Patches(4) drew 4×4 patches)."""
    torch.manual_seed(0)  # test-only: init
    model = nn.Sequential(nn.Flatten(), nn.Linear(3 * 8 * 8, 5))
    x = torch.randn(4, 3, 8, 8, generator=_gen(1))
    y = torch.tensor([0, 1, 2, 3])
    with pytest.raises(ValueError, match=r"patch=2 .*Patches\(size=4"):
        sensitivity_penalty(model, x, tokens=Patches(4), patch=2, generator=_gen(0))
    with pytest.raises(ValueError, match="patch=2"):
        sensitivity_regularized_loss(model, x, y, tokens=Patches(4), patch=2, generator=_gen(0))
    seq = nn.Sequential(nn.Flatten(), nn.Linear(5 * 3, 2))
    with pytest.raises(ValueError, match="patch=4"):
        sensitivity_penalty(seq, torch.randn(4, 5, 3), tokens=Sequence(), patch=4,
                            generator=_gen(0))
    # the default and a matching size keep their numbers
    default, _ = sensitivity_penalty(model, x, generator=_gen(3))
    four, _ = sensitivity_penalty(model, x, patch=4, generator=_gen(3))
    same, _ = sensitivity_penalty(model, x, tokens=Patches(4), patch=4, generator=_gen(3))
    assert torch.equal(default, four) and torch.equal(default, same)


def test_an_embedding_position_is_refused_where_the_output_is_per_position():
    """``Embedding(position=k)`` reads a per-position output at position k in a measurement;
    the regularizer compared the whole output instead, without a word. Refused there (with the
    ``output=`` that selects k); an output of one row per example is compared as it is."""
    torch.manual_seed(0)  # test-only: init
    tagger = nn.Sequential(nn.Embedding(40, 8), nn.LayerNorm(8), nn.Linear(8, 3))  # (B, T, 3)
    ids = torch.randint(2, 40, (3, 6), generator=_gen(1))
    with pytest.raises(ValueError, match=r"position=0.*output=lambda out: out\[:, 0\]"):
        sensitivity_penalty(tagger, ids, tokens=Embedding("1", position=0), generator=_gen(0))
    picked, _ = sensitivity_penalty(tagger, ids, tokens=Embedding("1"), generator=_gen(0),
                                    output=lambda out: out[:, 0])
    assert picked.item() >= 0
    # position=None keeps the whole output, which is what the regularizer compares
    sensitivity_penalty(tagger, ids, tokens=Embedding("1", position=None), generator=_gen(0))
    pooled = nn.Sequential(nn.Embedding(40, 8), nn.LayerNorm(8), nn.Flatten(), nn.Linear(48, 3))
    sensitivity_penalty(pooled, ids, tokens=Embedding("1", position=0), generator=_gen(0))


class _Bf16Text(nn.Module):
    """A bf16 text model whose embedding puts out 256 values per token."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)  # test-only: init
        self.emb, self.head = nn.Embedding(40, 256), nn.Linear(256, 3)
        self.to(torch.bfloat16)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.head(torch.tanh(self.emb(ids) * 20).mean(1))


def test_noise_rounded_away_on_low_precision_tokens_is_refused():
    """Noise far below the bf16 grid of the tokens it lands on is rounded away: the penalty
    described another noise (on bf16 images at σ = 0.001 it was 5× the float32 model's), without
    a word. Refused, naming the fix; σ = 1 on the same tokens trains as before."""
    torch.manual_seed(0)  # test-only: init
    images = nn.Sequential(nn.Flatten(), nn.Linear(3 * 8 * 8, 5)).to(torch.bfloat16)
    x = (torch.rand(64, 3, 8, 8, generator=_gen(1)) * 2 + 2).bfloat16()  # values in [2, 4)
    with pytest.raises(ValueError, match="too small for the bfloat16 images.*autocast"):
        sensitivity_penalty(images, x, sigma=1e-3, generator=_gen(0))
    penalty, _ = sensitivity_penalty(images, x, sigma=1.0, generator=_gen(0))
    assert torch.isfinite(penalty)
    with pytest.raises(ValueError, match="too small for the bfloat16"):
        random_patch_noise(x, 4, 1e-3, _gen(0))
    with pytest.raises(ValueError, match="too small for the bfloat16"):
        gaussian_noise_augment(x, 1e-3, _gen(0))

    vectors = nn.Sequential(nn.Flatten(), nn.Linear(5 * 64, 2)).to(torch.bfloat16)
    v = (torch.rand(32, 5, 64, generator=_gen(2)) + 2).bfloat16()
    with pytest.raises(ValueError, match="too small for the bfloat16 token vectors"):
        sensitivity_penalty(vectors, v, tokens=Sequence(), sigma=1e-3, generator=_gen(0))
    sensitivity_penalty(vectors, v, tokens=Sequence(), sigma=1.0, generator=_gen(0))

    text = _Bf16Text()
    ids = torch.randint(0, 40, (8, 5), generator=_gen(3))
    with torch.no_grad():
        text.emb.weight.add_(3.0)  # token vectors near 3: bf16 spacing 1/64
    with pytest.raises(ValueError, match="too small for the bfloat16 token vectors of 'emb'"):
        sensitivity_penalty(text, ids, tokens=Embedding("emb"), sigma=1e-3, generator=_gen(0))
    sensitivity_penalty(text, ids, tokens=Embedding("emb"), sigma=1.0, generator=_gen(0))
