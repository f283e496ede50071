"""Output sharpness, session 79 (3): float8 parameters refused by name instead of a raw torch
error, ShPred's flips of examples whose clean class is a tie said (float32 ties at any sigma_w,
bf16 ties only where rounding decides them), complex outputs and losses refused."""

from __future__ import annotations

import copy
import warnings

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from senslab.measure.sharpness import loss_sharpness, output_sharpness

# the few-flips warning of small batches is not what these tests are about
pytestmark = pytest.mark.filterwarnings("ignore:ShPred's standard error rests:RuntimeWarning")

FLOAT8 = [torch.float8_e4m3fn, torch.float8_e5m2]


class Dequant(nn.Module):
    """A weight stored in ``dtype`` and used in float32 (weight-only quantization)."""

    def __init__(self, dtype: torch.dtype) -> None:
        super().__init__()
        g = torch.Generator().manual_seed(0)
        self.weight = nn.Parameter(torch.randn(3, 4, generator=g).to(dtype), requires_grad=False)
        self.bias = nn.Parameter(torch.zeros(3))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.weight.float(), self.bias)


def _x(b: int = 6, d: int = 4, seed: int = 1) -> torch.Tensor:
    return torch.randn(b, d, generator=torch.Generator().manual_seed(seed))


def _messages(fn):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        res = fn()
    return res, [str(w.message) for w in caught]


@pytest.mark.parametrize("dtype", FLOAT8)
def test_a_float8_weight_is_refused_by_name_and_measured_excluded(dtype: torch.dtype) -> None:
    # before: RuntimeError "Promotion for Float8 Types is not supported" from inside the draw
    model = Dequant(dtype)
    with pytest.raises(ValueError, match=r"'weight' \(float8.*exclude=\['weight'\].*float32"):
        output_sharpness(model, _x(), generator=0)
    with pytest.raises(ValueError, match=r"'weight' \(float8"):
        loss_sharpness(model, F.mse_loss, _x(), torch.zeros(6, 3), generator=0)
    # the fix the message names: excluded, it is measured as its float32 twin
    twin = copy.deepcopy(model)
    twin.weight.data = twin.weight.data.float()  # the same values, held in float32
    a = output_sharpness(model, _x(), exclude=["weight"], generator=0)
    b = output_sharpness(twin, _x(), exclude=["weight"], generator=0)
    assert a.shop.estimate == b.shop.estimate > 0


def test_a_model_cast_to_float8_is_refused_before_its_forward() -> None:
    # before: NotImplementedError "clamp_min_scalar_cpu" not implemented for 'Float8_e4m3fn'
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 3)).to(torch.float8_e4m3fn)
    with pytest.raises(ValueError, match=r"'0\.weight' \(float8_e4m3fn\).*and 1 more"):
        output_sharpness(model, _x().to(torch.float8_e4m3fn), generator=0)


def _tied_head() -> nn.Linear:
    """Three classes; rows 0 and 1 are zero, so their logits tie (both 0) and class 0 is the
    clean prediction wherever class 2's logit is negative."""
    head = nn.Linear(4, 3)
    with torch.no_grad():
        head.weight.zero_()
        head.bias.zero_()
        head.weight[2] = 1.0
    return head


def test_flips_of_exactly_tied_examples_are_said_with_their_count() -> None:
    x = _x(64, seed=0)
    head = _tied_head()
    tied = int((head(x)[:, 2] < 0).sum())
    for sigma in (1e-3, 1e-2):  # the same share at any sigma: the tie-break, not the noise
        res, said = _messages(lambda s=sigma: output_sharpness(head, x, sigma_w=s, repeats=20,
                                                               generator=0))
        assert res.shpred is not None and res.shpred.estimate > 0.15
        ties = [m for m in said if m.startswith("ShPred counts flips of examples whose clean")]
        assert len(ties) == 1
        assert f"{tied} of the 64 examples" in ties[0]
        assert f"ShPred over the other {64 - tied} examples is 0" in ties[0]
    # nothing is said at sigma_w = 0, nor of a model without ties
    _, said = _messages(lambda: output_sharpness(head, x, sigma_w=0.0, generator=0))
    assert not any("tie" in m for m in said)
    model = nn.Linear(4, 3)
    torch.manual_seed(0)
    nn.init.normal_(model.weight)
    res, said = _messages(lambda: output_sharpness(model, x, sigma_w=0.05, generator=0))
    assert res.shpred is not None and res.shpred.estimate > 0
    assert not any("tie" in m for m in said)


def test_a_column_exactly_on_its_boundary_is_a_tie() -> None:
    head = nn.Linear(4, 1)  # all-zero: every logit is exactly 0, read as class 0
    with torch.no_grad():
        head.weight.zero_()
        head.bias.zero_()
    res, said = _messages(lambda: output_sharpness(head, _x(16), sigma_w=1e-4, generator=0,
                                                   output_kind="logits"))
    assert res.shpred is not None and res.shpred.estimate > 0.2
    assert any("16 of the 16 examples" in m and "no other example is left" in m for m in said)
    # a ReLU'd logit of 0 (negative pre-activation) is clamped on its boundary, not tied: it
    # flips only where the noise overcomes the pre-activation, and sits on 0 in other draws
    relu = nn.Sequential(nn.Linear(4, 1), nn.ReLU())
    with torch.no_grad():
        relu[0].weight.zero_()
        relu[0].bias.fill_(-0.5)
    res, said = _messages(lambda: output_sharpness(relu, _x(16), sigma_w=0.5, generator=0,
                                                   output_kind="logits"))
    assert res.shpred is not None and res.shpred.estimate > 0
    assert not any("clean class is a tie" in m for m in said)


def _bf16_mlp() -> tuple[nn.Module, torch.Tensor]:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 200))
    return model.bfloat16(), torch.randn(256, 32).bfloat16()


def test_bf16_ties_are_said_only_where_rounding_decides_their_flips() -> None:
    model, x = _bf16_mlp()
    out = model(x).float().topk(2, 1).values
    assert int((out[:, 0] == out[:, 1]).sum()) > 0  # rounding ties some examples
    # the noise moves their margins by 4-7 spacings: flips as the float32 copy's (0.090)
    res, said = _messages(lambda: output_sharpness(model, x, sigma_w=0.003, repeats=10,
                                                   generator=0))
    assert not any("clean class is a tie" in m for m in said)
    # by 1.4-2.4 spacings: rounding decides them (ShPred 0.035 against float32's 0.032)
    res, said = _messages(lambda: output_sharpness(model, x, sigma_w=0.001, repeats=10,
                                                   generator=0))
    ties = [m for m in said if "clean class is a tie" in m]
    assert len(ties) == 1 and "bfloat16" in ties[0] and "float32 copy" in ties[0]


def test_a_complex_output_is_refused() -> None:
    class Complex(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lin = nn.Linear(4, 3)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            y = self.lin(x)
            return torch.complex(y, 2 * y)

    torch.manual_seed(0)
    model = Complex()
    # before: ShOp of the real part alone (0.29 where the L1 change is sqrt(5) times that)
    with pytest.raises(ValueError, match="complex.*output=torch.view_as_real"):
        output_sharpness(model, _x(), generator=0)
    res = output_sharpness(model, _x(), generator=0, output=torch.view_as_real)
    real = output_sharpness(model.lin, _x(), generator=0)
    assert res.shop.estimate == pytest.approx(3 * real.shop.estimate, rel=1e-5)
    with pytest.raises(ValueError, match="complex loss"):
        loss_sharpness(model, lambda o, y: (o - y).square().mean(), _x(), torch.zeros(6, 3),
                       generator=0)
