"""The widening of checked precision's band (senslab.measure._precision, ._int8) for inputs
larger than the calibration's: it follows the sizes bf16's rounding and int8's quantisation
grow with — the inputs' largest absolute value and root mean square, and int8's quantisation
range, which includes 0 — not only their range (max − min), which a constant shift leaves as
it was."""

from __future__ import annotations

import pytest
import torch
from checked_flips import Recorder
from torch import nn

from senslab.measure import _int8, _precision
from senslab.tokens import Sequence

LOWS = ["bf16", pytest.param("int8", marks=pytest.mark.skipif(
    not _int8.available(), reason="this torch has no x86 quantised linear kernels"))]


class Centred(nn.Module):
    """A two-layer MLP whose first layer's weight rows sum to 0: a constant added to every
    input feature leaves its outputs (and every product's input range) as they were."""

    output_kind = "logits"

    def __init__(self, features: int) -> None:
        super().__init__()
        torch.manual_seed(0)  # test-only: nn.Linear initialises from the global RNG
        self.l1, self.l2 = nn.Linear(features, 128), nn.Linear(128, 3)
        with torch.no_grad():
            self.l1.weight -= self.l1.weight.mean(1, keepdim=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.l2(torch.relu(self.l1(x.flatten(1))))


def _flips(model, batches, low):
    out = {}
    for precision in ("float32", f"{low}-checked"):
        m = Recorder(model, Sequence(), sigma=0.3, repeats=4, generator=5, precision=precision)
        for b in batches:
            m.update(b)
        out[precision] = m
    return out["float32"], out[f"{low}-checked"]


@pytest.mark.parametrize("low", LOWS)
@pytest.mark.parametrize("case", ["offset", "offset-past-an-outlier"])
def test_inputs_shifted_by_a_constant_the_model_cancels_keep_float32_flips(low, case):
    """Calibrated on N(0, 1) inputs, then a batch of N(0, 1) + 64: the outputs and every
    product's input range are unchanged, and with the band widened by the range alone the
    shifted batch kept the calibration's band (bf16 and int8 then took their own decisions on
    many copies: 0.083 and 0.115 against float32's 0.087 in the audit, 12–16 of 32 examples
    off). "offset-past-an-outlier": a calibration with one input of about 120 in every example,
    then a shift of 100, whose largest absolute value stays below the calibration's — bf16's
    error summed over the many shifted values grows with their root mean square (17 of 2,048
    copies flipped otherwise than float32 with the widening by the largest absolute value
    alone)."""
    g = torch.Generator().manual_seed(0)
    t, d, shift = (8, 8, 64.0) if case == "offset" else (16, 16, 100.0)
    model = Centred(t * d).eval()
    first, second = torch.randn(32, t, d, generator=g), torch.randn(32, t, d, generator=g)
    if case != "offset":
        first[:, 0, 0] = 120.0 + torch.randn(32, generator=g)
    full, checked = _flips(model, [first, second + shift], low)
    assert checked.checked_precision == low
    with torch.no_grad():  # the model cancels the shift: its outputs are float32's as they were
        torch.testing.assert_close(model(second + shift), model(second), atol=1e-3, rtol=0)
    assert torch.equal(checked.copies, full.copies)
    a, b = checked.compute(), full.compute()
    assert a.estimate == b.estimate and torch.equal(a.per_sample, b.per_sample)
    assert 0 < b.estimate < 1 and a.recheck_fraction < 1


def test_the_recorded_sizes_are_what_the_error_grows_with():
    """Per call: int8's quantisation range (from min(x, 0) to max(x, 0): PyTorch's dynamic
    quantisation always includes 0, so its step grows with a constant shift), the largest
    absolute value and the root mean square; bf16's products (over their first two inputs) the
    largest absolute value, the root mean square and the range."""
    x, rms = torch.tensor([[63.0, 65.0], [64.0, 64.0]]), 4096.5 ** 0.5
    assert _int8.extents(x) == pytest.approx([65.0, 65.0, rms])
    assert _int8.extents(-x) == pytest.approx([65.0, 65.0, rms])
    assert _int8.extents(torch.tensor([[-1.0, 3.0]])) == pytest.approx([4.0, 3.0, 5 ** 0.5])
    rec = _precision._Ranges("bf16")
    with rec:
        torch.nn.functional.linear(x, torch.full((3, 2), 0.5))
    assert rec.read() == pytest.approx([65.0, rms, 2.0])
    # the shift is what the band widens for: the largest absolute value's ratio
    check = _precision.PrecisionCheck()
    check.use("bf16")
    check._ranges = [1.0, 0.5, 2.0]
    check._recorder().ranges = [torch.tensor(v) for v in (65.0, 64.0, 2.0)]
    assert check._widening(4) == 128.0
