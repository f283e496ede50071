"""Generated tasks: made from a seed on every call, never stored on disk.

=====================  =========================================================================
``sparse_frequent``    sparse-vs-frequent token task of the low-sensitivity paper (§4.1, A.1)
``modular_addition``   (a + b) mod p on all p² pairs, tokens ``a b =`` (grokking, §7.3)
``sparse_parity``      y = Π_{i∈S} x_i on uniform x ∈ {±1}ⁿ (A.6)
``boolean``            PARITY / MAJORITY / FIRST / MEAN / random functions (Hahn & Rofin)
``maxmargin_attention``  sequences with a unique optimal token (Vasudeva, Deora & Thrampoulidis)
=====================  =========================================================================

Every loader takes ``seed`` (an int; a bool or a float that is not whole is refused) and draws
all randomness from ``torch.Generator`` streams derived from it: one stream for what the splits
share (token sets, the parity subset, a random function's table, the vector v) and one per
split, so that "train" and "test" never overlap in draws and a split is reproducible on its
own. Binary targets are long {0, 1} with 1 ⇔ y = +1;
the ±1 labels are in ``meta["y_pm"]``, float32 in every loader that has them.
"""

from __future__ import annotations

import inspect
import math
import numbers
import warnings
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, replace
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from .._seeds import CPU_SEED_END
from ._registry import register_dataset
from ._roots import locate, reads_no_files
from .base import ArrayDataset, whole_number

#: stream numbers: 0 is shared by all splits; "ood" reuses the "test" stream on purpose (see below);
#: "redraw" replaces test strings that the training split holds too (:func:`_held_out`)
_STREAM = {"shared": 0, "train": 1, "test": 2, "ood": 2, "validation": 3, "redraw": 4}

for _name in ("sparse_frequent", "modular_addition", "sparse_parity", "boolean",
              "maxmargin_attention"):
    reads_no_files(_name, "is generated from a seed")


def _generator(seed: int, stream: str) -> torch.Generator:
    """An independent generator for ``(seed, stream)``; a large odd multiplier keeps the streams
    of neighbouring seeds apart (seed s, stream 1 is not seed s+1, stream 0)."""
    seed = _check_seed(seed)
    return torch.Generator().manual_seed((seed * 1_000_003 + _STREAM[stream]) % (2**63 - 1))


def _check_count(value: object, option: str, name: str, what: str = "a number of examples"
                 ) -> int:
    """``value`` as a count (``what`` it counts, for the error), refused unless it is an int ≥ 1:
    a size of 0 gave an empty split (no accuracy, no sensitivity) without a word, and a bool read
    as 1 or 0."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 1:
        raise ValueError(f"{name}: {option} must be an int ≥ 1 ({what}), got {value!r}")
    return int(value)


def _check_finite(value: object, option: str, name: str) -> float:
    """``value`` as a finite real number: a NaN or infinite one went into the data and made it
    NaN without a word, and a bool read as 0 or 1."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real) \
            or not math.isfinite(value):
        raise ValueError(f"{name}: {option} must be a finite number (not a bool), got "
                         f"{value!r}")
    return float(value)


def _check_seed(seed: object, option: str = "seed", name: str = "") -> int:
    """``seed`` as an int, refused where it is a bool or a number that is not whole: ``int()``
    cut 1.7 to 1 (seed 1's data) and read True as 1, each without a word. Whatever ``int()``
    reads exactly passes as before (numpy's and torch's integers, 2.0, "3"). A seed outside
    [0, 2**32) is refused too: torch's CPU generator keeps only the low 32 bits of the stream
    seed, so seed 2**32 + 1 gave exactly seed 1's data, and a negative seed another seed's.
    ``option`` and ``name`` (the loader) are named in the error."""
    where = f"{name}: " if name else ""
    value = whole_number(seed)
    if value is not None and not 0 <= value < CPU_SEED_END:
        raise ValueError(
            f"{where}{option}={value} is outside [0, 2**32 = {CPU_SEED_END}): torch's CPU "
            f"generator keeps only a seed's low 32 bits, so it would give exactly the data of "
            f"another seed in that range (seed 2**32 + 1 gave seed 1's), and two seeds meant as "
            f"independent repeats the same data; pass a seed in [0, {CPU_SEED_END}), e.g. "
            f"{option}={value % CPU_SEED_END} (seed % 2**32)")
    if value is not None:
        return value
    raise ValueError(f"{where}{option}={seed!r} is not an int: a seed is a whole number (a "
                     f"float was cut to one, a bool read as 0 or 1, giving another seed's data "
                     f"without a word); pass an int, e.g. {option}=0")


def _check_bits(n_bits: object, name: str) -> int:
    """``n_bits`` as a number of input bits, refused unless it is an int ≥ 1: 0 bits gave
    1,024 empty strings with constant (PARITY) or NaN (MEAN) targets, and True read as 1 bit,
    each without a word."""
    if isinstance(n_bits, bool) or not isinstance(n_bits, numbers.Integral) or n_bits < 1:
        raise ValueError(f"{name}: n_bits must be an int ≥ 1 (the length of the ±1 strings), "
                         f"got {n_bits!r}")
    return int(n_bits)


def _check_split(name: str, split: str, allowed: tuple[str, ...]) -> str:
    if split not in allowed:
        raise ValueError(f"{name} has splits {', '.join(map(repr, allowed))}; got split={split!r}")
    return split


