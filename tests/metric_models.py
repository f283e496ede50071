"""Small models shared by the metric tests."""

from __future__ import annotations

import torch
from torch import nn


class Text(nn.Module):
    """Token ids → embedding → two same-shaped LayerNorms (``norm``, ``norm2``) → mean → 2
    logits: two layers whose descriptions are equal, for telling layers apart."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)  # test-only: init
        self.emb, self.norm, self.norm2 = nn.Embedding(10, 8), nn.LayerNorm(8), nn.LayerNorm(8)
        self.head = nn.Linear(8, 2)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.head(self.norm2(self.norm(self.emb(ids))).mean(1))
