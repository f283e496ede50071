"""One rule for whole numbers across the loaders (:func:`senslab.data.base.whole_number`): NumPy's
bool is a bool, not bit or digit 1; whatever ``int()`` reads exactly passes."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from senslab.data import create_dataset
from senslab.data.base import whole_number
from senslab.data.synthetic import sparse_parity


@pytest.mark.parametrize("value", [True, np.True_, np.False_, 1.7, "1.5", "x", None, [1]])
def test_what_is_not_a_whole_number(value: object) -> None:
    assert whole_number(value) is None


@pytest.mark.parametrize("value, expected", [
    (3, 3), (np.int16(3), 3), (torch.tensor(3), 3), (2.0, 2), (np.float32(4.0), 4), ("5", 5),
    (2**70, 2**70)])
def test_what_is_one(value: object, expected: int) -> None:
    assert whole_number(value) == expected


def test_numpy_bools_are_refused_as_seeds_and_bits() -> None:
    with pytest.raises(ValueError, match="seed=.*not an int"):
        sparse_parity("train", seed=np.True_)  # seed 1's data, without a word
    with pytest.raises(ValueError, match="whole bit indices"):
        sparse_parity("train", subset=[np.True_, np.int64(3)], seed=0)  # bits 1 and 3


def test_digit_pairs_follow_the_same_rule() -> None:
    with pytest.raises(ValueError, match="whole numbers"):
        create_dataset("digits", split="test", digits=(np.True_, 8))  # the 1-vs-8 task
    with pytest.raises(ValueError, match="whole numbers"):
        create_dataset("digits", split="test", digits=("a", 8))  # int("a") failed bare
    a = create_dataset("digits", split="test", digits=(np.int64(3), np.float64(8.0)))
    b = create_dataset("digits", split="test", digits=(3, 8))
    assert torch.equal(a.targets, b.targets) and a.meta.get("classes") == b.meta.get("classes")