def _pm_to_target(y_pm: Tensor) -> Tensor:
    """±1 labels → long {0, 1} targets (1 ⇔ +1)."""
    return (y_pm > 0).long()


# --------------------------------------------------------------------------- sparse vs frequent


@dataclass(frozen=True)
class SparseFrequentConfig:
    """Parameters of the sparse-vs-frequent task (main paper Def. 4.2/4.3; the symbols were lost
    from our copy, so the exact design below is ours).

    Vocabulary: ``vocab_size`` one-hot tokens, laid out as ids ``S_+ | S_- | F_+ | F_- | R`` with
    ``|S_±| = sparse_set_size``, ``|F_±| = frequent_set_size`` and the irrelevant tokens R the
    rest. A sequence of ``seq_len`` tokens with label y ∈ {±1} (uniform): a random split of the
    positions into ``num_sparse`` sparse positions (tokens uniform from S_y), ``num_frequent``
    frequent positions (``round(lam·num_frequent)`` tokens uniform from F_y, the rest uniform
    from F_{-y}) and the remaining positions (uniform from R).

    Both features decide y on every sequence: the sparse count margin #S_y − #S_{-y} is
    ``num_sparse`` and the frequent margin #F_y − #F_{-y} is m_f = 2·round(lam·f) − f > 0. The knob
    ``lam`` sets which feature gives the *lower-sensitivity* classifier under the paper's
    sensitivity (replace one uniformly chosen position by a token uniform over the vocabulary):
    a margin of 1 or 2 is broken by one replacement, a large margin never is. With lam near 1/2
    the frequent feature is fragile and spread over many positions (case 1: sparse is less
    sensitive); with lam = 1 it cannot be flipped by one replacement (case 2: frequent is less
    sensitive). :func:`feature_sensitivities` measures both.
    """

    vocab_size: int = 40
    seq_len: int = 20
    num_sparse: int = 1
    num_frequent: int = 9
    lam: float = 5 / 9
    sparse_set_size: int = 1
    frequent_set_size: int = 4

    def __post_init__(self) -> None:
        for option in ("vocab_size", "seq_len", "num_sparse", "num_frequent", "sparse_set_size",
                       "frequent_set_size"):
            # a float (2.0) failed deep in torch with a raw TypeError, a bool read as 0 or 1
            value = getattr(self, option)
            if isinstance(value, bool) or not isinstance(value, numbers.Integral):
                raise ValueError(f"sparse_frequent: {option} must be an int, got {value!r}")
        # NaN failed in round() with "cannot convert float NaN to integer"; True read as lam=1
        _check_finite(self.lam, "lam", "sparse_frequent")
        s, f, L = self.num_sparse, self.num_frequent, self.seq_len
        if min(s, f, self.sparse_set_size, self.frequent_set_size) < 1:
            raise ValueError(f"counts and set sizes must be ≥ 1: {self}")
        if s + f > L:
            raise ValueError(f"num_sparse + num_frequent = {s + f} exceeds seq_len = {L}")
        if not 2 * self.num_major > f:
            raise ValueError(
                f"lam={self.lam} gives {self.num_major} of {f} frequent tokens from F_y: the "
                "label's frequent tokens must be a strict majority; use lam > 1/2 "
                f"(e.g. {(f // 2 + 1) / f:.3g})"
            )
        if self.lam > 1:
            # lam=1.05 with f=9 rounded to 9 of 9 and passed: lam=1's data, config saying 1.05
            raise ValueError(f"sparse_frequent: lam={self.lam} is the fraction of the frequent "
                             f"tokens drawn from F_y, so it must be ≤ 1; use lam=1 for all "
                             f"{f} from F_y")
        if self.num_irrelevant_ids < 0 or (self.num_irrelevant_ids < 1 and s + f < L):
            raise ValueError(
                f"vocab_size={self.vocab_size} is too small for the 2·(sparse_set_size + "
                f"frequent_set_size) feature tokens and the irrelevant ones; need at least "
                f"{2 * (self.sparse_set_size + self.frequent_set_size) + (s + f < L)}"
            )

    @property
    def num_major(self) -> int:
        """Frequent positions drawn from the label's own set F_y."""
        return int(round(self.lam * self.num_frequent))

    @property
    def num_irrelevant_ids(self) -> int:
        return self.vocab_size - 2 * (self.sparse_set_size + self.frequent_set_size)

    def token_sets(self) -> dict[str, Tensor]:
        """Token ids of S_+, S_-, F_+, F_-, R (keys "sparse+", "sparse-", …, "irrelevant")."""
        ks, kf = self.sparse_set_size, self.frequent_set_size
        edges = [0, ks, 2 * ks, 2 * ks + kf, 2 * ks + 2 * kf, self.vocab_size]
        names = ["sparse+", "sparse-", "frequent+", "frequent-", "irrelevant"]
        return {n: torch.arange(a, b) for n, a, b in zip(names, edges[:-1], edges[1:], strict=True)}


#: The two documented cases, three settings each (ours). Case 1: lam just above 1/2, so the
#: frequent margin is 1 and the sparse classifier is the less sensitive one; case 2: a large
#: frequent margin, so the frequent classifier is the less sensitive one.
SPARSE_FREQUENT_SETTINGS: dict[tuple[int, int], SparseFrequentConfig] = {
    (1, 0): SparseFrequentConfig(40, 20, 1, 9, 5 / 9),
    (1, 1): SparseFrequentConfig(40, 30, 1, 15, 8 / 15),
    (1, 2): SparseFrequentConfig(60, 20, 2, 11, 6 / 11, sparse_set_size=2),
    (2, 0): SparseFrequentConfig(40, 20, 1, 9, 1.0),
    (2, 1): SparseFrequentConfig(40, 30, 1, 12, 1.0),
    (2, 2): SparseFrequentConfig(60, 30, 1, 15, 0.8),
}

