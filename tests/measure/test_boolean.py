"""Tests for senslab.measure.boolean: reference values, Fourier identities, estimators, errors."""

from __future__ import annotations

import itertools
import math

import pytest
import torch
from torch import nn

from senslab.measure.boolean import (
    MAX_EXACT_N,
    all_inputs,
    average_sensitivity_fourier,
    boolean_sensitivity,
    degree,
    first,
    fourier_coefficients,
    index_to_inputs,
    influence_fourier,
    inputs_to_index,
    majority,
    mean,
    noise_stability,
    parity,
    random_function,
    sparse_parity,
    spectral_weights,
    subset_sizes,
    table_function,
    truth_table,
)


def gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def naive_sensitivity(table: list[float], n: int, rule: str) -> tuple[float, list[float], float]:
    """Slow reference: loop over every point and bit with Python integers."""
    per_point, influence = [], [0.0] * n
    for i in range(1 << n):
        s = 0.0
        for j in range(n):
            a, b = table[i], table[i ^ (1 << j)]
            c = (a - b) ** 2 / 4 if rule == "real" else float((a > 0) != (b > 0))
            s += c
            influence[j] += c / (1 << n)
        per_point.append(s)
    return sum(per_point) / len(per_point), influence, max(per_point)


def tiny_mlp(n: int, seed: int, out: int = 1, dtype: torch.dtype = torch.float32) -> nn.Module:
    model = nn.Sequential(nn.Linear(n, 16), nn.Tanh(), nn.Linear(16, out)).to(dtype)
    g = gen(seed)
    with torch.no_grad():
        for p in model.parameters():  # explicit generator: no global RNG state
            p.copy_(torch.randn(p.shape, generator=g, dtype=dtype))
    return model.eval()


# ----------------------------------------------------------------------------- encoding


def test_encoding_order_and_round_trip() -> None:
    x = all_inputs(3)
    assert x.shape == (8, 3)
    assert x[0].tolist() == [1, 1, 1]  # index 0: all bits 0 → all +1
    assert x[1].tolist() == [-1, 1, 1]  # bit 0 is coordinate 0
    assert x[6].tolist() == [1, -1, -1]
    idx = torch.arange(1 << 7)
    assert torch.equal(inputs_to_index(index_to_inputs(idx, 7)), idx)
    assert subset_sizes(4).tolist() == [bin(i).count("1") for i in range(16)]


# ----------------------------------------------------------------------------- reference values


@pytest.mark.parametrize("n", [1, 5, 10, 15])
def test_parity_and_first(n: int) -> None:
    p = boolean_sensitivity(parity, n, method="exact")
    assert p.average == n and p.max == n and p.normalized == 1.0 and p.stderr == 0.0
    assert torch.equal(p.influence, torch.ones(n, dtype=torch.float64))
    f = boolean_sensitivity(first, n, method="exact")
    assert f.average == 1.0 and f.max == 1.0
    assert f.influence[0] == 1.0 and f.influence[1:].sum() == 0.0


@pytest.mark.parametrize("n, expected", [(5, 1.875), (10, 2.4609), (15, 3.1421)])
def test_majority_reference_values(n: int, expected: float) -> None:
    res = boolean_sensitivity(majority, n, method="exact")
    assert round(res.average, 4) == expected
    # Closed forms: only edges between the last losing and first winning level of #(+1) count.
    k = n // 2 + 1  # fewest +1 bits that win (ties lose)
    closed = 2 * math.comb(n, k) * k / 2**n
    assert res.average == pytest.approx(closed, abs=1e-12)
    assert res.output == "sign" and res.num_points == 2**n and res.num_evaluations == 2**n


@pytest.mark.parametrize("n", [2, 5, 10])
def test_mean_real_rule_is_one_over_n(n: int) -> None:
    res = boolean_sensitivity(mean, n, method="exact", dtype=torch.float64)
    assert res.output == "real"  # auto picks "real" for MEAN's many values
    assert res.average == pytest.approx(1 / n, abs=1e-12)
    table = truth_table(mean, n, dtype=torch.float64)
    assert average_sensitivity_fourier(table) == pytest.approx(1 / n, abs=1e-12)
    # Default float32 inputs: the same up to float32 rounding of the mean.
    assert boolean_sensitivity(mean, n).average == pytest.approx(1 / n, rel=1e-6)
    # The indicator rule on the same outputs is a different quantity (a change of sign).
    assert boolean_sensitivity(mean, n, output="sign").average != pytest.approx(1 / n)


