"""Ranks above 0 of a distributed metric draw from 32-bit seeds: torch's CPU generator keeps no
more of a seed, and the token-wise estimator refuses a larger one on a CPU."""

from __future__ import annotations

import numpy as np
import pytest
import torch

pytest.importorskip("torchmetrics")

from senslab.integrations.torchmetrics import rank_seed  # noqa: E402


@pytest.mark.parametrize("seed", [0, 5, 2**32 - 1])
def test_rank_seeds_are_32_bit_distinct_and_draw_what_the_64_bit_ones_drew_on_a_cpu(seed):
    seeds = [rank_seed(seed, r) for r in range(1, 65)]
    assert all(0 <= s < 2**32 for s in seeds) and len(set(seeds)) == len(seeds)
    assert rank_seed(seed, 0) == seed
    for r in (1, 7):  # the 64-bit seed of before, drawn here independently of senslab
        old = int(np.random.SeedSequence([seed, r]).generate_state(1, np.uint64)[0])
        assert old >= 2**32 or old == rank_seed(seed, r)
        a = torch.randn(5, generator=torch.Generator().manual_seed(old))
        b = torch.randn(5, generator=torch.Generator().manual_seed(rank_seed(seed, r)))
        assert torch.equal(a, b)
