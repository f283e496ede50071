"""Every registered model can be measured through the core's one call on its default tokens."""

from __future__ import annotations

import pytest
import torch

from senslab.measure import token_sensitivity
from senslab.models import create_model, list_models
from senslab.tokens import Embedding, Patches, Sequence

# small configurations: the defaults of some models are paper-sized
SMALL = {
    "vit_small": {"image_size": 8, "in_channels": 1, "patch_size": 2, "depth": 1, "dim": 16,
                  "heads": 2, "dim_head": 8, "mlp_dim": 16},
    "vit_simple": {"image_size": 8, "in_channels": 1, "patch_size": 2, "depth": 1, "dim": 16,
                   "heads": 2, "dim_head": 8, "mlp_dim": 16},
    "convmixer": {"image_size": 8, "in_channels": 1, "dim": 16, "depth": 1},
    "resnet18": {"image_size": 8, "in_channels": 1, "width": 0.0625},  # 4-8-16-32 channels
    "densenet121": {"image_size": 16, "in_channels": 1, "growth_rate": 4, "blocks": (2, 2, 2, 2)},
    "mlp": {"image_size": 8, "widths": (16,), "sens_patch": 2},
    "mlp_sigmoid": {"image_size": 8, "widths": (16,), "sens_patch": 2},
    "cnn": {"image_size": 8, "channels": (4, 4), "hidden": 8, "sens_patch": 2},
    "lstm": {"vocab_size": 50, "dim": 16, "layers": 1, "max_len": 12},
    "roberta": {"vocab_size": 50, "dim": 16, "layers": 1, "heads": 2, "max_len": 12},
    "roberta_relu": {"vocab_size": 50, "dim": 16, "layers": 1, "heads": 2, "max_len": 12},
    "gpt2": {"vocab_size": 50, "dim": 16, "layers": 1, "heads": 2, "max_len": 12},
    "sparse_attention": {"dim": 10},
    "modadd_transformer": {"p": 7, "dim": 16, "heads": 2, "mlp_dim": 16},
    "parity_transformer": {"n_bits": 6, "dim": 16, "heads": 2},
    "boolean_transformer": {"n_bits": 6, "dim": 16},
    "attention_model": {"dim": 6},
}


def inputs_for(name: str, model: torch.nn.Module, g: torch.Generator):
    tokens = model.default_tokens()
    cfg = model.config
    if isinstance(tokens, Patches):
        size = getattr(cfg, "image_size", 8)
        return torch.randn(4, getattr(cfg, "in_channels", 1), size, size, generator=g), None
    if isinstance(tokens, Sequence):
        return torch.randn(4, 5, SMALL[name]["dim"], generator=g), None
    assert isinstance(tokens, Embedding)
    if name == "modadd_transformer":
        ids = torch.tensor([[1, 2, 7], [3, 4, 7], [5, 6, 7], [0, 0, 7]])
        return ids, model.number_mask(ids) if hasattr(model, "number_mask") else None
    if name in ("parity_transformer", "boolean_transformer"):
        return torch.randint(0, 2, (4, 6), generator=g).float() * 2 - 1, None
    ids = torch.randint(5, 50, (4, 12), generator=g)
    mask = torch.arange(12)[None] < torch.tensor([12, 9, 5, 3])[:, None]
    return {"input_ids": ids.masked_fill(~mask, 1), "attention_mask": mask}, None


def test_every_registered_model_is_covered():
    assert set(list_models()) == set(SMALL)


@pytest.mark.parametrize("name", list_models())
def test_sensitivity_of_every_model(name):
    model = create_model(name, **SMALL[name])
    x, mask = inputs_for(name, model, torch.Generator().manual_seed(0))
    r = token_sensitivity(model, x, mask=mask, sigma=1.0, repeats=2, compare="l1")
    assert r.num_examples == 4 and r.num_forward > 4
    assert r.estimate > 0  # the noise reaches the output through the default tokens
    c = token_sensitivity(model, x, mask=mask, sigma=1.0, repeats=2)
    assert 0.0 <= c.estimate <= 1.0


@pytest.mark.parametrize("name", list_models())
def test_every_model_declares_its_outputs_logits(name):
    """The zoo's models output logits (one column: its sign is the class), and say so: a
    small-init scalar model whose outputs all lie in (0, 1) is not refused as ambiguous."""
    model = create_model(name, **SMALL[name])
    assert model.output_kind == "logits"
    x, mask = inputs_for(name, model, torch.Generator().manual_seed(0))
    squash = token_sensitivity(model, x, mask=mask, sigma=1.0,
                               output=lambda out: 0.5 + 0.01 * torch.tanh(out))  # all in (0, 1)
    assert 0.0 <= squash.estimate <= 1.0