def test_sparse_parity_and_degrees() -> None:
    chi = sparse_parity([0, 3, 5])
    res = boolean_sensitivity(chi, 7, method="exact")
    assert res.average == 3.0
    assert res.influence.nonzero().flatten().tolist() == [0, 3, 5]
    c = fourier_coefficients(truth_table(chi, 7))
    assert c[0b101001] == pytest.approx(1.0) and c.abs().sum() == pytest.approx(1.0)
    assert degree(truth_table(parity, 6)) == 6
    assert degree(truth_table(first, 6)) == 1
    assert degree(truth_table(sparse_parity([]), 3)) == 0
    with pytest.raises(ValueError, match="bit 5"):
        sparse_parity([5])(torch.ones(2, 3))
    with pytest.raises(ValueError, match="distinct"):
        sparse_parity([1, 1])


# ----------------------------------------------------------------------------- against a reference


@pytest.mark.parametrize("rule", ["sign", "real"])
def test_exact_matches_naive_loops(rule: str) -> None:
    n = 4
    table = torch.randn(1 << n, generator=gen(3), dtype=torch.float64)
    avg, infl, mx = naive_sensitivity(table.tolist(), n, rule)
    res = boolean_sensitivity(table, output=rule)
    assert res.average == pytest.approx(avg, abs=1e-12)
    assert res.influence.tolist() == pytest.approx(infl, abs=1e-12)
    assert res.max == pytest.approx(mx, abs=1e-12)


def test_fwht_matches_dense_transform() -> None:
    n = 5
    table = torch.randn(1 << n, generator=gen(1), dtype=torch.float64)
    x = all_inputs(n, torch.float64)
    chi = torch.stack([x[:, [j for j in range(n) if s >> j & 1]].prod(1) for s in range(1 << n)])
    assert torch.allclose(fourier_coefficients(table), chi @ table / 2**n, atol=1e-12)


@pytest.mark.parametrize("n, seed", [(1, 0), (3, 1), (6, 2), (8, 3), (10, 4)])
def test_fourier_identities_on_random_functions(n: int, seed: int) -> None:
    table = random_function(n, gen(seed))
    assert set(table.unique().tolist()) <= {-1.0, 1.0}
    c = fourier_coefficients(table)
    assert c.pow(2).sum().item() == pytest.approx(1.0, abs=1e-12)  # Parseval
    assert spectral_weights(table).sum().item() == pytest.approx(1.0, abs=1e-12)
    direct = boolean_sensitivity(table)
    assert direct.method == "exact" and direct.output == "sign"
    assert average_sensitivity_fourier(table) == pytest.approx(direct.average, abs=1e-10)
    assert torch.allclose(influence_fourier(table), direct.influence, atol=1e-12)
    assert torch.allclose(influence_fourier(c, coefficients=True), direct.influence, atol=1e-12)


def test_real_rule_fourier_identity() -> None:
    table = torch.randn(1 << 7, generator=gen(5), dtype=torch.float64)
    res = boolean_sensitivity(table, output="real")
    assert average_sensitivity_fourier(table) == pytest.approx(res.average, abs=1e-10)
    assert torch.allclose(influence_fourier(table), res.influence, atol=1e-12)


