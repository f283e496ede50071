"""A linear classifier head on token vectors, for tests whose truth is a closed-form flip
probability (the paired comparisons' calibration tests)."""

from __future__ import annotations

import torch


class TokenMeanHead(torch.nn.Module):
    """A linear 3-class head on each token, averaged over the tokens: a token's noise moves
    the logits by W ε / T."""

    def __init__(self, w: torch.Tensor, b: torch.Tensor) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(w.shape[1], w.shape[0])
        with torch.no_grad():
            self.lin.weight.copy_(w)
            self.lin.bias.copy_(b)

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        return self.lin(z).mean(1)
