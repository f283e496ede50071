"""Audit 81 of the integrations: merging a state dict that holds none of the metric's states —
``state_dict()`` of a metric left at torchmetrics' default ``persistent(False)``, which is empty,
or a module's state dict whose entries carry the module's prefix — raised torchmetrics' own
"Expected state variable n to be present in incoming state OrderedDict()", after a warning that
blamed an older senslab for the missing configuration; now refused with the cause and the fix,
and the fix merges. Real metrics and models, no mocks."""

from __future__ import annotations

import warnings

import pytest
import torch
from torch import nn

pytest.importorskip("torchmetrics")

from senslab.integrations.torchmetrics import TokenSensitivityMetric  # noqa: E402
from senslab.tokens import Patches  # noqa: E402

pytestmark = pytest.mark.filterwarnings(
    "ignore::RuntimeWarning",  # few flips on a toy model
    "ignore:The ``compute`` method:UserWarning",  # torchmetrics: merged, not updated, here
)


def _model() -> nn.Module:
    torch.manual_seed(0)  # test-only: init
    return nn.Sequential(nn.Flatten(), nn.Linear(16, 3))


def _measured(generator: int) -> TokenSensitivityMetric:
    metric = TokenSensitivityMetric(Patches(2), sigma=0.5, generator=generator)
    metric.update(_model(), torch.randn(8, 1, 4, 4, generator=torch.Generator().manual_seed(1)))
    return metric


def test_merging_the_empty_state_dict_of_a_non_persistent_metric_names_the_fix():
    target = TokenSensitivityMetric(Patches(2), sigma=0.5)
    other = _measured(1)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no warning of an older senslab's dict either
        with pytest.raises(ValueError, match=r"it is empty.*persistent\(True\)"):
            target.merge_state(other.state_dict())
    assert float(target.n) == 0  # nothing merged
    other.persistent(True)  # the fix named
    target.merge_state(other.state_dict())
    assert target.result().num_examples == 8


def test_merging_a_modules_state_dict_names_the_prefix():
    holder = nn.Module()
    holder.sens = _measured(1)
    holder.sens.persistent(True)
    target = TokenSensitivityMetric(Patches(2), sigma=0.5)
    with pytest.raises(ValueError, match=r"prefix \('sens'…\).*without the prefix 'sens\.'"):
        target.merge_state(holder.state_dict())
    own = {k.removeprefix("sens."): v for k, v in holder.state_dict().items()}
    target.merge_state(own)
    assert target.result().num_examples == 8
