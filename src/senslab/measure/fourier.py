"""Fourier analysis of functions on {±1}ⁿ from their truth tables
(docs/definitions.md#fourier-coefficients).

f(x) = Σ_S f̂(S) χ_S(x) with χ_S(x) = Π_{i∈S} xᵢ; all 2ⁿ coefficients by a fast Walsh–Hadamard
transform in O(n·2ⁿ). Degree, spectral weight per degree, noise stability
Stab_ρ(f) = Σ_S ρ^|S| f̂(S)², and the identities Inf_i(f) = Σ_{S∋i} f̂(S)² and
as(f) = Σ_S |S| f̂(S)² (checked against direct flip counts in the tests). Truth tables use the
encoding of :mod:`senslab.measure.boolean` (subset S = bitmask, ``coefficients[S]`` = f̂(S)).
"""

from __future__ import annotations

import math
from numbers import Real

import torch
from torch import Tensor

from ._cube import check_n, table_n


def _spectrum(table: Tensor, coefficients: bool, output: str = "auto") -> Tensor:
    table_n(table)
    if table.dim() == 2:
        table = table[:, 0]
    return table.double() if coefficients else fourier_coefficients(table, output=output)


def _two_valued(values: Tensor) -> bool:
    """Whether every value is 0 or 1, or every value is −1 or 1."""
    return bool(torch.isin(values, torch.tensor([0, 1], dtype=values.dtype)).all()
                or torch.isin(values, torch.tensor([-1, 1], dtype=values.dtype)).all())


def _real_values(table: Tensor, output: str = "auto") -> Tensor:
    """The table as float64 values (``output``, as in
    :func:`~senslab.measure.boolean.boolean_sensitivity`): ``"sign"`` reads it as a Boolean
    function — bool, or labels 0/1 or ±1 of any dtype — as the ±1 function
    :func:`~senslab.measure.boolean.truth_table` gives (+1 on True / label 1), since the
    identities (as(f) = Σ|S|f̂(S)², Stab_ρ = E[f(x)f(y)]) hold for ±1 values; read as 0/1 they
    would give a quarter of the flip count. ``"real"`` takes the numbers as they are (bool as
    0/1). ``"auto"`` reads bool and integer tables, and float tables whose values are all 0 or 1
    (or all ±1), as Boolean — the float 0/1 table of ``majority`` was read as numbers, a quarter
    of its flips — and other float tables as real. Multi-class labels are refused."""
    if output not in ("auto", "sign", "real"):
        raise ValueError(f"output must be 'auto', 'sign' or 'real', got {output!r}")
    if output == "real":
        return table.double()
    values = table.unique()
    if table.dtype == torch.bool or _two_valued(values):
        return (table > 0).double() * 2 - 1  # 1 → +1; 0 or −1 → −1
    if table.is_floating_point() and output == "auto":
        return table.double()
    if table.is_floating_point():
        raise ValueError(
            f"output='sign' reads the table as a Boolean function, but it holds other values "
            f"than 0/1 or ±1 ({values[:5].tolist()}…): pass (table > threshold) for the class "
            "at a threshold, or output='real' for the numbers")
    raise ValueError(
        f"Fourier analysis needs a real-valued or a Boolean table, not multi-class labels: "
        f"this integer table holds {values.numel()} labels {values[:5].tolist()}: pass a ±1 "
        "table (truth_table(f, n) gives one) or the real outputs as float")


def fourier_coefficients(table: Tensor, *, output: str = "auto") -> Tensor:
    """All 2ⁿ Fourier coefficients f̂(S) = 2⁻ⁿ Σ_x f(x) χ_S(x), indexed by the bitmask S. A
    Boolean table (bool, or labels 0/1 or ±1 of any dtype, float included) is read as its ±1
    function (+1 on True / label 1, as :func:`~senslab.measure.boolean.truth_table`);
    ``output="real"`` takes a table's numbers as they are (:func:`_real_values`).

    Fast Walsh–Hadamard transform: for each bit j, every pair of entries (a, b) whose indices
    differ only in bit j becomes (a + b, a − b); n such butterfly passes of O(2ⁿ) tensor work
    each (float64, on a copy). With bit j ↦ x_j = 1 − 2·bit, the pass for bit j multiplies by
    x_j's two values, so after all n passes entry S holds Σ_x f(x) χ_S(x).
    """
    n = table_n(table)
    h = _real_values(table[:, 0] if table.dim() == 2 else table, output).clone()
    for j in range(n):
        pairs = h.view(-1, 2, 1 << j)  # middle axis = bit j of the index
        a = pairs[:, 0].clone()
        pairs[:, 0] += pairs[:, 1]
        pairs[:, 1] = a - pairs[:, 1]
    return h / (1 << n)


def subset_sizes(n: int) -> Tensor:
    """|S| for every bitmask S < 2ⁿ (popcount), built by doubling: |S + 2ʲ| = |S| + 1."""
    check_n(n)
    sizes = torch.zeros(1, dtype=torch.long)
    for _ in range(n):
        sizes = torch.cat([sizes, sizes + 1])
    return sizes


