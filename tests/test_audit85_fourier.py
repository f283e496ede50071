"""Audit 85, Fourier analysis and the reference functions on {±1}ⁿ: string encodings that
cannot hold −1, indices outside [0, 2ⁿ), float bit positions, batches of no bits, and float64
tables large enough to overflow the transform or the degree's norm."""

from __future__ import annotations

import pytest
import torch

from senslab.measure import (
    all_inputs,
    degree,
    first,
    fourier_coefficients,
    mean,
    sparse_parity,
)
from senslab.measure.boolean import index_to_inputs, inputs_to_index


def _brute_coefficients(table: torch.Tensor) -> torch.Tensor:
    """f̂(S) = 2⁻ⁿ Σ_x f(x) χ_S(x), summed term by term over the strings."""
    n = table.numel().bit_length() - 1
    x = all_inputs(n, torch.float64)
    return torch.stack([
        (table * x[:, [i for i in range(n) if s >> i & 1]].prod(1)).mean()
        for s in range(1 << n)])


@pytest.mark.parametrize("dtype", [torch.bool, torch.uint8])
def test_strings_in_a_dtype_that_cannot_hold_minus_one_are_refused(dtype):
    # bool made every string all True, uint8 wrote −1 as 255
    with pytest.raises(ValueError, match=f"dtype={dtype} cannot hold the ±1 strings"):
        all_inputs(3, dtype)
    with pytest.raises(ValueError, match="cannot hold the ±1 strings"):
        index_to_inputs(torch.arange(4), 2, dtype)
    # the dtypes that hold −1 still give the same strings
    for ok in (torch.int8, torch.long, torch.float16, torch.float64):
        assert torch.equal(all_inputs(3, ok).double(), all_inputs(3, torch.float64))


def test_indices_outside_the_cube_are_refused_not_wrapped_round():
    # index 2ⁿ + i gave the string of i, −1 the all −1 string, 2.7 the string of 2
    with pytest.raises(ValueError, match=r"lie in \[0, 2\^2\).*\[0, 7\]"):
        index_to_inputs(torch.arange(8), 2)
    with pytest.raises(ValueError, match=r"lie in \[0, 2\^3\)"):
        index_to_inputs(torch.tensor([-1]), 3)
    with pytest.raises(TypeError, match="integer tensor"):
        index_to_inputs(torch.tensor([2.7]), 3)
    with pytest.raises(ValueError, match="positive integer number of bits"):
        index_to_inputs(torch.tensor([1]), -1)
    idx = torch.tensor([0, 5, 127], dtype=torch.int32)
    assert torch.equal(inputs_to_index(index_to_inputs(idx, 7)), idx.long())
    assert index_to_inputs(torch.tensor([], dtype=torch.long), 3).shape == (0, 3)


def test_float_bit_positions_are_refused_not_cut_to_ints():
    x = torch.tensor([[1.0, -1.0, -1.0]])
    with pytest.raises(TypeError, match="integer bit positions, got 0.5"):
        sparse_parity([0.5, 2.7])  # int() read it as bits 0 and 2
    with pytest.raises(TypeError, match="integer bit positions"):
        sparse_parity([True])
    with pytest.raises(TypeError, match="a sequence of ints"):
        sparse_parity(3)
    # integers of every kind still name their bits
    import numpy as np
    for subset in ([1, 2], (np.int64(1), np.int64(2)), torch.tensor([1, 2]), range(1, 3)):
        assert sparse_parity(subset)(x).tolist() == [1.0]
    assert sparse_parity([])(x).tolist() == [1.0]


def test_a_batch_of_no_bits_is_refused():
    # MEAN of no bits was NaN, FIRST an IndexError
    for f in (mean, first):
        with pytest.raises(ValueError, match=r"n ≥ 1 bits, got shape \(3, 0\)"):
            f(torch.ones(3, 0))


def test_large_float64_tables_keep_their_coefficients_and_degree():
    table = torch.tensor([1.0, 1.0, -1.0, 1.0, 0.5, -2.0, 1.0, 3.0], dtype=torch.float64)
    expected = _brute_coefficients(table)
    assert torch.allclose(fourier_coefficients(table, output="real"), expected)
    assert degree(table) == 3
    for scale in (1e307, 1e200, 1e-300):
        c = fourier_coefficients(table * scale, output="real")
        assert bool(torch.isfinite(c).all())  # 1e307 summed to ±inf before dividing by 2ⁿ
        assert torch.allclose(c / scale, expected)
        assert degree(table * scale) == 3  # ‖f‖₂ overflowed at 1e200: an infinite cut, 0
    sparse = torch.tensor([1.0, 1.0, 1.0, 1.0], dtype=torch.float64)
    sparse[3] += 1e-7  # f̂ of degree 2 is 2.5e-8·‖f‖₂, under the default cut
    for scale in (1.0, 1e200, 1e-200):
        assert degree(sparse * scale) == 0
        assert degree(sparse * scale, rtol=1e-9) == 2
