"""A model that cannot run in bf16 (DeBERTa v1 fills its attention mask with float32's smallest
number, which bf16 cannot hold) is measured in float32 under the default "auto" and refused by
name under an explicit checked precision, not failed with torch's raw error."""

from __future__ import annotations

import pytest
import torch

from senslab.measure import token_sensitivity
from senslab.tokens import Sequence


class Float32Mask(torch.nn.Module):
    """Fills a mask with float32's smallest number in the dtype its activations run in, as
    DeBERTa v1 does: under bf16 autocast the fill overflows."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(8, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.lin(x)  # bf16 under autocast
        h = h.masked_fill(torch.zeros_like(h, dtype=torch.bool), torch.finfo(torch.float32).min)
        return h.float().mean(dim=1)


def _x() -> torch.Tensor:
    return torch.randn(4, 3, 8, generator=torch.Generator().manual_seed(0))


def test_an_explicit_checked_bf16_names_float32() -> None:
    with pytest.raises(RuntimeError, match=r"the model fails in bf16 .*precision='float32'"):
        token_sensitivity(Float32Mask().eval(), _x(), Sequence(), sigma=1.0, generator=0,
                          precision="bf16-checked")


def test_auto_measures_such_a_model_in_float32() -> None:
    torch.manual_seed(0)
    model = Float32Mask().eval()
    want = token_sensitivity(model, _x(), Sequence(), sigma=1.0, generator=0,
                             precision="float32")
    got = token_sensitivity(model, _x(), Sequence(), sigma=1.0, generator=0, precision="auto")
    assert got.estimate == want.estimate and got.recheck_fraction is None