TOKEN_TYPES = ("irrelevant", "sparse", "frequent")


def sparse_frequent_ids(
    config: SparseFrequentConfig, num_samples: int, generator: torch.Generator, ood: bool = False
) -> tuple[Tensor, Tensor, Tensor]:
    """Token ids (N, L), token types (N, L) (index into :data:`TOKEN_TYPES`) and ±1 labels (N,)
    (float32, as every loader's ``meta["y_pm"]``).

    ``ood=True`` draws the sparse tokens from the opposite label's set S_{-y}. Every random draw is
    the same with and without ``ood``, so an OOD set is its in-distribution twin with exactly the
    sparse tokens swapped (S_y[k] → S_{-y}[k]).
    """
    c, n, L = config, num_samples, config.seq_len
    ks, kf = c.sparse_set_size, c.frequent_set_size
    y = torch.randint(0, 2, (n,), generator=generator) * 2 - 1
    order = torch.rand(n, L, generator=generator).argsort(dim=1)  # random positions per sequence
    sparse_pick = torch.randint(0, ks, (n, c.num_sparse), generator=generator)
    freq_pick = torch.randint(0, kf, (n, c.num_frequent), generator=generator)
    n_rest = L - c.num_sparse - c.num_frequent
    rest_pick = torch.randint(0, max(c.num_irrelevant_ids, 1), (n, n_rest), generator=generator)

    pos = (y > 0).long().unsqueeze(1)  # 1 for y = +1
    sparse_label = 1 - pos if ood else pos  # which label's sparse set is used
    sparse_tok = (1 - sparse_label) * ks + sparse_pick  # S_+ = [0, ks), S_- = [ks, 2ks)
    major = torch.arange(c.num_frequent).unsqueeze(0) < c.num_major  # slots drawn from F_y
    freq_label = torch.where(major, pos, 1 - pos)
    freq_tok = 2 * ks + (1 - freq_label) * kf + freq_pick
    rest_tok = 2 * ks + 2 * kf + rest_pick

    slot_tok = torch.cat([sparse_tok, freq_tok, rest_tok], dim=1)  # (n, L) in slot order
    slot_type = torch.tensor([1] * c.num_sparse + [2] * c.num_frequent + [0] * n_rest)
    ids = torch.empty_like(slot_tok).scatter_(1, order, slot_tok)
    types = torch.empty_like(slot_tok).scatter_(1, order, slot_type.expand(n, L).contiguous())
    # float32 as sparse_parity's and maxmargin_attention's y_pm: these were long, so
    # meta["y_pm"].mean() failed here alone and a dtype check on y_pm depended on the task
    return ids, types, y.float()


def _feature_predictions(ids: Tensor, config: SparseFrequentConfig) -> dict[str, Tensor]:
    """±1/0 predictions of the two ideal classifiers sign(#X_+ − #X_-), X = S or F (0 = tie)."""
    sets = config.token_sets()

    def count(name: str) -> Tensor:
        return torch.isin(ids, sets[name]).sum(dim=-1)

    return {
        "sparse": torch.sign(count("sparse+") - count("sparse-")),
        "frequent": torch.sign(count("frequent+") - count("frequent-")),
    }


def feature_sensitivities(
    config: SparseFrequentConfig, num_samples: int = 2000, seed: int = 0
) -> dict[str, float]:
    """Sensitivity of the ideal sparse and frequent classifiers, by Monte Carlo.

    For each classifier h ∈ {sign(#S_+ − #S_-), sign(#F_+ − #F_-)} this estimates
    P_{x, i, t}[h(x̃) ≠ h(x)], where x̃ is x with position i (uniform) replaced by token t (uniform
    over the vocabulary), the paper's replacement distribution for this task. A tie (h = 0) counts
    as a change. This is what makes a case "case 1" (sparse lower) or "case 2" (frequent lower).
    """
    # 0 samples gave NaN for both classifiers without a word
    num_samples = _check_count(num_samples, "num_samples", "feature_sensitivities",
                               "a number of sequences")
    g = _generator(seed, "validation")
    ids, _, _ = sparse_frequent_ids(config, num_samples, g)
    pos = torch.randint(0, config.seq_len, (num_samples,), generator=g)
    tok = torch.randint(0, config.vocab_size, (num_samples,), generator=g)
    flipped = ids.clone()
    flipped[torch.arange(num_samples), pos] = tok
    before, after = _feature_predictions(ids, config), _feature_predictions(flipped, config)
    return {k: (before[k] != after[k]).float().mean().item() for k in before}


def _check_case(case: object, setting: object) -> tuple[int, int]:
    """``(case, setting)`` as a key of :data:`SPARSE_FREQUENT_SETTINGS`, refused unless each is an
    int of the table: ``case=[1]`` failed with a raw "unhashable type: 'list'", and ``case=True``
    was read as case 1 (a bool is an int) and recorded as True in ``meta``, without a word."""
    picked = []
    for option, value, valid in (("case", case, (1, 2)), ("setting", setting, (0, 1, 2))):
        if isinstance(value, bool) or not isinstance(value, numbers.Integral) \
                or int(value) not in valid:
            raise ValueError(
                f"sparse_frequent: {option} must be one of {', '.join(map(str, valid))} (an int), "
                f"got {value!r}; case 1 (the sparse feature is the less sensitive one) or 2 (the "
                f"frequent one), setting 0, 1 or 2 pick a row of SPARSE_FREQUENT_SETTINGS, e.g. "
                f"case=1, setting=0")
        picked.append(int(value))
    return picked[0], picked[1]


