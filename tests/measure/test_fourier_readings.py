"""How the Fourier functions, boolean_sensitivity and truth_table read tables whose reading
is not given by their values alone: a float table of zeros, NaN entries, uint8 labels, and
float values within rounding of a Boolean function."""

import warnings

import pytest
import torch
from torch import nn

from senslab.measure.boolean import boolean_sensitivity, truth_table
from senslab.measure.fourier import (
    average_sensitivity_fourier,
    degree,
    fourier_coefficients,
    influence_fourier,
    noise_stability,
    spectral_weights,
)
from senslab.measure.functions import majority, parity


def test_a_float_table_of_zeros_is_refused_as_ambiguous():
    """torch.zeros(8) read as the constant False gave f̂(∅) = −1 and noise stability 1; the
    zero function has 0 for both. output='auto' cannot tell, so it asks."""
    zeros = torch.zeros(8)
    for quantity in (fourier_coefficients, spectral_weights,
                     lambda t, **kw: noise_stability(t, 0.5, **kw)):
        with pytest.raises(ValueError, match="only 0.*output='real'.*output='sign'"):
            quantity(zeros)
    with pytest.raises(ValueError, match="only 0"):
        fourier_coefficients(zeros.double().unsqueeze(1))  # a (2ⁿ, 1) column too
    assert torch.equal(fourier_coefficients(zeros, output="real"), torch.zeros(8).double())
    assert fourier_coefficients(zeros, output="sign")[0] == -1.0
    assert noise_stability(zeros, 0.5, output="real") == 0.0
    assert noise_stability(zeros, 0.5, output="sign") == 1.0
    # both readings give the same degree, influences and as(f): these answer
    assert degree(zeros) == 0
    assert torch.equal(influence_fourier(zeros), torch.zeros(3).double())
    assert average_sensitivity_fourier(zeros) == 0.0
    # bool and integer tables are Boolean by their dtype: unchanged
    assert fourier_coefficients(torch.zeros(8, dtype=torch.bool))[0] == -1.0
    assert fourier_coefficients(torch.zeros(8, dtype=torch.long))[0] == -1.0


def test_non_finite_entries_are_refused():
    """One NaN made every coefficient NaN, and degree() compared them False with its cut:
    degree 0 without a word."""
    table = truth_table(parity, 3).clone()
    table[5] = float("nan")
    with pytest.raises(ValueError, match="NaN or infinite.*evaluate f again"):
        degree(table)
    with pytest.raises(ValueError, match="NaN or infinite"):
        degree(table, output="real")
    table[5] = float("inf")
    with pytest.raises(ValueError, match="NaN or infinite"):
        noise_stability(table, 0.5)
    coefficients = fourier_coefficients(truth_table(parity, 3))
    coefficients[2] = float("nan")
    with pytest.raises(ValueError, match="coefficients hold.*fourier_coefficients"):
        degree(coefficients, coefficients=True)


def test_uint8_labels_are_compared_as_numbers():
    """−1 as uint8 wraps to 255, so labels {1, 255} were read as ±1: the constant +1."""
    with pytest.raises(ValueError, match="multi-class labels"):
        fourier_coefficients(torch.tensor([1, 255] * 4, dtype=torch.uint8))
    zero_one = (truth_table(majority, 5) > 0).to(torch.uint8)
    assert torch.equal(fourier_coefficients(zero_one),
                       fourier_coefficients(truth_table(majority, 5)))


def _saturated_majority() -> torch.Tensor:
    """MAJORITY on 5 bits through a saturated sigmoid, as float32 gives it (1.0 and 2e-9)."""
    return torch.sigmoid(20 * truth_table(majority, 5)).float()


