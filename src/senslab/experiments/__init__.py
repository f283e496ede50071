"""Registered experiments: ``senslab run NAME``; ``list_experiments()``."""

from . import demo  # noqa: F401  (register experiments)
from .base import (
    Experiment,
    get_experiment,
    list_experiments,
    load_summaries,
    register_experiment,
    run_experiment,
)

__all__ = [
    "Experiment",
    "get_experiment",
    "list_experiments",
    "load_summaries",
    "register_experiment",
    "run_experiment",
]
