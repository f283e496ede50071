"""Audit 77 (torchmetrics): TokenSensitivityMetric in a torchmetrics MetricCollection."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("torchmetrics")
from torchmetrics import MetricCollection  # noqa: E402

from senslab.integrations.torchmetrics import TokenSensitivityMetric  # noqa: E402
from senslab.tokens import Patches  # noqa: E402


class _Switch(torch.nn.Module):
    """A linear classifier that predicts class 0 for everything until ``on`` (a model before
    it learns anything: no perturbation flips it, at any sigma)."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.lin = torch.nn.Linear(16, 3)
        self.on = False

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.lin(x.flatten(1))
        return out if self.on else torch.zeros_like(out) + torch.tensor([1.0, 0.0, 0.0])


def _batches() -> torch.Tensor:
    return torch.randn(3, 8, 1, 4, 4, generator=torch.Generator().manual_seed(1))


def _run(metrics: dict, compute_groups: bool) -> dict[str, float]:
    net, xs = _Switch(), _batches()
    col = MetricCollection(metrics, compute_groups=compute_groups)
    for k, x in enumerate(xs):
        net.on = k > 0
        col.update(net, x, index=torch.arange(8 * k, 8 * k + 8))
    return {k: float(v) for k, v in col.compute().items()}


@pytest.mark.filterwarnings("ignore")
def test_a_collection_never_reports_one_sigmas_estimate_as_anothers() -> None:
    """Two sigmas whose first batch has no flip have equal states; torchmetrics' compute
    groups then updated only the first, and sigma=2.0 reported sigma=0.1's 0.0 for its own
    0.1875, without a word."""
    alone = _run({"b": TokenSensitivityMetric(Patches(2), sigma=2.0)}, True)["b"]
    assert alone > 0.1
    separate = _run({"a": TokenSensitivityMetric(Patches(2), sigma=0.1),
                     "b": TokenSensitivityMetric(Patches(2), sigma=2.0)}, False)
    assert separate["b"] == alone
    with pytest.raises(RuntimeError, match="compute_groups=False"):
        _run({"a": TokenSensitivityMetric(Patches(2), sigma=0.1),
              "b": TokenSensitivityMetric(Patches(2), sigma=2.0)}, True)


@pytest.mark.filterwarnings("ignore")
def test_states_put_in_a_metrics_place_are_refused_by_the_sync_too() -> None:
    """The processes' sync refuses them as well (on every process: the flag is gathered)."""
    net, xs = _Switch(), _batches()
    a = TokenSensitivityMetric(Patches(2), sigma=1.0)
    b = TokenSensitivityMetric(Patches(2), sigma=1.0)
    a.update(net, xs[0])
    a.update(net, xs[1])
    b.update(net, xs[0])
    for name in a._defaults:  # what MetricCollection's compute groups do
        setattr(b, name, getattr(a, name))
    with pytest.raises(RuntimeError, match="process\\(es\\) \\[0\\]"):
        b._sync_dist(lambda t, group=None: [t])
    a._sync_dist(lambda t, group=None: [t])  # its own states sync
