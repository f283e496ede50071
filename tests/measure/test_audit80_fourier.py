"""Audit 80: the cube index, degree() of reduced-precision tables, and Fourier functions on the
device of the table."""

from __future__ import annotations

import warnings

import pytest
import torch

from senslab.measure import (
    all_inputs,
    average_sensitivity_fourier,
    degree,
    influence_fourier,
    majority,
    mean,
    noise_stability,
    parity,
    spectral_weights,
    table_function,
    truth_table,
)
from senslab.measure._cube import inputs_to_index


def test_a_bool_batch_looked_up_in_a_table_is_named_with_the_fix():
    """inputs_to_index raised torch's '"abs_cpu" not implemented for 'Bool'' for a bool batch,
    naming neither the ±1 encoding nor the conversion."""
    lookup = table_function(truth_table(parity, 3))
    x = all_inputs(3)
    with pytest.raises(ValueError, match=r"bool tensor(?s:.*)1 − 2·x\.float\(\)"):
        lookup(x < 0)
    assert torch.equal(lookup(1 - 2 * (x < 0).float()), parity(x).double())


def test_strings_longer_than_an_int64_index_are_refused():
    """Bit 63 wrapped to the sign (all −1 on 64 bits read as index −1) and bits from 64 on
    dropped out: two different 70-bit strings had index 0, read as the same string."""
    a = torch.ones(2, 70)
    a[0, 65] = -1
    with pytest.raises(ValueError, match=r"n=70 bits have no int64 index(?s:.*)at most 63"):
        inputs_to_index(a)
    with pytest.raises(ValueError, match="n=64 bits"):
        inputs_to_index(-torch.ones(1, 64))
    # 63 bits still fit, exactly
    assert inputs_to_index(-torch.ones(1, 63)).item() == 2**63 - 1
    top = torch.ones(1, 63)
    top[0, 62] = -1
    assert inputs_to_index(top).item() == 2**62


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_degree_of_a_reduced_precision_real_table_warns(dtype):
    """MEAN on 10 bits has degree 1; its table cast to bf16/fp16 read degree 9 with the default
    rtol and no word (truth_table warns of its bf16 outputs, a table passed in bf16 did not)."""
    exact = truth_table(mean, 10)
    table = exact.to(dtype)
    with pytest.warns(UserWarning, match=r"gives degree 9, where rtol=0\.01 gives 1(?s:.*)"
                                         r"degree\(table, rtol=0\.01\)"):
        assert degree(table) == 9  # the number is unchanged, and now said
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert degree(table, rtol=1e-2) == 1
        assert degree(exact) == 1


def test_exact_and_boolean_reduced_precision_tables_do_not_warn():
    """x0·x1 is exact in bf16 (degree 2 at any cut); a bf16 ±1 or 0/1 table is read as its
    Boolean function, exactly: MAJORITY on 9 bits keeps degree 9 (its top coefficients lie
    below 1e-2, so rtol=1e-2 must not be proposed for it)."""
    x = all_inputs(8)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert degree((x[:, 0] * x[:, 1]).bfloat16()) == 2
        assert degree(majority(all_inputs(9)).bfloat16()) == 9
        assert degree(truth_table(majority, 9).half()) == 9
        assert degree(majority(all_inputs(9)).bfloat16(), output="sign") == 9


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_spectral_functions_take_a_cuda_table():
    """spectral_weights, noise_stability, average_sensitivity_fourier and degree built their
    subset sizes on the CPU: a CUDA table failed with a device mismatch."""
    table = truth_table(majority, 7)
    gpu = table.cuda()
    assert torch.allclose(spectral_weights(gpu).cpu(), spectral_weights(table))
    assert noise_stability(gpu, 0.5) == pytest.approx(noise_stability(table, 0.5))
    assert average_sensitivity_fourier(gpu) == pytest.approx(average_sensitivity_fourier(table))
    assert degree(gpu) == degree(table) == 7
    assert torch.allclose(influence_fourier(gpu).cpu(), influence_fourier(table))