def test_a_table_within_rounding_of_zero_one_warns_and_keeps_its_number():
    """Read as numbers, MAJORITY's sigmoid table gives as = 0.469, a quarter of the 1.875 its
    exact 0/1 table gives: output='auto' says so, and the number stays the 'real' one."""
    table = _saturated_majority()
    with pytest.warns(UserWarning, match="within 0.01 of 0 or 1.*table > 0.5.*output='real'") \
            as caught:
        value = average_sensitivity_fourier(table)
    assert caught[0].filename == __file__  # points at the caller
    assert value == pytest.approx(0.46875, abs=1e-6)
    assert average_sensitivity_fourier(table > 0.5) == pytest.approx(1.875)
    with pytest.warns(UserWarning, match="within 0.01 of -1 or 1"):
        degree(torch.tanh(4 * truth_table(majority, 5)).float())
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert average_sensitivity_fourier(table, output="real") == value
        average_sensitivity_fourier(truth_table(majority, 5))  # exact ±1
        average_sensitivity_fourier((truth_table(majority, 5) > 0).float())  # exact 0/1
        degree(1e-10 * truth_table(parity, 6))  # a small real function, near 0 only
        degree(0.1 + 0.8 * (truth_table(majority, 5) > 0).double())  # 0.1 / 0.9: real


def test_boolean_sensitivity_warns_on_values_within_rounding_of_zero_one():
    """The same table counted by boolean_sensitivity: 'real' (0.469) with a warning that names
    output='sign' with threshold=0.5 (1.875); a model already gets the real-column warning."""
    table = _saturated_majority()
    with pytest.warns(UserWarning, match="within 0.01 of 0 or 1.*threshold=0.5") as caught:
        r = boolean_sensitivity(table)
    assert caught[0].filename == __file__
    assert r.output == "real" and r.average == pytest.approx(0.46875, abs=1e-6)
    assert boolean_sensitivity(table, output="sign", threshold=0.5).average == \
        pytest.approx(1.875)

    def sigmoid_majority(x: torch.Tensor) -> torch.Tensor:
        return torch.sigmoid(20 * (2 * majority(x) - 1))

    with pytest.warns(UserWarning, match="within 0.01 of 0 or 1"):
        boolean_sensitivity(sigmoid_majority, 12, method="sample", num_samples=50)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        boolean_sensitivity(table, output="real")

    class Head(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return torch.sigmoid(20 * (2 * majority(x) - 1))

    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        boolean_sensitivity(Head().eval(), 5)
    messages = [str(w.message) for w in seen]
    assert len(messages) == 1 and "not as a classifier's logit" in messages[0]


def test_truth_table_of_an_f_that_returns_only_zeros_asks_how_to_read_it():
    """output='auto' returned the −1 table (constant False) for an f returning 0.0 everywhere,
    a zero function as much as a logit head at 0."""

    def zero(x: torch.Tensor) -> torch.Tensor:
        return torch.zeros(x.shape[0])

    with pytest.raises(ValueError, match="0 for every string.*output='real'.*output='sign'"):
        truth_table(zero, 3)
    assert torch.equal(truth_table(zero, 3, output="real"), torch.zeros(8).double())
    assert torch.equal(truth_table(zero, 3, output="sign"), -torch.ones(8).double())
    assert torch.equal(truth_table(zero, 3, threshold=-1.0), torch.ones(8).double())
    with pytest.warns(UserWarning, match="returns the values as they are.*threshold=0.5"):
        truth_table(lambda x: torch.sigmoid(20 * (2 * majority(x) - 1)), 5)


def test_truth_table_reads_its_own_bf16_table_as_real():
    """truth_table's bf16 check computes degree() of the real table it returns: read with
    output='auto', a saturated sigmoid's table warned about a reading the caller had fixed
    with output='real' (and a table of zeros would be ambiguous)."""

    def sigmoid_majority(x: torch.Tensor) -> torch.Tensor:
        return torch.sigmoid(20 * (2 * majority(x) - 1)).bfloat16()

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        table = truth_table(sigmoid_majority, 5, output="real")
        zeros = truth_table(lambda x: torch.zeros(x.shape[0], dtype=torch.bfloat16), 4,
                            output="real")
    assert table.min() > 0 and table.max() == 1.0
    assert torch.equal(zeros, torch.zeros(16).double())
