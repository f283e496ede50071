"""A bf16 or fp16 default dtype — Lightning's ``precision="bf16-true"`` sets one around every
step — must not change a measurement: the noise and the random token choices were drawn in it
(other numbers than the same measurement anywhere else, from coarser draws), and
``allocation="linear"`` failed with a dtype clash."""

from __future__ import annotations

import pytest
import torch

from senslab.measure import CompareSensitivity, token_sensitivity
from senslab.tokens import Patches

OPTIONS = {"plain": {"repeats": 2}, "antithetic": {"repeats": 2, "antithetic": True},
           "num_tokens": {"repeats": 2, "num_tokens": 2},
           "allocation": {"allocation": "linear"}}


def model() -> torch.nn.Module:
    torch.manual_seed(0)  # test-only: the layer's initialisation
    return torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(3 * 8 * 8, 10))


@pytest.fixture
def default_dtype():
    previous = torch.get_default_dtype()
    yield
    torch.set_default_dtype(previous)


@pytest.mark.parametrize("low", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("name", list(OPTIONS))
@pytest.mark.filterwarnings("ignore:the standard error rests on")
def test_a_low_precision_default_dtype_leaves_the_measurement_as_it_is(name, low,
                                                                      default_dtype):
    m = model()
    x = torch.randn(16, 3, 8, 8, generator=torch.Generator().manual_seed(1))

    def measure():
        return token_sensitivity(m, x, Patches(4), sigma=0.5, generator=0, **OPTIONS[name])

    ref = measure()
    torch.set_default_dtype(low)
    got = measure()
    assert torch.get_default_dtype() == low  # put back after the measurement
    torch.set_default_dtype(torch.float32)
    assert 0 < ref.estimate < 1
    assert torch.equal(got.per_sample, ref.per_sample)
    assert (got.estimate, got.stderr) == (ref.estimate, ref.stderr)


@pytest.mark.filterwarnings("ignore:the standard error rests on")
def test_a_comparison_under_a_bf16_default_dtype_is_the_float32_one(default_dtype):
    x = torch.randn(16, 3, 8, 8, generator=torch.Generator().manual_seed(1))
    a, b = model(), model()
    with torch.no_grad():
        b[1].weight.mul_(0.5)

    def compare():
        metric = CompareSensitivity({"a": a, "b": b}, Patches(4), sigma=0.5, generator=0,
                                    repeats=2)
        metric.update(x)
        return metric.compute().differences["a", "b"]

    ref = compare()
    torch.set_default_dtype(torch.bfloat16)
    got = compare()
    torch.set_default_dtype(torch.float32)
    assert (got.estimate, got.stderr) == (ref.estimate, ref.stderr)