def test_a_float_zero_one_table_is_read_as_boolean_as_boolean_sensitivity_reads_it() -> None:
    """``majority`` returns float 0/1: its table was read as numbers, and the spectral
    functions gave a quarter of its flips (0.469 against 1.875 for n = 5) where
    ``boolean_sensitivity`` counts them. ``output="real"`` keeps the numbers' reading."""
    table = majority(all_inputs(5))
    assert table.is_floating_point() and set(table.unique().tolist()) == {0.0, 1.0}
    direct = boolean_sensitivity(table)
    assert direct.average == pytest.approx(1.875)
    assert average_sensitivity_fourier(table) == pytest.approx(1.875, abs=1e-12)
    assert torch.allclose(influence_fourier(table), direct.influence, atol=1e-12)
    signs = table * 2 - 1
    assert torch.equal(fourier_coefficients(table), fourier_coefficients(signs))
    assert torch.equal(fourier_coefficients(table), fourier_coefficients(table.long()))
    assert degree(table) == degree(signs) == 5
    # P[f(x) ≠ f(y)] = (1 − Stab_ρ)/2 for ±1 functions, by enumeration at ρ = 1/2
    x = all_inputs(5)
    keep = torch.tensor([(1 + 0.5) / 2, (1 - 0.5) / 2], dtype=torch.float64)
    flips = ((x[:, None, :] != x[None, :, :]).long())  # (x, y, bit)
    p_pair = keep[flips].prod(-1) / len(x)
    disagree = float((p_pair * (table[:, None] != table[None, :])).sum())
    assert (1 - noise_stability(table, 0.5)) / 2 == pytest.approx(disagree, abs=1e-12)
    real = boolean_sensitivity(table, output="real")
    assert average_sensitivity_fourier(table, output="real") == pytest.approx(real.average)
    assert real.average == pytest.approx(1.875 / 4)
    assert spectral_weights(table, output="real").sum() == pytest.approx(float(table.mean()))
    with pytest.raises(ValueError, match="output must be 'auto', 'sign' or 'real'"):
        fourier_coefficients(table, output="labels")
    with pytest.raises(ValueError, match=r"output='sign'.*table > threshold"):
        fourier_coefficients(torch.rand(32, generator=gen(0), dtype=torch.float64),
                             output="sign")


def test_random_function_expected_sensitivity() -> None:
    n = 8
    values = [boolean_sensitivity(random_function(n, gen(s))).average for s in range(20)]
    assert sum(values) / len(values) == pytest.approx(n / 2, abs=0.15)
    assert torch.equal(random_function(n, gen(1)), random_function(n, gen(1)))
    assert not torch.equal(random_function(n, gen(1)), random_function(n, gen(2)))


# ----------------------------------------------------------------------------- estimators


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_sampled_within_four_standard_errors(seed: int) -> None:
    table = random_function(10, gen(100 + seed))
    exact = boolean_sensitivity(table, method="exact")
    for f in (table, majority):
        ref = exact if f is table else boolean_sensitivity(majority, 10, method="exact")
        res = boolean_sensitivity(f, 10, method="sample", num_samples=500, generator=gen(seed))
        assert res.method == "sample" and res.num_points == 500 and res.stderr > 0
        assert abs(res.average - ref.average) < 4 * res.stderr
        assert res.ci95[0] < res.average < res.ci95[1]
        assert res.max <= ref.max


def test_seeding_reproducible_and_distinct() -> None:
    def run(seed: int | None):
        g = None if seed is None else gen(seed)
        return boolean_sensitivity(majority, 16, method="sample", num_samples=300, generator=g)

    a, b, c = run(7), run(7), run(8)
    assert a.average == b.average and torch.equal(a.influence, b.influence)
    assert a.average != c.average or not torch.equal(a.influence, c.influence)
    assert run(None).average == run(0).average  # None means seed 0


def test_chunked_equals_unchunked() -> None:
    n = 9
    ref = boolean_sensitivity(majority, n, method="exact")
    for chunk in (1, 7, 100):
        res = boolean_sensitivity(majority, n, method="exact", chunk_size=chunk)
        assert (res.average, res.max, res.num_evaluations) == (ref.average, ref.max, 2**n)
        assert torch.equal(res.influence, ref.influence)
    big = boolean_sensitivity(parity, n, method="sample", num_samples=50, generator=gen(2))
    for chunk in (n + 1, 3 * (n + 1) + 2):
        res = boolean_sensitivity(
            majority, n, method="sample", num_samples=50, generator=gen(2), chunk_size=chunk
        )
        one = boolean_sensitivity(majority, n, method="sample", num_samples=50, generator=gen(2))
        assert res.average == one.average and torch.equal(res.influence, one.influence)
        assert res.stderr == one.stderr and res.num_evaluations == 50 * (n + 1)
    assert big.average == n


