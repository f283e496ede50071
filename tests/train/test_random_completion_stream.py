"""The random completion of a Boolean table draws from a stream of its own: at function seeds
≡ 0 (mod 2**30) its generator was the boolean data set's subset stream (the labels at even
positions were the parities of the subset permutation's swaps)."""

from __future__ import annotations

import pytest
import torch

from senslab.data.synthetic import _generator
from senslab.train.loops.boolean import random_completion


@pytest.mark.parametrize("fs", [0, 2**30, 2**31, 3 * 2**30, 1, 5])
def test_the_completion_is_not_the_subset_stream(fs: int) -> None:
    table, index = torch.zeros(64), torch.arange(0)
    completion = random_completion(table, index, fs)
    subset_stream = torch.randint(0, 2, (64,), generator=_generator(fs, "train")).float()
    assert not torch.equal(completion, subset_stream)


def test_other_seeds_draw_as_before() -> None:
    # seed 1's completion is its generator's first draws, 7,919 + 1 (unchanged by the fix)
    table, index = torch.zeros(32), torch.arange(0)
    expect = torch.randint(0, 2, (32,), generator=torch.Generator().manual_seed(7_920)).float()
    assert torch.equal(random_completion(table, index, 1), expect)
