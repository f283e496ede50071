"""Audit 86 of the torchmetrics integration: a zero standard error of alike rates is said as
``TokenSensitivity`` says it; torchmetrics' ``Running`` wrapper is refused naming its cause;
states merged or loaded into a fresh metric count as updated."""

from __future__ import annotations

import warnings

import pytest
import torch
from metric_models import patch_batches, patch_net

pytest.importorskip("torchmetrics")

from torchmetrics.wrappers import Running  # noqa: E402

from senslab.integrations.torchmetrics import TokenSensitivityMetric  # noqa: E402
from senslab.measure import token_sensitivity  # noqa: E402
from senslab.tokens import Patches, Sequence  # noqa: E402

ALIKE = "the standard error is 0 because the per-example flip rates of all 2 examples came out"
BEFORE_UPDATE = "was called before the ``update`` method"


class TwoTokens(torch.nn.Module):
    """Class 1 where the noise on token 0 or token 2 is positive: each example flips on about a
    quarter of its copies, at random."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        s = x[:, 0, 0].clamp(min=0) + x[:, 2, 0].clamp(min=0)
        return torch.stack([torch.full_like(s, 1e-6), s], dim=1)


def _said(call) -> tuple[object, list[str]]:
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        out = call()
    return out, [str(w.message) for w in said]


def test_the_metric_says_a_zero_standard_error_of_alike_rates_once() -> None:
    metric = TokenSensitivityMetric(Sequence(), sigma=1.0, repeats=8, generator=17)
    metric.update(TwoTokens(), torch.zeros(2, 4, 1))
    r, said = _said(metric.result)
    ref = token_sensitivity(TwoTokens(), torch.zeros(2, 4, 1), Sequence(), sigma=1.0,
                            repeats=8, generator=17)
    assert r.per_sample.tolist() == ref.per_sample.tolist() == [0.375, 0.375]
    assert r.stderr == 0 and r.stderr_subset > 0
    assert sum(m.startswith(ALIKE) for m in said) == 1, said
    metric.update(TwoTokens(), torch.zeros(2, 4, 1))  # more alike rates: said once per metric
    _, again = _said(metric.compute)
    assert not any(m.startswith(ALIKE) for m in again), again


def test_rates_with_spread_say_nothing_of_alike_rates() -> None:
    metric = TokenSensitivityMetric(Sequence(), sigma=1.0, repeats=8, generator=0)
    metric.update(TwoTokens(), torch.zeros(2, 4, 1))
    r, said = _said(metric.result)
    assert r.stderr > 0
    assert not any("came out alike" in m for m in said), said


def test_torchmetrics_running_wrapper_is_refused_naming_its_noise_restart() -> None:
    net, batches = patch_net(), patch_batches(2)
    running = Running(TokenSensitivityMetric(Patches(2), sigma=0.5), window=2)
    for batch in batches:
        running(net, batch)
    with pytest.raises(RuntimeError, match="Running wrapper") as err:
        running.compute()
    assert "restarts the noise from the seed" in str(err.value)
    assert "compute_groups" not in str(err.value)  # not the collection's cause and fix
    # merge_state, which adds states through the same torchmetrics method, still adds up
    a = TokenSensitivityMetric(Patches(2), sigma=0.5)
    b = TokenSensitivityMetric(Patches(2), sigma=0.5, generator=1)
    a.update(net, batches[0])
    b.update(net, batches[1])
    a.merge_state(b)
    assert a.result().num_examples == 32


def test_states_merged_or_loaded_into_a_fresh_metric_count_as_updated() -> None:
    net, batches = patch_net(), patch_batches(2)
    a = TokenSensitivityMetric(Patches(2), sigma=0.5)
    b = TokenSensitivityMetric(Patches(2), sigma=0.5, generator=1)
    a.update(net, batches[0])
    b.update(net, batches[1])
    merged = TokenSensitivityMetric(Patches(2), sigma=0.5)
    merged.merge_state(a)
    merged.merge_state(b)
    value, said = _said(merged.compute)
    assert not any(BEFORE_UPDATE in m for m in said), said
    assert merged.result().num_examples == 32
    a.persistent(True)
    loaded = TokenSensitivityMetric(Patches(2), sigma=0.5)
    loaded.persistent(True)
    loaded.load_state_dict(a.state_dict())
    value, said = _said(loaded.compute)
    assert not any(BEFORE_UPDATE in m for m in said), said
    assert float(value) == float(a.compute())
    # a metric that holds nothing is still warned of, then refused
    fresh = TokenSensitivityMetric(Patches(2), sigma=0.5)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with pytest.raises(RuntimeError, match="no examples measured yet"):
            fresh.compute()
    assert any(BEFORE_UPDATE in str(w.message) for w in caught)
