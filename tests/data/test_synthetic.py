"""Generated tasks: determinism, shapes, label definitions, splits."""

from __future__ import annotations

import itertools

import pytest
import torch

from senslab.data import create_dataset
from senslab.data.synthetic import (
    SPARSE_FREQUENT_SETTINGS,
    SparseFrequentConfig,
    boolean_cube,
    feature_sensitivities,
)

GENERATED = ["sparse_frequent", "modular_addition", "sparse_parity", "boolean",
             "maxmargin_attention"]


@pytest.mark.parametrize("name", GENERATED)
def test_same_seed_same_data_other_seed_other_data(name: str) -> None:
    a = create_dataset(name, split="train", seed=3)
    b = create_dataset(name, split="train", seed=3)
    c = create_dataset(name, split="train", seed=4)
    assert torch.equal(a.inputs, b.inputs) and torch.equal(a.targets, b.targets)
    assert not torch.equal(a.inputs, c.inputs)


# --------------------------------------------------------------------------- sparse vs frequent


def test_sparse_frequent_shapes_labels_and_token_layout() -> None:
    d = create_dataset("sparse_frequent", split="train", case=1, setting=0, num_samples=500)
    cfg = SparseFrequentConfig(**d.meta["config"])
    assert d.inputs.shape == (500, cfg.seq_len, cfg.vocab_size)
    assert torch.equal(d.inputs.sum(-1), torch.ones(500, cfg.seq_len))  # one-hot
    assert torch.equal(d.inputs.argmax(-1), d.meta["token_ids"])
    assert 0.4 < d.targets.float().mean() < 0.6  # balanced labels
    assert torch.equal(d.targets, (d.meta["y_pm"] > 0).long())

    sets, ids, types = d.meta["token_sets"], d.meta["token_ids"], d.meta["token_type"]
    assert (types == 1).sum(1).eq(cfg.num_sparse).all()
    assert (types == 2).sum(1).eq(cfg.num_frequent).all()
    pos = d.meta["y_pm"] > 0
    # sparse positions hold the label's own sparse tokens
    own_sparse = torch.where(pos[:, None], torch.isin(ids, sets["sparse+"]),
                             torch.isin(ids, sets["sparse-"]))
    assert torch.equal(own_sparse, types == 1)
    # the frequent majority is the label's: exactly num_major of f from F_y
    own_freq = torch.where(pos[:, None], torch.isin(ids, sets["frequent+"]),
                           torch.isin(ids, sets["frequent-"]))
    assert own_freq.sum(1).eq(cfg.num_major).all()
    assert torch.isin(ids[types == 0], sets["irrelevant"]).all()


def test_ood_split_flips_exactly_the_sparse_tokens() -> None:
    test = create_dataset("sparse_frequent", split="test", case=2, setting=1, num_samples=300)
    ood = create_dataset("sparse_frequent", split="ood", case=2, setting=1, num_samples=300)
    assert torch.equal(test.targets, ood.targets)
    assert torch.equal(test.meta["token_type"], ood.meta["token_type"])
    ids_t, ids_o = test.meta["token_ids"], ood.meta["token_ids"]
    sparse = test.meta["token_type"] == 1
    assert torch.equal(ids_t[~sparse], ids_o[~sparse])  # everything else unchanged
    sets = test.meta["token_sets"]
    pos = (test.meta["y_pm"] > 0)[:, None].expand_as(sparse)
    # in OOD a positive sequence carries S_- tokens and a negative one S_+ tokens
    assert torch.isin(ids_o[sparse & pos], sets["sparse-"]).all()
    assert torch.isin(ids_o[sparse & ~pos], sets["sparse+"]).all()
    assert torch.isin(ids_t[sparse & pos], sets["sparse+"]).all()


@pytest.mark.parametrize("case,setting", sorted(SPARSE_FREQUENT_SETTINGS))
def test_documented_cases_order_the_feature_sensitivities(case: int, setting: int) -> None:
    s = feature_sensitivities(SPARSE_FREQUENT_SETTINGS[case, setting], num_samples=4000)
    if case == 1:
        assert s["sparse"] < s["frequent"] - 0.1
    else:
        assert s["frequent"] < s["sparse"]


def test_sparse_frequent_rejects_non_majority_lambda_and_unknown_option() -> None:
    with pytest.raises(ValueError, match="strict majority"):
        SparseFrequentConfig(lam=0.5, num_frequent=10)
    with pytest.raises(TypeError, match="unknown sparse_frequent option"):
        create_dataset("sparse_frequent", split="train", seqlen=10)


# --------------------------------------------------------------------------- modular addition


