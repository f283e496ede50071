"""Integer outputs measured by a distance (compare='l1'/'l2') are said once per metric: class
labels' changes were counted by their numbering without a word."""

from __future__ import annotations

import warnings

import pytest
import torch
from torch import nn

from senslab.measure import TokenSensitivity, token_sensitivity
from senslab.tokens import Sequence

pytestmark = pytest.mark.filterwarnings("ignore:the standard error rests:RuntimeWarning")


class Labels(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.lin = nn.Linear(4, 5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.lin(x.mean(1)).argmax(-1)


X = torch.randn(6, 3, 4, generator=torch.Generator().manual_seed(1))


def test_integer_outputs_under_a_distance_are_said_once() -> None:
    metric = TokenSensitivity(Labels(), Sequence(), sigma=1.0, repeats=2, compare="l1",
                              generator=0)
    with pytest.warns(UserWarning, match=r"returns integers \(int64\).*compare='class'"):
        metric.update(X)
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message=".*returns integers")
        metric.update(X)  # once per metric


def test_class_comparison_and_float_outputs_are_not_said() -> None:
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message=".*returns integers")
        token_sensitivity(Labels(), X, Sequence(), sigma=1.0, repeats=2, generator=0)
        lin = nn.Sequential(nn.Flatten(), nn.Linear(12, 3))
        token_sensitivity(lin, X, Sequence(), sigma=1.0, repeats=2, compare="l2", generator=0)