@register_dataset("sparse_frequent")
def sparse_frequent(
    split: str = "train",
    root: Any = None,
    download: bool = False,
    case: int = 1,
    setting: int = 0,
    num_samples: int | None = None,
    seed: int = 0,
    **overrides: Any,
) -> ArrayDataset:
    """Sparse-vs-frequent task. ``case`` 1|2, ``setting`` 0|1|2 pick a row of
    :data:`SPARSE_FREQUENT_SETTINGS`; keyword ``overrides`` (any :class:`SparseFrequentConfig`
    field, e.g. ``seq_len=30``) replace its values. Splits "train", "test" and "ood" (the test
    sequences with sparse tokens drawn from the opposite label's set). Default sizes (ours):
    1,000 per split.

    Inputs (N, L, V) float one-hot; targets long {0, 1} (1 ⇔ y = +1). ``meta`` holds
    ``token_ids`` (N, L), ``token_type`` (N, L) with codes ``TOKEN_TYPES`` (0 irrelevant, 1 sparse,
    2 frequent), ``token_sets`` (ids of S_±, F_±, R), ``y_pm`` and the resolved ``config``.
    """
    del download  # generated, nothing to fetch
    locate("sparse_frequent", root)  # refuses a root
    seed = _check_seed(seed, name="sparse_frequent")
    _check_split("sparse_frequent", split, ("train", "test", "ood"))
    case, setting = _check_case(case, setting)
    fields = SparseFrequentConfig.__dataclass_fields__
    unknown = sorted(set(overrides) - set(fields))
    if unknown:
        raise TypeError(f"unknown sparse_frequent option(s) {unknown}; valid: {sorted(fields)}")
    config = replace(SPARSE_FREQUENT_SETTINGS[case, setting], **overrides)
    n = 1000 if num_samples is None else _check_count(num_samples, "num_samples",
                                                       "sparse_frequent")
    ids, types, y = sparse_frequent_ids(config, n, _generator(seed, split), ood=split == "ood")
    return ArrayDataset(
        inputs=F.one_hot(ids, config.vocab_size).float(),
        targets=_pm_to_target(y),
        num_classes=2,
        name="sparse_frequent",
        meta={
            "per_example": ("token_ids", "token_type", "y_pm"),
            "token_ids": ids,
            "token_type": types,
            "token_types": TOKEN_TYPES,
            "token_sets": config.token_sets(),
            "y_pm": y,
            "config": asdict(config),
            "case": case,
            "setting": setting,
        },
    )


# --------------------------------------------------------------------------- modular addition


@register_dataset("modular_addition")
def modular_addition(
    split: str = "train",
    root: Any = None,
    download: bool = False,
    p: int = 113,
    train_fraction: float = 0.3,
    seed: int = 0,
) -> ArrayDataset:
    """(a + b) mod p on all p² pairs (docs/definitions.md#modular-addition), as token sequences
    ``a b =`` with ``=`` = id p.

    A seeded permutation of the p² pairs puts the first ``round(train_fraction·p²)`` in "train"
    and the rest in "test". Inputs (N, 3) long, targets (N,) long in [0, p), num_classes = p;
    ``meta["vocab_size"] = p + 1``.
    """
    del download  # generated, nothing to fetch
    locate("modular_addition", root)  # refuses a root
    seed = _check_seed(seed, name="modular_addition")
    _check_split("modular_addition", split, ("train", "test"))
    # a float p (113.0) failed in torch.randperm with a raw TypeError
    if isinstance(p, bool) or not isinstance(p, numbers.Integral) or p < 2:
        raise ValueError(f"modular_addition: p must be an int ≥ 2 (the modulus), got {p!r}")
    p = int(p)
    # a string ("0.3") failed in the comparison with a raw TypeError
    if not 0.0 < _check_finite(train_fraction, "train_fraction", "modular_addition") < 1.0:
        raise ValueError(f"modular_addition: train_fraction must be in (0, 1) (the share of "
                         f"the p² pairs in 'train', e.g. 0.3), got {train_fraction}")
    n_train = round(train_fraction * p * p)
    if not 0 < n_train < p * p:
        # an empty split has no accuracy: a run would train on nothing or never "generalise"
        raise ValueError(
            f"train_fraction={train_fraction} of the {p * p:,} pairs of p={p} rounds to "
            f"{n_train:,} training pairs, which leaves the "
            f"{'train' if n_train == 0 else 'test'} split empty; use a train_fraction between "
            f"1/{p * p} and {p * p - 1}/{p * p}, or a larger p"
        )
    a, b = torch.cartesian_prod(torch.arange(p), torch.arange(p)).unbind(1)
    perm = torch.randperm(p * p, generator=_generator(seed, "shared"))
    index = perm[:n_train] if split == "train" else perm[n_train:]
    a, b = a[index], b[index]
    tokens = torch.stack([a, b, torch.full_like(a, p)], dim=1)
    return ArrayDataset(
        tokens, (a + b) % p, num_classes=p, name="modular_addition",
        meta={"p": p, "vocab_size": p + 1, "eq_token": p, "pair_index": index,
              "per_example": ("pair_index",)},
    )


