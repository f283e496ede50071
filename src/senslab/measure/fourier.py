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
import sys
import warnings
from numbers import Real

import torch
from torch import Tensor

from ._cube import check_n, table_n


def _spectrum(table: Tensor, coefficients: bool, output: str = "auto",
              constant_free: bool = False) -> Tensor:
    """f̂ of a table (or the coefficients given). ``constant_free``: the caller's number
    ignores f̂(∅) (degree, influences, as(f)), so a float table of zeros, which ``"auto"``
    refuses as ambiguous, is read as the zero function: both readings give the same number."""
    table_n(table)
    if table.dim() == 2:
        table = table[:, 0]
    if not coefficients:
        if constant_free and output == "auto" and table.is_floating_point() \
                and not bool(table.ne(0).any()):
            output = "real"
        return fourier_coefficients(table, output=output)
    _check_finite(table, "coefficients")
    return table.double()


def _check_finite(table: Tensor, what: str = "table") -> None:
    """Refuse NaN or infinite entries: one NaN makes every coefficient NaN, which compares
    False with every cut, so degree() read a table with one NaN as degree 0. Refuse complex
    entries too: ``output="real"`` (and ``coefficients=True``) dropped the imaginary part with
    no more than torch's one-time warning (1+1j read as 1), the other readings failed with
    torch's bare "unique not implemented for 'ComplexFloat'"."""
    if table.is_complex():
        kind = str(table.dtype).removeprefix("torch.")
        raise ValueError(
            f"the {what} {'are' if what == 'coefficients' else 'is'} complex ({kind}): Fourier "
            "analysis here is of real-valued functions on {±1}ⁿ, and read as real numbers the "
            "imaginary parts would be dropped without a word. Pass table.real where the "
            "imaginary parts are 0, or analyse table.real and table.imag apart (the transform "
            "is linear)")
    if table.is_floating_point() and not bool(torch.isfinite(table).all()):
        bad = table[~torch.isfinite(table)]
        fix = ("recompute them with fourier_coefficients(table)" if what == "coefficients"
               else "evaluate f again where it failed: a truth table needs all 2ⁿ values")
        raise ValueError(
            f"the {what} {'hold' if what == 'coefficients' else 'holds'} {bad.numel()} NaN or "
            f"infinite entries ({bad[:3].tolist()}…), "
            f"so every Fourier quantity would be NaN or wrong: {fix}")


_PAIRS = ((0.0, 1.0), (-1.0, 1.0))

#: a float table whose values all lie within this of 0/1 (or of ±1), each of the two taken,
#: is a Boolean function up to rounding (a saturated sigmoid's 0.9999999) to ``output="auto"``
NEAR_BOOLEAN = 1e-2


def _two_valued(values: Tensor) -> bool:
    """Whether every value is 0 or 1, or every value is −1 or 1 (compared as float64: a uint8
    −1 would wrap to 255, so labels {1, 255} read as the constant +1)."""
    values = values.double()
    return any(bool(torch.isin(values, values.new_tensor(pair)).all()) for pair in _PAIRS)


def _near_two_valued(values: Tensor) -> tuple[float, float] | None:
    """The pair (0/1 or ±1) that every value lies within :data:`NEAR_BOOLEAN` of, each of the
    two taken by some value, if any; None otherwise."""
    values = values.double()
    for low, high in _PAIRS:
        near_low = (values - low).abs() <= NEAR_BOOLEAN
        near_high = (values - high).abs() <= NEAR_BOOLEAN
        if bool((near_low | near_high).all() and near_low.any() and near_high.any()):
            return low, high
    return None


def _caller_level() -> int:
    """warnings.warn's stacklevel of the first frame outside this file (the user's call), for
    a warning raised in the function that calls this."""
    frame, level = sys._getframe(1), 1
    while frame is not None and frame.f_code.co_filename == __file__:
        frame, level = frame.f_back, level + 1
    return level


