"""Models by name: ``create_model(name, **overrides)``, ``list_models(pattern)``.

Every model has a frozen dataclass config and a ``default_tokens()`` method returning the
:class:`senslab.tokens.Tokenization` its sensitivity is measured on by default.
"""

from . import resnet, small, text, vision, vit  # noqa: F401  (register factories)
from ._registry import create_model, list_models, model_config, register_model

__all__ = ["create_model", "list_models", "model_config", "register_model"]