# --------------------------------------------------------------------------- Boolean inputs


def _uniform_pm(n: int, bits: int, generator: torch.Generator) -> Tensor:
    """(n, bits) uniform ±1 floats."""
    return torch.randint(0, 2, (n, bits), generator=generator).float() * 2 - 1


def boolean_cube(n_bits: int) -> Tensor:
    """All 2ⁿ points of {±1}ⁿ: row i has x_j = +1 iff bit j of i is set (x_1 least significant)."""
    if not 1 <= n_bits <= 24:
        raise ValueError(f"the full cube needs 1 ≤ n_bits ≤ 24 (2ⁿ rows), got {n_bits}")
    i = torch.arange(2**n_bits).unsqueeze(1)
    return ((i >> torch.arange(n_bits)) & 1).float() * 2 - 1


def _cube_index(x: Tensor) -> Tensor:
    """Inverse of :func:`boolean_cube`: the row index of each ±1 point."""
    return ((x > 0).long() << torch.arange(x.shape[1])).sum(dim=1)


#: up to this many bits the strings a training split lacks are listed (2ⁿ flags)
_ENUMERABLE_BITS = 24


def _in_rows(x: Tensor, rows: Tensor) -> Tensor:
    """(N,) bool: which ±1 strings of ``x`` are also rows of ``rows``."""
    n_bits = x.shape[1]
    if n_bits <= 62:  # a cube index fits in a long
        return torch.isin(_cube_index(x), _cube_index(rows))

    def keys(t: Tensor) -> list[tuple[int, ...]]:
        chunks = [_cube_index(t[:, i:i + 62]) for i in range(0, n_bits, 62)]
        return list(map(tuple, torch.stack(chunks, dim=1).tolist()))

    seen = set(keys(rows))
    return torch.tensor([k in seen for k in keys(x)], dtype=torch.bool)


def _held_out(name: str, x: Tensor, train: Tensor, seed: int, size_option: str
              ) -> tuple[Tensor, Tensor]:
    """The test strings ``x`` with every string that the training split ``train`` holds too
    replaced by one drawn uniformly from the strings it lacks, and a per-row flag of the rows
    still in ``train`` (all False unless ``train`` holds every string, when a warning says so).

    Independent uniform draws repeat training strings as soon as 2ⁿ is not much larger than the
    training set (n = 10 bits and 2,000 training strings: 86% of the test rows), and the test
    accuracy then counts memorised strings as generalisation. Only clashing rows are redrawn,
    from a stream of their own, so a test split that held no training string is unchanged.
    """
    clash = _in_rows(x, train)
    if not clash.any():
        return x, clash
    n_bits, g, x = x.shape[1], _generator(seed, "redraw"), x.clone()
    if n_bits <= _ENUMERABLE_BITS:
        seen = torch.zeros(2**n_bits, dtype=torch.bool)
        seen[_cube_index(train)] = True
        unseen = (~seen).nonzero().squeeze(1)
        if len(unseen) == 0:
            warnings.warn(
                f"{name}: the {len(train):,} training strings hold all {2**n_bits:,} strings of "
                f"{n_bits} bits, so no test string can be held out: {int(clash.sum()):,} test "
                f"rows repeat training strings and the test accuracy is a training accuracy "
                f"(meta['in_train']); use more bits or a smaller {size_option}",
                UserWarning, stacklevel=4)
            return x, clash
        pick = unseen[torch.randint(0, len(unseen), (int(clash.sum()),), generator=g)]
        x[clash] = ((pick.unsqueeze(1) >> torch.arange(n_bits)) & 1).float() * 2 - 1
        return x, torch.zeros_like(clash)
    for _ in range(1000):  # above 24 bits a redraw clashes with probability < len(train) / 2²⁵
        x[clash] = _uniform_pm(int(clash.sum()), n_bits, g)
        clash = _in_rows(x, train)
        if not clash.any():
            return x, clash
    raise RuntimeError(f"{name}: 1,000 redraws of {n_bits}-bit test strings still hit the "
                       f"{len(train):,} training strings; use a smaller {size_option}")


