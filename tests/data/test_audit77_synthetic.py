"""Audit 77 (synthetic): generated tasks and the data home, wrong data without a word."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from senslab.data._roots import DECLARED, DataFiles, data_home, locate
from senslab.data.synthetic import boolean, maxmargin_attention, sparse_parity


def test_sparse_parity_subset_of_non_whole_indices_is_refused() -> None:
    """subset=[0.5, 1.7, 3] was cut to S = [0, 1, 3] by the long conversion: the labels were
    the parity of other bits than the ones asked for, without a word."""
    with pytest.raises(ValueError, match="subset"):
        sparse_parity("train", subset=[0.5, 1.7, 3], seed=0)
    with pytest.raises(ValueError, match="subset"):
        sparse_parity("train", subset=[True, False], seed=0)  # read as bits 1 and 0
    with pytest.raises(ValueError, match="subset"):
        sparse_parity("train", subset="13", seed=0)  # not bits 1 and 3
    # whole numbers in any integer-valued form still work
    d = sparse_parity("train", subset=torch.tensor([3, 1]), train_size=8, seed=0)
    assert d.meta["subset"] == [1, 3]
    assert torch.equal(d.targets, (d.inputs[:, [1, 3]].prod(1) > 0).long())
    assert sparse_parity("train", subset=[1.0, 4.0], train_size=8, seed=0).meta["subset"] == [1, 4]


@pytest.mark.parametrize("sampling", ["fresh", "cube"])
def test_boolean_n_bits_must_be_a_positive_int(sampling: str) -> None:
    """n_bits=0 with "fresh" gave 1,024 rows of no bits, with constant 0 targets (PARITY) or
    NaN targets (MEAN); n_bits=True was read as 1 bit."""
    for bad in (0, True, -2):
        with pytest.raises(ValueError, match="n_bits"):
            boolean("train", function="mean", n_bits=bad, sampling=sampling, seed=0)
    with pytest.raises(ValueError, match="n_bits"):
        sparse_parity("train", n_bits=True, subset=[0], seed=0)
    d = boolean("train", function="mean", n_bits=3, sampling=sampling, seed=0)
    assert d.inputs.shape[1] == 3 and not d.targets.isnan().any()


def test_counts_are_checked_as_counts() -> None:
    """boolean's train_size=True trained on 1 point of the cube; 128.0 died in a slice with
    "slice indices must be integers"; maxmargin_attention's num_samples=0 gave an empty split."""
    with pytest.raises(ValueError, match="train_size"):
        boolean("train", sampling="subset", train_size=True, seed=0)
    with pytest.raises(ValueError, match="train_size"):
        boolean("train", sampling="subset", train_size=128.5, seed=0)
    with pytest.raises(ValueError, match="num_samples"):
        maxmargin_attention("train", num_samples=0, seed=0)
    assert len(boolean("train", sampling="subset", train_size=128, seed=0)) == 128
    assert len(maxmargin_attention("train", num_samples=3, seed=0)) == 3


def test_blank_senslab_data_is_not_a_folder_in_the_working_directory(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """SENSLAB_DATA="  " (a blank value, like the empty one that means "not set") was read as a
    folder named "  " in the working directory: downloads went to ./  /<name>."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setenv("SENSLAB_DATA", "  ")
    default = tmp_path / "home" / ".cache" / "senslab" / "data"
    assert data_home() == default
    monkeypatch.setitem(DECLARED, "audit77_blank_home",
                        DataFiles("audit77_blank_home", (("a.txt",),), downloadable=True))
    found = locate("audit77_blank_home", download=True)
    assert found is not None and found.path == default / "audit77_blank_home"
