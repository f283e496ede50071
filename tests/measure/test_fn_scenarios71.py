"""A researcher's scenarios with the Boolean-function and sharpness measures (session 71):
closed forms checked against independent formulas, and the inputs that returned a wrong number
without a word — a bool or unsigned input dtype, complex or column-less outputs, float class
labels read with the sign rule — now refused; sharpness intervals cut to the values the measure
can take."""

from __future__ import annotations

import math

import pytest
import torch
from scipy.stats import t as student_t
from torch import nn

from senslab.measure.boolean import (
    boolean_sensitivity,
    first,
    majority,
    parity,
    spectral_weights,
    truth_table,
)
from senslab.measure.sharpness import output_sharpness


# ----------------------------------------------------------------------------- closed forms
@pytest.mark.parametrize("n", [1, 2, 5, 9])
def test_closed_forms_exact(n: int) -> None:
    assert boolean_sensitivity(parity, n).average == n
    assert boolean_sensitivity(first, n).average == 1
    assert boolean_sensitivity(lambda x: torch.ones(len(x)), n).average == 0
    if n % 2:  # as(MAJORITY) = n·C(n−1, (n−1)/2)/2ⁿ⁻¹ for odd n
        expected = n * math.comb(n - 1, (n - 1) // 2) / 2 ** (n - 1)
        assert boolean_sensitivity(majority, n).average == pytest.approx(expected, abs=1e-12)
    weights = spectral_weights(truth_table(parity, n))
    assert weights[n] == pytest.approx(1.0) and float(weights[:n].abs().sum()) == 0.0


def test_large_n_is_sampled_and_exact_where_the_function_is_constant_per_point() -> None:
    r = boolean_sensitivity(parity, 40, num_samples=200)
    assert r.method == "sample" and r.average == 40 and r.ci95 == (40.0, 40.0)
    with pytest.raises(ValueError, match="too large for exact enumeration"):
        boolean_sensitivity(parity, 40, method="exact")


# ----------------------------------------------------------------------------- input dtype
@pytest.mark.parametrize("dtype", [torch.bool, torch.uint8, torch.complex64])
def test_input_dtype_that_cannot_hold_minus_one_is_refused(dtype: torch.dtype) -> None:
    # bool made every string all-True (FIRST read as(f) = 0); uint8 wrapped −1 to 255 (16129)
    with pytest.raises(ValueError, match="cannot hold the ±1 strings"):
        boolean_sensitivity(lambda x: x[:, 0].float(), 5, dtype=dtype)
    with pytest.raises(ValueError, match="cannot hold the ±1 strings"):
        truth_table(lambda x: x[:, 0].float(), 3, dtype=dtype)


def test_signed_integer_input_dtype_measures_the_same_function() -> None:
    assert boolean_sensitivity(lambda x: x[:, 0] * x[:, 1], 5, dtype=torch.long).average == 2


# ----------------------------------------------------------------------------- outputs
def test_complex_outputs_are_refused() -> None:
    # cut to integer labels, 0.3·x₀ read as the constant 0: as(f) = 0 for a dictator
    with pytest.raises(ValueError, match="complex outputs"):
        boolean_sensitivity(lambda x: (0.3 * x[:, 0]).to(torch.complex64), 5)


def test_outputs_without_a_column_are_refused_clearly() -> None:
    with pytest.raises(ValueError, match="no output column"):
        boolean_sensitivity(lambda x: x[:, :0], 5)


def _two_bit_labels(x: torch.Tensor) -> torch.Tensor:
    """Float labels 0, 1, 2: the number of the first two bits that are +1."""
    return (x[:, 0] > 0).float() + (x[:, 1] > 0).float()


@pytest.mark.parametrize("method", ["exact", "sample"])
def test_float_class_labels_with_the_sign_rule_are_refused(method: str) -> None:
    # as long labels every flip of bit 0 or 1 changes the class: as(f) = 2; read as value > 0
    # labels 1 and 2 were one class (1.0), and labels 1/2 never changed (0.0)
    assert boolean_sensitivity(lambda x: _two_bit_labels(x).long(), 5).average == 2
    with pytest.raises(ValueError, match="class labels as floats"):
        boolean_sensitivity(_two_bit_labels, 5, output="sign", method=method,
                            num_samples=200)
    with pytest.raises(ValueError, match="class labels as floats"):
        boolean_sensitivity(lambda x: (x[:, 0] > 0).float() + 1, 5, output="sign",
                            method=method, num_samples=200)
    with pytest.raises(ValueError, match="class labels as floats"):
        truth_table(lambda x: (x[:, 0] > 0).float() + 1, 3, output="sign")
    # a boundary given says how to read them: class 1 iff value > 1.5
    r = boolean_sensitivity(lambda x: (x[:, 0] > 0).float() + 1, 5, output="sign",
                            threshold=1.5)
    assert r.average == 1


def test_float_label_table_with_the_sign_rule_is_refused() -> None:
    table = _two_bit_labels(torch.tensor([[1.0, 1.0], [-1.0, 1.0], [1.0, -1.0], [-1.0, -1.0]]))
    with pytest.raises(ValueError, match="class labels as floats"):
        boolean_sensitivity(table, output="sign")
    assert boolean_sensitivity(table.long()).average == 2  # labels 2, 1, 1, 0: every flip changes


# ----------------------------------------------------------------------------- sharpness
def test_sharpness_intervals_stay_within_the_values_the_measures_take() -> None:
    model = nn.Linear(3, 2)
    with torch.no_grad():
        model.weight.zero_()
        model.bias.copy_(torch.tensor([0.0, 1e-3]))  # any weight noise may flip a prediction
    x = torch.randn(16, 3, generator=torch.Generator().manual_seed(0))
    res = output_sharpness(model, x, sigma_w=0.1, repeats=3, generator=1)
    q = float(student_t.ppf(0.975, 2))
    pred, shop = res.shpred, res.shop
    assert pred is not None
    # the uncut t intervals reached below 0 and above 1: [−0.5, 1.3] for a share of flips
    assert pred.estimate - q * pred.stderr < 0 and pred.estimate + q * pred.stderr > 1
    assert shop.estimate - q * shop.stderr < 0
    assert pred.ci95 == (0.0, 1.0)
    assert shop.ci95[0] == 0.0 and shop.ci95[1] == pytest.approx(shop.estimate + q * shop.stderr)
    again = output_sharpness(model, x, sigma_w=0.1, repeats=3, generator=1)
    assert again.shpred is not None and again.shpred.per_draw.equal(pred.per_draw)