def spectral_weights(table: Tensor, *, coefficients: bool = False,
                     output: str = "auto") -> Tensor:
    """W_k = Σ_{|S|=k} f̂(S)² for k = 0..n, a float64 tensor (n+1,); Σ_k W_k = E[f²] (Parseval).

    Pass ``coefficients=True`` when ``table`` already holds f̂ (from fourier_coefficients);
    ``output``: how a table is read, as in :func:`fourier_coefficients`.
    """
    c = _spectrum(table, coefficients, output)
    n = table_n(c)
    return torch.zeros(n + 1, dtype=torch.float64).index_add_(0, subset_sizes(n), c.pow(2))


#: default relative tolerance of :func:`degree`, a multiple of ‖f‖₂: float32 rounding of the
#: outputs (relative 6e-8 each) moves the coefficients by about 1e-8·‖f‖₂
DEGREE_RTOL = 1e-6


def degree(table: Tensor, tol: float | None = None, *, rtol: float | None = None,
           coefficients: bool = False, output: str = "auto") -> int:
    """deg(f) = max |S| with |f̂(S)| > cut (0 for a constant, including the zero function).

    The cut is relative to the table's scale ‖f‖₂ = (Σ_S f̂(S)²)^½ = E[f²]^½ (Parseval):
    ``rtol``·‖f‖₂. The default ``rtol`` is ``min(DEGREE_RTOL, 2⁻ⁿ)``: 1e-6 ignores the
    coefficients that float32 rounding of a model's outputs leaves at every degree (a few
    1e-9 for outputs of size 1, which an absolute 1e-9 counted: a linear model read as degree
    5 to 10), and 2⁻ⁿ stays below 2¹⁻ⁿ, the smallest nonzero coefficient of a ±1 function, so
    Boolean tables keep their exact degree. A table computed in bf16 or fp16 needs more, e.g.
    ``rtol=1e-2``. ``tol`` is an absolute cut instead (|f̂(S)| > tol), for a known noise
    level; pass one of the two. ``output``: how a table is read, as in
    :func:`fourier_coefficients`.
    """
    if tol is not None and rtol is not None:
        raise ValueError(
            f"pass tol (an absolute cut, got {tol!r}) or rtol (relative to ‖f‖₂, got {rtol!r}), "
            "not both")
    for name, value in (("tol", tol), ("rtol", rtol)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, Real)
                                  or not math.isfinite(value) or value < 0):
            raise ValueError(f"{name} must be a finite number ≥ 0, got {value!r}")
    c = _spectrum(table, coefficients, output)
    n = table_n(c)
    if tol is not None:
        cut = float(tol)
    else:
        scale = float(c.pow(2).sum().sqrt())
        cut = scale * (min(DEGREE_RTOL, 2.0**-n) if rtol is None else float(rtol))
    sizes = subset_sizes(n)[c.abs() > cut]
    return int(sizes.max()) if len(sizes) else 0


def noise_stability(table: Tensor, rho: float, *, coefficients: bool = False,
                    output: str = "auto") -> float:
    """Stab_ρ(f) = Σ_S ρ^|S| f̂(S)² = E[f(x) f(y)] for a ρ-correlated pair (x, y).

    y keeps each bit of x with probability (1 + ρ)/2 and flips it otherwise, so for ±1-valued f,
    P[f(x) ≠ f(y)] = (1 − Stab_ρ(f)) / 2.
    """
    if isinstance(rho, bool) or not isinstance(rho, Real):
        raise TypeError(f"rho is a correlation: pass a number in [-1, 1], got "
                        f"{type(rho).__name__} {rho!r}")
    if not -1.0 <= rho <= 1.0:
        raise ValueError(f"rho is a correlation and must lie in [-1, 1], got {rho}")
    weights = spectral_weights(table, coefficients=coefficients, output=output)
    return float((weights * rho ** torch.arange(len(weights), dtype=torch.float64)).sum())


def average_sensitivity_fourier(table: Tensor, *, coefficients: bool = False,
                                output: str = "auto") -> float:
    """Σ_S |S| f̂(S)²: as(f) for ±1-valued f, the "real" sensitivity Σᵢ E[(D_i f)²] otherwise
    (``output``: how a table is read, as in :func:`fourier_coefficients`)."""
    weights = spectral_weights(table, coefficients=coefficients, output=output)
    return float((weights * torch.arange(len(weights), dtype=torch.float64)).sum())


def influence_fourier(table: Tensor, *, coefficients: bool = False,
                      output: str = "auto") -> Tensor:
    """Inf_i(f) = Σ_{S∋i} f̂(S)² for every bit i, a float64 tensor (n,) (``output``: how a
    table is read, as in :func:`fourier_coefficients`)."""
    c = _spectrum(table, coefficients, output)
    n = table_n(c)
    w = c.pow(2)
    # S ∋ i ⇔ bit i of S is set: the second half of every (−1, 2, 2ⁱ) block.
    return torch.stack([w.view(-1, 2, 1 << i)[:, 1].sum() for i in range(n)])
