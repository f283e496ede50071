"""The Lightning tests' tiny classifier and data, to import after
``pytest.importorskip("lightning")``: a real module that trains on the CPU in well under a
second."""

from __future__ import annotations

import lightning
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset


class Module(lightning.LightningModule):
    """A tiny classifier of 8×8 one-channel inputs into 3 classes, the same weights every time;
    ``logs_in`` names the hook ("training_step" or "on_train_epoch_end") where it logs a value
    of its own under the key ``sensitivity``."""

    def __init__(self, logs_in: str | None = None) -> None:
        super().__init__()
        torch.manual_seed(0)  # test-only: init
        self.net = nn.Sequential(nn.Flatten(), nn.Linear(64, 16), nn.Tanh(), nn.Linear(16, 3))
        self.logs_in = logs_in

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], _: int) -> torch.Tensor:
        x, y = batch
        loss = nn.functional.cross_entropy(self(x), y)
        if self.logs_in == "training_step":
            self.log("sensitivity", 123.0, on_step=False, on_epoch=True)
        return loss

    def on_train_epoch_end(self) -> None:
        if self.logs_in == "on_train_epoch_end":
            self.log("sensitivity", 7.0)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.5)


def data() -> tuple[DataLoader, torch.Tensor]:
    """32 random examples in batches of 8, and the first 10 as the tracked subset."""
    g = torch.Generator().manual_seed(1)
    x = torch.randn(32, 1, 8, 8, generator=g)
    y = torch.randint(0, 3, (32,), generator=g)
    return DataLoader(TensorDataset(x, y), batch_size=8), x[:10]