def _real_values(table: Tensor, output: str = "auto") -> Tensor:
    """The table as float64 values (``output``, as in
    :func:`~senslab.measure.boolean.boolean_sensitivity`): ``"sign"`` reads it as a Boolean
    function — bool, or labels 0/1 or ±1 of any dtype — as the ±1 function
    :func:`~senslab.measure.boolean.truth_table` gives (+1 on True / label 1), since the
    identities (as(f) = Σ|S|f̂(S)², Stab_ρ = E[f(x)f(y)]) hold for ±1 values; read as 0/1 they
    would give a quarter of the flip count. ``"real"`` takes the numbers as they are (bool as
    0/1). ``"auto"`` reads bool and integer tables, and float tables whose values are all 0 or 1
    (or all ±1), as Boolean — the float 0/1 table of ``majority`` was read as numbers, a quarter
    of its flips — and other float tables as real. Multi-class labels are refused, and so are
    NaN or infinite entries.

    Under ``"auto"`` a float table holding only 0 is refused: it is the zero function (f̂ = 0,
    Stab_ρ = 0) as much as the constant False (f̂(∅) = −1, Stab_ρ = 1), and the error names
    both ``output="real"`` and ``output="sign"``. A float table read as real whose values all
    lie within :data:`NEAR_BOOLEAN` of 0 and 1 (or of −1 and 1), each taken, is a Boolean
    function up to rounding (a saturated sigmoid): read as numbers, a 0/1 one gives about a
    quarter of its flip count, so ``"auto"`` warns; ``output="real"`` keeps the numbers
    without the warning, ``table > 0.5`` (``table > 0`` for ±1) gives the Boolean function."""
    if output not in ("auto", "sign", "real"):
        raise ValueError(f"output must be 'auto', 'sign' or 'real', got {output!r}")
    _check_finite(table)
    if output == "real":
        return table.double()
    values = table.unique()
    if output == "auto" and table.is_floating_point() and not bool(values.ne(0).any()):
        raise ValueError(
            f"this float table holds only 0 ({table.numel()} values): the zero function "
            "(every f̂(S) = 0, noise stability 0) or the Boolean constant False (f̂(∅) = −1, "
            "noise stability 1)? Pass output='real' for the zero function or output='sign' "
            "for the constant False (or a bool table)")
    if table.dtype == torch.bool or _two_valued(values):
        return (table > 0).double() * 2 - 1  # 1 → +1; 0 or −1 → −1
    if table.is_floating_point() and output == "auto":
        pair = _near_two_valued(values)
        if pair is not None:
            low, high = pair
            cut = (low + high) / 2
            warnings.warn(
                f"output='auto' reads this float table as real numbers, but every value lies "
                f"within {NEAR_BOOLEAN:g} of {low:g} or {high:g}: a Boolean function up to "
                f"rounding (a saturated sigmoid's 0.9999999?) would read as its ±1 function"
                + (", with about 4 times the spectral weight off ∅ (as(f), influences)"
                   if low == 0.0 else "") +
                f". Pass table > {cut:g} for the Boolean function, or output='real' to keep "
                "the numbers without this warning",
                UserWarning, stacklevel=_caller_level())
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
    ``output="real"`` takes a table's numbers as they are (:func:`_real_values`). Under
    ``output="auto"`` a float table of zeros is refused — the zero function (f̂ = 0) or the
    constant False (f̂(∅) = −1)? pass ``output="real"`` or ``output="sign"`` — and a float
    table within :data:`NEAR_BOOLEAN` of 0/1 or ±1 but not on them (a saturated sigmoid) is
    read as real with a warning. NaN or infinite entries are refused.

    Fast Walsh–Hadamard transform: for each bit j, every pair of entries (a, b) whose indices
    differ only in bit j becomes ((a + b)/2, (a − b)/2); n such butterfly passes of O(2ⁿ)
    tensor work each (float64, on a copy). With bit j ↦ x_j = 1 − 2·bit, the pass for bit j
    averages over x_j's two values, so after all n passes entry S holds 2⁻ⁿ Σ_x f(x) χ_S(x).
    Halving in every pass (exact in binary floating point) keeps every partial sum within
    max |f|: summed first and divided by 2ⁿ at the end, a float64 table near 1e308 overflowed
    to ±inf coefficients; below that the numbers are the same to the last bit.
    """
    n = table_n(table)
    h = _real_values(table[:, 0] if table.dim() == 2 else table, output).clone()
    for j in range(n):
        pairs = h.view(-1, 2, 1 << j)  # middle axis = bit j of the index
        a, b = pairs[:, 0] * 0.5, pairs[:, 1] * 0.5
        pairs[:, 0] = a + b
        pairs[:, 1] = a - b
    return h


def subset_sizes(n: int) -> Tensor:
    """|S| for every bitmask S < 2ⁿ (popcount), built by doubling: |S + 2ʲ| = |S| + 1."""
    n = check_n(n)
    sizes = torch.zeros(1, dtype=torch.long)
    for _ in range(n):
        sizes = torch.cat([sizes, sizes + 1])
    return sizes


def spectral_weights(table: Tensor, *, coefficients: bool = False,
                     output: str = "auto") -> Tensor:
    """W_k = Σ_{|S|=k} f̂(S)² for k = 0..n, a float64 tensor (n+1,) on the table's device;
    Σ_k W_k = E[f²] (Parseval).

    Pass ``coefficients=True`` when ``table`` already holds f̂ (from fourier_coefficients);
    ``output``: how a table is read, as in :func:`fourier_coefficients`. The squares are
    summed scaled by powers of two, so coefficients beyond 1e154 do not overflow on the way;
    a weight that is itself beyond float64 (above 1.8e308) is refused, not returned as inf.
    """
    c = _spectrum(table, coefficients, output)
    return _unscale(*_weights(c), c, "the spectral weights W_k = Σ_{|S|=k} f̂(S)²")


#: the exponent that :func:`_squares` gives f̂(S) = 0 (below every float64 exponent)
_NO_EXP = -(1 << 20)


def _squares(c: Tensor) -> tuple[Tensor, Tensor]:
    """(m², e) with f̂(S)² = m(S)²·2^e(S) exactly (m from torch.frexp, |m| in [1/2, 1);
    e = :data:`_NO_EXP` where f̂(S) = 0). Squared as they are, coefficients above about
    1.3e154 overflowed (spectral weights, influences and noise stability of inf, as(f) of nan,
    the influences of bits that the large coefficient does not touch included) and ones below
    about 1e-162 underflowed to 0."""
    m, x = torch.frexp(c)
    x = x.long()
    return m * m, torch.where(c != 0, 2 * x, torch.full_like(x, _NO_EXP))


def _in_range(c: Tensor) -> bool:
    """Whether every nonzero f̂(S)² is a normal float64 as it is (then the sums are taken
    unscaled, as fast as ever; :func:`_squares` otherwise)."""
    a = c.abs()
    if float(a.max()) >= 2.0**511:
        return False
    return float(torch.where(a > 0, a, torch.ones_like(a)).min()) >= 2.0**-510


def _shift(values: Tensor, by: Tensor) -> Tensor:
    """values·2^by for by ≤ 0 (exact, but where it leaves the normal range: terms 2¹⁰⁰⁰ times
    below their sum's largest, which no float64 sum keeps)."""
    return torch.ldexp(values, by.clamp(-4 * 1100, 0).to(values.dtype))


def _weights(c: Tensor) -> tuple[Tensor, Tensor]:
    """(U, E): W_k = U_k·2^E_k, each degree's squares summed scaled to its largest (a power
    of two: in float64's range the sums are the same to the last bit)."""
    # on c's device: a CUDA table met CPU sizes here, a device error from index_add_
    n = table_n(c)
    sizes = subset_sizes(n).to(c.device)
    if _in_range(c):
        return torch.zeros(n + 1, dtype=torch.float64, device=c.device).index_add_(
            0, sizes, c.pow(2)), torch.zeros(n + 1, dtype=torch.long, device=c.device)
    m2, e = _squares(c)
    top = torch.full((n + 1,), _NO_EXP, dtype=torch.long, device=c.device).scatter_reduce(
        0, sizes, e, "amax")
    return torch.zeros(n + 1, dtype=torch.float64, device=c.device).index_add_(
        0, sizes, _shift(m2, e - top[sizes])), top


def _unscale(values: Tensor, exps: Tensor, c: Tensor, what: str) -> Tensor:
    """values·2^exps (float64, on values' device), refused where it leaves float64's range."""
    try:
        out = [math.ldexp(v, k) for v, k in zip(values.tolist(), exps.tolist(), strict=True)]
    except OverflowError:
        top = float(c.abs().max())
        raise ValueError(
            f"{what} overflow float64 (above about 1.8e308): the Fourier coefficients reach "
            f"|f̂(S)| = {top:.3g}, and their squares are beyond float64's range, so the number "
            "would be inf or nan. These quantities scale with the square of the table: pass "
            "table / s for a scale s (e.g. a power of two near the table's largest value) and "
            "multiply the result by s² where it can be represented (in log space otherwise)"
        ) from None
    return torch.tensor(out, dtype=torch.float64, device=values.device)


def _total(terms: Tensor, exps: Tensor, c: Tensor, what: str) -> float:
    """Σ_k terms_k·2^exps_k as a float, summed scaled to the largest term's power of two."""
    live = exps[terms != 0]
    if not len(live):
        return 0.0
    top = live.max()
    total = _shift(terms, exps - top).sum().reshape(1)
    return float(_unscale(total, top.reshape(1), c, what)[0])


#: default relative tolerance of :func:`degree`, a multiple of ‖f‖₂: float32 rounding of the
#: outputs (relative 6e-8 each) moves the coefficients by about 1e-8·‖f‖₂
DEGREE_RTOL = 1e-6


def degree(table: Tensor, tol: float | None = None, *, rtol: float | None = None,
           coefficients: bool = False, output: str = "auto") -> int:
    """deg(f) = max |S| with |f̂(S)| > cut (0 for a constant, including the zero function: a
    float table of zeros, which :func:`fourier_coefficients` refuses as ambiguous, has degree 0
    in either reading, as do its influences and :func:`average_sensitivity_fourier`).

    The cut is relative to the table's scale ‖f‖₂ = (Σ_S f̂(S)²)^½ = E[f²]^½ (Parseval):
    ``rtol``·‖f‖₂. The default ``rtol`` is ``min(DEGREE_RTOL, 2⁻ⁿ)``: 1e-6 ignores the
    coefficients that float32 rounding of a model's outputs leaves at every degree (a few
    1e-9 for outputs of size 1, which an absolute 1e-9 counted: a linear model read as degree
    5 to 10), and 2⁻ⁿ stays below 2¹⁻ⁿ, the smallest nonzero coefficient of a ±1 function, so
    Boolean tables keep their exact degree. A table computed in bf16 or fp16 needs more, e.g.
    ``rtol=1e-2``; a table passed in bf16 or fp16 and read as real numbers warns when that
    changes its degree (the default leaves it as it is). ``tol`` is an absolute cut instead
    (|f̂(S)| > tol), for a known noise level; pass one of the two. ``output``: how a table is
    read, as in :func:`fourier_coefficients`.
    """
    if tol is not None and rtol is not None:
        raise ValueError(
            f"pass tol (an absolute cut, got {tol!r}) or rtol (relative to ‖f‖₂, got {rtol!r}), "
            "not both")
    for name, value in (("tol", tol), ("rtol", rtol)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, Real)
                                  or not math.isfinite(value) or value < 0):
            raise ValueError(f"{name} must be a finite number ≥ 0, got {value!r}")
    c = _spectrum(table, coefficients, output, constant_free=True)
    n = table_n(c)
    if tol is not None:
        cut = float(tol)
    else:
        cut = _norm_cut(c, min(DEGREE_RTOL, 2.0**-n) if rtol is None else float(rtol))
    found = _degree_above(c, cut)
    if tol is None and rtol is None and not coefficients and _reduced_real(table, output):
        # truth_table warns of its bf16/fp16 outputs; a table passed in that dtype is seen here
        rounded = _degree_above(c, _norm_cut(c, REDUCED_RTOL))
        if rounded != found:
            name = str(table.dtype).removeprefix("torch.")
            warnings.warn(
                f"degree() reads this {name} table as real numbers with the default rtol "
                f"({min(DEGREE_RTOL, 2.0**-n):.3g}, for float32 rounding): its {name} rounding "
                f"({8 if table.dtype == torch.bfloat16 else 11} significant bits) leaves "
                f"Fourier coefficients at every degree, so it gives degree {found}, where "
                f"rtol={REDUCED_RTOL:g} gives {rounded}. "
                f"Pass degree(table, rtol={REDUCED_RTOL:g}), or evaluate the function in "
                "float32",
                UserWarning, stacklevel=_caller_level())
    return found


