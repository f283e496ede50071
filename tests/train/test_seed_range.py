"""Training seeds are refused from 2**32 on: torch's CPU generator keeps only a seed's low 32 bits,
so seed 2**32 + s would have trained exactly as seed s, and two "independent" seeds of a verdict
would have been one run twice."""

from __future__ import annotations

import pytest
import torch

from senslab.train.config import RunConfig, set_option, validate
from senslab.train.loops.attention import AttentionConfig, AttentionData
from senslab.train.loops.boolean import BooleanRunConfig
from senslab.train.loops.grokking import GrokkingRun
from senslab.train.loops.pretrained import PretrainedConfig
from senslab.train.loops.sparse_frequent import SparseFrequentRun
from senslab.train.loops.sparse_parity import SparseParityRun

BIG = 2**32


def test_the_reason_holds_a_cpu_generator_reads_a_seed_mod_2_to_the_32():
    # If torch ever keeps all 64 bits, this fails and the limit can go.
    a = torch.randn(4, generator=torch.Generator().manual_seed(5))
    b = torch.randn(4, generator=torch.Generator().manual_seed(BIG + 5))
    assert torch.equal(a, b)


CONFIGS = [(RunConfig, "seed"), (AttentionConfig, "seed"), (AttentionData, "seed"),
           (BooleanRunConfig, "seed"), (BooleanRunConfig, "function_seed"), (GrokkingRun, "seed"),
           (PretrainedConfig, "seed"), (SparseFrequentRun, "seed"), (SparseParityRun, "seed")]


@pytest.mark.parametrize(("cls", "key"), CONFIGS, ids=[f"{c.__name__}.{k}" for c, k in CONFIGS])
def test_every_seed_field_takes_32_bits_and_refuses_more_saying_why(cls, key):
    cfg = cls()
    set_option(cfg, key, str(BIG - 1))
    assert getattr(validate(cfg), key) == BIG - 1
    with pytest.raises(ValueError, match=r"low 32 bits.*seed s's run") as err:
        set_option(cls(), key, str(BIG + 5))
    assert key in str(err.value) and str(BIG + 5) in str(err.value)
    built = cls()
    setattr(built, key, BIG)  # a config built in code is checked by validate
    with pytest.raises(ValueError, match="low 32 bits"):
        validate(built)


def test_a_negative_seed_is_refused_without_the_32_bit_reason():
    with pytest.raises(ValueError, match=r"seed must be in \[0, 4294967296\), got -1$"):
        set_option(RunConfig(), "seed", "-1")
