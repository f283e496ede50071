"""senslab: measure, track and regularize the sensitivity of neural networks.

    >>> from senslab import token_sensitivity, Patches
    >>> result = token_sensitivity(model, images, Patches(4), sigma=0.1)  # doctest: +SKIP
"""

from .measure import (
    BooleanSensitivity,
    CompareSensitivity,
    ComparisonResult,
    SensitivityResult,
    TokenSensitivity,
    boolean_sensitivity,
    compare_sensitivity,
    token_sensitivity,
)
from .tokens import Embedding, Patches, Sequence, auto_tokens

__version__ = "0.1.0"

__all__ = [
    "BooleanSensitivity",
    "CompareSensitivity",
    "ComparisonResult",
    "Embedding",
    "Patches",
    "Sequence",
    "SensitivityResult",
    "TokenSensitivity",
    "auto_tokens",
    "boolean_sensitivity",
    "compare_sensitivity",
    "token_sensitivity",
]
