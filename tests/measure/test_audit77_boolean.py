"""Audit 77 of senslab.measure.boolean / fourier: findings reproduced as tests."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch

from senslab.measure.boolean import boolean_sensitivity, majority, truth_table


def _zero_one_majority_with_one_real_entry(n: int) -> torch.Tensor:
    """MAJORITY's float 0/1 table with one entry of 0.5: a real-valued table, which
    ``output="auto"`` reads with the "real" rule when it sees every entry."""
    table = truth_table(majority, n, output="real")
    table[0] = 0.5
    return table


def test_a_sampled_truth_table_is_read_by_the_rule_of_all_its_entries():
    """A table is known in full: method="sample" must count it by the rule method="exact"
    resolves from all its entries. Read from the 750 sampled entries of 16,384, the one
    0.5 was missed and the table counted by class (about 4 times the exact "real" count), with a
    warning about 'a value the sample missed' that the table itself settles."""
    table = _zero_one_majority_with_one_real_entry(14)
    exact = boolean_sensitivity(table, method="exact")
    assert exact.output == "real"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # few-events advice: not the point
        sampled = boolean_sensitivity(table, method="sample", num_samples=50, generator=1)
    assert sampled.output == "real"
    assert abs(sampled.average - exact.average) < 5 * sampled.stderr + 1e-9


def test_a_sampled_zero_one_table_is_not_warned_of_values_the_sample_missed():
    """A float 0/1 table is two-valued in every entry: sampled, it is counted by class as
    exactly, without the warning meant for callables whose other values are unknown."""
    table = truth_table(majority, 12, output="real")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        sampled = boolean_sensitivity(table, method="sample", num_samples=400, generator=0)
    assert sampled.output == "sign"
    exact = boolean_sensitivity(table).average
    assert abs(sampled.average - exact) < 5 * sampled.stderr


def test_a_sampled_table_of_probabilities_is_refused_under_sign_as_exactly():
    """The [0, 1] ambiguity is judged on the whole table, not on the sampled entries."""
    table = _zero_one_majority_with_one_real_entry(14)
    with pytest.raises(ValueError, match="probabilities or logits"):
        boolean_sensitivity(table, method="exact", output="sign")
    with pytest.raises(ValueError, match="probabilities or logits"):
        boolean_sensitivity(table, method="sample", output="sign", num_samples=50,
                            generator=1)


def test_numpy_integer_sizes_are_taken_as_the_integers_they_are():
    """A NumPy int64 chunk_size was refused as "too small" (4096 ≥ 21 rows), a NumPy
    num_samples as "not an integer ≥ 2" (500); both are integers and give the numbers of
    the same Python ints."""
    plain = boolean_sensitivity(majority, 9, method="sample", num_samples=300, chunk_size=50,
                                generator=1)
    numpy = boolean_sensitivity(majority, 9, method="sample", num_samples=np.int64(300),
                                chunk_size=np.int64(50), generator=1)
    assert numpy.average == plain.average and numpy.num_points == 300
    table = truth_table(majority, 9)
    exact = boolean_sensitivity(majority, 9, method="exact").average
    assert boolean_sensitivity(majority, 9, method="exact",
                               chunk_size=np.int64(64)).average == exact
    assert boolean_sensitivity(table, chunk_size=np.int64(64)).average == exact
    assert torch.equal(truth_table(majority, 9, chunk_size=np.int64(7)), table)
    # and the number of bits: a NumPy n was refused as "not a positive integer"
    assert boolean_sensitivity(majority, np.int64(9), method="exact").average == exact
    assert torch.equal(truth_table(majority, np.int64(9)), table)


def test_a_chunk_size_that_is_no_integer_is_named_as_such():
    with pytest.raises(ValueError, match=r"chunk_size must be an integer.*4096\.0 \(float\)"):
        boolean_sensitivity(majority, 20, method="sample", chunk_size=4096.0)
    with pytest.raises(ValueError, match="too small"):
        boolean_sensitivity(majority, 20, method="sample", chunk_size=np.int64(4))


class _Scores(torch.nn.Module):
    """A column regressed onto {0, 1} (paper 2's rule: class 1 iff score > 1/2)."""

    output_kind = "scores"

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return majority(x)  # 0/1 scores


def test_a_declared_scores_model_is_refused_with_a_fix_this_function_takes():
    """The refusal advised "pass output_kind='scores', threshold=t to the measurement":
    boolean_sensitivity has no output_kind= (a TypeError). It now names output='sign' with
    threshold=t on a wrapper, and that advice measures the model's class changes."""
    model = _Scores().eval()
    with pytest.raises(ValueError, match=r"output='sign', threshold=t") as caught:
        boolean_sensitivity(model, 5, threshold=0.5)
    assert "output_kind='scores', threshold=t to the measurement" not in str(caught.value)
    with pytest.raises(ValueError, match=r"take no output_kind="):
        truth_table(model, 5)
    advised = boolean_sensitivity(lambda x: model(x), 5, output="sign", threshold=0.5)
    assert advised.average == pytest.approx(1.875)


def test_a_wrapper_of_a_scores_model_under_auto_warns_instead_of_refusing():
    """Behind a wrapper the kind only names the real-column warning: the wrapper's own read
    of a column is not refused by the model's attribute."""
    model = _Scores().eval()

    def scores_half(x: torch.Tensor) -> torch.Tensor:
        return 0.5 * model(x) + 0.25  # 0.25 / 0.75: a real column under 'auto'

    with pytest.warns(UserWarning, match="declares output_kind='scores'"):
        r = boolean_sensitivity(scores_half, 5)
    assert r.output == "real"
