"""Audit 84 (sharpness): input/weight dtype clashes named, parameter_norm's memory, complex and
parametrized parameters, frozen parameters perturbed."""

from __future__ import annotations

import math
import warnings

import pytest
import torch
from torch import nn

from senslab.measure.sharpness import (
    layernorm_blowup,
    loss_sharpness,
    output_sharpness,
    parameter_norm,
)
from senslab.tokens.base import DtypeClash


def _mlp() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 8), nn.LayerNorm(8), nn.Linear(8, 3))


@pytest.mark.parametrize("model_dtype,input_dtype", [(torch.float64, torch.float32),
                                                     (torch.float32, torch.float64)])
def test_dtype_clash_named_by_every_measure(model_dtype, input_dtype):
    model = _mlp().to(model_dtype)
    x = torch.randn(6, 4, generator=torch.Generator().manual_seed(1), dtype=input_dtype)
    name = str(model_dtype).removeprefix("torch.")
    calls = [
        lambda: output_sharpness(model, x, generator=0),
        lambda: loss_sharpness(model, lambda o, y: o.square().mean(), x, None, generator=0,
                               exclude=()),
        lambda: layernorm_blowup(model, x),
    ]
    for call in calls:
        # before: torch's "mat1 and mat2 must have the same dtype" from inside the forward
        with pytest.raises(DtypeClash, match=rf"weights are {name}.*\.to\(torch\.{name}\)"):
            call()
    # nothing is left changed by the refused calls
    assert all(p.dtype == model_dtype for p in model.parameters())
    assert model.training


def test_model_that_casts_its_inputs_is_measured_as_it_is():
    class Casting(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lin = nn.Linear(4, 3)

        def forward(self, x):
            return self.lin(x.to(self.lin.weight.dtype))

    torch.manual_seed(0)
    model = Casting().double()
    x = torch.randn(6, 4, generator=torch.Generator().manual_seed(1))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # ShPred's few flips: not read here
        res = output_sharpness(model, x, generator=0)
        ref = output_sharpness(model, x.double(), generator=0)
    assert res.shop.estimate == pytest.approx(ref.shop.estimate, rel=1e-6)
    assert res.shop.estimate > 0


def test_parameter_norm_counts_complex_modulus():
    class Complex(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.w = nn.Parameter(torch.tensor([3 + 4j, 0j], dtype=torch.complex64))
            self.b = nn.Parameter(torch.tensor([12.0]))

    with warnings.catch_warnings():
        warnings.simplefilter("error")  # before: torch's "discards the imaginary part"
        value = parameter_norm(Complex(), exclude=())
    assert value == pytest.approx(13.0)  # before: sqrt(9 + 144) = 12.37


def test_parameter_norm_counts_shared_memory_once():
    class Shared(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.a = nn.Parameter(torch.full((2, 2), 1.0))
            self.b = nn.Parameter(self.a.data.t())  # a transposed tie: one memory
            self.c = nn.Parameter(self.a.data[0])  # a view of a's first row
            self.d = nn.Parameter(torch.full((3,), 2.0))

    assert parameter_norm(Shared(), exclude=()) == pytest.approx(math.sqrt(4 + 12))
    # before: sqrt(4 + 4 + 2 + 12) = 4.69


def test_parameter_norm_disjoint_views_of_a_flat_buffer_each_count():
    flat = torch.arange(1.0, 7.0)

    class Flat(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.a = nn.Parameter(flat[:2])
            self.b = nn.Parameter(flat[2:].view(2, 2))

    assert parameter_norm(Flat(), exclude=()) == pytest.approx(float(flat.norm()))


def test_parameter_norm_of_a_parametrized_weight_said_and_consistent():
    torch.manual_seed(0)
    layer = torch.nn.utils.parametrizations.weight_norm(nn.Linear(3, 3))
    own = math.sqrt(sum(float(p.detach().double().square().sum()) for p in layer.parameters()))
    with pytest.warns(UserWarning, match=r"parameter_norm counts the parametrization's own"):
        value = parameter_norm(layer, exclude=())
    assert value == pytest.approx(own)
    plain = math.sqrt(float(layer.weight.detach().double().square().sum())
                      + float(layer.bias.detach().double().square().sum()))
    assert abs(value - plain) > 0.1  # the number differs from the plain weights' norm
    torch.nn.utils.parametrize.remove_parametrizations(layer, "weight")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert parameter_norm(layer, exclude=()) == pytest.approx(plain)


def test_frozen_parameters_are_perturbed_and_counted():
    """The decision (docs/definitions.md#sharpness-and-norms): theta is every weight, frozen or
    not; excluding the frozen ones by name leaves them alone."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.Linear(8, 3))
    model[0].requires_grad_(False)
    x = torch.randn(16, 4, generator=torch.Generator().manual_seed(1))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # ShPred's few flips: not read here
        both = output_sharpness(model, x, generator=0).shop.estimate
        trainable = output_sharpness(model, x, generator=0, exclude=("0.",)).shop.estimate
    assert both > trainable > 0
    assert parameter_norm(model, exclude=()) == pytest.approx(
        math.sqrt(sum(float(p.detach().double().square().sum())
                  for p in model.parameters())))


def test_parameter_norm_of_meta_parameters_refused():
    with torch.device("meta"):
        model = nn.Linear(3, 3)
    # before: torch's "Cannot copy out of meta tensor; no data!"
    with pytest.raises(ValueError, match=r"'weight', 'bias' of Linear are on the 'meta' device"):
        parameter_norm(model, exclude=())