#: the rtol that :func:`degree` names for a bf16 or fp16 table read as real numbers
REDUCED_RTOL = 1e-2


def _norm_cut(c: Tensor, r: float) -> float:
    """r·‖f‖₂ = r·(Σ_S f̂(S)²)^½, the norm taken of c scaled by a power of two (exact): squared
    as they are, float64 coefficients above about 1e154 overflowed (an infinite cut: degree 0
    for any such table) and ones below about 1e-162 underflowed (a cut of 0)."""
    top = float(c.abs().max())
    if top == 0.0:
        return 0.0
    e = math.frexp(top)[1]
    half = -e // 2  # two factors: 2^±e alone can leave float64's range
    unit = c * 2.0**half * 2.0**(-e - half)
    try:
        return math.ldexp(r * float(unit.pow(2).sum().sqrt()), e)
    except OverflowError:  # r·‖f‖₂ beyond float64, so above every |f̂(S)| ≤ max |f|
        return math.inf


def _degree_above(c: Tensor, cut: float) -> int:
    sizes = subset_sizes(table_n(c)).to(c.device)[c.abs() > cut]
    return int(sizes.max()) if len(sizes) else 0


def _reduced_real(table: Tensor, output: str) -> bool:
    """Whether ``table`` holds bf16 or fp16 values that :func:`_real_values` reads as numbers
    (a two-valued one is read as its ±1 function, exactly)."""
    if table.dtype not in (torch.bfloat16, torch.float16):
        return False
    if output == "real":
        return True
    values = (table[:, 0] if table.dim() == 2 else table).unique()
    return output == "auto" and bool(values.ne(0).any()) and not _two_valued(values)


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
    c = _spectrum(table, coefficients, output)
    weights, exps = _weights(c)  # scaled: a weight beyond float64 may still give Stab_ρ in it
    k = torch.arange(len(weights), dtype=torch.float64, device=weights.device)
    return _total(weights * rho ** k, exps, c, "the noise stability Σ_S ρ^|S| f̂(S)² would")