def test_module_lambda_and_table_agree() -> None:
    n = 6
    model = tiny_mlp(n, seed=4)
    table = truth_table(model, n, output="sign")
    assert set(table.unique().tolist()) == {-1.0, 1.0}  # a non-trivial function
    results = [
        boolean_sensitivity(model, n, output="sign"),
        boolean_sensitivity(lambda x: model(x), n, output="sign"),
        boolean_sensitivity(table),
        boolean_sensitivity(table_function(table), n),
    ]
    for r in results[1:]:
        assert r.average == results[0].average and torch.equal(r.influence, results[0].influence)
    assert results[2].num_evaluations == 0
    # Sampled with one seed: the callable and its table see the same strings.
    s1 = boolean_sensitivity(model, n, method="sample", output="sign", generator=gen(9))
    s2 = boolean_sensitivity(table, method="sample", generator=gen(9))
    assert s1.average == s2.average and s1.num_points == s2.num_points
    # Real rule on the module equals the Fourier identity on its real-valued table.
    real = boolean_sensitivity(model, n, output="real")
    assert real.average == pytest.approx(
        average_sensitivity_fourier(truth_table(model, n, output="real")), rel=1e-9
    )


def test_class_logits_dtype_and_threshold() -> None:
    n = 5
    two = tiny_mlp(n, seed=1, out=2, dtype=torch.float64)  # float64 module gets float64 inputs
    t2 = truth_table(two, n)
    manual = (two(all_inputs(n, torch.float64)).argmax(1) == 1).double() * 2 - 1
    assert torch.equal(t2, manual)
    three = tiny_mlp(n, seed=2, out=3)
    t3 = truth_table(three, n)
    assert t3.dtype == torch.long and len(t3.unique()) == 3
    assert boolean_sensitivity(three, n).average == boolean_sensitivity(t3).average
    with pytest.raises(ValueError, match="scalar outputs"):
        boolean_sensitivity(three, n, output="real")
    # A regression onto {0, 1}: threshold 0.5 recovers MAJORITY.
    soft = lambda x: 0.1 + 0.8 * majority(x)  # noqa: E731
    res = boolean_sensitivity(soft, n, output="sign", threshold=0.5)
    assert res.average == boolean_sensitivity(majority, n).average


def test_auto_method_choice() -> None:
    assert boolean_sensitivity(parity, 10).method == "exact"
    assert boolean_sensitivity(parity, 20, num_samples=100).method == "sample"
    assert boolean_sensitivity(random_function(12, gen(0)), num_samples=2).method == "exact"


def test_training_mode_module_warns() -> None:
    model = tiny_mlp(3, seed=0).train()
    with pytest.warns(UserWarning, match="eval"):
        boolean_sensitivity(model, 3, output="sign")


# ----------------------------------------------------------------------------- stability, Huang


def test_noise_stability_closed_forms() -> None:
    for rho in (-0.5, 0.0, 0.3, 1.0):
        assert noise_stability(truth_table(parity, 5), rho) == pytest.approx(rho**5, abs=1e-12)
        assert noise_stability(truth_table(first, 4), rho) == pytest.approx(rho, abs=1e-12)
        maj3 = 0.75 * rho + 0.25 * rho**3  # ±1 MAJ₃ = (x₁+x₂+x₃)/2 − x₁x₂x₃/2
        assert noise_stability(truth_table(majority, 3), rho) == pytest.approx(maj3, abs=1e-12)
    with pytest.raises(ValueError, match="rho"):
        noise_stability(truth_table(parity, 3), 1.5)


@pytest.mark.parametrize("rho, seed", [(0.3, 0), (0.8, 1), (-0.4, 2)])
def test_noise_stability_monte_carlo(rho: float, seed: int) -> None:
    n, samples = 6, 200_000
    table = random_function(n, gen(50 + seed))
    g = gen(seed)
    x = 1 - 2 * torch.randint(0, 2, (samples, n), generator=g)
    keep = torch.rand(samples, n, generator=g) < (1 + rho) / 2
    y = torch.where(keep, x, -x)
    f = table_function(table)
    flips = (f(x.double()) != f(y.double())).double()
    se = flips.std().item() / math.sqrt(samples)
    assert abs(flips.mean().item() - (1 - noise_stability(table, rho)) / 2) < 4 * se


