"""Audit 83 of the generated tasks (src/senslab/data/synthetic.py): refusals that were missing or
raw, each checked against the behaviour before the fix."""

from __future__ import annotations

import pytest
import torch

from senslab.data import create_dataset
from senslab.data.synthetic import SparseFrequentConfig


def test_sparse_frequent_refuses_lam_above_one_that_rounds_to_all_frequent_tokens() -> None:
    # lam=1.05 with 9 frequent positions rounded to 9 of 9 and passed: lam=1's data, with
    # config["lam"] = 1.05 recorded
    with pytest.raises(ValueError, match=r"lam=1.05 .* must be ≤ 1; use lam=1"):
        create_dataset("sparse_frequent", "train", num_samples=4, lam=1.05, seed=0)
    with pytest.raises(ValueError, match="must be ≤ 1"):
        SparseFrequentConfig(lam=1.04)
    # lam = 1 itself is case 2's setting and still loads: every frequent token from F_y
    d = create_dataset("sparse_frequent", "train", case=2, setting=0, num_samples=8, seed=1)
    assert d.meta["config"]["lam"] == 1.0 and len(d) == 8


@pytest.mark.parametrize("subset", [5, torch.tensor(3)])
def test_sparse_parity_bare_index_subset_is_refused_with_the_fix(subset: object) -> None:
    # subset=5 failed in list() with a raw "'int' object is not iterable"
    with pytest.raises(ValueError, match=r"subset must be a list .*\(subset=\[i\] for the one bit"):
        create_dataset("sparse_parity", "train", n_bits=8, subset=subset, train_size=4)
    assert create_dataset("sparse_parity", "train", n_bits=8, subset=[5],
                          train_size=4).meta["subset"] == [5]


def test_modular_addition_non_number_train_fraction_is_refused_by_name() -> None:
    # "0.3" failed in the comparison with a raw TypeError
    with pytest.raises(ValueError, match="modular_addition: train_fraction must be a finite"):
        create_dataset("modular_addition", "train", p=7, train_fraction="0.3")
    with pytest.raises(ValueError, match=r"modular_addition: train_fraction must be in \(0, 1\)"):
        create_dataset("modular_addition", "train", p=7, train_fraction=-0.1)
    assert len(create_dataset("modular_addition", "train", p=7, train_fraction=0.5)) == 24


@pytest.mark.parametrize("options,needs", [
    ({"function": "random"}, "function='random'"),
    ({"sampling": "cube"}, "sampling='cube'"),
    ({"sampling": "subset", "train_size": 8}, "sampling='subset'"),
])
def test_boolean_cube_above_24_bits_names_the_option_and_the_way_out(
        options: dict[str, object], needs: str) -> None:
    # the refusal was boolean_cube's "the full cube needs 1 ≤ n_bits ≤ 24", naming neither
    with pytest.raises(ValueError, match=rf"boolean: {needs}.*use n_bits ≤ 24, or "
                                         r"sampling='fresh'"):
        create_dataset("boolean", "train", n_bits=25, **options)
    # fresh strings of a fixed function need no cube
    d = create_dataset("boolean", "train", n_bits=25, size=16, seed=2)
    assert d.inputs.shape == (16, 25)
    assert torch.equal(d.targets, ((d.inputs > 0).sum(1) % 2).float())
