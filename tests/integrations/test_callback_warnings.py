"""A callback measures its subset with a new metric at every evaluation: a cause the metric
says once (its options, its model) must still be said once over the callback's evaluations, not
in every one (a training run's logs, recorded with an "always" filter, filled with it)."""

from __future__ import annotations

import importlib.util
import warnings

import pytest

from senslab.tokens import Patches

from ..measure.test_warned_once import FEW_PAIRS, count, few_pairs_case


def _callbacks() -> list[str]:
    return [name for name, module in (("hf", "transformers"), ("lightning", "lightning"))
            if importlib.util.find_spec(module) is not None]


@pytest.mark.parametrize("kind", _callbacks())
def test_a_callback_says_a_cause_once_over_its_evaluations(kind: str) -> None:
    if kind == "hf":
        from senslab.integrations.hf import SensitivityCallback
    else:
        from senslab.integrations.lightning import SensitivityCallback
    model, x, options = few_pairs_case()
    callback = SensitivityCallback(x, Patches(2), batch_size=4, **options)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        results = [callback.measure(model) for _ in range(3)]
    assert count([str(w.message) for w in caught], FEW_PAIRS) == 1  # was one per batch: 6
    assert len({r.estimate for r in results}) == 1  # the same subset and seed every time
    other = SensitivityCallback(x, Patches(2), batch_size=4, **options)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        other.measure(model)
    assert count([str(w.message) for w in caught], FEW_PAIRS) == 1  # another callback: said
