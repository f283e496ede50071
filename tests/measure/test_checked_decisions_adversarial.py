"""Adversarial cases for checked precision (senslab.measure._precision): a checked run's
decisions must be a float32 run's, copy by copy, with the same seed and the same draws."""

from __future__ import annotations

import warnings

import torch
from checked_flips import Recorder
from torch import nn

from senslab.tokens import Sequence


class Branchy(nn.Module):
    """Short sequences (4 tokens): an elementwise score, no matrix product, so nothing runs in
    bf16. Longer ones: two linear layers, the first cancelling a constant 64 added to its
    inputs (weight rows summing to 0), so bf16's rounding of the shifted inputs changes the
    outputs far more than the outputs' size suggests."""

    output_kind = "logits"

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)  # test-only: the parameters initialise from the global RNG
        self.w = nn.Parameter(torch.randn(3, 64))
        self.l1, self.head = nn.Linear(64, 64), nn.Linear(64, 3)
        with torch.no_grad():
            self.l1.weight -= self.l1.weight.mean(1, keepdim=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x.mean(1)
        if x.shape[1] <= 4:
            return (h[:, None, :] * self.w).sum(-1)
        return self.head(torch.relu(self.l1(h + 64.0)))


def test_a_later_branch_with_products_after_a_calibration_without_any_is_rechecked():
    """The calibration (a first batch of short sequences) runs no product in bf16: its bound is
    0, exactly. A later batch of long sequences runs products the calibration never saw, whose
    band is widened by inf — every copy re-checked, as documented — but 0 × inf is NaN, which
    no margin is <=: before, each such copy outside a spot check took bf16's class (28 of
    1,280 copies here, 0.033 against float32's 0.015, 6 of 48 examples' rates off; 155 of
    3,072 in the audit's larger run), while the spot-check warning named a band of "nan" and
    said the decisions stayed float32's."""
    g = torch.Generator().manual_seed(0)
    first = torch.randn(16, 4, 64, generator=g)  # 16 × 4 × 4 = 256 copies: the calibration
    later = torch.randn(32, 8, 64, generator=g)
    model = Branchy().eval()
    runs = {}
    for precision in ("float32", "bf16-checked"):
        m = Recorder(model, Sequence(), sigma=0.3, repeats=4, generator=5, precision=precision)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            m.update(first)
            m.update(later)
        runs[precision] = m
    full, checked = runs["float32"], runs["bf16-checked"]
    assert checked.checked_precision == "bf16" and checked.check_bound == 0.0
    assert torch.equal(checked.copies, full.copies)
    a, b = checked.compute(), full.compute()
    assert a.estimate == b.estimate and torch.equal(a.per_sample, b.per_sample)
    assert 0 < b.estimate < 1
    # the later batch's copies all re-checked (its products were never calibrated), the
    # calibration's too
    later_copies = 32 * 8 * 4
    assert a.num_forward_fp32 >= later_copies + 256