def test_huang_sensitivity_bound() -> None:
    for n, seed in itertools.product(range(2, 7), range(4)):
        dense = random_function(n, gen(seed))
        # Sparse tables (few −1 entries) have low sensitivity, where the bound has bite.
        idx = torch.randint(0, 1 << n, (2,), generator=gen(seed))
        sparse = torch.ones(1 << n, dtype=torch.float64).index_fill_(0, idx, -1.0)
        for table in (dense, sparse):
            s_max = boolean_sensitivity(table).max
            assert degree(table) <= s_max**2


# ----------------------------------------------------------------------------- bad input


def test_bad_input_errors() -> None:
    with pytest.raises(ValueError, match="power|2\\^n"):
        boolean_sensitivity(torch.ones(6))
    with pytest.raises(ValueError, match="n=3"):
        boolean_sensitivity(torch.ones(8), 4)
    with pytest.raises(ValueError, match="NaN"):
        boolean_sensitivity(lambda x: torch.full((x.shape[0],), float("nan")), 3)
    with pytest.raises(ValueError, match="method='sample'"):
        boolean_sensitivity(parity, MAX_EXACT_N + 1, method="exact")
    with pytest.raises(ValueError, match="returned shape"):
        boolean_sensitivity(lambda x: x[:1, 0], 3)  # one output for a batch of 8
    with pytest.raises(ValueError, match="required"):
        boolean_sensitivity(parity)
    with pytest.raises(ValueError, match="output"):
        boolean_sensitivity(parity, 3, output="probability")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="method"):
        boolean_sensitivity(parity, 3, method="mc")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="chunk_size"):
        boolean_sensitivity(parity, 8, method="sample", chunk_size=4)
    with pytest.raises(ValueError, match="num_samples"):
        boolean_sensitivity(parity, 30, method="sample", num_samples=1)
    with pytest.raises(ValueError, match="positive integer"):
        boolean_sensitivity(parity, 0)
    with pytest.raises(ValueError, match="2\\^n"):
        fourier_coefficients(torch.ones(12))
    with pytest.raises(ValueError, match="multi-class"):
        degree(torch.arange(8))


def test_a_threshold_the_rule_would_ignore_is_refused():
    """f = 0.1 + 0.8·MAJORITY is real-valued: output='auto' counts the squared change, where a
    threshold means nothing; the threshold once vanished silently (0.30 instead of the 1.875
    of output='sign', threshold=0.5)."""
    from senslab.measure.functions import majority

    def f(x: torch.Tensor) -> torch.Tensor:
        return 0.1 + 0.8 * (majority(x) > 0).float()

    with pytest.raises(ValueError, match="threshold=0.5.*chose 'real'.*output='sign'"):
        boolean_sensitivity(f, 5, threshold=0.5)
    with pytest.raises(ValueError, match="threshold=0.5.*output='real'"):
        boolean_sensitivity(f, 5, output="real", threshold=0.5)
    signed = boolean_sensitivity(f, 5, output="sign", threshold=0.5).average
    assert signed == pytest.approx(boolean_sensitivity(majority, 5).average)
    assert signed == pytest.approx(1.875)


def test_sampled_auto_rule_on_zero_one_values_warns_and_explicit_rules_do_not():
    """From a sample, 'auto' cannot know that a {0, 1}-valued callable never takes a value in
    between: it says so; ±1 values (where both rules agree) and explicit rules stay quiet."""
    import warnings

    from senslab.measure.functions import majority

    def zero_one(x: torch.Tensor) -> torch.Tensor:
        return (x[:, 0] > 0).float()

    with pytest.warns(UserWarning, match="output='sign' or output='real'"):
        r = boolean_sensitivity(zero_one, 20, method="sample", num_samples=200)
    assert r.output == "sign"
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        boolean_sensitivity(zero_one, 20, method="sample", num_samples=200, output="sign")
        boolean_sensitivity(lambda x: x[:, 0], 20, method="sample", num_samples=200)
        boolean_sensitivity(zero_one, 6)  # exact: every value seen
        boolean_sensitivity(majority, 20, method="sample", num_samples=200)  # declared Boolean