def test_modular_addition_split_sizes_disjoint_and_labels() -> None:
    p = 113
    train = create_dataset("modular_addition", split="train", seed=1)
    test = create_dataset("modular_addition", split="test", seed=1)
    assert len(train) == round(0.3 * p * p) == 3831
    assert len(train) + len(test) == p * p
    pairs = lambda d: set(map(tuple, d.inputs[:, :2].tolist()))  # noqa: E731
    assert not pairs(train) & pairs(test)
    assert len(pairs(train) | pairs(test)) == p * p
    assert (train.inputs[:, 2] == p).all() and train.meta["vocab_size"] == p + 1
    assert torch.equal(train.targets, (train.inputs[:, 0] + train.inputs[:, 1]) % p)


# --------------------------------------------------------------------------- sparse parity


def test_sparse_parity_labels_are_the_product_over_the_subset() -> None:
    d = create_dataset("sparse_parity", split="test", n_bits=12, k=4, test_size=400, seed=2)
    s = d.meta["subset"]
    assert len(s) == 4 and len(set(s)) == 4
    assert torch.equal(d.meta["y_pm"], d.inputs[:, s].prod(1))
    assert torch.equal(d.targets, (d.inputs[:, s].prod(1) > 0).long())
    other = create_dataset("sparse_parity", split="train", n_bits=12, k=4, seed=2)
    assert other.meta["subset"] == s  # the subset is shared by the splits
    given = create_dataset("sparse_parity", split="train", n_bits=12, subset=[0, 5])
    assert given.meta["subset"] == [0, 5]
    with pytest.raises(ValueError, match="subset"):
        create_dataset("sparse_parity", split="train", n_bits=4, subset=[1, 9])


# --------------------------------------------------------------------------- Boolean functions


def _average_sensitivity(x: torch.Tensor, y: torch.Tensor, squared: bool = False) -> float:
    """as(f) on the full cube by direct flip counting (index i ⊕ 2^j flips bit j)."""
    n = x.shape[1]
    idx = torch.arange(2**n)
    total = torch.zeros(())
    for j in range(n):
        diff = y - y[idx ^ (1 << j)]
        total = total + (diff**2 if squared else (diff != 0).float()).mean()
    return total.item()


@pytest.mark.parametrize(
    "function,n,expected",
    [("majority", 5, 1.875), ("parity", 5, 5.0), ("first", 5, 1.0), ("mean", 5, 0.2),
     ("majority", 10, 2.4609375)],
)
def test_boolean_functions_match_their_sensitivities_on_the_cube(
    function: str, n: int, expected: float
) -> None:
    d = create_dataset("boolean", split="train", function=function, n_bits=n, sampling="cube")
    assert d.inputs.shape == (2**n, n)
    # the MEAN target is in [0, 1]; on the ±1 scale the squared change is 4× larger and the
    # "real" rule (docs/definitions.md#counting-rule) divides by 4 again, so the plain squared
    # change of the [0, 1] target is the reference
    got = _average_sensitivity(d.inputs, d.targets, squared=function == "mean")
    assert got == pytest.approx(expected, abs=1e-6)


def test_boolean_function_definitions_pointwise() -> None:
    x = boolean_cube(4)
    d = {f: create_dataset("boolean", function=f, n_bits=4, sampling="cube").targets
         for f in ("parity", "majority", "first", "mean")}
    for row, xi in enumerate(x.tolist()):
        ones = sum(v > 0 for v in xi)
        assert d["parity"][row] == ones % 2
        assert d["majority"][row] == float(ones > 2)  # tie (2 of 4) → 0
        assert d["first"][row] == float(xi[0] > 0)
        assert d["mean"][row] == pytest.approx(ones / 4)


def test_boolean_subset_split_and_random_function() -> None:
    kw = dict(function="random", n_bits=10, sampling="subset", train_size=256, seed=5)
    train = create_dataset("boolean", split="train", **kw)
    test = create_dataset("boolean", split="test", **kw)
    assert len(train) == 256 and len(test) == 1024 - 256
    assert not set(train.meta["index"].tolist()) & set(test.meta["index"].tolist())
    table = train.meta["table"]
    assert torch.equal(table, test.meta["table"])  # same function on both sides
    assert torch.equal(train.targets, table[train.meta["index"]])
    assert torch.equal(train.inputs, boolean_cube(10)[train.meta["index"]])
    assert 0.4 < table.mean() < 0.6
    # a random function's average sensitivity is ≈ n/2
    assert _average_sensitivity(boolean_cube(10), table) == pytest.approx(5.0, abs=0.3)


def test_boolean_fresh_samples_are_uniform_and_differ_by_split() -> None:
    a = create_dataset("boolean", split="train", function="first", n_bits=8, size=2000)
    b = create_dataset("boolean", split="test", function="first", n_bits=8, size=2000)
    assert not torch.equal(a.inputs, b.inputs)
    assert set(a.inputs.unique().tolist()) == {-1.0, 1.0}
    assert abs(a.inputs.mean().item()) < 0.05
    assert torch.equal(boolean_cube(8)[a.meta["index"]], a.inputs)


# --------------------------------------------------------------------------- max-margin attention


