"""Audit 80, generated tasks and their trainers: seeds that alias another seed's data, options
read wrongly or failing with raw tracebacks, NaN data without a word, and grokking config ranges
wider than what the run accepts."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch

from senslab.data import create_dataset
from senslab.data.synthetic import (
    SPARSE_FREQUENT_SETTINGS,
    feature_sensitivities,
    maxmargin_attention,
    modular_addition,
    sparse_frequent,
    sparse_frequent_ids,
    sparse_parity,
)
from senslab.train.config import validate
from senslab.train.loops.grokking import GrokkingRun


@pytest.mark.parametrize("name, options", [
    ("sparse_parity", {"n_bits": 12, "train_size": 50, "test_size": 50}),
    ("modular_addition", {"p": 7}),
    ("sparse_frequent", {"num_samples": 20}),
    ("boolean", {"n_bits": 6, "size": 20}),
    ("maxmargin_attention", {"num_samples": 8}),
])
@pytest.mark.parametrize("seed", [2**32 + 1, -1])
def test_a_seed_outside_32_bits_is_refused_not_aliased(name: str, options: dict, seed: int
                                                       ) -> None:
    # seed 2**32 + 1 gave exactly seed 1's data: torch's CPU generator keeps the low 32 bits
    with pytest.raises(ValueError, match=r"outside \[0, 2\*\*32"):
        create_dataset(name, "train", seed=seed, **options)
    top = create_dataset(name, "train", seed=2**32 - 1, **options)  # the last seed still runs
    assert not torch.equal(top.inputs, create_dataset(name, "train", seed=0, **options).inputs)


def test_boolean_function_seed_outside_32_bits_is_refused() -> None:
    with pytest.raises(ValueError, match=r"function_seed=4294967296 is outside"):
        create_dataset("boolean", function="random", n_bits=4, sampling="cube",
                       function_seed=2**32)


@pytest.mark.parametrize("k", [True, 2.0, 0])
def test_sparse_parity_k_must_be_a_whole_count(k: object) -> None:
    # k=True trained on the parity of one bit; k=2.0 failed in a slice with a raw TypeError
    with pytest.raises(ValueError, match="k must be an int ≥ 1"):
        sparse_parity(n_bits=10, k=k, seed=0)
    assert len(sparse_parity(n_bits=10, k=2, seed=0).meta["subset"]) == 2


@pytest.mark.parametrize("p", [11.0, 11.5, "11", True])
def test_modular_addition_p_must_be_an_int(p: object) -> None:
    with pytest.raises(ValueError, match=r"p must be an int ≥ 2 \(the modulus\)"):
        modular_addition(p=p)


@pytest.mark.parametrize("option, value, message", [
    ("lam", True, "lam must be a finite number"),  # was read as lam = 1 (case 2's margin)
    ("lam", math.nan, "lam must be a finite number"),  # was "cannot convert float NaN"
    ("num_sparse", 2.0, "num_sparse must be an int"),  # raw TypeError in torch.randint
    ("seq_len", 20.5, "seq_len must be an int"),
    ("frequent_set_size", 4.0, "frequent_set_size must be an int"),
])
def test_sparse_frequent_options_of_the_wrong_kind_are_refused(option: str, value: object,
                                                               message: str) -> None:
    with pytest.raises(ValueError, match=message):
        sparse_frequent(seed=0, num_samples=10, **{option: value})


def test_feature_sensitivities_of_no_samples_is_refused_not_nan() -> None:
    config = SPARSE_FREQUENT_SETTINGS[1, 0]
    with pytest.raises(ValueError, match="num_samples must be an int ≥ 1"):
        feature_sensitivities(config, num_samples=0)  # was {'sparse': nan, 'frequent': nan}
    sens = feature_sensitivities(config, num_samples=200, seed=0)
    assert sens["sparse"] < sens["frequent"]  # case 1


@pytest.mark.parametrize("option, value", [
    ("opt_score", math.nan), ("opt_score", math.inf), ("query_signal", math.nan),
    ("other_score_frac", math.inf), ("seq_len", 4.0), ("dim", 8.0),
])
def test_maxmargin_attention_refuses_values_that_made_nan_data(option: str, value: object
                                                                ) -> None:
    # opt_score=nan made all 8,192 input entries NaN without a word
    with pytest.raises(ValueError, match=f"{option} must be"):
        maxmargin_attention(seed=0, **{option: value})
    assert maxmargin_attention(seed=0, query_signal=0.5).inputs.isfinite().all()


@pytest.mark.parametrize("option, value", [("train_fraction", 1.0), ("sigma", 0.0)])
def test_grokking_config_refuses_what_the_run_would_refuse(option: str, value: float) -> None:
    # both passed validation and failed only when the run built its data / first measured
    cfg = dataclasses.replace(GrokkingRun(), **{option: value})
    with pytest.raises(ValueError, match=option):
        validate(cfg)
    validate(dataclasses.replace(GrokkingRun(), **{option: 0.5}))


def test_sparse_frequent_counts_and_positions_match_the_documented_design() -> None:
    """Every sequence holds s tokens of S_y, round(λf) of F_y, f − round(λf) of F_-y, the rest
    from R; the sparse positions are uniform; labels are balanced; OOD swaps only the sparse
    tokens (a guard for the generator, which the audit found right)."""
    config = SPARSE_FREQUENT_SETTINGS[1, 2]
    ids, types, y = sparse_frequent_ids(config, 4000, torch.Generator().manual_seed(1))
    sets = config.token_sets()
    count = {k: torch.isin(ids, v).sum(1) for k, v in sets.items()}
    pos = y > 0
    f, major = config.num_frequent, config.num_major
    assert (count["sparse+"][pos] == config.num_sparse).all()
    assert (count["sparse-"][~pos] == config.num_sparse).all()
    for label, own, other in ((pos, "frequent+", "frequent-"), (~pos, "frequent-", "frequent+")):
        assert (count[own][label] == major).all() and (count[other][label] == f - major).all()
    assert (count["irrelevant"] == config.seq_len - config.num_sparse - f).all()
    assert abs(pos.float().mean().item() - 0.5) < 0.03
    share = (types == 1).float().mean(0)  # each position holds a sparse token s/L of the time
    assert (share - config.num_sparse / config.seq_len).abs().max() < 0.025
    ood, _, y_ood = sparse_frequent_ids(config, 4000, torch.Generator().manual_seed(1), ood=True)
    assert torch.equal(y, y_ood) and torch.equal(ids != ood, types == 1)


def test_generated_data_ignores_the_global_random_state() -> None:
    torch.manual_seed(0)
    a = create_dataset("sparse_frequent", "train", num_samples=30, seed=3).inputs
    torch.manual_seed(12345)
    torch.rand(100)
    b = create_dataset("sparse_frequent", "train", num_samples=30, seed=3).inputs
    assert torch.equal(a, b)
    train = modular_addition("train", p=11, seed=3).meta["pair_index"]
    test = modular_addition("test", p=11, seed=3).meta["pair_index"]
    assert len(train) == round(0.3 * 121) and not set(train.tolist()) & set(test.tolist())