def test_zero_one_strings_are_refused_by_the_cube_index():
    from senslab.measure._cube import inputs_to_index
    from senslab.measure.functions import parity, table_function

    with pytest.raises(ValueError, match=r"±1 strings.*1 − 2·x"):
        inputs_to_index(torch.tensor([[0.0, 1.0, 1.0], [1.0, 0.0, 0.0]]))
    x = torch.tensor([[1.0, -1.0, -1.0], [-1.0, 1.0, 1.0]])
    assert inputs_to_index(x).tolist() == [6, 1]
    lookup = table_function(parity(torch.tensor([[1.0, 1.0, 1.0]]).new_ones(8, 3)))
    with pytest.raises(ValueError, match="±1 strings"):
        lookup(torch.tensor([[0.0, 1.0, 1.0]]))


def test_a_boolean_table_is_analysed_as_its_pm1_function():
    """bool, 0/1 and ±1 integer tables give the ±1 function's spectrum (+1 on True / label 1,
    as truth_table): the Fourier form of the average sensitivity equals the flip count, and
    Stab_ρ = E[f(x) f(y)] (read as 0/1 they gave a quarter of the flips)."""
    from senslab.measure.boolean import (
        average_sensitivity_fourier,
        boolean_sensitivity,
        majority,
        noise_stability,
        truth_table,
    )
    from senslab.measure.fourier import fourier_coefficients

    pm = truth_table(majority, 5)
    flips = boolean_sensitivity(pm).average
    for table in (pm > 0, (pm > 0).long(), pm.long()):
        assert average_sensitivity_fourier(table) == pytest.approx(flips)
        assert noise_stability(table, 0.5) == pytest.approx(noise_stability(pm, 0.5))
        assert torch.equal(fourier_coefficients(table), fourier_coefficients(pm))
    with pytest.raises(ValueError, match="not multi-class labels.*truth_table"):
        fourier_coefficients(torch.tensor([2, 5] * 4))


class _MajorityProbability(nn.Module):
    """P(MAJORITY = +1) as a sigmoid of the bit sum, declared as probabilities."""

    output_kind = "probabilities"

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.sigmoid(3.0 * x.sum(1))


def test_a_declared_probability_model_counts_class_changes_at_one_half():
    """A model that declares output_kind='probabilities' is a classifier: its class is p > 1/2
    (at the default threshold 0 no probability ever changed class: a false 0), and "auto"
    counts class changes — MAJORITY's 1.875 on 5 bits; truth_table gives its ±1 table."""
    model = _MajorityProbability().eval()
    want = boolean_sensitivity(majority, 5).average
    assert want == pytest.approx(1.875)
    for output in ("sign", "auto"):
        assert boolean_sensitivity(model, 5, output=output).average == pytest.approx(want)
    assert torch.equal(truth_table(model, 5), truth_table(majority, 5))


def test_a_threshold_that_would_be_ignored_is_refused():
    """truth_table applied no threshold to real outputs ("auto" chose "real") and none to class
    labels; both are refused, as boolean_sensitivity refuses them."""
    def prob(x: torch.Tensor) -> torch.Tensor:  # probabilities, undeclared
        return torch.sigmoid(3.0 * x.sum(1))

    with pytest.raises(ValueError, match="chose 'real'.*pass output='sign'"):
        truth_table(prob, 5, threshold=0.5)
    table = truth_table(prob, 5, output="sign", threshold=0.5)
    assert average_sensitivity_fourier(table) == pytest.approx(1.875)

    def count(x: torch.Tensor) -> torch.Tensor:  # integer outputs: class labels
        return (x > 0).sum(1)

    for call in (lambda: boolean_sensitivity(count, 5, output="sign", threshold=2.0),
                 lambda: truth_table(count, 5, output="sign", threshold=2.0),
                 lambda: boolean_sensitivity(lambda x: torch.stack([x[:, 0], -x[:, 0]], 1), 3,
                                             output="sign", threshold=0.5)):
        with pytest.raises(ValueError, match="class labels.*drop threshold"):
            call()