def average_sensitivity_fourier(table: Tensor, *, coefficients: bool = False,
                                output: str = "auto") -> float:
    """Σ_S |S| f̂(S)²: as(f) for ±1-valued f, the "real" sensitivity Σᵢ E[(D_i f)²] otherwise
    (``output``: how a table is read, as in :func:`fourier_coefficients`)."""
    c = _spectrum(table, coefficients, output, constant_free=True)
    weights, exps = _weights(c)
    k = torch.arange(len(weights), dtype=torch.float64, device=weights.device)
    return _total(weights * k, exps, c, "Σ_S |S| f̂(S)² would")


def influence_fourier(table: Tensor, *, coefficients: bool = False,
                      output: str = "auto") -> Tensor:
    """Inf_i(f) = Σ_{S∋i} f̂(S)² for every bit i, a float64 tensor (n,) (``output``: how a
    table is read, as in :func:`fourier_coefficients`)."""
    c = _spectrum(table, coefficients, output, constant_free=True)
    n = table_n(c)
    if _in_range(c):
        w = c.pow(2)
        # S ∋ i ⇔ bit i of S is set: the second half of every (−1, 2, 2ⁱ) block.
        return torch.stack([w.view(-1, 2, 1 << i)[:, 1].sum() for i in range(n)])
    m2, e = _squares(c)
    sums, exps = [], []
    for i in range(n):
        # S ∋ i ⇔ bit i of S is set: the second half of every (−1, 2, 2ⁱ) block.
        exps.append(e.view(-1, 2, 1 << i)[:, 1].max())
        # scaled to its largest square (summed in the same order as unscaled: same last bit)
        sums.append(_shift(m2, e - exps[-1]).view(-1, 2, 1 << i)[:, 1].sum())
    return _unscale(torch.stack(sums), torch.stack(exps), c, "the influences Σ_{S∋i} f̂(S)²")
