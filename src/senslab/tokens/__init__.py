"""Tokenizations: how an input is cut into tokens that sensitivity perturbs one at a time."""

from .auto import DEFAULT_CNN_PATCH, auto_tokens, default_tokens
from .base import BoundTokens, Tokenization, call_model, select
from .embedding import Embedding, find_module
from .patches import Patches, Sequence

__all__ = [
    "DEFAULT_CNN_PATCH",
    "BoundTokens",
    "Embedding",
    "Patches",
    "Sequence",
    "Tokenization",
    "auto_tokens",
    "call_model",
    "default_tokens",
    "find_module",
    "select",
]
