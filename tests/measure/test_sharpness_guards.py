"""Sharpness and blow-up refusals: outputs whose class rule, rows or layout cannot be read, and
weight noise the weights' precision cannot hold (audit numbers51, findings 1, 4, 5, 6, 8, 11)."""

from __future__ import annotations

import math
import warnings
from types import SimpleNamespace

import pytest
import torch
from torch import nn

from senslab.measure.sharpness import (
    layernorm_blowup,
    layernorm_factors,
    loss_sharpness,
    output_sharpness,
)


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


# ------------------------------------------------------------- 1: a saturated sigmoid column
def _saturated_sigmoid() -> nn.Module:
    """Every clean output is sigmoid(20), exactly 1.0 in float32."""
    lin = nn.Linear(4, 1)
    with torch.no_grad():
        lin.weight.zero_()
        lin.bias.fill_(20.0)
    return nn.Sequential(lin, nn.Sigmoid())


def test_a_saturated_sigmoid_column_is_refused_once_noise_moves_it_inside():
    """Clean outputs all exactly 1.0 read as logits: no perturbed probability is ever <= 0, so
    ShPred was a false 0 (brute force: about 0.2). The perturbed outputs give the kind away."""
    model = _saturated_sigmoid()
    x = torch.randn(16, 4, generator=_gen(0))
    assert model(x).unique().tolist() == [1.0]
    with pytest.raises(ValueError, match="output_kind='probabilities'") as err:
        output_sharpness(model, x, sigma_w=10.0, repeats=3, generator=0)
    assert "exactly 0 or 1" in str(err.value)
    declared = output_sharpness(model, x, sigma_w=10.0, repeats=3, generator=0,
                                output_kind="probabilities")
    assert declared.shpred is not None and declared.shpred.estimate > 0.05
    # a declared model attribute says the same as the option
    model.output_kind = "probabilities"
    same = output_sharpness(model, x, sigma_w=10.0, repeats=3, generator=0)
    assert torch.equal(same.shpred.per_draw, declared.shpred.per_draw)


class Step(nn.Module):
    """Hard 0/1 decisions: clean and perturbed outputs stay in {0, 1}."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return (self.lin(x) > 0).float()


def test_hard_zero_one_decisions_are_still_measured():
    torch.manual_seed(0)  # test-only: layer init
    res = output_sharpness(Step(), torch.randn(32, 4, generator=_gen(1)), sigma_w=2.0,
                           repeats=3, generator=0)
    assert res.shpred is not None and res.shpred.estimate > 0


# ------------------------------------------------------------- 4: sequence-first blow-up
def _encoder(norm_first: bool = True) -> nn.Module:
    torch.manual_seed(0)  # test-only: model init
    layer = nn.TransformerEncoderLayer(8, 2, 16, dropout=0.0, norm_first=norm_first)
    return nn.TransformerEncoder(layer, 1, norm=nn.LayerNorm(8), enable_nested_tensor=False)


class SeqFirstModel(nn.Module):
    """(B, T, 3) in; a stock sequence-first encoder with a final ``norm`` inside."""

    def __init__(self) -> None:
        super().__init__()
        self.inp = nn.Linear(3, 8)
        self.enc = _encoder()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.enc(self.inp(x).transpose(0, 1))[-1].sum(-1)


def _true_factors(model: nn.Module, x: torch.Tensor) -> dict[str, torch.Tensor]:
    """Hooks on the true (T, B, D) inputs, max over T (axis 0)."""
    seen: dict[str, torch.Tensor] = {}
    handles = [m.register_forward_pre_hook(
        lambda _m, a, n=n: seen.__setitem__(n, a[0].detach().double()))
        for n, m in model.named_modules() if isinstance(m, nn.LayerNorm)]
    try:
        with torch.no_grad():
            model(x)
    finally:
        for h in handles:
            h.remove()
    return {n: (h.var(-1, unbiased=False) + 1e-5).rsqrt().amax(0) for n, h in seen.items()}


@pytest.mark.parametrize("batch", [5, 8])
def test_the_final_norm_of_a_sequence_first_encoder_is_read_sequence_first(batch):
    """nn.TransformerEncoder(norm=...) carries no batch_first of its own: its first layer's
    self_attn says. With B = T = 8 the final norm's positions were read as examples."""
    model = SeqFirstModel().eval()
    x = torch.randn(batch, 8, 3, generator=_gen(1))
    x[0] *= 30  # one example on another scale, so rows differ
    got = layernorm_factors(model, x, readout_modules=())
    want = _true_factors(model, x)
    assert list(got) == ["enc.layers.0.norm1", "enc.layers.0.norm2", "enc.norm"]
    for name in got:
        torch.testing.assert_close(got[name], want[name], rtol=1e-6, atol=0)


