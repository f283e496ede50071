"""Text models (audit 81): building one leaves the caller's random stream and default device
alone; token ids of a dtype the embedding cannot take, and config fields that are not positive
integers, are refused with an error naming the fix instead of failing inside torch."""

from __future__ import annotations

import pytest
import torch

from senslab.models import create_model
from senslab.models.text import GPT2Classifier, RobertaClassifier, RobertaConfig, TextConfig

NAMES = ["lstm", "roberta", "roberta_relu", "gpt2"]
SMALL = dict(vocab_size=30, max_len=8, dim=8, layers=1, heads=2, dropout=0.0)


@pytest.mark.parametrize("name", NAMES)
def test_building_a_text_model_leaves_the_global_rng_and_draws_on_the_cpu(name: str) -> None:
    """The layers' own default init drew from the global RNG before ``init_weights`` redrew every
    weight from the seed, so each build moved the caller's stream; under a default device the
    model was built there (with a CUDA default, the CPU generator's draws raise). The meta device
    stands in for a GPU, as in the vision models' test."""
    torch.manual_seed(123)
    state = torch.random.get_rng_state()
    cpu = create_model(name, seed=4, **SMALL)
    assert torch.equal(torch.random.get_rng_state(), state)
    with torch.device("meta"):
        other = create_model(name, seed=4, **SMALL)
    for (key, a), b in zip(cpu.state_dict().items(), other.state_dict().values(), strict=True):
        assert b.device.type == "cpu", key
        assert torch.equal(a, b), key


@pytest.mark.parametrize("name", NAMES)
def test_token_ids_of_a_dtype_the_embedding_cannot_take_are_refused_naming_the_fix(
        name: str) -> None:
    model = create_model(name, **SMALL).eval()
    ids = torch.randint(2, SMALL["vocab_size"], (2, 5), generator=torch.Generator().manual_seed(0))
    dtypes = [torch.int16, torch.uint8] + ([torch.uint16] if hasattr(torch, "uint16") else [])
    for dtype in dtypes:  # uint16: numpy token files; before, "lt_cpu" not implemented
        with pytest.raises(ValueError, match=r"dtype torch\.u?int(8|16).*input_ids\.long\(\)"):
            model(ids.to(dtype))
    with torch.no_grad():  # int32 is still taken, with int64's logits
        assert torch.equal(model(ids.to(torch.int32)), model(ids))


@pytest.mark.parametrize(("cls", "config_cls", "bad"), [
    (RobertaClassifier, RobertaConfig, {"heads": 2.0}),  # built, then failed at forward
    (GPT2Classifier, TextConfig, {"layers": True}),  # built one layer
    (RobertaClassifier, RobertaConfig, {"num_classes": 2.0}),
])
def test_config_fields_that_are_not_positive_integers_are_refused(cls, config_cls, bad) -> None:
    field, value = next(iter(bad.items()))
    with pytest.raises(ValueError, match=rf"{config_cls.__name__}\.{field} must be a positive "
                                         rf"integer, got {value!r}"):
        cls(config_cls(**{**SMALL, **bad}))
