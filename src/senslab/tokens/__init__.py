"""Tokenizations: how an input is cut into tokens that sensitivity perturbs one at a time."""

from .base import BoundTokens, Tokenization, call_model, select
from .embedding import Embedding, find_module
from .patches import Patches, Sequence

__all__ = [
    "BoundTokens",
    "Embedding",
    "Patches",
    "Sequence",
    "Tokenization",
    "call_model",
    "find_module",
    "select",
]
