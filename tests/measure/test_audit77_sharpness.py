"""Audit 77 of senslab.measure.sharpness: the read-out rule of the LayerNorm blow-up, empty
batches, tied weights excluded by their second name, and options that were ignored or refused
with a misleading message."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from senslab.measure.sharpness import (
    layernorm_blowup,
    layernorm_factors,
    loss_sharpness,
    output_sharpness,
    parameter_norm,
)


class EmbedNormFirst(nn.Module):
    """A pre-LN model whose embedding LayerNorm and final norm are both top-level modules
    (senslab's GPT2Classifier, BLOOM's word_embeddings_layernorm and ln_f)."""

    readout_position = -1

    def __init__(self) -> None:
        super().__init__()
        g = torch.Generator().manual_seed(0)
        self.embed = nn.Linear(3, 8)
        self.embed_ln = nn.LayerNorm(8)
        self.block = nn.Sequential(nn.LayerNorm(8), nn.Linear(8, 8))
        self.norm = nn.LayerNorm(8)
        with torch.no_grad():
            for p in self.parameters():
                p.copy_(torch.randn(p.shape, generator=g))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.embed_ln(self.embed(x))
        h = h + self.block(h).cumsum(1)  # every position reaches the last one
        return self.norm(h)[:, -1]


def _inputs() -> torch.Tensor:
    g = torch.Generator().manual_seed(1)
    x = torch.randn(3, 5, 3, generator=g)
    x[:, 0] *= 0.01  # the first position has the smallest variance: its factor is the largest
    return x


def test_an_embedding_layernorm_beside_the_final_norm_is_read_at_every_position() -> None:
    model, x = EmbedNormFirst(), _inputs()
    everywhere = layernorm_factors(model, x, readout_modules=())
    read = layernorm_factors(model, x)
    # the embedding LayerNorm feeds every position: its factor is the maximum over positions
    torch.testing.assert_close(read["embed_ln"], everywhere["embed_ln"])
    assert bool((read["embed_ln"] > read["norm"]).all())
    # the final norm is the last layer: read at the read-out position only
    h = model.embed_ln(model.embed(x))
    h = h + model.block(h).cumsum(1)
    last = (h[:, -1].double().var(-1, unbiased=False) + model.norm.eps).rsqrt()
    torch.testing.assert_close(read["norm"], last.detach())


def test_readout_modules_without_a_readout_position_are_refused() -> None:
    class NoReadout(EmbedNormFirst):
        readout_position = None  # type: ignore[assignment]

    x = _inputs()
    with pytest.raises(ValueError, match="readout_position"):
        layernorm_factors(NoReadout(), x, readout_modules=["norm"])
    layernorm_factors(NoReadout(), x, readout_modules=())  # () asks for the maximum: fine


@pytest.mark.parametrize("position", [True, 1.0])
def test_a_readout_position_that_is_not_an_int_is_refused(position: object) -> None:
    with pytest.raises(TypeError, match="readout_position"):
        layernorm_blowup(EmbedNormFirst(), _inputs(), readout_position=position)  # type: ignore


def test_a_readout_module_given_as_one_string_is_one_name() -> None:
    model, x = EmbedNormFirst(), _inputs()
    one = layernorm_factors(model, x, readout_modules="norm")  # type: ignore[arg-type]
    listed = layernorm_factors(model, x, readout_modules=["norm"])
    for k in listed:
        torch.testing.assert_close(one[k], listed[k])


def test_an_empty_batch_is_refused_by_every_measure() -> None:
    model = nn.Sequential(nn.Linear(4, 8), nn.LayerNorm(8), nn.Linear(8, 3))
    x, y = torch.zeros(0, 4), torch.zeros(0, 3)

    def summed(out: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return F.mse_loss(out, target, reduction="sum")

    with pytest.raises(ValueError, match="no example"):
        loss_sharpness(model, summed, x, y, generator=0)  # was 0 ± 0
    with pytest.raises(ValueError, match="no example"):
        loss_sharpness(model, F.mse_loss, x, y, generator=0)  # was NaN, blamed on the model
    with pytest.raises(ValueError, match="no example"):
        output_sharpness(model, x, generator=0)  # was a RuntimeError from a reshape
    with pytest.raises(ValueError, match="no example"):
        layernorm_blowup(model, x)


class TiedHead(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.emb = nn.Embedding(5, 8)
        self.mid = nn.Linear(8, 8)
        self.head = nn.Linear(8, 5)
        self.head.weight = self.emb.weight  # listed once, as emb.weight

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(torch.tanh(self.mid(self.emb(x))))


def test_excluding_a_tied_weight_by_its_second_name_beside_other_matches_is_refused() -> None:
    model, x = TiedHead(), torch.arange(5)
    # "head" also matches head.bias, so it passed; head.weight = emb.weight was perturbed and
    # counted in the norm (6.30, where head and emb excluded give 1.76)
    with pytest.raises(ValueError, match="tied"):
        output_sharpness(model, x, exclude=("head",), generator=0)
    with pytest.raises(ValueError, match="tied"):
        parameter_norm(model, exclude=("head",))
    both = parameter_norm(model, exclude=("head", "emb"))
    mid = torch.cat([model.mid.weight.detach().flatten(), model.mid.bias.detach()]).double()
    assert math.isclose(both, float(mid.norm()), rel_tol=1e-12)
    parameter_norm(model, exclude=("emb",))  # by the listed name: one tensor, left alone


def test_numpy_numbers_of_draws_and_sigma_are_taken() -> None:
    model = nn.Linear(4, 3)
    x = torch.randn(6, 4, generator=torch.Generator().manual_seed(0))
    with pytest.warns(RuntimeWarning):  # few flips: said, not the point here
        ours = output_sharpness(model, x, repeats=np.int64(3), sigma_w=np.float32(0.5),
                                generator=0)
    with pytest.warns(RuntimeWarning):
        plain = output_sharpness(model, x, repeats=3, sigma_w=float(np.float32(0.5)),
                                 generator=0)
    assert ours.shop.draws == 3
    assert ours.shop.estimate == plain.shop.estimate
    with pytest.raises(ValueError, match="integer >= 1"):
        output_sharpness(model, x, repeats=2.0)  # type: ignore[arg-type]
