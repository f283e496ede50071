"""Model registry: ``@register_model`` on a factory, ``create_model(name, **overrides)``,
``model_config(name)`` for the config a factory builds with."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from ..registry import Registry

MODELS: Registry[Callable[..., nn.Module]] = Registry("model")
#: name → the config its factory builds with when given no overrides (declared at registration)
_DEFAULT_CONFIGS: dict[str, Any] = {}


def register_model(
    name: str | None = None, *, config: Any = None
) -> Callable[[Callable[..., nn.Module]], Callable[..., nn.Module]]:
    """Register a factory ``fn(**overrides) -> nn.Module`` under ``name`` (default: its own name).

    ``config`` is the config the factory builds with when given no overrides (its frozen
    dataclass with the factory's own defaults, e.g. ``MLPConfig(activation="sigmoid")``), so
    :func:`model_config` can answer without building a model.
    """
    register = MODELS.register(name)

    def deco(fn: Callable[..., nn.Module]) -> Callable[..., nn.Module]:
        fn = register(fn)
        if config is not None:
            _DEFAULT_CONFIGS[name or fn.__name__] = config
        return fn

    return deco


def create_model(name: str, **overrides) -> nn.Module:
    """Build registered model ``name``; keyword overrides replace fields of its config."""
    return MODELS.get(name)(**overrides)


def model_config(name: str) -> Any:
    """The config ``create_model(name)`` builds with (no overrides), e.g. to learn which fields
    the model has. Read from the registration; a factory registered without ``config=`` is
    built once to ask (global RNG untouched). None for a model without a ``config``."""
    factory = MODELS.get(name)  # an unknown name: the error that lists close names
    if name in _DEFAULT_CONFIGS:
        return _DEFAULT_CONFIGS[name]
    with torch.random.fork_rng(devices=[]):
        return getattr(factory(), "config", None)


def list_models(pattern: str = "*") -> list[str]:
    """Registered model names matching a glob pattern, e.g. ``list_models("vit_*")``."""
    return MODELS.names(pattern)
