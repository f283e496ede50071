"""Datasets by name: ``create_dataset(name, split, root=..., download=...)``. Where their files
are found: :mod:`senslab.data._roots` (``find_root``, one rule for every dataset)."""

from . import corruptions, images, synthetic, text  # noqa: F401  (register loaders)
from ._download import DataUnavailableError, DataWriteError, fetch
from ._registry import create_dataset, list_datasets, register_dataset
from ._roots import data_home, find_root, locate
from .base import ArrayDataset

__all__ = [
    "ArrayDataset",
    "DataUnavailableError",
    "DataWriteError",
    "create_dataset",
    "data_home",
    "fetch",
    "find_root",
    "list_datasets",
    "locate",
    "register_dataset",
]
