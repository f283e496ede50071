"""Audit sharp83 of senslab.measure.sharpness: ShPred's few-flips warning followed its own
documented rule (reads the draws that flip against MIN_FLIPS, not against all R)."""

from __future__ import annotations

import warnings

import pytest
import torch
from torch import nn

from senslab.measure.sharpness import output_sharpness


class _Margins(nn.Module):
    """One logit per example, w·x + b (w = 1, b = 0): a draw flips the examples whose margin
    its noise on b outweighs — all of one sign at once."""

    output_kind = "logits"

    def __init__(self) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.ones(()))
        self.b = nn.Parameter(torch.zeros(()))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w * x + self.b


def _few_flip_warnings(x: torch.Tensor, repeats: int) -> tuple[object, list[str]]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        res = output_sharpness(_Margins(), x, repeats=repeats, generator=0)
    return res, [str(w.message) for w in caught
                 if str(w.message).startswith("ShPred's standard error rests")]


def test_many_draws_some_without_a_flip_say_nothing():
    """40 draws at margins ±0.02: about two thirds of the draws flip something, hundreds of
    predictions flip in all. The docstring says nothing is said then (MIN_FLIPS draws flipped
    something and MIN_FLIPS predictions flipped); the code warned whenever a single draw flipped
    nothing, telling the user to take more draws — which only makes such a draw likelier."""
    x = torch.tensor([0.02, -0.02] * 4)
    res, said = _few_flip_warnings(x, 40)
    flipped = int((res.shpred.per_draw > 0).sum())
    assert 10 <= flipped < 40  # the case at stake: many draws flipped, not every one
    assert said == []


def test_few_draws_with_one_without_a_flip_still_warn():
    """5 draws, one of which flipped nothing: fewer than min(R, MIN_FLIPS) = 5 draws flipped,
    so the warning stands, naming what the standard error needs."""
    x = torch.tensor([0.02, -0.02] * 4)
    for seed in range(50):  # a seed where some but not all of 5 draws flip
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            res = output_sharpness(_Margins(), x, repeats=5, generator=seed)
        if 0 < int((res.shpred.per_draw > 0).sum()) < 5:
            break
    else:
        raise AssertionError("no seed with some draws flipping")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        output_sharpness(_Margins(), x, repeats=5, generator=seed)
    said = [str(w.message) for w in caught if "rests on few flips" in str(w.message)]
    assert len(said) == 1 and "needs 5 draws that flip one and 10 flips" in said[0]


# -- layernorm blow-up: padding is no part of an example -------------------------------------
class _Tagger(nn.Module):
    """Embedding → LayerNorm → mean over the real positions: a dict-input model with an
    attention_mask (1 real, 0 padding) whose output ignores the pad tokens."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.embed = nn.Embedding(20, 8)
        self.ln = nn.LayerNorm(8)
        self.head = nn.Linear(8, 2)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        h = self.ln(self.embed(input_ids))
        m = attention_mask.unsqueeze(-1).to(h.dtype)
        return self.head((h * m).sum(1) / m.sum(1))


def _padded(ids: torch.Tensor, extra: int, pad: int = 0) -> dict[str, torch.Tensor]:
    mask = torch.ones_like(ids)
    tail = torch.full((ids.shape[0], extra), pad, dtype=ids.dtype)
    return {"input_ids": torch.cat([ids, tail], 1),
            "attention_mask": torch.cat([mask, torch.zeros_like(tail)], 1)}


def test_blowup_reads_the_real_positions_only():
    """One example, its output the same padded or not: its blow-up was 1.18 alone and 43.2
    padded by 6 pad tokens (the maximum over positions read the pad embedding's factor)."""
    from senslab.measure.sharpness import layernorm_blowup

    model = _Tagger()
    with torch.no_grad():  # a pad embedding of small spread: a large factor
        model.embed.weight[0] = 0.01 * torch.arange(8.0)
    ids = torch.tensor([[3, 7, 11, 5]])
    alone, padded = _padded(ids, 0), _padded(ids, 6)
    assert torch.allclose(model(**alone), model(**padded))
    want = layernorm_blowup(model, alone)
    got = layernorm_blowup(model, padded)
    assert torch.allclose(got, want)
    # the batch's other, longer example reads all of its positions
    both = {"input_ids": torch.tensor([[3, 7, 11, 5, 0, 0], [4, 9, 2, 8, 6, 1]]),
            "attention_mask": torch.tensor([[1, 1, 1, 1, 0, 0], [1, 1, 1, 1, 1, 1]])}
    got = layernorm_blowup(model, both)
    assert torch.allclose(got[0], want[0])
    assert torch.allclose(got[1], layernorm_blowup(model, {k: v[1:] for k, v in both.items()}))


def test_blowup_refuses_a_readout_at_padding():
    """A read-out position that is a pad token in some example reads no position of it."""
    from senslab.measure.sharpness import layernorm_blowup

    model = _Tagger()
    with pytest.raises(ValueError, match=r"readout_position -1 is padding in example\(s\) \[0\]"):
        layernorm_blowup(model, _padded(torch.tensor([[3, 7, 11, 5]]), 2), readout_position=-1,
                         readout_modules=["ln"])


class _PerPosition(_Tagger):
    """Per-position logits (B, T, 2): a token tagger."""

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        return self.head(self.ln(self.embed(input_ids)))


def test_shop_of_per_position_outputs_leaves_padding_out():
    """One example's per-position logits: ShOp 1.11 alone and 2.35 padded by 6 pad tokens
    (the pad positions' output changes were summed in); now the same, draw by draw, and an
    example in a batch reads as it does alone."""
    model = _PerPosition()
    ids = torch.tensor([[3, 7, 11, 5]])
    alone = output_sharpness(model, _padded(ids, 0), generator=0).shop
    padded = output_sharpness(model, _padded(ids, 6), generator=0).shop
    assert torch.allclose(padded.per_draw, alone.per_draw)
    both = {"input_ids": torch.tensor([[3, 7, 11, 5, 0, 0], [4, 9, 2, 8, 6, 1]]),
            "attention_mask": torch.tensor([[1, 1, 1, 1, 0, 0], [1, 1, 1, 1, 1, 1]])}
    got = output_sharpness(model, both, generator=0).shop.per_sample
    assert torch.allclose(got[0], alone.per_sample[0])