def test_maxmargin_attention_has_unique_optimal_token() -> None:
    d = create_dataset("maxmargin_attention", split="train", num_samples=64, seq_len=6, dim=8,
                       query_signal=3.0)
    x, v, y = d.inputs, d.meta["v"], d.meta["y_pm"]
    assert x.shape == (64, 6, 8) and v.norm().item() == pytest.approx(1.0)
    gamma = y[:, None] * (x @ v)
    assert torch.allclose(gamma, d.meta["gamma"])
    top2 = gamma.topk(2, dim=1).values
    assert (top2[:, 0] - top2[:, 1] >= 0.5 - 1e-5).all()  # unique, gap ≥ (1 − 0.5)·1
    assert torch.equal(gamma.argmax(1), d.meta["opt"])
    assert (d.meta["opt"] > 0).all()  # never the query token
    # with the query signal, W = v uᵀ attains the margin constraints (W_mm is feasible)
    u = d.meta["u"]
    idx = torch.arange(64)
    x_opt = x[idx, d.meta["opt"]]
    margins = ((x_opt[:, None] - x) @ v) * (x[:, 0] @ u)[:, None]
    mask = torch.ones(64, 6, dtype=torch.bool)
    mask[idx, d.meta["opt"]] = False
    assert (margins[mask] > 0).all()


def test_splits_validated() -> None:
    for name, bad in itertools.product(GENERATED, ["validation"]):
        with pytest.raises(ValueError, match="split"):
            create_dataset(name, split=bad)


def test_dataset_to_device_keeps_examples_and_meta() -> None:
    """``ArrayDataset.to``: the same examples on a device (here the host; the GPU path runs in
    tests/measure/test_gpu.py's device), a dict of inputs included, meta copied not shared."""
    ds = create_dataset("sparse_frequent", split="train", case=1, setting=0, num_samples=12)
    moved = ds.to("cpu")
    assert moved is not ds and moved.meta == ds.meta and moved.meta is not ds.meta
    x, y = moved.batch(slice(0, 12))
    x0, y0 = ds.batch(slice(0, 12))
    assert torch.equal(y, y0)
    for k in x0 if isinstance(x0, dict) else [None]:
        assert torch.equal(x[k] if k else x, x0[k] if k else x0)
    with pytest.raises(RuntimeError):
        ds.to("no-such-device")


@pytest.mark.parametrize("name, options, keys", [
    ("sparse_frequent", {}, ("token_ids", "token_type", "y_pm")),
    ("maxmargin_attention", {}, ("opt", "gamma", "y_pm")),
    ("boolean", {"n_bits": 6, "function": "parity"}, ("index",)),
])
def test_a_subset_cuts_its_per_example_metadata_alike(name, options, keys):
    """first()/subset kept the full dataset's per-example metadata (100 rows of token types
    beside 10 examples); listed in meta['per_example'], it is cut with the examples."""
    full = create_dataset(name, split="train", **options)
    part = full.first(7, generator=torch.Generator().manual_seed(0))
    order = torch.randperm(len(full), generator=torch.Generator().manual_seed(0))[:7]
    for key in keys:
        assert len(part.meta[key]) == 7
        assert torch.equal(torch.as_tensor(part.meta[key]), torch.as_tensor(full.meta[key])[order])
    assert torch.equal(part.targets, full.targets[order])


@pytest.mark.parametrize(("name", "options"), [
    ("boolean", {}), ("boolean", {"n_bits": 7, "sampling": "cube"}), ("sparse_parity", {}),
    ("sparse_parity", {"n_bits": 9, "k": 2}), ("modular_addition", {}),
    ("modular_addition", {"p": 11}), ("sparse_frequent", {}),
    ("sparse_frequent", {"case": 1, "setting": 2}), ("sparse_frequent", {"vocab_size": 50}),
    ("maxmargin_attention", {}), ("maxmargin_attention", {"dim": 5}),
])
def test_input_size_is_the_generated_inputs_size(name: str, options: dict) -> None:
    """What ``senslab measure``/``train`` match a model's size to before generating anything:
    the bits per string, p, or the token vector length, as the generated data has them."""
    from senslab.data.synthetic import INPUTS, input_size

    d = create_dataset(name, split="train", **options)
    kind = INPUTS[name]
    held = {"bits": d.inputs.shape[1], "ids": d.meta.get("p"), "vectors": d.inputs.shape[-1]}
    assert input_size(name, options) == held[kind]
    assert (d.inputs.dim(), d.inputs.is_floating_point()) == {
        "bits": (2, True), "ids": (2, False), "vectors": (3, True)}[kind]


def test_input_size_leaves_options_the_loader_refuses_to_it() -> None:
    from senslab.data.synthetic import input_size

    assert input_size("sparse_frequent", {"case": 3}) is None  # the loader names valid cases
    assert input_size("boolean", {"n_bits": "ten"}) is None
    assert input_size("digits", {}) is None
