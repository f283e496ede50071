"""Sensitivity measures: token-wise Gaussian sensitivity and Boolean (Fourier) analysis.

Every measure is a function returning a small frozen result dataclass; the token-wise one also
exists as an accumulating class (``update``/``compute``/``reset``/``merge``), and so does the
paired comparison of several models on the same perturbed copies (:mod:`.compare`).
"""

from .._exclusive import exclusive
from .._seeds import noise_seed
from .boolean import (
    BooleanSensitivity,
    all_inputs,
    average_sensitivity_fourier,
    boolean_sensitivity,
    degree,
    first,
    fourier_coefficients,
    influence_fourier,
    majority,
    mean,
    noise_stability,
    parity,
    random_function,
    sparse_parity,
    spectral_weights,
    table_function,
    truth_table,
)
from .compare import (
    CompareSensitivity,
    ComparisonResult,
    Difference,
    compare_sensitivity,
)
from .tokenwise import SensitivityResult, TokenSensitivity, token_sensitivity

__all__ = [
    "BooleanSensitivity",
    "CompareSensitivity",
    "ComparisonResult",
    "Difference",
    "SensitivityResult",
    "TokenSensitivity",
    "all_inputs",
    "average_sensitivity_fourier",
    "boolean_sensitivity",
    "compare_sensitivity",
    "degree",
    "exclusive",
    "first",
    "fourier_coefficients",
    "influence_fourier",
    "majority",
    "mean",
    "noise_seed",
    "noise_stability",
    "parity",
    "random_function",
    "sparse_parity",
    "spectral_weights",
    "table_function",
    "token_sensitivity",
    "truth_table",
]
