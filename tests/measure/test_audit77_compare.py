"""Audit of the paired comparison (``compare_sensitivity``/``CompareSensitivity``).

* Two models that differ on no copy get a difference of exactly 0 ± 0, "known exactly", while
  the models do differ (rarely); ``compute`` said nothing.
* The few-flips warnings of the models' own results did not say which model they meant.
* A model that measured a batch before another model failed kept it in its
  ``untrimmed_batches``: counted twice once the batch was measured again.
"""

from __future__ import annotations

import warnings

import pytest
import torch
from metric_models import Logit

from senslab.measure import CompareSensitivity, compare_sensitivity
from senslab.tokens import Embedding, Sequence

T, D = 4, 2


def _w() -> torch.Tensor:
    return torch.randn(T, D, generator=torch.Generator().manual_seed(0))


def _x(n: int = 8) -> torch.Tensor:
    return torch.randn(n, T, D, generator=torch.Generator().manual_seed(1))


def _caught(fn) -> tuple[object, list[str]]:
    with warnings.catch_warnings(record=True) as rec:
        warnings.simplefilter("always")
        out = fn()
    return out, [str(w.message) for w in rec]


def test_no_disagreement_on_any_copy_is_warned_not_reported_as_known_exactly():
    """Biases 0 and 0.02: the models differ (true subset difference −0.0015) but disagreed on
    none of the 128 copies of this run (76% of seeds): a − b = +0.0000 ± 0.0000, 95% CI
    [0, 0], with each model at 12 flips and no warning; such intervals covered the true
    difference in 0 of 303 runs."""
    w = _w()
    r, said = _caught(lambda: compare_sensitivity(
        {"a": Logit(w, 0.0), "b": Logit(w, 0.02)}, _x(), Sequence(), sigma=1.0, repeats=4,
        generator=0))
    d = r.difference("a", "b")
    assert r.results["a"].estimate > 0.05  # each model flips, so neither warns of itself
    assert d.estimate == 0.0 and d.stderr == 0.0 and d.ci95 == (0.0, 0.0)
    hits = [m for m in said if "no copy on which the two models differ" in m]
    assert len(hits) == 1, said
    assert "'a' − 'b'" in hits[0] and "3/128" in hits[0]


def test_a_wrapper_around_the_same_model_is_warned_too():
    """One module under two objects (the module and a function calling it) passes the
    same-object refusal; its exact 0 ± 0 is said, once per pair (a second compute is quiet)."""
    torch.manual_seed(0)  # test-only: init
    net = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(T * D, 3))
    metric = CompareSensitivity({"net": net, "wrapped": lambda z: net(z)}, Sequence(),
                                sigma=1.0, repeats=2, generator=0)
    metric.update(_x())
    _, said = _caught(metric.compute)
    assert sum("no copy on which the two models differ" in m for m in said) == 1
    _, again = _caught(metric.compute)
    assert not any("no copy on which" in m for m in again)


def test_models_that_disagree_are_not_warned():
    w = _w()
    r, said = _caught(lambda: compare_sensitivity(
        {"a": Logit(w, 0.0), "b": Logit(-w, 0.3)}, _x(), Sequence(), sigma=1.0, repeats=4,
        generator=0))
    assert r.difference("a", "b").stderr > 0
    assert not any("no copy on which" in m for m in said)


def test_a_models_own_warning_names_the_model():
    """A model that never flips: its "rests on no flip" warning said nothing of which of the
    two models it was."""
    w = _w()
    _, said = _caught(lambda: compare_sensitivity(
        {"base": Logit(w, 0.0), "robust": Logit(w, 100.0)}, _x(), Sequence(), sigma=1.0,
        repeats=4, generator=0))
    own = [m for m in said if "rests on no flip" in m]
    assert own and all(m.startswith("model 'robust': ") for m in own), said


class _Mean(torch.nn.Module):
    """Mean of the embeddings over all positions, padding included (so the batch runs at
    full width); ``fail``: its first forward of more than 4 rows raises once."""

    def __init__(self, fail: bool = False) -> None:
        super().__init__()
        self.emb = torch.nn.Embedding(10, 4)
        self.head = torch.nn.Linear(4, 3)
        self.fail = fail

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        if self.fail and len(ids) > 4:
            self.fail = False
            raise RuntimeError("transient failure")
        return self.head(self.emb(ids).mean(1))


def test_a_failed_update_leaves_untrimmed_batches_as_they_were():
    torch.manual_seed(0)  # test-only: init
    ids = torch.randint(1, 10, (4, 6), generator=torch.Generator().manual_seed(2))
    mask = torch.arange(6)[None] < torch.tensor([6, 3, 4, 2])[:, None]
    metric = CompareSensitivity({"a": _Mean(), "b": _Mean(fail=True)}, Embedding("emb"),
                                sigma=0.5)
    with pytest.raises(RuntimeError, match="model 'b': transient"):
        metric.update(ids, mask)
    assert [m.untrimmed_batches for m in metric.metrics.values()] == [0, 0]
    metric.update(ids, mask)
    assert [m.untrimmed_batches for m in metric.metrics.values()] == [1, 1]
