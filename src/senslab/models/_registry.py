"""Model registry: ``@register_model`` on a factory, ``create_model(name, **overrides)``."""

from __future__ import annotations

from collections.abc import Callable

from torch import nn

from ..registry import Registry

MODELS: Registry[Callable[..., nn.Module]] = Registry("model")
register_model = MODELS.register


def create_model(name: str, **overrides) -> nn.Module:
    """Build registered model ``name``; keyword overrides replace fields of its config."""
    return MODELS.get(name)(**overrides)


def list_models(pattern: str = "*") -> list[str]:
    """Registered model names matching a glob pattern, e.g. ``list_models("vit_*")``."""
    return MODELS.names(pattern)
