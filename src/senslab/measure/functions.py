"""Reference functions on {±1}ⁿ: PARITY, MAJORITY, FIRST, MEAN, sparse parities, random and
tabulated functions (docs/definitions.md#reference-boolean-functions;
Hahn & Rofin).

Each takes a (N, n) batch of ±1 strings and returns (N,) values in the batch's float dtype, so
they serve both as measured functions and as regression targets for generated tasks. Entries
other than ±1 are refused: on 0/1 bits PARITY would compute AND and MAJORITY OR, silently.
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Iterable, Sequence

import torch
from torch import Tensor

from ._cube import MAX_EXACT_N, check_n, inputs_to_index, table_n
from ._options import _check_generator, _seeded


def _bits(x: Tensor) -> Tensor:
    """``x`` as a float (N, n) batch, refused unless every entry is ±1 (one pass over x)."""
    if x.dim() != 2:
        raise ValueError(f"expected a (N, n) batch of ±1 strings, got shape {tuple(x.shape)}")
    if x.shape[1] == 0:
        # MEAN of no bits was NaN without a word, FIRST an IndexError
        raise ValueError(
            f"expected strings of n ≥ 1 bits, got shape {tuple(x.shape)} (no bits): a batch "
            "of N strings of n bits has shape (N, n)")
    if x.dtype == torch.bool:
        raise ValueError(
            "expected ±1 strings, got a bool tensor: read as 0/1 bits these functions compute "
            "other functions. Pass 1 − 2·x.float() (True ↦ −1), or x.float() * 2 − 1 (True ↦ +1)"
        )
    bad = x.abs() != 1
    if bool(bad.any()):
        got = x[bad].unique()[:4].tolist()
        raise ValueError(
            f"expected ±1 strings, got entries {got}: on 0/1 bits these functions compute other "
            "functions (PARITY would be AND, MAJORITY OR). For 0/1 bits pass 1 − 2·x (bit 1 ↦ "
            "−1)"
        )
    return x if x.is_floating_point() else x.float()


def parity(x: Tensor) -> Tensor:
    """PARITY(x) = Π_i x_i ∈ {±1}; as = n, degree n (f̂ is 1 on S = all bits)."""
    return _bits(x).prod(1)


def majority(x: Tensor) -> Tensor:
    """MAJORITY(x) = 1 if more bits are +1 than −1, else 0 (ties → 0); values in {0, 1}.

    +1 counts as a "one", as in the companion code. For odd n, as = n·C(n−1, (n−1)/2)/2ⁿ⁻¹;
    for even n only ties/one-above-tie pairs change: n=5 → 1.875, n=10 → 2.4609, n=15 → 3.1421.
    """
    x = _bits(x)
    return (x.sum(1) > 0).to(x.dtype)


majority.boolean_output = "sign"  # type: ignore[attr-defined]  # Boolean: no sample can tell


def first(x: Tensor) -> Tensor:
    """FIRST(x) = x_1 ∈ {±1} (the dictator function); as = 1."""
    return _bits(x)[:, 0].clone()


def mean(x: Tensor) -> Tensor:
    """MEAN(x) = (1/n) Σ_i x_i, real-valued; with the "real" rule as = n·(2/n)²/4 = 1/n."""
    return _bits(x).mean(1)


def sparse_parity(subset: Sequence[int]) -> Callable[[Tensor], Tensor]:
    """A function x ↦ Π_{i∈S} x_i (0-based bit positions); the empty subset is the constant 1."""
    if isinstance(subset, (str, bytes)) or not isinstance(subset, Iterable):
        raise TypeError(
            f"subset is the bit positions of the parity, a sequence of ints, got {subset!r}: "
            "e.g. sparse_parity([0, 2]) for x_0·x_2 (sparse_parity(range(k)) for the first k)")
    index = [_position(i, subset) for i in subset]
    if any(i < 0 for i in index) or len(set(index)) != len(index):
        raise ValueError(f"subset must hold distinct non-negative bit positions, got {subset}")
    cols = torch.tensor(index, dtype=torch.long)

    def chi(x: Tensor) -> Tensor:
        x = _bits(x)
        if index and max(index) >= x.shape[1]:
            raise ValueError(f"subset {index} names bit {max(index)} but x has {x.shape[1]} bits")
        return x[:, cols.to(x.device)].prod(1)

    chi.__name__ = f"sparse_parity_{'_'.join(map(str, index)) or 'empty'}"
    return chi


def _position(i: object, subset: object) -> int:
    """A bit position as an int: int() cut a float 0.5 to bit 0 and 2.7 to bit 2 without a
    word; an integer of any kind (NumPy, a 0-d integer tensor) is taken, a bool is not."""
    if not isinstance(i, bool) and not (isinstance(i, Tensor) and i.dtype == torch.bool):
        try:
            return operator.index(i)  # type: ignore[arg-type]
        except TypeError:
            pass
    raise TypeError(
        f"subset must hold integer bit positions, got {i!r} ({type(i).__name__}) in {subset!r}: "
        "pass ints, e.g. sparse_parity([0, 2])")


def random_function(n: int, generator: torch.Generator | int | None) -> Tensor:
    """A uniformly random ±1 truth table (float64, length 2ⁿ); E[as(f)] = n/2.

    ``generator`` is a ``torch.Generator`` or an int seed (None: seed 0), as for
    :func:`~senslab.measure.boolean.boolean_sensitivity`; a seed ``s`` gives the table of
    ``torch.Generator().manual_seed(s)``, so it must be below 2**32: that CPU generator keeps
    only a seed's low 32 bits (seed 2**32 + 1 would give seed 1's table), and a larger seed is
    refused. Use it with :func:`table_function` for a callable, or pass the table directly.
    """
    n = check_n(n)
    _check_generator(generator)
    if n > MAX_EXACT_N:
        raise ValueError(f"a random truth table for n={n} has 2^{n} entries; n ≤ {MAX_EXACT_N}")
    generator = _seeded(generator)
    bits = torch.randint(0, 2, (1 << n,), generator=generator, device=generator.device)
    return (1 - 2 * bits).double().cpu()


def table_function(table: Tensor) -> Callable[[Tensor], Tensor]:
    """The callable x ↦ table[index(x)] for a truth table (values returned as stored)."""
    n = table_n(table)
    values = table[:, 0] if table.dim() == 2 else table

    def lookup(x: Tensor) -> Tensor:
        if x.dim() != 2 or x.shape[1] != n:
            raise ValueError(f"this table takes (N, {n}) ±1 strings, got {tuple(x.shape)}")
        return values.to(x.device)[inputs_to_index(x)]

    return lookup
