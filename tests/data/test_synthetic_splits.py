"""Generated data checked against brute force: held-out test strings, labels, empty splits, the
metadata a subset cuts with its examples."""

from __future__ import annotations

import itertools
import math
import warnings

import pytest
import torch

from senslab.data import create_dataset
from senslab.data.base import ArrayDataset
from senslab.data.synthetic import SparseFrequentConfig


def _rows(x: torch.Tensor) -> list[tuple[int, ...]]:
    return [tuple(int(v) for v in r) for r in x.tolist()]


# --------------------------------------------------------------------------- held-out test strings


def test_sparse_parity_test_strings_are_not_training_strings() -> None:
    """At the experiment's cpu scale (n = 10, 2,000 / 1,000) independent draws put 86% of the
    test rows among the training strings: test accuracy counted memory as generalisation."""
    opts = dict(n_bits=10, k=3, train_size=2000, test_size=1000, seed=0)
    train = create_dataset("sparse_parity", "train", **opts)
    test = create_dataset("sparse_parity", "test", **opts)
    seen = set(_rows(train.inputs))
    held = _rows(test.inputs)
    assert len(test) == 1000 and not [r for r in held if r in seen]
    assert not test.meta["in_train"].any()
    # drawn from the strings "train" lacks: (almost) all of them turn up in 1,000 draws
    unseen = set(itertools.product((-1, 1), repeat=10)) - seen
    assert set(held) <= unseen and len(set(held)) >= 0.9 * len(unseen)
    # labels: the product over S, by hand
    s = test.meta["subset"]
    want = [int(math.prod(r[i] for i in s) > 0) for r in held]
    assert test.targets.tolist() == want and test.targets.dtype == torch.long
    assert train.meta["subset"] == s  # one function for both splits


def test_a_test_split_without_clashes_is_unchanged() -> None:
    """Only clashing rows are redrawn: at n = 20 the test split is the plain uniform draw but
    for the rows that were training strings."""
    from senslab.data.synthetic import _generator, _uniform_pm

    opts = dict(n_bits=20, k=3, train_size=3000, test_size=3000, seed=1)
    train = create_dataset("sparse_parity", "train", **opts)
    test = create_dataset("sparse_parity", "test", **opts)
    raw = _uniform_pm(3000, 20, _generator(1, "test"))
    seen = set(_rows(train.inputs))
    clash = torch.tensor([r in seen for r in _rows(raw)])
    assert 0 < clash.sum() < 30  # ≈ 3000² / 2²⁰ ≈ 8.6 clashes expected
    assert torch.equal(test.inputs[~clash], raw[~clash])
    assert not {r for r in _rows(test.inputs)} & seen


@pytest.mark.parametrize("function", ["majority", "parity", "first", "random"])
def test_boolean_fresh_test_strings_are_held_out_and_labelled_right(function: str) -> None:
    opts = dict(function=function, n_bits=8, size=300, seed=4)
    train = create_dataset("boolean", "train", **opts)
    test = create_dataset("boolean", "test", **opts)
    assert not set(_rows(train.inputs)) & set(_rows(test.inputs))
    assert not test.meta["in_train"].any() and "in_train" in test.meta["per_example"]
    index = [sum(1 << j for j, v in enumerate(r) if v > 0) for r in _rows(test.inputs)]
    assert test.meta["index"].tolist() == index
    for r, i, t in zip(_rows(test.inputs), index, test.targets.tolist(), strict=True):
        ones = sum(v > 0 for v in r)
        want = {"majority": float(2 * ones > 8), "parity": float(ones % 2),
                "first": float(r[0] > 0)}.get(function)
        if want is None:  # the random table is the one "train" uses, read at the string's index
            want = train.meta["table"][i].item()
        assert t == want
    assert test.targets.dtype == torch.float32


