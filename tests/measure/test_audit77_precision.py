"""Audit of checked precision (senslab.measure._precision): products that bf16 autocast runs in
bf16 but that the check did not size, so a later batch with larger inputs to them kept the
calibration's band and took bf16's decisions."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from checked_flips import assert_shifted_example_keeps_float32_flips
from torch import nn

from senslab.measure import _precision

CPU = torch.device("cpu")

#: products CPU autocast runs in bf16 that are not ``F.linear``/``torch.matmul``/``einsum``
PRODUCTS = {
    "linalg.matmul": lambda x, w: torch.linalg.matmul(x, w.T),
    "tensordot": lambda x, w: torch.tensordot(x, w.T, dims=1),
    "inner": lambda x, w: torch.inner(x, w),
    "inner-method": lambda x, w: x.inner(w),
    "multi_dot": lambda x, w: torch.linalg.multi_dot([x, w.T]),
    "vecdot": lambda x, w: torch.linalg.vecdot(x[:, None, :], w[None]),
}


class Centred(nn.Module):
    """A two-layer MLP whose first product (written as ``how``) has weight rows summing to 0: a
    constant added to every input feature leaves its outputs as they were, while bf16's rounding
    of that product grows with the shift."""

    output_kind = "logits"

    def __init__(self, features: int, how: str) -> None:
        super().__init__()
        torch.manual_seed(0)  # test-only: nn.Linear initialises from the global RNG
        self.how = how
        self.l1, self.l2 = nn.Linear(features, 128), nn.Linear(128, 3)
        with torch.no_grad():
            self.l1.weight -= self.l1.weight.mean(1, keepdim=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = PRODUCTS[self.how](x.flatten(1), self.l1.weight) + self.l1.bias
        return self.l2(torch.relu(h))


def test_a_shifted_example_through_a_tensordot_keeps_float32_flips():
    """Calibrated on N(0, 1) inputs, then a batch in which one example is shifted by 64: the
    product's bf16 error grows with the shift. Unsized, the band stayed the calibration's, the
    spot checks (1/64 of the copies) missed the example, and 16 of 2,048 copies took bf16's
    class without a word (sensitivity 0.0522 against float32's 0.0444)."""
    assert_shifted_example_keeps_float32_flips(Centred(64, "tensordot").eval(), seed=0, repeats=4)


@pytest.mark.parametrize("how", list(PRODUCTS))
def test_every_product_autocast_lowers_is_sized(how):
    """The band of a chunk whose inputs to the product are shifted by 64 is widened, and the
    product counts as run in bf16."""
    g = torch.Generator().manual_seed(0)
    model = Centred(16, how).eval()
    first = torch.randn(8, 16, generator=g)
    with torch.inference_mode(), torch.autocast("cpu", dtype=torch.bfloat16):
        assert PRODUCTS[how](first, model.l1.weight).dtype == torch.bfloat16  # autocast lowers it
    check = _precision.PrecisionCheck()
    check.use("bf16")
    with torch.inference_mode():
        with check._lowered(CPU):
            h = PRODUCTS[how](first, model.l1.weight)
        check._calibrated_ranges()
        with check._lowered(CPU):
            PRODUCTS[how](first + 64.0, model.l1.weight)
        assert h.dtype == torch.bfloat16 and check._recorder().lowered
        assert float(check._widening(len(first))) > 10


@pytest.mark.parametrize("how", ["prelu", "conv_tbc"])
def test_prelu_and_conv_tbc_are_sized(how):
    """``F.prelu`` and ``F.conv_tbc`` run in bf16 under CPU autocast too."""
    g = torch.Generator().manual_seed(0)
    if how == "prelu":
        x, w = torch.randn(8, 16, generator=g), torch.full((1,), 0.25)

        def op(a):
            return F.prelu(a, w)
    else:
        x, w = torch.randn(6, 4, 3, generator=g), torch.randn(2, 3, 5, generator=g)

        def op(a):
            return F.conv_tbc(a, w, torch.zeros(5), 0)
    check = _precision.PrecisionCheck()
    check.use("bf16")
    with torch.inference_mode():
        with check._lowered(CPU):
            assert op(x).dtype == torch.bfloat16
        check._calibrated_ranges()
        with check._lowered(CPU):
            op(x * 100)
        assert check._recorder().lowered
        assert float(check._widening(len(x))) > 10