class LooseNorm(nn.Module):
    """A sequence-first encoder layer, then a LayerNorm of the model's own on its (T, B, D)
    output: no layer says how that LayerNorm's input is laid out."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)  # test-only: model init
        self.inp = nn.Linear(3, 8)
        self.layer = nn.TransformerEncoderLayer(8, 2, 16, dropout=0.0)
        self.out_norm = nn.LayerNorm(8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out_norm(self.layer(self.inp(x).transpose(0, 1)))[-1].sum(-1)


def test_an_undeclared_layout_that_cannot_be_told_apart_is_refused():
    model = LooseNorm().eval()
    x = torch.randn(6, 6, 3, generator=_gen(2))
    x[0] *= 30
    with pytest.raises(ValueError, match="batch_first=False"):
        layernorm_blowup(model, x, readout_modules=())
    got = layernorm_factors(model, x, readout_modules=(), batch_first=False)
    torch.testing.assert_close(got["out_norm"], _true_factors(model, x)["out_norm"],
                               rtol=1e-6, atol=0)
    # B != T: the batch-first reading does not fit, and the error names the argument
    with pytest.raises(ValueError, match="batch_first=False"):
        layernorm_factors(model, torch.randn(4, 6, 3, generator=_gen(3)), readout_modules=())
    with pytest.raises(TypeError, match="batch_first"):
        layernorm_factors(model, x, batch_first=1)  # type: ignore[arg-type]


# ------------------------------------------------------------- 5: Hugging Face heads
class FakeHead(nn.Module):
    """A Hugging Face sequence-classification head in miniature: ``config.problem_type``."""

    def __init__(self, problem: str, labels: int) -> None:
        super().__init__()
        self.config = SimpleNamespace(problem_type=problem)
        self.lin = nn.Linear(4, labels)

    def forward(self, x: torch.Tensor) -> SimpleNamespace:
        return SimpleNamespace(logits=self.lin(x))


@pytest.mark.parametrize(("problem", "labels"), [("regression", 1),
                                                 ("multi_label_classification", 3)])
def test_regression_and_multi_label_heads_report_no_shpred(problem, labels):
    torch.manual_seed(0)  # test-only: layer init
    model = FakeHead(problem, labels)
    x = torch.randn(8, 4, generator=_gen(0))
    res = output_sharpness(model, x, sigma_w=0.5, repeats=2, generator=0)
    assert res.shpred is None and res.shop.estimate > 0
    assert problem in res.shpred_reason
    assert problem in str(res)
    # an output_kind the caller gave says how to read it
    given = output_sharpness(model, x, sigma_w=0.5, repeats=2, generator=0, output_kind="logits")
    assert given.shpred is not None and given.shpred_reason is None


def test_class_less_outputs_say_why_shpred_is_missing():
    model = nn.Sequential(nn.Embedding(7, 5))  # (B, T, 5): not class scores
    ids = torch.randint(0, 7, (4, 3), generator=_gen(0))
    res = output_sharpness(model, ids, repeats=2, generator=0)
    assert res.shpred is None and "(4, 3, 5)" in res.shpred_reason


# ------------------------------------------------------------- 6: low-precision weights
def _unit_weights(dtype: torch.dtype) -> nn.Module:
    """Linear(64 -> 1) with |w| in [1, 2): bf16 spacing 2^-7, fp16 spacing 2^-10."""
    lin = nn.Linear(64, 1)
    g = _gen(0)
    with torch.no_grad():
        sign = torch.randn(1, 64, generator=g).sign()
        lin.weight.copy_((sign * (1 + torch.rand(1, 64, generator=g))).to(dtype).float())
        lin.bias.fill_(1.5)
    return lin.to(dtype)


@pytest.mark.parametrize(("dtype", "sigma"), [(torch.bfloat16, 0.001), (torch.bfloat16, 0.002),
                                              (torch.bfloat16, 0.004), (torch.float16, 0.0002)])
def test_weight_noise_below_the_weights_spacing_is_refused(dtype, sigma):
    """Rounded to the weights' grid the applied noise was 0.3x (sigma 0.001), mostly zero
    (0.002) or 1.2x (0.004) of the noise drawn, and ShOp 16x too small at 0.001."""
    model = _unit_weights(dtype)
    before = model.weight.detach().clone()
    x = torch.randn(16, 64, generator=_gen(1)).to(dtype)
    with pytest.raises(ValueError, match=r"model\.float\(\)") as err:
        output_sharpness(model, x, sigma_w=sigma, repeats=2, generator=0)
    assert "sigma_w" in str(err.value)
    assert torch.equal(model.weight, before)  # restored after the refusal
    with pytest.raises(ValueError, match=r"sigma=.*model\.float\(\)"):
        loss_sharpness(model, lambda o, t: o.float().square().mean(), x, None, sigma=sigma,
                       draws=2, generator=0)


def test_weight_noise_well_above_the_spacing_and_float32_weights_are_measured():
    x = torch.randn(16, 64, generator=_gen(1))
    res = output_sharpness(_unit_weights(torch.bfloat16), x.bfloat16(), sigma_w=0.05,
                           repeats=2, generator=0)
    assert res.shop.estimate > 0
    assert output_sharpness(_unit_weights(torch.float32), x, sigma_w=0.001, repeats=2,
                            generator=0).shop.estimate > 0
    # sigma 0 draws no noise: nothing to compare
    zero = output_sharpness(_unit_weights(torch.bfloat16), x.bfloat16(), sigma_w=0.0, repeats=1)
    assert zero.shop.estimate == 0.0


# ------------------------------------------------------------- 8: one row per example
class BatchMean(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.lin(x).mean(0, keepdim=True)  # (1, 3) for any batch


class Total(BatchMean):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.lin(x).sum()  # one number


def test_a_model_without_one_output_row_per_example_is_refused():
    x = torch.randn(8, 4, generator=_gen(0))
    with pytest.raises(ValueError, match="1 rows .* for 8 examples"):
        output_sharpness(BatchMean(), x, generator=0)
    with pytest.raises(ValueError, match="single number for 8 examples"):
        output_sharpness(Total(), x, generator=0)


# ------------------------------------------------------------- 11: structured outputs
class Pair(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 2)
        self.ln = nn.LayerNorm(2)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return x, self.ln(self.lin(x))  # (features, logits)


class LogitsOnly(Pair):
    def forward(self, x: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        return self.ln(self.lin(x))


def test_output_selects_the_logits_of_a_structured_output():
    """The refusal names output=1; output_sharpness and loss_sharpness now accept it."""
    torch.manual_seed(0)  # test-only: layer init
    pair = Pair()
    plain = LogitsOnly()
    plain.load_state_dict(pair.state_dict())
    x = torch.randn(8, 4, generator=_gen(0))
    with pytest.raises(TypeError, match="output=1"):
        output_sharpness(pair, x, generator=0)
    got = output_sharpness(pair, x, sigma_w=0.3, repeats=3, generator=0, output=1)
    want = output_sharpness(plain, x, sigma_w=0.3, repeats=3, generator=0)
    assert torch.equal(got.shop.per_draw, want.shop.per_draw)
    assert torch.equal(got.shpred.per_draw, want.shpred.per_draw)
    y = torch.zeros(8, dtype=torch.long)
    ls = loss_sharpness(pair, nn.functional.cross_entropy, x, y, draws=3, generator=0,
                        output=1)
    assert ls.estimate == loss_sharpness(plain, nn.functional.cross_entropy, x, y, draws=3,
                                         generator=0).estimate
    # the blow-up reads no output, so a tuple needs no selector
    torch.testing.assert_close(layernorm_blowup(pair, x), layernorm_blowup(plain, x))


# ------------------------------- audit apis53: random forwards, side effects, exclude, NaN loss
class MCDropout(nn.Module):
    """Dropout kept on at test time (MC dropout): random in eval mode."""

    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = nn.Linear(8, 32), nn.Linear(32, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.relu(self.a(x))
        return self.b(nn.functional.dropout(h, p=0.3, training=True))


def test_a_forward_random_in_eval_mode_is_refused():
    """At sigma_w=0 the truth is 0; the dropout noise read as ShOp 0.54 ± 0.005 (audit D1)."""
    torch.manual_seed(0)  # test-only: layer init and the model's own dropout
    model = MCDropout()
    x = torch.randn(64, 8, generator=_gen(0))
    y = torch.randint(0, 3, (64,), generator=_gen(1))
    with pytest.raises(ValueError, match=r"random in eval mode.*training=True") as err:
        output_sharpness(model, x, sigma_w=0.0, repeats=3, generator=0)
    assert "ShOp" in str(err.value)
    with pytest.raises(ValueError, match=r"random in eval mode.*loss sharpness"):
        loss_sharpness(model, nn.functional.cross_entropy, x, y, sigma=0.0, draws=3)
    # the same network made deterministic is measured: exactly 0 at sigma 0
    model.forward = lambda x: model.b(torch.relu(model.a(x)))  # type: ignore[method-assign]
    assert output_sharpness(model, x, sigma_w=0.0, repeats=3, generator=0).shop.estimate == 0
    assert loss_sharpness(model, nn.functional.cross_entropy, x, y, sigma=0.0,
                          draws=3).estimate == 0


def test_a_random_loss_fn_is_refused():
    model = nn.Linear(4, 2)
    x = torch.randn(16, 4, generator=_gen(0))

    def noisy(out: torch.Tensor, _t: object) -> torch.Tensor:
        return out.square().mean() + torch.rand(())

    with pytest.raises(ValueError, match="forward or loss_fn is random"):
        loss_sharpness(model, noisy, x, None, draws=2)


def _bn_mlp() -> nn.Module:
    torch.manual_seed(0)  # test-only: layer init
    model = nn.Sequential(nn.Linear(6, 16), nn.BatchNorm1d(16), nn.Tanh(), nn.Linear(16, 3))
    with torch.no_grad():  # running statistics that eval-mode backward reads
        model[1].running_mean.uniform_(-0.5, 0.5)
        model[1].running_var.uniform_(0.5, 2.0)
    return model.eval()


@pytest.mark.parametrize("which", ["output", "loss"])
def test_a_pending_backward_survives_and_gets_the_same_gradients(which):
    """p.copy_ / b.copy_ bumped every version counter: loss.backward() after the call raised
    'modified by an inplace operation' (audit D3)."""
    x = torch.randn(8, 6, generator=_gen(0))
    reference = _bn_mlp()
    reference(x).pow(2).mean().backward()
    model = _bn_mlp()
    loss = model(x).pow(2).mean()
    versions = [t._version for t in [*model.parameters(), *model.buffers()]]
    if which == "output":
        output_sharpness(model, x, sigma_w=0.1, repeats=2, generator=0)
    else:
        loss_sharpness(model, lambda o, _t: o.pow(2).mean(), x, None, draws=2, generator=0)
    loss.backward()  # raised "modified by an inplace operation"
    assert [t._version for t in [*model.parameters(), *model.buffers()]] == versions
    for p, q in zip(model.parameters(), reference.parameters(), strict=True):
        assert torch.equal(p.grad, q.grad)


class Counter(nn.Module):
    """Reassigns one buffer (self.calls = self.calls + 1) and updates another in place."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 2)
        self.register_buffer("calls", torch.zeros(()))
        self.register_buffer("seen", torch.zeros(()))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.calls = self.calls + 1
        self.seen.add_(0)  # written, value unchanged
        return self.lin(x)