@register_dataset("sparse_parity")
def sparse_parity(
    split: str = "train",
    root: Any = None,
    download: bool = False,
    n_bits: int = 20,
    k: int | None = None,
    subset: list[int] | tuple[int, ...] | None = None,
    train_size: int = 1000,
    test_size: int = 1000,
    seed: int = 0,
) -> ArrayDataset:
    """Sparse parity (main paper A.6): x uniform on {±1}ⁿ, y = Π_{i∈S} x_i with |S| = k.

    S is ``subset`` if given, else k distinct indices drawn from ``seed`` (shared by the splits);
    a ``k`` given with a ``subset`` of another size is refused (it was ignored). Defaults (n=20,
    k=3, 1,000 / 1,000) are ours. Inputs (N, n) float ±1; targets long {0, 1}
    (1 ⇔ y = +1); ``meta["subset"]`` is S (sorted), ``meta["y_pm"]`` the ±1 labels.

    "test" holds out the training strings: a test string that the "train" split of the same
    options holds too is replaced by one drawn uniformly from the strings "train" lacks, so the
    test accuracy measures generalisation, not memory (with few bits independent draws repeat
    most training strings). ``meta["in_train"]`` flags test rows still in "train": none, unless
    "train" holds all 2ⁿ strings (then with a warning).
    """
    del download  # generated, nothing to fetch
    locate("sparse_parity", root)  # refuses a root
    seed = _check_seed(seed, name="sparse_parity")
    _check_split("sparse_parity", split, ("train", "test"))
    n_bits = _check_bits(n_bits, "sparse_parity")
    if subset is None:
        # True read as k = 1 (the parity of one bit) and 2.0 failed in a slice with a TypeError
        k = 3 if k is None else _check_count(k, "k", "sparse_parity", "the number of bits in S")
        if not 1 <= k <= n_bits:
            raise ValueError(f"k must be in [1, n_bits={n_bits}], got {k}")
        s = torch.randperm(n_bits, generator=_generator(seed, "shared"))[:k]
    else:
        # a bare index (subset=5) failed in list() with a raw "'int' object is not iterable"
        iterable = not isinstance(subset, (str, bytes)) and hasattr(subset, "__iter__") \
            and getattr(subset, "ndim", 1) != 0
        entries = list(subset) if iterable else [subset]
        picked = [whole_number(i) for i in entries]
        if any(i is None for i in picked) or not iterable:
            # the long conversion cut 1.7 to 1 and read True as 1: the parity of other bits
            raise ValueError(
                f"sparse_parity: subset must be a list of whole bit indices in [0, {n_bits}), "
                f"got {subset!r}; pass a list of ints, e.g. subset=[0, 1, 3] (subset=[i] for "
                f"the one bit i)")
        s = torch.tensor(picked, dtype=torch.long)
        if s.numel() == 0 or s.unique().numel() != s.numel() or s.min() < 0 or s.max() >= n_bits:
            raise ValueError(
                f"subset must be distinct indices in [0, {n_bits}), got {list(subset)}"
            )
        if k is not None and k != s.numel():
            raise ValueError(
                f"sparse_parity: k={k!r} and subset={list(subset)} ({s.numel()} bits) disagree: "
                f"S is the subset given, so k is not used; drop k, or pass k={s.numel()}")
    s = s.sort().values
    train_size = _check_count(train_size, "train_size", "sparse_parity")
    test_size = _check_count(test_size, "test_size", "sparse_parity")
    n = train_size if split == "train" else test_size
    x = _uniform_pm(n, n_bits, _generator(seed, split))
    meta: dict[str, Any] = {"subset": s.tolist(), "n_bits": n_bits, "per_example": ("y_pm",)}
    if split == "test":
        train_x = _uniform_pm(train_size, n_bits, _generator(seed, "train"))
        x, meta["in_train"] = _held_out("sparse_parity", x, train_x, seed, "train_size")
        meta["per_example"] = ("y_pm", "in_train")
    y = x[:, s].prod(dim=1)
    meta["y_pm"] = y
    return ArrayDataset(x, _pm_to_target(y), num_classes=2, name="sparse_parity", meta=meta)


def _parity(x: Tensor) -> Tensor:
    """1 iff an odd number of +1's (the companion code's "number of ones mod 2")."""
    return ((x > 0).sum(dim=1) % 2).float()


def _majority(x: Tensor) -> Tensor:
    """1 iff strictly more +1's than −1's (ties → 0,
    docs/definitions.md#reference-boolean-functions)."""
    return ((x > 0).sum(dim=1) * 2 > x.shape[1]).float()


def _first(x: Tensor) -> Tensor:
    return (x[:, 0] > 0).float()


def _mean(x: Tensor) -> Tensor:
    """Fraction of +1's, in [0, 1]; one flip moves it by 1/n, so as = n·(1/n)² = 1/n."""
    return (x > 0).float().mean(dim=1)


BOOLEAN_FUNCTIONS: dict[str, Callable[[Tensor], Tensor]] = {
    "parity": _parity, "majority": _majority, "first": _first, "mean": _mean,
}


def _check_sampling_options(sampling: str, size: int | None, train_size: int | None) -> None:
    """Refuse a ``size`` or ``train_size`` of :func:`boolean` that its ``sampling`` does not use
    (None: not given): "fresh" draws ``size`` strings per split, "subset" takes ``train_size``
    points of the cube, "cube" all of it. An option that changes nothing was ignored without a
    word (``train_size=128`` with "fresh" trained on 1,024 strings)."""
    uses = {"fresh": "size", "subset": "train_size", "cube": None}[sampling]
    for option, value in (("size", size), ("train_size", train_size)):
        if value is None or option == uses:
            continue
        if sampling == "fresh":
            why = (f"which draws size strings (default 1,024) for each split: pass size={value!r} "
                   f"for {value!r} fresh strings per split, or sampling='subset' to train on "
                   f"{value!r} points of the cube")
        elif sampling == "subset":
            why = ("which trains on train_size points of the cube and tests on all the others: "
                   "drop size (train_size sets the split), or use sampling='fresh' with size")
        else:
            why = ("which holds all 2ⁿ strings in each split: drop it, or use sampling='fresh' "
                   "(size) or 'subset' (train_size)")
        raise ValueError(f"boolean: {option}={value!r} does not apply to sampling={sampling!r}, "
                         f"{why}")


