"""Audit 86, the token-wise estimator (measure/tokenwise.py, measure/_stats.py): the data
standard error of per-example rates that are all alike, and memory_budget with a fixed
chunk_size."""

from __future__ import annotations

import math
import warnings

import pytest
import torch
from torch import nn

from senslab.measure import TokenSensitivity
from senslab.measure._stats import State, result
from senslab.tokens import Sequence


class _TokenZeroFlips(nn.Module):
    """One logit: a perturbed token 0 always flips the class (the clean inputs are 0, the logit
    falls far below 0 off an integer), the other tokens are never read: every example's rate is
    exactly 1/3 over its 3 tokens, whatever the noise."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        a = x[:, 0, 0]
        return (1e-3 - 1e6 * (a - a.round()) ** 2)[:, None]


class _HalfAndAlways(nn.Module):
    """Token 0 flips the class about half the time (the sign of its noise), token 1 always,
    token 2 never: every example's rate is (3 + B)/9 at 3 draws per token, B its token-0 flips."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        a, b = x[:, 0, 0], x[:, 1, 0]
        return (a - a.round() + 1e-3 - 1e6 * (b - b.round()) ** 2)[:, None]


def _raw_var(rates: list[float]) -> float:
    """The data variance from raw float64 sums, as compute() took it before."""
    t = torch.tensor(rates, dtype=torch.float64)
    n, s1, s2 = len(t), t.sum().item(), (t * t).sum().item()
    est = s1 / n
    return (s2 - n * est * est) / (n - 1)


def test_rates_all_alike_give_a_data_standard_error_of_exactly_zero():
    """Five examples at exactly 1/3 each: the raw sums left 2.8e-17 of variance, and the result
    read ``0.3333 ± 0.0000000024`` (95% CI 0.33333333–0.33333334), a standard error that no
    spread gave."""
    assert _raw_var([1 / 3] * 5) > 0  # the rounding the result must not report
    m = TokenSensitivity(_TokenZeroFlips(), Sequence(), sigma=0.1, repeats=4, generator=0,
                         precision="float32", output_kind="logits")
    m.update(torch.zeros(5, 3, 2))
    r = m.compute()
    assert r.per_sample.tolist() == [r.per_sample[0].item()] * 5
    assert r.estimate == pytest.approx(1 / 3, abs=1e-15)
    assert r.stderr == 0.0
    assert r.ci95 == (r.estimate, r.estimate)
    assert "± 0.0000 " in str(r)


def test_rates_alike_by_chance_are_said_whatever_their_rounding():
    """Seed 39: five examples at 5/9 each, alike by chance (the noise gives a subset standard
    error); the raw sums read ``0.5556 ± 0.0000000033`` and the warning that alike rates give no
    standard error, which reads an exact 0, said nothing (at 4/9, seed 25, it spoke)."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        m = TokenSensitivity(_HalfAndAlways(), Sequence(), sigma=0.1, repeats=3, generator=39,
                             precision="float32", output_kind="logits")
        m.update(torch.zeros(5, 3, 1))
        r = m.compute()
    rates = r.per_sample.tolist()
    assert rates == [rates[0]] * 5 and rates[0] == pytest.approx(5 / 9)  # the case: alike
    assert _raw_var([5 / 9] * 5) > 0
    assert r.stderr_subset > 0
    assert r.stderr == 0.0
    said = [str(w.message) for w in caught]
    assert any("came out alike" in s for s in said), said


def test_rates_with_a_spread_keep_the_variance_of_the_raw_sums_to_the_last_bit():
    """The guard changes nothing where the rates differ, even by a single flip."""
    for rates in ([0.25, 0.5, 0.125, 0.75, 1 / 3], [1 / 3] * 4 + [1 / 3 + 1 / 64],
                  [1 / 9, 2 / 9, 1 / 9, 1 / 9, 1 / 9, 1 / 9]):
        t = torch.tensor(rates, dtype=torch.float64)
        st = State(n=len(t), s1=t.sum().item(), s2=(t * t).sum().item(), within=1e-4,
                   samples=[t.float()])
        r = result(st, "data", "left", True, 0.1)
        assert r.stderr == math.sqrt(_raw_var(rates) / len(t))


def test_merged_alike_rates_give_zero_and_a_single_example_stays_nan():
    """The guard reads the merged state's rates (two metrics, 2 + 3 examples at 1/3, whose
    merged sums leave 2.8e-17 of variance), and a state of one example keeps its NaN."""
    states = []
    for n in (2, 3):
        m = TokenSensitivity(_TokenZeroFlips(), Sequence(), sigma=0.1, repeats=2, generator=n,
                             precision="float32", output_kind="logits")
        m.update(torch.zeros(n, 3, 2))
        states.append(m)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # alike rates: the merge warns of twins
        states[0].merge(states[1])
        st = states[0].state
        est = st.s1 / st.n
        assert st.s2 - st.n * est * est != 0  # the rounding the result must not report
        r = states[0].compute()
    assert r.num_examples == 5 and r.stderr == 0.0
    one = State(n=1, s1=1 / 3, s2=1 / 9, samples=[torch.tensor([1 / 3])])
    assert math.isnan(result(one, "data", "left", True, 0.1).stderr)


def test_memory_budget_with_a_fixed_chunk_size_is_refused_naming_both():
    """chunk_size=4 fixed every chunk at 4 copies and memory_budget= was ignored without a
    word; it is refused, naming both options and the fix."""
    model = nn.Sequential(nn.Flatten(), nn.Linear(12, 3))
    with pytest.raises(ValueError, match=r"memory_budget=1000000.*chunk_size=4.*ignored"):
        TokenSensitivity(model, Sequence(), sigma=0.5, chunk_size=4, memory_budget=10**6)
    # either alone is measured; "auto" with a budget as before
    for options in ({"chunk_size": 4}, {"memory_budget": 10**6},
                    {"chunk_size": "auto", "memory_budget": 10**6}):
        m = TokenSensitivity(model, Sequence(), sigma=0.5, generator=0, precision="float32",
                             **options)
        m.update(torch.randn(2, 4, 3, generator=torch.Generator().manual_seed(0)))
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # few flips: not what is tested here
            assert m.compute().num_examples == 2