def test_a_reassigned_buffer_is_put_back_by_name():
    """The snapshot was copied into the old tensor object: calls == 4 after 3 draws (audit D4)."""
    model = Counter()
    calls, seen = model.calls, model.seen
    x = torch.randn(8, 4, generator=_gen(0))
    output_sharpness(model, x, repeats=3, generator=0)
    loss_sharpness(model, lambda o, _t: o.square().mean(), x, None, draws=3, generator=0)
    assert model.calls is calls and model.calls.item() == 0.0
    assert model.seen is seen and model.state_dict()["calls"].item() == 0.0


def test_an_output_that_is_a_parameter_is_measured():
    """A model returning its own weight: the clean output was the parameter itself, perturbed
    in place with it, so ShOp was 0; E|Δ| = σ·sqrt(2/π) per example."""

    class Weights(nn.Module):
        def __init__(self, n: int) -> None:
            super().__init__()
            self.theta = nn.Parameter(torch.zeros(n))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.theta

    res = output_sharpness(Weights(400), torch.zeros(400, 1), sigma_w=1.0, repeats=5,
                           generator=0)
    assert res.shop.estimate == pytest.approx(math.sqrt(2 / math.pi), rel=0.05)


def test_a_forward_that_writes_its_parameters_is_refused():
    class Clamps(nn.Linear):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            with torch.no_grad():
                self.weight.clamp_(-0.1, 0.1)
            return super().forward(x)

    torch.manual_seed(0)  # test-only: layer init
    with pytest.raises(ValueError, match="writes into the parameter"):
        output_sharpness(Clamps(4, 2), torch.randn(8, 4, generator=_gen(0)), generator=0)