def test_a_training_split_holding_every_string_is_said_and_flagged() -> None:
    """No string can be held out: the test rows stay (they are flagged) and a warning names the
    cause and the fix."""
    with pytest.warns(UserWarning, match=r"hold all 8 strings of 3 bits.*training accuracy.*"
                                         r"smaller train_size"):
        test = create_dataset("sparse_parity", "test", n_bits=3, k=2, train_size=100,
                              test_size=20, seed=0)
    assert len(test) == 20 and test.meta["in_train"].all()
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a held-out split is made without a word
        create_dataset("sparse_parity", "test", n_bits=3, k=2, train_size=4, test_size=20)


def test_more_than_62_bits_have_no_wrong_cube_index() -> None:
    """Above 62 bits the cube index does not fit a long: it was 0 on every row."""
    train = create_dataset("boolean", "train", function="parity", n_bits=70, size=6, seed=2)
    test = create_dataset("boolean", "test", function="parity", n_bits=70, size=6, seed=2)
    for d in (train, test):
        assert "index" not in d.meta and "index" not in d.meta["per_example"]
        assert d.targets.tolist() == [float(sum(v > 0 for v in r) % 2) for r in _rows(d.inputs)]
    assert test.first(3).meta["in_train"].shape == (3,)


def test_row_membership_above_62_bits_matches_brute_force() -> None:
    from senslab.data.synthetic import _in_rows

    g = torch.Generator().manual_seed(0)
    train = torch.randint(0, 2, (20, 130), generator=g).float() * 2 - 1
    x = torch.randint(0, 2, (10, 130), generator=g).float() * 2 - 1
    x[[1, 4, 7]] = train[[3, 0, 19]]
    x[8] = train[5].clone()
    x[8, 129] *= -1  # differs in the last bit only: not a training string
    seen = set(_rows(train))
    assert _in_rows(x, train).tolist() == [r in seen for r in _rows(x)]
    assert _in_rows(x, train).nonzero().squeeze(1).tolist() == [1, 4, 7]


# --------------------------------------------------------------------------- modular addition


@pytest.mark.parametrize(("p", "fraction", "empty"),
                         [(2, 0.1, "train"), (2, 0.9, "test"), (113, 1e-5, "train"),
                          (5, 0.99, "test")])
def test_modular_addition_refuses_a_fraction_that_empties_a_split(p, fraction, empty) -> None:
    """round(train_fraction·p²) of 0 or p² gave an empty split without a word (p = 5,
    train_fraction = 0.99: 25 training pairs, 0 test pairs)."""
    for split in ("train", "test"):
        with pytest.raises(ValueError, match=rf"leaves the {empty} split empty; use a "
                                             rf"train_fraction between 1/{p * p} and "
                                             rf"{p * p - 1}/{p * p}"):
            create_dataset("modular_addition", split, p=p, train_fraction=fraction)


def test_modular_addition_at_the_bounds_and_by_brute_force() -> None:
    p = 5
    one = create_dataset("modular_addition", "train", p=p, train_fraction=1 / 25)
    assert len(one) == 1
    train = create_dataset("modular_addition", "train", p=p, train_fraction=24 / 25, seed=3)
    test = create_dataset("modular_addition", "test", p=p, train_fraction=24 / 25, seed=3)
    assert (len(train), len(test)) == (24, 1)
    pairs = _rows(train.inputs) + _rows(test.inputs)
    assert sorted(pairs) == [(a, b, p) for a in range(p) for b in range(p)]
    targets = train.targets.tolist() + test.targets.tolist()
    assert targets == [(a + b) % p for a, b, _ in pairs]
    assert train.inputs.dtype == train.targets.dtype == torch.long


# --------------------------------------------------------------------------- labels, seeds, vocab


