"""A data standard error of exactly 0 from several examples whose rates came out alike by chance
is said, not shown as an interval of width 0 without a word."""

from __future__ import annotations

import warnings

import pytest
import torch

from senslab.measure import token_sensitivity
from senslab.tokens import Sequence


class TwoTokens(torch.nn.Module):
    """Class 1 where the noise on token 0 or token 2 is positive: each example flips on about a
    quarter of its copies, at random."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        s = x[:, 0, 0].clamp(min=0) + x[:, 2, 0].clamp(min=0)
        return torch.stack([torch.full_like(s, 1e-6), s], dim=1)


def _measure(seed: int):
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        r = token_sensitivity(TwoTokens(), torch.zeros(2, 4, 1), Sequence(), sigma=1.0,
                              repeats=8, generator=seed)
    return r, [str(w.message) for w in said]


def test_alike_rates_of_two_examples_are_said() -> None:
    r, said = _measure(17)  # both examples flip on 12 of their 32 copies
    assert r.per_sample.tolist() == [0.375, 0.375] and r.stderr == 0 and r.stderr_subset > 0
    assert any(m.startswith("the standard error is 0 because the per-example flip rates of "
                            "all 2 examples came out alike") for m in said), said


@pytest.mark.parametrize("seed", [0, 1])
def test_rates_with_spread_say_nothing_of_it(seed: int) -> None:
    r, said = _measure(seed)
    assert r.stderr > 0
    assert not any("came out alike" in m for m in said)
