"""The model registry: every factory declares the config it builds with, so callers learn a
model's fields without building it."""

from __future__ import annotations

import pytest
import torch

from senslab.models import create_model, list_models, model_config, register_model
from senslab.models._registry import MODELS


@pytest.mark.parametrize("name", list_models())
def test_declared_config_is_the_one_the_factory_builds(name):
    with torch.random.fork_rng(devices=[]):
        built = create_model(name).config
    assert model_config(name) == built
    assert type(model_config(name)) is type(built)


def test_model_config_names_close_models_for_a_typo():
    with pytest.raises(KeyError, match="Did you mean 'mlp'"):
        model_config("mpl")


def test_undeclared_config_is_read_from_one_build(monkeypatch):
    """A factory registered without ``config=`` is built once to ask; the global RNG is kept."""
    monkeypatch.setattr(MODELS, "_entries", dict(MODELS._entries))  # registration undone after
    calls = []

    @register_model("_toy_for_registry_test")
    def toy(**overrides):
        calls.append(overrides)
        return torch.nn.Linear(2, 2)

    state = torch.get_rng_state()
    assert model_config("_toy_for_registry_test") is None  # a model without a config
    assert calls == [{}] and torch.equal(torch.get_rng_state(), state)
