"""Checked precisions (audit 85): float64 outputs of a float32 model keep float64's decisions."""

import pytest
import torch
from torch import nn

from senslab import Sequence, TokenSensitivity
from senslab.measure import _int8


class _Recorder(TokenSensitivity):
    """Keeps every copy's flip, in plan order."""

    def _add(self, vals, *rest) -> None:  # type: ignore[override]
        self.copies = torch.cat([getattr(self, "copies", torch.zeros(0)), vals.cpu()])
        super()._add(vals, *rest)


def _run(model, x, precision, **options) -> _Recorder:
    m = _Recorder(model, Sequence(), sigma=0.5, repeats=4, generator=5, precision=precision,
                  **options)
    m.update(x)
    return m


class _LogLikelihoods(nn.Module):
    """float32 features, float64 class log-likelihoods near -1e5 that differ by about 1e-3:
    float32 (spacing 0.0078 there) cannot tell the classes apart, float64 can."""

    def __init__(self) -> None:
        super().__init__()
        g = torch.Generator().manual_seed(0)
        self.body = nn.Linear(64, 64)  # wide enough for int8 to run it
        self.head = nn.Linear(64, 2).double()
        with torch.no_grad():
            self.body.weight.copy_(torch.randn(64, 64, generator=g) / 8)
            self.body.bias.zero_()
            self.head.weight.copy_(torch.randn(2, 64, generator=g, dtype=torch.float64) * 1e-3)
            self.head.bias.fill_(-1e5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.body(x).double().mean(1))


@pytest.mark.parametrize("precision", ["bf16-checked", "int8-checked", "auto"])
def test_float64_outputs_of_a_float32_model_keep_float64_decisions(precision):
    """Before: the checked path rounded every output, the float32 re-checks included, to
    float32, where the two log-likelihoods tie: on 8 features 220 of 384 copies read as class
    0 against float32's 6 flips (sensitivity 0.56 for 0.016), bf16's "unchanged" margins
    sending the copies to a float32 path that still rounded them; int8 took 224 of 768 wrong."""
    if precision == "int8-checked" and not _int8.available():
        pytest.skip("this torch lacks the x86 quantised kernels")
    model = _LogLikelihoods().eval()
    x = torch.randn(16, 6, 64, generator=torch.Generator().manual_seed(1))
    full = _run(model, x, "float32")
    checked = _run(model, x, precision)
    assert int((checked.copies != full.copies).sum()) == 0
    a, b = checked.compute(), full.compute()
    assert a.estimate == b.estimate and 0 < b.estimate < 1
    assert torch.equal(a.per_sample, b.per_sample)
