"""Sharpness, LayerNorm blow-up and parameter norm: closed forms, side effects, errors."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from senslab.measure.sharpness import (
    layernorm_blowup,
    layernorm_factors,
    loss_sharpness,
    output_sharpness,
    parameter_norm,
)
from senslab.models import create_model


def _snapshot(model: nn.Module) -> dict[str, torch.Tensor]:
    state = {f"p:{n}": p.detach().clone() for n, p in model.named_parameters()}
    state.update({f"b:{n}": b.detach().clone() for n, b in model.named_buffers()})
    return state


def _assert_unchanged(model: nn.Module, before: dict[str, torch.Tensor]) -> None:
    after = _snapshot(model)
    assert after.keys() == before.keys()
    for k, v in before.items():
        assert torch.equal(after[k], v), f"{k} changed"


class Quadratic(nn.Module):
    """Returns its parameter θ, so loss_fn = ½‖out‖² is L(θ) = ½‖θ‖²."""

    def __init__(self, d: int, size: float = 1.0) -> None:
        super().__init__()
        self.theta = nn.Parameter(torch.linspace(-size, size, d))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.theta


def _half_sq(out: torch.Tensor, _targets: object) -> torch.Tensor:
    return 0.5 * out.square().sum()


class WithPositions(nn.Module):
    """A linear map plus a 'pos_embedding' it records on every forward."""

    def __init__(self) -> None:
        super().__init__()
        g = torch.Generator().manual_seed(1)
        self.pos_embedding = nn.Parameter(torch.randn(4, generator=g))
        self.lin = nn.Linear(4, 2)
        self.seen: list[torch.Tensor] = []

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.seen.append(self.pos_embedding.detach().clone())
        return self.lin(x + self.pos_embedding)


# ---------------------------------------------------------------------------- output sharpness
def test_linear_shop_matches_closed_form() -> None:
    # f(x) = Wx + b: each output of ΔW x + Δb is N(0, σ²(‖x‖² + 1)), E|·| = √(2/π)·σ·√(‖x‖²+1)
    torch.manual_seed(0)  # only for the layer's default init; the measurement uses its generator
    model = nn.Linear(5, 3)
    x = torch.randn(8, 5, generator=torch.Generator().manual_seed(2))
    sigma = 0.1
    res = output_sharpness(model, x, sigma_w=sigma, repeats=400, generator=3)
    per_x = 3 * math.sqrt(2 / math.pi) * sigma * (x.square().sum(1) + 1).sqrt()
    expected = per_x.mean().item()
    lo, hi = res.shop.ci95
    assert lo <= expected <= hi
    assert res.shop.stderr < 0.05 * expected  # the CI is informative, not trivially wide
    assert res.shop.draws == 400 and res.num_examples == 8
    torch.testing.assert_close(res.shop.per_sample, per_x.double(), rtol=0.15, atol=0)


def test_shpred_zero_without_noise_and_positive_with_much() -> None:
    model = nn.Linear(6, 4)
    x = torch.randn(32, 6, generator=torch.Generator().manual_seed(0))
    assert output_sharpness(model, x, sigma_w=0.0, generator=0).shpred.estimate == 0.0
    res = output_sharpness(model, x, sigma_w=5.0, repeats=3, generator=0)
    assert 0.3 < res.shpred.estimate <= 1.0
    assert res.shpred.per_sample.shape == (32,)


def test_shpred_none_for_sequence_outputs() -> None:
    model = nn.Sequential(nn.Embedding(7, 5))  # (B, T, 5) outputs are not class scores
    ids = torch.randint(0, 7, (4, 3), generator=torch.Generator().manual_seed(0))
    res = output_sharpness(model, ids, repeats=2, generator=0)
    assert res.shpred is None and res.shop.estimate > 0


def test_same_seed_same_numbers_and_generator_equals_seed() -> None:
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 3))
    x = torch.randn(10, 4, generator=torch.Generator().manual_seed(0))
    a = output_sharpness(model, x, generator=7)
    b = output_sharpness(model, x, generator=torch.Generator().manual_seed(7))
    c = output_sharpness(model, x, generator=8)
    assert torch.equal(a.shop.per_draw, b.shop.per_draw)
    assert not torch.equal(a.shop.per_draw, c.shop.per_draw)
    assert output_sharpness(model, x).shop.estimate == output_sharpness(model, x).shop.estimate


def test_restores_params_buffers_and_modes_bit_exactly() -> None:
    model = nn.Sequential(nn.Linear(4, 6), nn.BatchNorm1d(6), nn.Dropout(0.5), nn.Linear(6, 2))
    model.train()
    model[3].eval()  # a mixed state must come back as it was, module by module
    before = _snapshot(model)
    x = torch.randn(9, 4, generator=torch.Generator().manual_seed(0))
    output_sharpness(model, x, repeats=3, generator=0)
    loss_sharpness(model, nn.functional.cross_entropy, x, torch.zeros(9, dtype=torch.long))
    _assert_unchanged(model, before)
    assert [m.training for m in model] == [True, True, True, False]


class Exploding(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(3, 2)
        self.bn = nn.BatchNorm1d(2)
        self.calls = 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        if self.calls == 3:  # fail with the weights perturbed
            raise RuntimeError("boom")
        return self.bn(self.lin(x))


def test_restores_after_an_exception_inside() -> None:
    model = Exploding().train()
    before = _snapshot(model)
    with pytest.raises(RuntimeError, match="boom"):
        output_sharpness(model, torch.randn(4, 3), repeats=5, generator=0)
    _assert_unchanged(model, before)
    assert model.training and model.bn.training


def test_batchnorm_in_eval_mode_independent_of_batch() -> None:
    model = nn.Sequential(nn.Linear(3, 4), nn.BatchNorm1d(4), nn.Linear(4, 3))
    with torch.no_grad():
        model[1].running_mean.fill_(0.3)
        model[1].running_var.fill_(2.0)
    model.train()
    x = torch.randn(12, 3, generator=torch.Generator().manual_seed(0))
    full = output_sharpness(model, x, repeats=3, generator=5)
    part = output_sharpness(model, x[:4], repeats=3, generator=5)
    # in eval mode each example's output depends on itself only (same weight draws: same seed)
    torch.testing.assert_close(part.shop.per_sample, full.shop.per_sample[:4])


def test_dropout_is_off_while_measuring() -> None:
    model = nn.Sequential(nn.Linear(5, 5), nn.Dropout(0.5), nn.Linear(5, 2)).train()
    x = torch.randn(6, 5, generator=torch.Generator().manual_seed(0))
    assert output_sharpness(model, x, sigma_w=0.0, repeats=2).shop.estimate == 0.0


def test_excluded_parameters_are_never_perturbed() -> None:
    model = WithPositions()
    pos0 = model.pos_embedding.detach().clone()
    w0 = model.lin.weight.detach().clone()
    x = torch.randn(3, 4, generator=torch.Generator().manual_seed(0))
    output_sharpness(model, x, repeats=3, exclude=("pos",), generator=0)
    loss_sharpness(model, nn.functional.mse_loss, x, torch.zeros(3, 2), draws=3)
    # each of the two calls: the clean forward twice (is it repeatable?), then 3 draws
    assert len(model.seen) == 2 * 5 and all(torch.equal(p, pos0) for p in model.seen)
    # and without the exclusion the positional parameter does move
    model.seen.clear()
    output_sharpness(model, x, repeats=2, generator=0)
    assert not torch.equal(model.seen[2], pos0)  # the first draw, after two clean forwards
    assert torch.equal(model.lin.weight, w0)


# ---------------------------------------------------------------------------- loss sharpness
def test_quadratic_loss_sharpness_is_half_sigma_squared_d() -> None:
    # L(θ+Δ) − L(θ) = θ·Δ + ½‖Δ‖², whose expectation is σ²·d/2
    # (θ small enough that the zero-mean θ·Δ term leaves a tight interval)
    d, sigma = 100, 0.02
    model = Quadratic(d, size=0.05)
    res = loss_sharpness(model, _half_sq, torch.zeros(1), None, sigma=sigma, draws=300)
    expected = sigma**2 * d / 2
    lo, hi = res.ci95
    assert lo <= expected <= hi
    assert hi - lo < expected  # tight enough to mean something
    assert res.reference == pytest.approx(0.5 * model.theta.square().sum().item())
    assert res.per_draw.shape == (300,)


def test_loss_sharpness_scale_and_reproducibility() -> None:
    model = Quadratic(10)
    a = loss_sharpness(model, _half_sq, torch.zeros(1), None, draws=6, generator=4)
    b = loss_sharpness(model, _half_sq, torch.zeros(1), None, draws=6, generator=4, scale=4.0)
    assert b.estimate == pytest.approx(4 * a.estimate)
    assert b.stderr == pytest.approx(4 * a.stderr)
    assert b.reference == pytest.approx(4 * a.reference)


def test_loss_sharpness_boolean_transformer_excludes_positions() -> None:
    model = create_model("boolean_transformer", n_bits=6, dim=8, ff_dim=8, layers=1)
    x = torch.randint(0, 2, (16, 6), generator=torch.Generator().manual_seed(0))
    y = (x.sum(1) % 2).float()
    before = _snapshot(model)
    res = loss_sharpness(model, nn.functional.mse_loss, x, y, draws=4, scale=4.0, generator=0)
    assert math.isfinite(res.estimate) and res.draws == 4 and res.scale == 4.0
    _assert_unchanged(model, before)


def test_errors_name_the_problem() -> None:
    model = nn.Linear(2, 2)
    x = torch.randn(3, 2)
    with pytest.raises(ValueError, match="sigma_w"):
        output_sharpness(model, x, sigma_w=-1.0)
    with pytest.raises(ValueError, match="repeats"):
        output_sharpness(model, x, repeats=0)
    with pytest.raises(ValueError, match="exclude"):
        output_sharpness(model, x, exclude=("weight", "bias"))
    with pytest.raises(ValueError, match="scalar"):
        loss_sharpness(model, lambda o, t: o, x, None, draws=2)
    with pytest.raises(TypeError, match="generator"):
        output_sharpness(model, x, generator=1.5)  # type: ignore[arg-type]


def test_single_draw_has_nan_stderr() -> None:
    res = output_sharpness(nn.Linear(2, 2), torch.randn(3, 2), repeats=1)
    assert math.isnan(res.shop.stderr) and math.isfinite(res.shop.estimate)


# ---------------------------------------------------------------------------- blow-up and norm
class TwoNorms(nn.Module):
    """ln_in over every position, then a 'last layer' whose LayerNorm is read at the end."""

    def __init__(self, d: int = 4) -> None:
        super().__init__()
        self.ln_in = nn.LayerNorm(d, eps=0.05)
        self.mix = nn.Linear(d, d)
        self.last = nn.Module()
        self.last.ln = nn.LayerNorm(d, eps=1e-3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.last.ln(self.mix(self.ln_in(x)))
        return h[:, -1].sum(-1)


def _inv_std(h: torch.Tensor, eps: float) -> torch.Tensor:
    h = h.double()
    mean = h.mean(-1, keepdim=True)
    return 1.0 / ((h - mean).square().mean(-1) + eps).sqrt()


def test_layernorm_blowup_matches_hand_computation() -> None:
    model = TwoNorms()
    x = torch.randn(3, 5, 4, generator=torch.Generator().manual_seed(0)) * 0.3
    with torch.no_grad():
        a = _inv_std(x, 0.05)  # (B, T)
        h = model.mix(model.ln_in(x))
        b = _inv_std(h, 1e-3)
    # default rule: the last layer is the parent of the last LayerNorm to run ("last")
    got = layernorm_blowup(model, x, readout_position=-1)
    torch.testing.assert_close(got, a.amax(1) * b[:, -1])
    factors = layernorm_factors(model, x, readout_position=-1)
    assert list(factors) == ["ln_in", "last.ln"]
    # explicit read-out modules, another position, and no read-out rule at all
    got2 = layernorm_blowup(model, x, readout_position=2, readout_modules=["last.ln"])
    torch.testing.assert_close(got2, a.amax(1) * b[:, 2])
    torch.testing.assert_close(layernorm_blowup(model, x), a.amax(1) * b.amax(1))
    assert not model.ln_in._forward_pre_hooks and not model.last.ln._forward_pre_hooks


def test_layernorm_blowup_boolean_transformer_uses_its_readout() -> None:
    model = create_model("boolean_transformer", n_bits=6, dim=8, ff_dim=8, layers=2).train()
    x = torch.randint(0, 2, (5, 6), generator=torch.Generator().manual_seed(0))
    factors = layernorm_factors(model, x)
    assert list(factors) == ["blocks.0.ln1", "blocks.0.ln2", "blocks.1.ln1", "blocks.1.ln2"]
    blow = layernorm_blowup(model, x)
    assert blow.shape == (5,) and blow.dtype == torch.float64 and (blow > 0).all()
    everywhere = layernorm_blowup(model, x, readout_modules=())
    assert (everywhere >= blow).all()  # the max over positions can only be larger
    assert model.training


def test_layernorm_blowup_errors() -> None:
    with pytest.raises(ValueError, match="no nn.LayerNorm"):
        layernorm_blowup(nn.Linear(2, 2), torch.randn(1, 2))
    with pytest.raises(ValueError, match="not LayerNorms"):
        layernorm_blowup(TwoNorms(), torch.randn(1, 3, 4), readout_modules=["mix"])


def test_parameter_norm_excludes_positions() -> None:
    model = WithPositions()
    w, b = model.lin.weight.detach().double(), model.lin.bias.detach().double()
    expected = math.sqrt(w.square().sum().item() + b.square().sum().item())
    assert parameter_norm(model) == pytest.approx(expected, rel=1e-12)
    full = math.sqrt(expected**2 + model.pos_embedding.detach().double().square().sum().item())
    assert parameter_norm(model, exclude=()) == pytest.approx(full, rel=1e-12)


def test_the_default_exclude_is_the_positional_embeddings_by_name_component():
    """The default leaves out positional embeddings: GPT-2's wpe (no "pos" in its name) is
    left out, a LLaMA-style post_attention_layernorm ("pos" inside "post") is not."""
    model = nn.ModuleDict({
        "wpe": nn.Embedding(4, 3), "wte": nn.Embedding(5, 3),
        "layer": nn.ModuleDict({"post_attention_layernorm": nn.LayerNorm(3)}),
        "pos_embed": nn.Embedding(4, 3), "embed_positions": nn.Embedding(4, 3)})
    kept = ["wte.weight", "layer.post_attention_layernorm.weight",
            "layer.post_attention_layernorm.bias"]
    params = dict(model.named_parameters())
    want = math.sqrt(sum(float(params[k].detach().double().square().sum()) for k in kept))
    assert parameter_norm(model) == pytest.approx(want)
    assert parameter_norm(model, exclude=()) > want
    assert parameter_norm(model, exclude=("wte",)) < parameter_norm(model, exclude=())


@pytest.mark.parametrize("batch", [5, 8])
def test_blowup_of_a_sequence_first_encoder_reads_its_positions(batch):
    """nn.TransformerEncoderLayer runs (T, B, D) by default: its LayerNorms' positions are on
    axis 0. With B = T = 8 the batch axis was taken for positions without a word."""
    torch.manual_seed(0)  # test-only: model init
    layer = nn.TransformerEncoderLayer(8, 2, 16, dropout=0.0)
    model = nn.Sequential(nn.Linear(4, 8), layer).eval()

    class SeqFirst(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.net = model

        def forward(self, x: torch.Tensor) -> torch.Tensor:  # (B, T, 4) in, (T, B, 8) inside
            return self.net(x.transpose(0, 1)).transpose(0, 1)

    x = torch.randn(batch, 8, 4, generator=torch.Generator().manual_seed(1))
    seen: list[torch.Tensor] = []
    handle = layer.norm1.register_forward_pre_hook(lambda m, a: seen.append(a[0].detach()))
    got = layernorm_factors(SeqFirst(), x, readout_modules=())
    handle.remove()
    h = seen[0].transpose(0, 1).double()  # (B, T, D)
    inv = (h.var(dim=2, unbiased=False) + layer.norm1.eps).rsqrt()  # (B, T)
    want = inv.max(dim=1).values
    key = next(k for k in got if k.endswith("norm1"))
    assert torch.allclose(got[key].double(), want, rtol=1e-6)
    assert layernorm_blowup(SeqFirst(), x, readout_modules=()).shape == (batch,)


def test_bool_arguments_and_an_asked_for_kind_are_refused():
    model = nn.Linear(3, 1)
    x = torch.randn(4, 3, generator=torch.Generator().manual_seed(0))
    with pytest.raises(ValueError, match="repeats"):
        output_sharpness(model, x, repeats=True)
    with pytest.raises(ValueError, match="sigma_w"):
        output_sharpness(model, x, sigma_w=True)
    with pytest.raises(TypeError, match="generator"):
        loss_sharpness(model, lambda o, y: o.mean(), x, None, generator=True)
    with torch.no_grad():
        model.weight.fill_(2.0)
    with pytest.raises(ValueError, match="outside \\[0, 1\\]"):  # not probabilities: an error
        output_sharpness(model, x, output_kind="probabilities", generator=0)
