"""Which products checked bf16 (senslab.measure._precision) sizes, and how: the band of a later
batch is widened by how much larger its products' factors are than the calibration's, so every
product autocast runs in bf16 must be sized by its factors — the factors of ``input + a @ b``
(not the added term), the method forms (BLOOM's ``alibi.baddbmm(q, k)``), the products inside
``nn.MultiheadAttention`` — and the widening must follow both factors' sizes together, as
bf16's rounding error of a product does."""

from __future__ import annotations

import warnings

import pytest
import torch
from checked_flips import Recorder
from torch import nn

from senslab.measure import _precision
from senslab.tokens import Sequence

CPU = torch.device("cpu")


def _widening(model: nn.Module, first: torch.Tensor, later: torch.Tensor) -> float:
    """The band's widening for ``later`` after a calibration on ``first``."""
    check = _precision.PrecisionCheck()
    check.use("bf16")
    with torch.inference_mode():
        with check._lowered(CPU):
            model(first)
        check._calibrated_ranges()
        with check._lowered(CPU):
            model(later)
        assert check._recorder().lowered
        return float(check._widening(len(later)))


class AddedScores(nn.Module):
    """Attention scores as ``bias + q @ kᵀ`` (``torch.baddbmm``, or its method form on the bias
    as BLOOM writes it), the keys the inputs' second half: no other product sees them."""

    output_kind = "logits"

    def __init__(self, method: bool) -> None:
        super().__init__()
        torch.manual_seed(0)  # test-only: nn.Linear initialises from the global RNG
        self.method = method
        self.q, self.head = nn.Linear(16, 16), nn.Linear(16, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, k = self.q(x[..., :16]), x[..., 16:].transpose(1, 2)
        bias = torch.zeros(x.shape[0], x.shape[1], x.shape[1])
        scores = bias.baddbmm(q, k) if self.method else torch.baddbmm(bias, q, k)
        return self.head((scores.softmax(-1) @ x[..., :16]).mean(1))


class Attention(nn.Module):
    output_kind = "logits"

    def __init__(self, layer: bool) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.layer = layer
        if layer:  # post-norm: its output hides the inputs' size
            self.body = nn.TransformerEncoderLayer(32, 4, 64, dropout=0.0, batch_first=True)
        else:
            self.body = nn.MultiheadAttention(32, 4, batch_first=True)
        self.head = nn.Linear(32, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.body(x) if self.layer else self.body(x, x, x, need_weights=False)[0]
        return self.head(h.mean(1))


def _inputs() -> torch.Tensor:
    return torch.randn(8, 6, 32, generator=torch.Generator().manual_seed(1))


@pytest.mark.parametrize("method", [False, True], ids=["torch.baddbmm", "Tensor.baddbmm"])
def test_the_factors_of_an_added_product_are_sized_not_its_added_term(method):
    """Keys 8× larger widen the band 8×: the scores' error grows with them. Before, torch's
    form sized the added term (zeros) and the queries, its method form nothing: the band
    widened by 1.20 in both (from the softmax's sharper output alone)."""
    x = _inputs()
    later = x.clone()
    later[..., 16:] *= 8
    assert _widening(AddedScores(method).eval(), x, later) == pytest.approx(8.0)


def test_every_added_product_records_its_two_factors():
    """``addmm``, ``baddbmm`` and ``addbmm``, as functions and as methods, with the factors
    given by position or by name: each call records the larger of its two factors' largest
    absolute values (the added term is 100, larger than both) and their product."""
    g = torch.Generator().manual_seed(2)
    a2, b2 = torch.randn(3, 4, generator=g), torch.randn(4, 5, generator=g) * 3
    a3, b3 = torch.randn(2, 3, 4, generator=g), torch.randn(2, 4, 5, generator=g) * 3
    calls = [
        lambda c: torch.addmm(c, a2, b2), lambda c: c.addmm(a2, b2),
        lambda c: torch.addmm(c, mat1=a2, mat2=b2),
        lambda c: torch.baddbmm(c[None].expand(2, 3, 5), a3, b3),
        lambda c: c[None].expand(2, 3, 5).baddbmm(batch1=a3, batch2=b3),
        lambda c: torch.addbmm(c, a3, b3), lambda c: c.addbmm(a3, b3),
    ]
    for i, call in enumerate(calls):
        rec = _precision._Ranges("bf16")
        with torch.autocast("cpu", dtype=torch.bfloat16), rec:
            call(torch.full((3, 5), 100.0))
        a, b = (a2, b2) if i < 3 else (a3, b3)
        largest = rec.read()
        assert rec.lowered and len(largest) == 3, i
        assert largest[0] == pytest.approx(max(a.abs().max(), b.abs().max())), i
        product = rec.read_all()[1]
        assert len(product) == 3 and product[0] == pytest.approx(a.abs().max() * b.abs().max())


@pytest.mark.parametrize("layer", [False, True], ids=["MultiheadAttention", "EncoderLayer"])
@pytest.mark.parametrize("redispatch", [True, False], ids=["inside", "from-arguments"])
def test_multihead_attention_is_sized(layer, redispatch, monkeypatch):
    """Inputs 8× larger make the attention scores' factors (queries and keys) each 8× larger:
    the band widens 64× (the projections' biases start at 0, so exactly). Before, nothing
    inside ``F.multi_head_attention_forward`` was recorded (a mode does not see the calls
    inside a Python function that hands itself to it): 10.8 (the head's input only) and 1.07
    (the encoder layer's norm hides the size from the feed-forward). Torch without
    ``_skip_one_hop_torch_function`` sizes the call from its arguments, with the same ratio."""
    if not redispatch:
        monkeypatch.setattr(_precision, "_REDISPATCH", None, raising=False)
    elif not hasattr(torch._C, "_skip_one_hop_torch_function"):
        pytest.skip("this torch cannot re-enter a mode inside a Python function")
    x = _inputs()
    assert _widening(Attention(layer).eval(), x, x * 8) == pytest.approx(64.0)


def test_an_input_smaller_than_its_weight_is_sized():
    """A linear layer's inputs (largest about 1.2) smaller than its weights (3.5): inputs 4×
    larger make the product's error 4× larger. Before, each product recorded only the larger
    of its inputs' and weights' sizes, and the band widened by 1.66 (where the inputs passed
    the weights)."""
    torch.manual_seed(0)
    model = nn.Linear(32, 3)
    with torch.no_grad():
        model.weight.mul_(20)

    def forward(x: torch.Tensor) -> torch.Tensor:
        return model(x.mean(1))
    x = _inputs()
    assert x.mean(1).abs().max() < model.weight.abs().max() / 2
    assert _widening(forward, x, x * 4) == pytest.approx(4.0)  # type: ignore[arg-type]


class Centred(nn.Module):
    """A two-layer MLP whose first layer's weight rows sum to 0 (a constant added to every
    input feature leaves the outputs as they were), its weights 1,000× larger than the inputs
    and its second layer's 1,000× smaller: the inputs' growth shows in no product's larger
    factor, and in no output."""

    output_kind = "logits"

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.l1, self.l2 = nn.Linear(64, 128), nn.Linear(128, 3)
        with torch.no_grad():
            self.l1.weight -= self.l1.weight.mean(1, keepdim=True)
            self.l1.weight *= 1000
            self.l1.bias *= 1000
            self.l2.weight /= 1000

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.l2(torch.relu(self.l1(x.flatten(1))))


def test_a_shift_smaller_than_the_weights_widens_the_band_before_any_spot_check():
    """Calibrated on N(0, 1) inputs, then a batch shifted by 64: bf16's rounding of the first
    product grows 64×, the band must too. Before, the band stayed as calibrated (the weights,
    up to 144, were each call's larger factor), and only a spot check found the error past it:
    the bound widened from 0.017 to 0.26 and a warning said copies outside the band could take
    bf16's class. Now the widening sees the shift: no warning, the bound as calibrated, the
    decisions float32's."""
    g = torch.Generator().manual_seed(0)
    first, later = torch.randn(32, 8, 8, generator=g), torch.randn(32, 8, 8, generator=g) + 64
    model = Centred().eval()
    runs = {}
    for precision in ("float32", "bf16-checked"):
        m = Recorder(model, Sequence(), sigma=0.3, repeats=4, generator=5, precision=precision)
        with warnings.catch_warnings(record=True) as said:
            warnings.simplefilter("always")
            m.update(first)
            calibrated = m.check_bound
            m.update(later)
        runs[precision] = m
    full, checked = runs["float32"], runs["bf16-checked"]
    assert checked.checked_precision == "bf16"
    assert not [w for w in said if "spot check" in str(w.message)]
    assert calibrated is not None and checked.check_bound == calibrated
    assert torch.equal(checked.copies, full.copies)
    a, b = checked.compute(), full.compute()
    assert a.estimate == b.estimate and torch.equal(a.per_sample, b.per_sample)
    assert 0 < b.estimate < 1 and a.recheck_fraction < 1
