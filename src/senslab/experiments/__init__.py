"""Registered experiments: ``senslab run NAME``; ``list_experiments()``."""

import importlib
import pkgutil

from .base import (
    Experiment,
    get_experiment,
    list_experiments,
    load_summaries,
    register_experiment,
    run_experiment,
)

# register every experiment module found in this package and its sub-packages
for _info in pkgutil.walk_packages(__path__, prefix=f"{__name__}."):
    if not _info.name.rsplit(".", 1)[-1].startswith("_"):
        importlib.import_module(_info.name)

__all__ = [
    "Experiment",
    "get_experiment",
    "list_experiments",
    "load_summaries",
    "register_experiment",
    "run_experiment",
]
