"""Sensitivity measures: token-wise Gaussian sensitivity, Boolean analysis."""

from .tokenwise import SensitivityResult, TokenSensitivity, token_sensitivity

__all__ = ["SensitivityResult", "TokenSensitivity", "token_sensitivity"]
