"""Audit 84: sparse_frequent's case/setting checks, one y_pm dtype across the generated tasks,
and boolean_sensitivity's word on label-like real values."""

from __future__ import annotations

import warnings

import pytest
import torch

from senslab.data.synthetic import (
    SPARSE_FREQUENT_SETTINGS,
    input_size,
    maxmargin_attention,
    sparse_frequent,
    sparse_frequent_ids,
    sparse_parity,
)
from senslab.measure.boolean import boolean_sensitivity, truth_table


@pytest.mark.parametrize("options", [{"case": [1]}, {"case": True}, {"setting": [0]},
                                     {"setting": False}, {"case": 3}])
def test_sparse_frequent_refuses_a_case_or_setting_outside_the_table(options):
    """case=[1] failed with a raw "unhashable type: 'list'"; case=True was read as case 1 and
    recorded as True in meta, without a word."""
    with pytest.raises(ValueError, match=r"must be one of .* got .*case=1, setting=0"):
        sparse_frequent(num_samples=4, **options)
    # input_size says None for options the loader refuses (it said 40 for case=True)
    assert input_size("sparse_frequent", options) is None


def test_sparse_frequent_accepts_the_table_cases_as_ints():
    d = sparse_frequent(case=torch.tensor(2).item(), setting=1, num_samples=4, seed=3)
    assert (d.meta["case"], d.meta["setting"]) == (2, 1)
    assert type(d.meta["case"]) is int
    assert d.meta["config"]["seq_len"] == SPARSE_FREQUENT_SETTINGS[2, 1].seq_len
    assert input_size("sparse_frequent", {"case": 1, "setting": 2}) == 60


def test_y_pm_is_float32_in_every_loader():
    """sparse_frequent's y_pm was long, sparse_parity's and maxmargin_attention's float32:
    y_pm.mean() failed on the one task alone."""
    sets = [sparse_frequent(split, num_samples=50, seed=1) for split in ("train", "test", "ood")]
    sets += [sparse_parity(split, n_bits=6, train_size=20, test_size=20, seed=1)
             for split in ("train", "test")]
    sets += [maxmargin_attention(split, num_samples=20, seed=1) for split in ("train", "test")]
    for d in sets:
        y = d.meta["y_pm"]
        assert y.dtype == torch.float32, d.name
        assert set(y.unique().tolist()) <= {-1.0, 1.0}
        assert torch.equal(d.targets, (y > 0).long())
        assert -1.0 <= y.mean().item() <= 1.0
    _, _, y = sparse_frequent_ids(SPARSE_FREQUENT_SETTINGS[1, 0], 10,
                                  torch.Generator().manual_seed(0))
    assert y.dtype == torch.float32


def _mod3(x):  # the number of +1 bits mod 3, as float labels 0/1/2
    return ((x > 0).sum(1) % 3).float()


def test_float_labels_read_as_real_values_are_warned_of():
    """Float labels 0/1/2 were counted as a real function (as = 3.05) without a word; as
    integer labels their class changes are 6.0 (every flip moves the count mod 3)."""
    with pytest.warns(UserWarning, match=r"3 whole numbers from 0 to 2: class labels as "
                                         r"floats\?.*\.long\(\).*output='real'"):
        r = boolean_sensitivity(_mod3, 6)
    assert r.average == pytest.approx(3.046875)  # the number is unchanged
    assert boolean_sensitivity(lambda x: _mod3(x).long(), 6).average == pytest.approx(6.0)
    table = _mod3(torch.cartesian_prod(*[torch.tensor([1.0, -1.0])] * 6).flip(1))
    with pytest.warns(UserWarning, match="class labels as floats"):
        boolean_sensitivity(table)  # a truth table, read exactly
    with pytest.warns(UserWarning, match="class labels as floats"):
        boolean_sensitivity(_mod3, 12, method="sample", num_samples=200)
    with pytest.warns(UserWarning, match="returns the values as they are"):
        truth_table(_mod3, 6)


def test_two_values_other_than_0_1_and_pm1_are_warned_of():
    """PARITY as 1/2 labels counted a quarter of each change (as = 1.5 on 6 bits, not 6)."""
    def parity12(x):
        return ((x > 0).sum(1) % 2 + 1).float()

    with pytest.warns(UserWarning, match=r"two values, 1 and 2.*= 0\.25, not 1"):
        assert boolean_sensitivity(parity12, 6).average == pytest.approx(1.5)


def test_real_valued_functions_keep_their_number_without_the_labels_warning():
    def mean01(x):  # MEAN on the {0, 1} scale: fractions, not labels
        return (x > 0).float().mean(1)

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert boolean_sensitivity(mean01, 4).average == pytest.approx(0.0625)
        # a sum of ±1 bits is whole but negative somewhere: a real function, not labels
        assert boolean_sensitivity(lambda x: x.sum(1), 5).average == pytest.approx(5.0)
        # output='real' keeps the labels' number without the warning
        assert boolean_sensitivity(_mod3, 6, output="real").average == pytest.approx(3.046875)
