"""Dataset registry: ``@register_dataset`` on a loader, ``create_dataset(name, split, ...)``."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ..registry import Registry

DATASETS: Registry[Callable[..., Any]] = Registry("dataset")
register_dataset = DATASETS.register


def create_dataset(name: str, split: str = "train", **kwargs: Any) -> Any:
    """Load registered dataset ``name`` (``split`` is e.g. "train", "test", "val", "ood")."""
    return DATASETS.get(name)(split=split, **kwargs)


def list_datasets(pattern: str = "*") -> list[str]:
    return DATASETS.names(pattern)


def takes(name: str, option: str) -> bool:
    """Whether the loader of registered dataset ``name`` has the keyword ``option`` (False for
    a name not registered)."""
    import inspect

    try:
        return option in inspect.signature(DATASETS.get(name)).parameters
    except (KeyError, TypeError, ValueError):
        return False
