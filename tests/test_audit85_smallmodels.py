"""Audit 85 (small models): building a small zoo model moved the caller's global random stream
and ran off the CPU under a default device; configs whose sizes were not integers built a model
that failed later (or inside torch); modadd token ids of a small integer dtype failed inside
torch."""

from __future__ import annotations

import pytest
import torch

from senslab.models import create_model
from senslab.models.small import (
    AttentionModel,
    AttentionModelConfig,
    BooleanConfig,
    BooleanTransformer,
    ModAddConfig,
    ModAddTransformer,
    ParityConfig,
    ParityTransformer,
    SparseAttention,
    SparseAttentionConfig,
)

SMALL = {
    "sparse_attention": (SparseAttention, SparseAttentionConfig, dict(dim=6)),
    "attention_model": (AttentionModel, AttentionModelConfig, dict(dim=6)),
    "modadd_transformer": (ModAddTransformer, ModAddConfig, dict(p=7, dim=16, heads=2,
                                                                  mlp_dim=32)),
    "parity_transformer": (ParityTransformer, ParityConfig, dict(n_bits=8, dim=16, heads=2,
                                                                  mlp_dim=32)),
    "boolean_transformer": (BooleanTransformer, BooleanConfig, dict(n_bits=8, dim=16, heads=2,
                                                                     ff_dim=16)),
}


@pytest.mark.parametrize("name", list(SMALL))
def test_building_leaves_the_global_stream_alone_and_keeps_the_weights(name: str) -> None:
    # the layers' default init ran on the global CPU generator before the seeded one replaced it
    cls, config, kw = SMALL[name]
    state = torch.random.get_rng_state()
    model = create_model(name, seed=3, **kw)
    assert torch.equal(torch.random.get_rng_state(), state)
    # the seed alone still decides the weights: the same as a plain build of the class
    plain = cls(config(seed=3, **kw))
    assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(),
                                                  plain.state_dict().values(), strict=True))


@pytest.mark.parametrize("name", list(SMALL))
def test_a_default_device_does_not_move_where_the_seed_draws(name: str) -> None:
    # under torch.set_default_device the model was built there (on a GPU the CPU generator's
    # draws fail); the meta device, which draws nothing, stands in for a GPU
    kw = SMALL[name][2]
    cpu = create_model(name, seed=2, **kw)
    with torch.device("meta"):
        other = create_model(name, seed=2, **kw)
    assert {p.device.type for p in other.state_dict().values()} == {"cpu"}
    assert all(torch.equal(a, b) for a, b in zip(cpu.state_dict().values(),
                                                  other.state_dict().values(), strict=True))


@pytest.mark.parametrize(("config", "kw", "field"), [
    (ParityConfig, dict(heads=4.0), "heads"),        # built; failed at the first forward
    (BooleanConfig, dict(heads=2.0), "heads"),
    (ModAddConfig, dict(heads=4.0), "heads"),
    (ParityConfig, dict(layers=True), "layers"),     # built one layer
    (ParityConfig, dict(n_bits=8.0), "n_bits"),      # failed inside torch.empty
    (SparseAttentionConfig, dict(dim=6.0), "dim"),   # failed inside torch.randn
    (AttentionModelConfig, dict(dim=float("nan")), "dim"),
])
def test_config_sizes_that_are_not_integers_are_refused_by_name(config, kw, field) -> None:
    with pytest.raises(ValueError, match=rf"{config.__name__}\.{field} must be a positive integer"):
        config(**kw)


@pytest.mark.parametrize("p", [7.0, float("nan"), True])
def test_a_modulus_that_is_not_an_integer_is_refused(p) -> None:
    with pytest.raises(ValueError, match="modulus p must be an integer of at least 2"):
        ModAddConfig(p=p)


@pytest.mark.parametrize("num_classes", [True, 2.0])
def test_parity_num_classes_that_is_not_an_int_is_refused(num_classes) -> None:
    # True and 2.0 compare equal to 1 and 2 and passed the check, then failed inside nn.Linear
    with pytest.raises(ValueError, match="num_classes must be 1 .* or 2"):
        ParityConfig(num_classes=num_classes)


@pytest.mark.parametrize("dtype", [torch.uint16, torch.uint8, torch.int16])
def test_modadd_small_integer_token_ids_are_refused_naming_long(dtype: torch.dtype) -> None:
    # uint16 failed in the range check ("lt_cpu" not implemented), uint8 and int16 inside the
    # embedding; int32 and int64 give the same logits
    model = create_model("modadd_transformer", **SMALL["modadd_transformer"][2]).eval()
    tokens = torch.tensor([[1, 2, 7], [3, 6, 7]])
    with pytest.raises(ValueError, match=r"dtype torch\.\w+.*tokens\.long\(\)"):
        model(tokens.to(dtype))
    torch.testing.assert_close(model(tokens.int()), model(tokens), rtol=0, atol=0)
