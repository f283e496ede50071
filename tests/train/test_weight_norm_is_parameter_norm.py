"""The training tracker's ``weight_norm`` is ``parameter_norm`` with nothing excluded: the same
number for complex parameters and memory shared by two parameters (each counted once)."""

from __future__ import annotations

import math

import torch
from torch import nn

from senslab.measure.sharpness import parameter_norm
from senslab.train.loops import grokking
from senslab.train.steps import weight_norm


class _Shared(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Parameter(torch.ones(2, 2))
        self.b = nn.Parameter(self.a.data.t())  # a second object on a's memory
        self.pos_embed = nn.Parameter(torch.full((3,), 2.0))  # excluded by parameter_norm's default
        self.z = nn.Parameter(torch.tensor([3 + 4j]))


def test_weight_norm_counts_shared_memory_once_and_complex_as_modulus() -> None:
    m = _Shared()
    # a: 4 ones; the positional 3 twos (12); z: |3+4i|² = 25; b is a's memory again
    assert weight_norm(m) == math.sqrt(4 + 12 + 25)
    assert weight_norm(m) == parameter_norm(m, exclude=())
    assert parameter_norm(m) == math.sqrt(4 + 25)  # the default leaves positional ones out


def test_grokking_logs_the_same_norm() -> None:
    assert grokking.weight_norm is weight_norm
    torch.manual_seed(0)
    lin = nn.Linear(4, 3)
    expect = math.sqrt(sum(float(p.double().square().sum()) for p in lin.parameters()))
    assert weight_norm(lin) == expect
