"""The encoding of {±1}ⁿ shared by :mod:`~senslab.measure.boolean`,
:mod:`~senslab.measure.fourier` and :mod:`~senslab.measure.functions`
(docs/definitions.md#boolean-functions).

A string x ∈ {±1}ⁿ is the integer i whose bit j encodes coordinate j: x_j = 1 − 2·bit_j(i), so
i = 0 is the all-(+1) string; a truth table is a 1-D tensor of length 2ⁿ indexed by i. This
module sits below the three: they import it, never each other's internals.
"""

from __future__ import annotations

from numbers import Integral

import torch
from torch import Tensor

#: Largest n for which a *function* is enumerated (2²² ≈ 4.2M evaluations); beyond, sample.
MAX_EXACT_N = 22

#: Largest n whose strings have an int64 index (bits 0..62; bit 63 is the sign bit).
MAX_INDEX_BITS = 63


def index_to_inputs(index: Tensor, n: int, dtype: torch.dtype = torch.float32) -> Tensor:
    """The ±1 strings (len(index), n) of integer indices: x_j = 1 − 2·bit_j(index).

    Indices must be integers in [0, 2ⁿ): bits above n dropped out, so index 2ⁿ + i gave the
    string of i, −1 gave the all −1 string, and a float 2.7 was cut to 2. ``dtype`` must hold
    −1 (a float or signed integer dtype): bool made every string all True and uint8 wrote −1
    as 255."""
    n = check_n(n)
    check_string_dtype(dtype)
    if not isinstance(index, Tensor) or index.is_floating_point() or index.is_complex() \
            or index.dtype == torch.bool:
        what = (f"a {str(index.dtype).removeprefix('torch.')} tensor"
                if isinstance(index, Tensor) else type(index).__name__)
        raise TypeError(
            f"index must be an integer tensor of string indices, got {what}: a float index "
            "would be cut to an integer without a word. Pass index.long() after rounding, "
            "or torch.arange(2**n) for all strings")
    index = index.long()
    if index.numel():
        low, high = int(index.min()), int(index.max())
        if low < 0 or (n < MAX_INDEX_BITS and high >= 1 << n):
            raise ValueError(
                f"indices of strings of n={n} bits lie in [0, 2^{n}), got some in "
                f"[{low}, {high}]: the bits above n would drop out (index 2^{n} + i reads as "
                "i, −1 as the all −1 string). Pass n large enough for the indices, or "
                f"index % 2**{n} for the wrap-round on purpose")
    bits = (index.unsqueeze(1) >> torch.arange(n, device=index.device)) & 1
    return (1 - 2 * bits).to(dtype)


def check_string_dtype(dtype: object, example: str = "torch.float32", what: str = "",
                       same: str = "every string would be the same",
                       fix: str = "for 0/1 bits take x < 0 of the ±1 strings (bit 1 ↦ −1, the "
                                  "encoding here)") -> None:
    """Refuse a ``dtype`` for ±1 strings that cannot hold −1: bool made both −1 and +1 True
    (``same``), an unsigned type wrapped −1 round to its largest value (255); a complex one is
    no bit. ``what`` follows "the ±1 strings" in the message, ``fix`` ends it."""
    if not isinstance(dtype, torch.dtype):
        raise TypeError(f"dtype must be a torch.dtype (e.g. {example}), got {dtype!r}")
    if dtype == torch.bool or dtype.is_complex or not dtype.is_signed:
        raise ValueError(
            f"dtype={dtype} cannot hold the ±1 strings{what}"
            + (f" (−1 and +1 are both True, so {same})" if dtype == torch.bool else
               " (−1 would wrap round to the type's largest value)" if not dtype.is_complex
               else "")
            + f": pass a float dtype ({example}) or a signed integer one (torch.long); {fix}")


def inputs_to_index(x: Tensor) -> Tensor:
    """Inverse of :func:`index_to_inputs`: the integer index of each ±1 row of ``x`` (N, n)."""
    if x.dim() != 2:
        raise ValueError(f"expected a (N, n) batch of ±1 strings, got shape {tuple(x.shape)}")
    if x.dtype == torch.bool:
        raise ValueError(
            "expected ±1 strings, got a bool tensor: read as 0/1 bits it names other strings. "
            "Pass 1 − 2·x.float() (True ↦ −1), or x.float() * 2 − 1 (True ↦ +1)"
        )
    if x.is_complex():
        # |1j| = 1 passed the ±1 check below, and the sign test then failed with torch's bare
        # "lt_cpu not implemented for 'ComplexFloat'"
        raise ValueError(
            f"expected real ±1 strings, got a complex tensor "
            f"({str(x.dtype).removeprefix('torch.')}): a string's bits are −1 or +1, and a "
            "complex entry such as 1j has |x| = 1 without being either. Pass x.real where the "
            "imaginary parts are 0"
        )
    if x.shape[1] > MAX_INDEX_BITS:
        raise ValueError(
            f"strings of n={x.shape[1]} bits have no int64 index: bit {MAX_INDEX_BITS} and "
            f"above would wrap round or drop out, giving distinct strings one index. Index "
            f"strings of at most {MAX_INDEX_BITS} bits (a truth table needs far fewer), or "
            "compare the strings themselves (torch.unique(x, dim=0))"
        )
    if bool((x.abs() != 1).any()):
        bad = x[(x.abs() != 1)].unique()[:4].tolist()
        raise ValueError(
            f"expected ±1 strings, got entries {bad}: a 0/1 string would be read as all +1 (one "
            "index for every row). For 0/1 bits pass 1 − 2·x (bit 1 ↦ −1)"
        )
    bits = (x < 0).long()  # −1 ↦ bit 1
    return (bits << torch.arange(x.shape[1], device=x.device)).sum(1)


def all_inputs(n: int, dtype: torch.dtype = torch.float32) -> Tensor:
    """All 2ⁿ strings of {±1}ⁿ as a (2ⁿ, n) matrix, row i = the string with index i."""
    n = check_n(n)
    if n > MAX_EXACT_N:
        raise ValueError(f"all_inputs({n}) would hold 2^{n} rows; n ≤ {MAX_EXACT_N} is supported")
    return index_to_inputs(torch.arange(1 << n), n, dtype)


def check_n(n: int) -> int:
    """``n`` as an int ≥ 1: any integer type (a NumPy ``int64`` from a config or an array was
    refused as "not a positive integer"), not a bool."""
    if isinstance(n, bool) or not isinstance(n, Integral) or n < 1:
        raise ValueError(f"n must be a positive integer number of bits, got {n!r}")
    return int(n)


def table_n(table: Tensor) -> int:
    """n for a truth table, with the errors a wrong table deserves."""
    if not isinstance(table, Tensor):
        raise TypeError(f"expected a truth table tensor, got {type(table).__name__}")
    if table.dim() == 2 and table.shape[1] == 1:
        table = table[:, 0]
    size = table.shape[0] if table.dim() == 1 else -1
    if size < 2 or size & (size - 1):
        raise ValueError(
            f"a truth table is a 1-D tensor of length 2^n (n ≥ 1); got shape {tuple(table.shape)}"
            " — build one with truth_table(f, n)"
        )
    return size.bit_length() - 1
