"""Audit 83 (Boolean sensitivity): bad inputs that failed with a bare or misleading error."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch

from senslab.measure.boolean import all_inputs, boolean_sensitivity, parity, truth_table


def test_a_numpy_truth_table_is_named_as_a_table_with_the_fix():
    table = truth_table(parity, 3).numpy()
    # was "n (the number of input bits) is required unless f is a truth table"
    with pytest.raises(TypeError, match=r"truth table must be a tensor.*torch\.as_tensor"):
        boolean_sensitivity(table)
    with pytest.raises(TypeError, match=r"truth table must be a tensor.*shape \(8,\)"):
        boolean_sensitivity(table, 3)
    assert boolean_sensitivity(torch.as_tensor(table)).average == 3.0


@pytest.mark.parametrize("num_samples", [None, "100", 2.5])
def test_a_num_samples_that_is_no_integer_is_named_under_auto(num_samples):
    # was a bare TypeError from comparing 2ⁿ with (n+1)·num_samples
    with pytest.raises(ValueError, match="num_samples must be an integer"):
        boolean_sensitivity(parity, 5, num_samples=num_samples)


def test_exact_ignores_num_samples_and_numpy_sizes_still_work():
    assert boolean_sensitivity(parity, 5, method="exact", num_samples=None).average == 5.0
    r = boolean_sensitivity(parity, 12, num_samples=np.int64(50), generator=0)
    assert r.method == "sample" and r.average == 12.0


def _one_hot(x: torch.Tensor) -> torch.Tensor:
    s = x.sum(1)
    return torch.stack([s < 0, s > 0], 1)  # odd n: exactly one True per row


def test_one_hot_bool_outputs_are_read_as_classes():
    # was "argmax(): does not support bool input"; MAJORITY on 5 bits: as = 1.875
    assert boolean_sensitivity(_one_hot, 5).average == 1.875
    r = boolean_sensitivity(_one_hot, 5, method="sample", num_samples=300, generator=1)
    ref = boolean_sensitivity(lambda x: _one_hot(x).long(), 5, method="sample",
                              num_samples=300, generator=1)
    assert r.average == ref.average
    table = truth_table(_one_hot, 3)
    assert torch.equal(table, (all_inputs(3).sum(1) > 0).double() * 2 - 1)


def test_bool_outputs_that_are_not_one_hot_are_refused():
    def multi(x):
        return torch.stack([x[:, 0] > 0, x[:, 1] > 0], 1)  # two labels, rows of 0, 1 or 2
    with pytest.raises(ValueError, match=r"not one\s+class per string \(one-hot\)"):
        boolean_sensitivity(multi, 4)


def test_one_output_per_bit_is_warned_of_as_positions():
    """A sequence model's per-position outputs, its [:, -1] forgotten, were read as n class
    scores without a word."""
    def per_position(x):  # one logit per position; the prediction is the last one's sign
        return torch.cumsum(x, dim=1)

    with pytest.warns(UserWarning, match=r"one column per bit, read as 5 class scores"):
        boolean_sensitivity(per_position, n=5)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        boolean_sensitivity(lambda x: torch.cumsum(x, dim=1)[:, -1], n=5)
