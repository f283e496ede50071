"""How an int seed becomes the random stream of the Boolean and sharpness measurements.

* torch's CPU generator (a Mersenne Twister) keeps only a seed's low 32 bits, while senslab took
  int seeds up to 2**64 - 1: ``random_function(4, 2**32 + 1)`` returned seed 1's table, and
  ``boolean_sensitivity``/``output_sharpness`` with seed 2**32 + 1 returned seed 1's estimate
  (1.68 and 1.68 for a majority of 5 of 12 bits; 2.2067 as the third weight draw of both) —
  two 64-bit seeds meant as independent repeats gave one estimate twice. On a CPU such a seed
  is now refused, naming the seed whose numbers it would have drawn.
* The sharpness functions checked the seed on their own: a negative seed ran as another one
  without a word (``-1`` drew the numbers of 2**64 - 1), a numpy int was a TypeError, and 2**64
  failed inside torch with "Overflow when unpacking long long".
* The message for a seed out of range suggested ``secrets.randbits(63)`` for a fresh seed: one
  that a CPU generator reads as its low 32 bits.
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch
from torch import nn

from senslab.measure import TokenSensitivity
from senslab.measure.boolean import boolean_sensitivity
from senslab.measure.functions import random_function
from senslab.measure.sharpness import loss_sharpness, output_sharpness
from senslab.tokens import Sequence

BIG = 2**32 + 1  # read by a CPU generator as seed 1


def majority(x: torch.Tensor) -> torch.Tensor:
    """Majority of the first 5 of the bits: s(f, x) varies from string to string."""
    return torch.sign(x[:, :5].sum(1))


def linear() -> nn.Module:
    torch.manual_seed(0)  # the layer's default init only; every measurement has its own seed
    return nn.Linear(4, 3)


X = torch.randn(10, 4, generator=torch.Generator().manual_seed(0))


def shop(seed, model=None):
    model = linear() if model is None else model
    return output_sharpness(model, X.to(next(model.parameters()).device), sigma_w=0.5,
                            repeats=3, generator=seed).shop.per_draw.tolist()


def test_torch_cpu_generator_reads_only_the_low_32_bits() -> None:
    """The premise, as torch behaves: seed 2**32 + 1 draws exactly seed 1's numbers."""
    one = torch.randn(5, generator=torch.Generator().manual_seed(1))
    big = torch.randn(5, generator=torch.Generator().manual_seed(BIG))
    assert torch.equal(one, big)


CALLS = {
    "random_function": lambda seed: random_function(4, seed),
    "boolean_sensitivity": lambda seed: boolean_sensitivity(
        majority, 12, method="sample", num_samples=50, generator=seed, output="sign"),
    "output_sharpness": shop,
    "loss_sharpness": lambda seed: loss_sharpness(
        linear(), nn.functional.mse_loss, X, torch.zeros(10, 3), draws=3, generator=seed),
}


@pytest.mark.parametrize("name", sorted(CALLS))
def test_a_cpu_seed_of_2_32_or_more_is_refused_not_read_as_another(name) -> None:
    """Before: seed 2**32 + 1 gave seed 1's numbers without a word."""
    with pytest.raises(ValueError, match=r"low 32 bits.*generator=1\b.*below 2\*\*32") as info:
        CALLS[name](BIG)
    assert "generator=4294967297" in str(info.value)
    with pytest.raises(ValueError, match="low 32 bits"):
        CALLS[name](2**64 - 1)


def test_seeds_below_2_32_give_the_numbers_of_torch_generator_manual_seed() -> None:
    """Same seed, same numbers: an int seed s draws what torch.Generator().manual_seed(s) draws,
    up to the largest seed a CPU generator reads in full."""
    for s in (0, 7, 2**32 - 1):
        bits = torch.randint(0, 2, (16,), generator=torch.Generator().manual_seed(s))
        assert random_function(4, s).tolist() == (1 - 2 * bits).double().tolist()
        a = boolean_sensitivity(majority, 12, method="sample", num_samples=50, generator=s,
                                output="sign")
        b = boolean_sensitivity(majority, 12, method="sample", num_samples=50,
                                generator=torch.Generator().manual_seed(s), output="sign")
        assert (a.average, a.influence.tolist()) == (b.average, b.influence.tolist())
        assert shop(s) == shop(torch.Generator().manual_seed(s))
    assert random_function(4, 0).tolist() != random_function(4, 2**32 - 1).tolist()


def test_sharpness_checks_its_seed_as_the_token_wise_estimator_does() -> None:
    """Before: -1 drew the numbers of seed 2**64 - 1 (on a CPU those of 2**32 - 1) without a
    word; a numpy int was a TypeError ("got int64"); 2**64 failed inside torch with "Overflow
    when unpacking long long"."""
    assert shop(np.int64(7)) == shop(7)
    assert shop(np.uint32(2**32 - 1)) == shop(2**32 - 1)
    for seed in (-1, 2**64):
        with pytest.raises(ValueError, match=r"generator seed must be an int from 0 to 2\*\*64"):
            shop(seed)
    for seed in (True, 1.0, "1", np.bool_(True)):
        with pytest.raises(TypeError, match="generator must be a torch.Generator or an int seed"):
            shop(seed)


def test_the_fresh_seed_suggested_is_one_a_cpu_generator_reads_in_full() -> None:
    """Before: the message suggested secrets.randbits(63), a seed whose top 31 bits a CPU
    generator drops."""
    model = nn.Sequential(nn.Flatten(), nn.Linear(8, 2))
    with pytest.raises(ValueError, match=r"secrets\.randbits\(32\)") as info:
        TokenSensitivity(model, Sequence(), sigma=1.0, generator=-1)
    assert "randbits(63)" not in str(info.value)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_a_cuda_model_takes_a_64_bit_seed_in_full() -> None:
    """CUDA's Philox generator reads all 64 bits: seed 2**32 + 1 is its own seed there."""
    model = linear().cuda()
    assert shop(BIG, model) == shop(torch.Generator("cuda").manual_seed(BIG), model)
    assert shop(BIG, model) != shop(1, model)


def test_the_token_wise_estimator_refuses_a_cpu_seed_another_seed_would_repeat():
    """TokenSensitivity (and the metrics built on it) made its CPU generator from any seed below
    2**64: seed 2**32 + 1 drew seed 1's noise, two 'independent' repeats gave one number."""
    warnings.simplefilter("ignore", RuntimeWarning)  # few flips on a tiny model
    from senslab import token_sensitivity
    from senslab.tokens import Sequence

    model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(12, 3))
    x = torch.randn(4, 4, 3, generator=torch.Generator().manual_seed(0))
    base = token_sensitivity(model, x, Sequence(), sigma=1.0, repeats=2, generator=1,
                             precision="float32").per_sample
    with pytest.raises(ValueError, match=r"generator=4294967297 is 2\*\*32 or more.*"
                                         r"generator=1 \(that is, seed % 2\*\*32\) gives"):
        token_sensitivity(model, x, Sequence(), sigma=1.0, repeats=2, generator=2**32 + 1,
                          precision="float32")
    again = token_sensitivity(model, x, Sequence(), sigma=1.0, repeats=2,
                              generator=torch.Generator().manual_seed(1), precision="float32")
    assert torch.equal(base, again.per_sample)
