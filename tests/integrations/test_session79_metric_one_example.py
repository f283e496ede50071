"""The torchmetrics metric says, as ``TokenSensitivity.compute`` does, why one example's data
standard error is NaN, and gives its fixed-subset one (it was reported ``± nan`` without a
word); once per metric, also after a reset."""

from __future__ import annotations

import math
import warnings

import pytest
import torch
from torch import nn

pytest.importorskip("torchmetrics")

from senslab.integrations.torchmetrics import TokenSensitivityMetric  # noqa: E402
from senslab.tokens import Patches  # noqa: E402


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Flatten(), nn.Linear(64, 16), nn.Tanh(), nn.Linear(16, 3))


def _one_example_warnings(caught: list[warnings.WarningMessage]) -> list[str]:
    return [str(w.message) for w in caught if "needs at least two examples" in str(w.message)]


def _measured(examples: int) -> tuple[nn.Module, torch.Tensor, TokenSensitivityMetric]:
    """The model, its ``examples`` images and a metric updated with them."""
    model = _model()
    x = torch.randn(examples, 1, 8, 8, generator=torch.Generator().manual_seed(1))
    metric = TokenSensitivityMetric(Patches(2), sigma=2.0, repeats=4, generator=0)
    metric.update(model, x)
    return model, x, metric


def test_one_example_is_said_once_with_its_subset_standard_error() -> None:
    model, x, metric = _measured(1)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        r = metric.result()
        metric.compute()
    said = _one_example_warnings(caught)
    assert math.isnan(r.stderr) and math.isfinite(r.stderr_subset)
    assert len(said) == 1
    assert f"{r.stderr_subset:.2g}" in said[0]
    metric.reset()
    metric.update(model, x)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        metric.compute()
    assert not _one_example_warnings(caught)  # said once per metric


def test_two_examples_are_not_warned_about() -> None:
    _, _, metric = _measured(2)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        r = metric.result()
    assert math.isfinite(r.stderr)
    assert not _one_example_warnings(caught)


def _first_entry(inp: torch.Tensor) -> torch.Tensor:
    """The logit is token 0's first entry: 0 (on the boundary, a tie) for a blank example."""
    return inp[:, 0, 0]


def test_the_metric_says_what_the_engine_says_of_ties_and_single_units() -> None:
    """The metric's states carry the counts behind the engine's warnings of tied clean classes
    and of a single unit of draws (it copied only its own list of sums, and said neither)."""
    from senslab.tokens import Sequence

    x = torch.zeros(6, 3, 2)
    x[3:, 0, 0] = torch.tensor([0.5, -0.7, 0.9])  # three blank examples tie, three do not
    metric = TokenSensitivityMetric(Sequence(), sigma=1e-3, repeats=1, mode="whole",
                                    estimand="subset", generator=0)
    metric.update(_first_entry, x)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        r = metric.result()
    said = [str(w.message) for w in caught]
    assert math.isnan(r.stderr)
    # the blank examples that flipped are said (a tie that no copy broke is not seen)
    broke = int((r.per_sample[:3] > 0).sum())
    assert broke >= 1 and r.per_sample[3:].sum() == 0
    assert any(f"clean class is a tie: {broke} of the 6 examples" in m for m in said), said
    assert any("single unit of noise draws" in m for m in said), said
    assert int(metric.num_ties) == broke
