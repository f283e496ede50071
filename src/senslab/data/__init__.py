"""Datasets by name: ``create_dataset(name, split, root=..., download=...)``."""

from . import corruptions, images, synthetic, text  # noqa: F401  (register loaders)
from ._download import DataUnavailableError, default_root, fetch
from ._registry import create_dataset, list_datasets, register_dataset
from .base import ArrayDataset

__all__ = [
    "ArrayDataset",
    "DataUnavailableError",
    "create_dataset",
    "default_root",
    "fetch",
    "list_datasets",
    "register_dataset",
]
