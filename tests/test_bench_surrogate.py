"""benchmarks/surrogate_flips.py: the control variate's bound — a surrogate that always agrees
gains the inverse of its cost, one that disagrees often loses — and ``int8-ffn`` runs only the
feed-forward layers in int8."""

from __future__ import annotations

import sys

import benchscripts
import pytest
import torch
from torch import nn


@pytest.fixture(scope="module")
def surrogate():
    sys.path.insert(0, str(benchscripts.BENCHMARKS))
    try:
        yield benchscripts.load("surrogate_flips.py", "senslab_surrogate_flips")
    finally:
        sys.path.remove(str(benchscripts.BENCHMARKS))


def test_the_bound(surrogate):
    # the surrogate's flips are float32's: only its own draws remain, each costing c
    assert surrogate.best_gain(0.05, 0.05, 0.0, 0.25) == pytest.approx(4.0)
    # free, but disagreeing: the pairs alone carry the variance
    assert surrogate.best_gain(0.05, 0.05, 0.01, 0.0) == pytest.approx(5.0)
    # disagreeing as often as float32 flips, at two thirds the cost: a loss
    assert surrogate.best_gain(0.05, 0.08, 0.09, 0.68) < 0.5
    assert surrogate.best_gain(0.0, 0.0, 0.0, 0.5) != surrogate.best_gain(0.0, 0.0, 0.0, 0.5)


def test_int8_ffn_quantises_the_feed_forward_layers_only(surrogate):
    if not surrogate._int8.available():
        pytest.skip("no x86 int8 kernels in this torch")
    torch.manual_seed(0)  # test-only: nn.Linear initialises from the global RNG
    block = nn.Sequential(nn.Linear(64, 64), nn.Linear(64, 256), nn.GELU(), nn.Linear(256, 64))
    x = torch.randn(8, 64, generator=torch.Generator().manual_seed(1))
    with torch.inference_mode():
        exact = block(x)
        with surrogate.surrogate("int8-ffn", block) as mode:
            some = block(x)
        with surrogate.surrogate("int8", block) as full:
            every = block(x)
    assert mode.calls == 2 and full.calls == 3
    assert not torch.equal(some, exact) and not torch.equal(some, every)
    with pytest.raises(ValueError, match="unknown surrogate"):
        surrogate.surrogate("int4", block)
