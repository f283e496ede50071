"""Optimisers and max-margin tools for the implicit bias of self-attention (Vasudeva et al.;
docs/definitions.md#self-attention-optimization).

``NGD`` / ``SNGD`` (normalised gradient descent, optional η_max cap), ``SPS`` (stochastic Polyak
step SPS_max) and ``Polyak`` (full-batch Polyak step) are ``torch.optim.Optimizer`` subclasses
usable on any model; ``max_margin_attention`` solves for W_mm exactly and
``max_margin_direction`` for the decoder's v_mm, and ``alignment`` / ``attention_sparsity``
measure how far training has gone towards them.
"""

from .maxmargin import (
    alignment,
    attention_margins,
    attention_sparsity,
    check_max_margin,
    max_margin_attention,
    max_margin_direction,
    optimal_tokens,
)
from .normalized import NGD, SNGD, global_grad_norm
from .polyak import SPS, Polyak

__all__ = [
    "NGD",
    "SNGD",
    "SPS",
    "Polyak",
    "alignment",
    "attention_margins",
    "attention_sparsity",
    "check_max_margin",
    "global_grad_norm",
    "max_margin_attention",
    "max_margin_direction",
    "optimal_tokens",
]