def test_majority_of_an_even_number_of_bits_breaks_ties_to_zero() -> None:
    d = create_dataset("boolean", "train", function="majority", n_bits=6, sampling="cube")
    for r, t in zip(_rows(d.inputs), d.targets.tolist(), strict=True):
        assert t == float(sum(r) > 0)
    # the docstring's imbalance: C(10, 6..10) / 2¹⁰ = 386 / 1024 strings are 1
    ten = create_dataset("boolean", "train", function="majority", n_bits=10, sampling="cube")
    assert ten.targets.sum().item() == 210 + 120 + 45 + 10 + 1


def test_the_seed_changes_the_parity_subset_and_the_strings() -> None:
    subsets = {tuple(create_dataset("sparse_parity", "train", n_bits=20, k=3, train_size=4,
                                    seed=s).meta["subset"]) for s in range(6)}
    assert len(subsets) > 1
    a, b = (create_dataset("sparse_parity", "test", n_bits=20, test_size=50, seed=s)
            for s in (0, 1))
    assert not torch.equal(a.inputs, b.inputs)


def test_a_vocabulary_too_small_for_the_feature_tokens_is_refused() -> None:
    """With no irrelevant positions the check was skipped and one_hot failed later with
    "Class values must be smaller than num_classes"."""
    with pytest.raises(ValueError, match=r"vocab_size=8 is too small.*need at least 10"):
        SparseFrequentConfig(vocab_size=8, seq_len=10, num_sparse=1, num_frequent=9)
    ok = SparseFrequentConfig(vocab_size=10, seq_len=10, num_sparse=1, num_frequent=9)
    assert ok.num_irrelevant_ids == 0
    d = create_dataset("sparse_frequent", "train", vocab_size=10, seq_len=10, num_sparse=1,
                       num_frequent=9, num_samples=5)
    assert d.inputs.shape == (5, 10, 10)


# --------------------------------------------------------------------------- per-example metadata


def test_per_example_metadata_of_another_length_is_refused() -> None:
    """A per-example entry with its own row count was cut by subset() at the same positions as
    the examples: each example got another one's metadata, or a silently short list."""
    x, y = torch.zeros(4, 2), torch.arange(4)
    with pytest.raises(ValueError, match=r"meta\['tag'\] is listed in meta\['per_example'\] "
                                         r"but has 5 rows for 4 examples"):
        ArrayDataset(x, y, 4, "toy", {"tag": torch.arange(5), "per_example": ("tag",)})
    with pytest.raises(ValueError, match=r"lists 'tag', which meta lacks"):
        ArrayDataset(x, y, 4, "toy", {"per_example": ("tag",)})
    with pytest.raises(ValueError, match="has None rows"):
        ArrayDataset(x, y, 4, "toy", {"tag": torch.tensor(3), "per_example": ("tag",)})
    ok = ArrayDataset(x, y, 4, "toy", {"tag": torch.arange(4) * 10, "words": list("abcd"),
                                       "per_example": ("tag", "words")})
    part = ok.subset(slice(1, 3))
    assert part.meta["tag"].tolist() == [10, 20] and part.meta["words"] == ["b", "c"]
    picked = ok.subset(torch.tensor([3, 0]))
    assert picked.meta["tag"].tolist() == [30, 0] and picked.targets.tolist() == [3, 0]
    assert picked.meta["words"] == ["d", "a"]
    masked = ok.subset(torch.tensor([True, False, False, True]))
    assert masked.meta["words"] == ["a", "d"] and masked.meta["tag"].tolist() == [0, 30]


def test_a_random_first_cuts_the_test_flags_with_the_examples() -> None:
    full = create_dataset("sparse_parity", "test", n_bits=12, train_size=500, test_size=40)
    g = torch.Generator().manual_seed(3)
    part = full.first(9, generator=g)
    order = torch.randperm(40, generator=torch.Generator().manual_seed(3))[:9]
    assert torch.equal(part.inputs, full.inputs[order])
    assert torch.equal(part.meta["y_pm"], part.inputs[:, full.meta["subset"]].prod(1))
    assert torch.equal(part.meta["in_train"], full.meta["in_train"][order])