@register_dataset("boolean")
def boolean(
    split: str = "train",
    root: Any = None,
    download: bool = False,
    function: str = "parity",
    n_bits: int = 10,
    sampling: str = "fresh",
    size: int | None = None,
    train_size: int | None = None,
    seed: int = 0,
    function_seed: int | None = None,
) -> ArrayDataset:
    """Boolean-function tasks of Hahn & Rofin (docs/definitions.md#boolean-tasks) on x ∈ {±1}ⁿ
    (float ±1).

    ``function``: "parity", "majority", "first", "mean" or "random" (a uniformly random table
    drawn from ``function_seed``, default ``seed``; refused with the other functions). Targets
    are float: {0, 1} for the Boolean
    functions (MSE to {0, 1}, as in Hahn & Rofin), the fraction of +1 bits for "mean"
    (num_classes = 1 then, a scalar regression). PARITY is 1 iff the number of +1 bits is odd: for
    even n that is ∏xᵢ = −1, the opposite of :func:`sparse_parity`'s target with S = all bits.
    MAJORITY is 1 iff strictly more bits are +1 (ties → 0), so for even n fewer than half the
    strings are 1 (37.7% at n = 10) and a constant 0 already scores 62% accuracy.

    ``sampling``: "fresh" — ``size`` uniform strings (default 1,024), a new stream per split, the
    "test" strings that "train" holds too redrawn from the strings it lacks (``meta["in_train"]``
    flags any left, which happens only when "train" holds all 2ⁿ, with a warning); "cube" — all
    2ⁿ points (any split); "subset" — a seeded ``train_size`` points of the cube (default 256)
    are "train", the other 2ⁿ − train_size are "test" (experiment (4): 128/256/512 of 1,024 for
    n = 10). ``size`` and ``train_size`` are each refused where the sampling does not use them:
    ``train_size=128`` with "fresh" trained on 1,024 strings without a word.
    ``meta["index"]`` is each row's cube index (:func:`boolean_cube` order; absent above 62 bits,
    where it does not fit a long) and, where the cube is enumerable, ``meta["table"]`` the
    targets of all 2ⁿ points.
    """
    del download  # generated, nothing to fetch
    locate("boolean", root)  # refuses a root
    if function not in (*BOOLEAN_FUNCTIONS, "random"):
        raise ValueError(f"unknown function {function!r}; use one of "
                         f"{', '.join(map(repr, [*BOOLEAN_FUNCTIONS, 'random']))}")
    if sampling not in ("fresh", "cube", "subset"):
        raise ValueError(f"sampling must be 'fresh', 'cube' or 'subset', got {sampling!r}")
    _check_split("boolean", split, ("train", "test"))
    n_bits = _check_bits(n_bits, "boolean")
    seed = _check_seed(seed, name="boolean")
    if function_seed is not None:
        function_seed = _check_seed(function_seed, "function_seed", "boolean")
        if function != "random":
            raise ValueError(f"boolean: function_seed seeds a random table, and "
                             f"function={function!r} has none (it changed nothing); remove it, "
                             "or use function='random'")
    _check_sampling_options(sampling, size, train_size)
    size = 1024 if size is None else _check_count(size, "size", "boolean")
    train_size = 256 if train_size is None else _check_count(train_size, "train_size", "boolean")

    table = None
    if function == "random" or sampling != "fresh":
        if n_bits > 24:  # boolean_cube's own refusal named neither the option nor a way out
            needs = (f"sampling={sampling!r}" if sampling != "fresh"
                     else "function='random' (a table of all 2ⁿ targets)")
            raise ValueError(
                f"boolean: {needs} enumerates all 2^{n_bits} strings of the cube, which is "
                f"only done up to n_bits=24; use n_bits ≤ 24, or sampling='fresh' with "
                f"function 'parity', 'majority', 'first' or 'mean' for more bits")
        cube = boolean_cube(n_bits)
        if function == "random":
            fs = seed if function_seed is None else function_seed
            table = torch.randint(0, 2, (2**n_bits,), generator=_generator(fs, "shared")).float()
        else:
            table = BOOLEAN_FUNCTIONS[function](cube)

    held: dict[str, Any] = {}
    if sampling == "fresh":
        x = _uniform_pm(size, n_bits, _generator(seed, split))
        if split == "test":
            train_x = _uniform_pm(size, n_bits, _generator(seed, "train"))
            x, held["in_train"] = _held_out("boolean", x, train_x, seed, "size")
        # no index above 62 bits rather than a wrong one (it was 0 for every row)
        index = _cube_index(x) if n_bits <= 62 else None
    elif sampling == "cube":
        x, index = cube, torch.arange(2**n_bits)
    else:
        if not 0 < train_size < 2**n_bits:
            raise ValueError(f"train_size must be in (0, 2^{n_bits}={2**n_bits}), got {train_size}")
        perm = torch.randperm(2**n_bits, generator=_generator(seed, "train"))
        index = perm[:train_size] if split == "train" else perm[train_size:]
        index = index.sort().values
        x = cube[index]
    y = table[index] if table is not None else BOOLEAN_FUNCTIONS[function](x)
    meta: dict[str, Any] = {"function": function, "n_bits": n_bits, "sampling": sampling}
    if index is not None:
        meta["index"] = index
    meta.update(held)
    meta["per_example"] = tuple(k for k in ("index", "in_train") if k in meta)
    if table is not None:
        meta["table"] = table
    return ArrayDataset(x, y, num_classes=1 if function == "mean" else 2, name="boolean",
                        meta=meta)


# --------------------------------------------------------------------------- max-margin attention