def test_an_exclude_entry_that_matches_nothing_is_refused_with_the_closest_names():
    """exclude=('layer0',) measured the unexcluded model without a word (audit S3)."""
    torch.manual_seed(0)  # test-only: layer init

    class Layers(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.layers = nn.ModuleList([nn.Linear(4, 4), nn.Linear(4, 2)])

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.layers[1](torch.tanh(self.layers[0](x)))

    model = Layers()
    x = torch.randn(8, 4, generator=_gen(0))
    with pytest.raises(ValueError, match=r"'layer0' is in no parameter name.*'layers\.0'"):
        output_sharpness(model, x, exclude=("layer0",), generator=0)
    with pytest.raises(ValueError, match="'layer0' is in no parameter name"):
        loss_sharpness(model, lambda o, _t: o.square().mean(), x, None, exclude="layer0")
    # a real substring, and the default positional exclude on a model without positions, pass
    output_sharpness(model, x, exclude=("layers.0",), repeats=2, generator=0)
    loss_sharpness(model, lambda o, _t: o.square().mean(), x, None, draws=2)


def _log_loss(out: torch.Tensor, _t: object) -> torch.Tensor:
    return out.log().mean()


def test_a_nan_loss_is_refused_naming_where_it_appeared():
    """A NaN loss gave a NaN sharpness without a word (audit S7)."""
    model = nn.Linear(1, 1)
    with torch.no_grad():
        model.weight.zero_()
        model.bias.fill_(1.0)  # clean output 1, log 0; perturbed outputs go negative
    x = torch.randn(16, 1, generator=_gen(0))
    with pytest.raises(ValueError, match=r"loss with the weights perturbed \(draw 1 of 3.*NaN"
                       r".*smaller sigma"):
        loss_sharpness(model, _log_loss, x, None, sigma=5.0, draws=3, generator=0)
    with pytest.raises(ValueError, match="loss of the clean model is NaN"):
        loss_sharpness(model, lambda o, t: (o * t).mean(), x, torch.full((16, 1), math.nan))
    with torch.no_grad():
        model.bias.fill_(math.nan)
    with pytest.raises(ValueError, match="clean model's output is NaN"):
        output_sharpness(model, x, generator=0)


class _AliasedWeight(nn.Module):
    """Reads its weight through an alias it keeps (a cached transpose of the same storage)."""

    def __init__(self, alias: bool) -> None:
        super().__init__()
        g = torch.Generator().manual_seed(1)
        self.lin = nn.Linear(6, 3)
        with torch.no_grad():
            self.lin.weight.copy_(torch.randn(3, 6, generator=g))
        self.alias = alias
        self.wt = self.lin.weight.data.t() if alias else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        w_t = self.wt if self.alias else self.lin.weight.t()
        return x @ w_t + self.lin.bias


def test_a_weight_read_through_an_alias_gets_its_noise():
    """Swapping perturbed tensors in as the parameters' .data hid the noise from a tensor that
    aliases their storage: ShOp 0.088 instead of 0.316 (only the bias moved), 0 for parameters
    that are views of a flat buffer. Aliased storage gets the noise written in place; the
    numbers equal those of the same model reading its parameters."""
    x = torch.randn(16, 6, generator=torch.Generator().manual_seed(0))
    plain = output_sharpness(_AliasedWeight(False), x, sigma_w=0.05, repeats=8, generator=0)
    model = _AliasedWeight(True)
    w0 = model.lin.weight.detach().clone()
    aliased = output_sharpness(model, x, sigma_w=0.05, repeats=8, generator=0)
    assert math.isclose(aliased.shop.estimate, plain.shop.estimate, rel_tol=1e-6)  # rounding
    assert plain.shop.estimate > 0.3
    assert torch.equal(model.lin.weight, w0) and torch.equal(model.wt, w0.t())


def test_a_sigma_of_the_wrong_type_is_named_as_such():
    with pytest.raises(ValueError, match=r"pass a number ≥ 0 \(a float\), got str '0.1'"):
        output_sharpness(nn.Linear(3, 2), torch.randn(4, 3), sigma_w="0.1")


def test_a_sequence_first_input_to_layernorm_blowup_says_the_inputs_must_be_batch_first():
    """The module's own (T, B, D) input: the message showed the shape after senslab's transpose
    and called T the batch, without saying that the *model's inputs* must be batch-first."""
    layer = nn.TransformerEncoderLayer(16, 2, 32, batch_first=False)
    enc = nn.TransformerEncoder(layer, 2, enable_nested_tensor=False).eval()
    x = torch.randn(7, 5, 16, generator=torch.Generator().manual_seed(0))  # (T, B, D)
    with pytest.raises(ValueError, match=r"shape \(7, 5, 16\) \(read as sequence-first(?s:.*)"
                                         r"model's inputs must be batch-first(?s:.*)wrapper"):
        layernorm_blowup(enc, x)

    class BatchFirst(nn.Module):  # the fix the message names
        def __init__(self) -> None:
            super().__init__()
            self.enc = enc

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.enc(x.transpose(0, 1)).transpose(0, 1)

    assert layernorm_blowup(BatchFirst(), x.transpose(0, 1)).shape == (5,)


def test_a_group_whose_noise_rounds_away_is_named_when_the_whole_passes():
    """The rounding check pools every bf16 coordinate: at σ_w = 0.002 a LayerNorm's gains of 1
    (spacing 2⁻⁷) kept 81% of their clean values while the call passed without a word."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 64), nn.LayerNorm(64), nn.Linear(64, 3))
    model = model.to(torch.bfloat16).eval()
    x = torch.randn(16, 64, generator=_gen(1)).bfloat16()
    with pytest.warns(UserWarning, match=r"rounded away on most coordinates(?s:.*)'1.weight'"):
        output_sharpness(model, x, sigma_w=0.002, generator=0)
    with warnings.catch_warnings():  # excluded, as the warning suggests: nothing to say
        warnings.simplefilter("error", UserWarning)  # the rounding warnings; few flips warn apart
        output_sharpness(model, x, sigma_w=0.002, generator=0, exclude=["1.weight"])


def test_a_scalar_parameter_is_not_named_by_the_chance_of_one_draw():
    """A CLIP-like bf16 logit scale (2.659, spacing 2⁻⁶): σ_w = 0.05 moves it on about 87% of
    draws, yet the draw-based warning named it in 12 of 100 calls (a scalar is 0% or 100%
    unchanged). It is named only where its expected unchanged share is above a half too."""
    class Scaled(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lin = nn.Linear(16, 3)
            self.logit_scale = nn.Parameter(torch.tensor(2.659))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.lin(x) * self.logit_scale

    torch.manual_seed(0)
    model = Scaled().to(torch.bfloat16).eval()
    x = torch.randn(8, 16, generator=_gen(2)).bfloat16()
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)
        for seed in range(40):
            output_sharpness(model, x, sigma_w=0.05, generator=seed)


def test_the_expected_unchanged_share_matches_simulation_at_a_power_of_two():
    """Below a power of two (a LayerNorm gain of 1) the bf16 grid is twice as fine: the share
    read with the spacing above on both sides was 0.604 where 0.468 of the weights keep their
    value (σ = 0.0046)."""
    from senslab.measure.sharpness import _expected_unchanged
    for value in (1.0, 1.5):
        p = torch.full((20000,), value, dtype=torch.bfloat16)
        noise = torch.randn(20000, generator=_gen(3)) * 0.0046
        simulated = ((p.float() + noise).bfloat16() == p).double().mean().item()
        assert abs(_expected_unchanged(p, 0.0046) - simulated) < 0.02, value


class _Tiled(nn.Module):
    """A small linear map whose outputs are repeated ``copies`` times (a wide head)."""

    def __init__(self, copies: int) -> None:
        super().__init__()
        self.lin = nn.Linear(8, 4)
        self.copies = copies

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.lin(x).repeat(1, self.copies)


def test_shop_of_a_wide_fp16_output_is_summed_beyond_fp16s_range():
    """Each output and each difference is finite in fp16, yet an example's sum of distances over
    400,000 outputs passes fp16's largest number (65,504): ShOp was inf. The same weights and
    noise with the outputs not repeated give exactly 1/100,000 of it."""
    x = torch.randn(4, 8, generator=_gen(3)).half()
    narrow, wide = _Tiled(1), _Tiled(100_000)
    wide.load_state_dict(narrow.state_dict())
    narrow, wide = narrow.half(), wide.half()
    small = output_sharpness(narrow, x, sigma_w=0.3, repeats=3, generator=0).shop.estimate
    large = output_sharpness(wide, x, sigma_w=0.3, repeats=3, generator=0).shop.estimate
    assert large > 65_504
    assert math.isfinite(large)
    assert large == pytest.approx(small * 100_000, rel=1e-9)