@register_dataset("maxmargin_attention")
def maxmargin_attention(
    split: str = "train",
    root: Any = None,
    download: bool = False,
    num_samples: int = 32,
    seq_len: int = 8,
    dim: int = 32,
    opt_score: float = 1.0,
    other_score_frac: float = 0.5,
    query_signal: float = 0.0,
    seed: int = 0,
) -> ArrayDataset:
    """Data for Φ(X) = vᵀ Xᵀ softmax(X W x₁) (Vasudeva et al.;
    docs/definitions.md#max-margin-attention-data), construction ours.

    A unit vector v (shared by the splits) fixes the token scores γ_it = y_i vᵀ x_it. Tokens start
    as N(0, I/d) (norm ≈ 1), then their component along v is replaced: the optimal token
    (position opt_i, uniform over 1..T−1, never the query x_1 at position 0) gets y_i·opt_score·v,
    every other token (the query included) c·v with c uniform in ±other_score_frac·opt_score.
    So γ_{i,opt} = opt_score and every other γ_it ≤ other_score_frac·opt_score: the optimal token
    is unique with a gap of at least (1 − other_score_frac)·opt_score.

    W_mm needs some W with (x_opt − x_t)ᵀ W x_1 ≥ 1; W = v uᵀ works when the queries are linearly
    separable by label along u, which random queries are (almost surely) when N ≤ d — the default
    N = d = 32. ``query_signal`` b > 0 adds y_i·b·u (u ⟂ v) to the query and makes this hold for
    any N. Inputs (N, T, d) float; targets long {0, 1} (1 ⇔ y = +1, logistic loss via BCE);
    ``meta``: ``v`` (d,), ``u`` (d,), ``opt`` (N,), ``gamma`` (N, T), ``y_pm`` (N,).
    """
    del download  # generated, nothing to fetch
    locate("maxmargin_attention", root)  # refuses a root
    seed = _check_seed(seed, name="maxmargin_attention")
    _check_split("maxmargin_attention", split, ("train", "test"))
    for option, value in (("seq_len", seq_len), ("dim", dim)):
        _check_count(value, option, "maxmargin_attention", "a size")
    # a NaN or infinite score made every token (a query signal: every query) NaN without a word
    for option, value in (("opt_score", opt_score), ("other_score_frac", other_score_frac),
                          ("query_signal", query_signal)):
        _check_finite(value, option, "maxmargin_attention")
    if seq_len < 2 or dim < 2:
        raise ValueError(
            f"need seq_len ≥ 2 (a query and a token) and dim ≥ 2; got {seq_len}, {dim}"
        )
    if not 0.0 <= other_score_frac < 1.0 or opt_score <= 0:
        raise ValueError("need opt_score > 0 and 0 ≤ other_score_frac < 1 for a unique optimum")
    shared = _generator(seed, "shared")
    v = torch.randn(dim, generator=shared)
    v = v / v.norm()
    u = torch.randn(dim, generator=shared)
    u = u - (u @ v) * v
    u = u / u.norm()

    g = _generator(seed, split)
    n, T = _check_count(num_samples, "num_samples", "maxmargin_attention"), seq_len
    y = (torch.randint(0, 2, (n,), generator=g) * 2 - 1).float()
    x = torch.randn(n, T, dim, generator=g) / math.sqrt(dim)
    opt = torch.randint(1, T, (n,), generator=g)
    c = (torch.rand(n, T, generator=g) * 2 - 1) * other_score_frac * opt_score
    c[torch.arange(n), opt] = y * opt_score
    x = x - (x @ v).unsqueeze(-1) * v + c.unsqueeze(-1) * v  # set each token's v-component to c
    x[:, 0] += query_signal * y.unsqueeze(1) * u
    gamma = y.unsqueeze(1) * (x @ v)
    return ArrayDataset(
        x, _pm_to_target(y), num_classes=2, name="maxmargin_attention",
        meta={"v": v, "u": u, "opt": opt, "gamma": gamma, "y_pm": y,
              "per_example": ("opt", "gamma", "y_pm")},
    )


# --------------------------------------------------------------------------- what the sets hold

#: what each generated set's inputs are, so that a model can be matched to them before anything
#: is generated: "bits" (N, n) float ±1; "ids" the (N, 3) long token ids ``a b =``; "vectors"
#: (N, L, d) float token vectors (one-hot for sparse_frequent)
INPUTS = {"boolean": "bits", "sparse_parity": "bits", "modular_addition": "ids",
          "sparse_frequent": "vectors", "maxmargin_attention": "vectors"}


def input_size(name: str, options: Mapping[str, Any]) -> int | None:
    """The size of generated set ``name``'s inputs with loader ``options``, without generating
    it: the number of bits n (boolean, sparse_parity), p (modular_addition: a, b < p and ``=`` is
    id p), the length d of a token vector (sparse_frequent: its vocab_size; maxmargin_attention:
    dim). None for another name, or options the loader refuses itself."""
    loaders: dict[str, Callable[..., ArrayDataset]] = {
        "boolean": boolean, "sparse_parity": sparse_parity, "modular_addition": modular_addition,
        "sparse_frequent": sparse_frequent, "maxmargin_attention": maxmargin_attention}
    if name not in loaders:
        return None
    defaults = {k: p.default for k, p in inspect.signature(loaders[name]).parameters.items()}
    given = {**defaults, **options}
    try:
        if name == "sparse_frequent":
            size = given.get("vocab_size", SPARSE_FREQUENT_SETTINGS[
                _check_case(given["case"], given["setting"])].vocab_size)
        else:
            size = given[{"modular_addition": "p", "maxmargin_attention": "dim"}.get(name,
                                                                                     "n_bits")]
    except (KeyError, TypeError, ValueError):  # an unknown case/setting, an unhashable value
        return None
    return size if isinstance(size, int) and not isinstance(size, bool) else None
