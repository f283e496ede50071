"""Metrics of other examples that drew the same noise (one seed, from the same point of its
stream) are merged, or all-reduced, with a warning: their flips are correlated copy for copy, and
the standard error that takes them as independent is too small."""

import copy
import warnings

import pytest
import torch
from torch import nn

from senslab.measure import TokenSensitivity
from senslab.measure._stats import shared_noise_ranks
from senslab.tokens import Patches

SAME = "drew the same noise"


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Flatten(), nn.Linear(16, 3)).eval()


def _x(n: int = 20) -> torch.Tensor:
    return torch.randn(n, 1, 4, 4, generator=torch.Generator().manual_seed(1))


def _measured(model, x, seed, **kw) -> TokenSensitivity:
    sigma = None if "replace_with" in kw else 1.0
    m = TokenSensitivity(model, Patches(2), sigma=sigma, generator=seed, **kw)
    m.update(x)
    return m


def _said(fn) -> list[str]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        fn()
    return [str(w.message) for w in caught if SAME in str(w.message)]


def test_two_jobs_with_the_default_seed_are_warned_of():
    model, x = _model(), _x()
    a, b = _measured(model, x[:10], 0), _measured(model, x[10:], 0)
    said = _said(lambda: a.merge(b))
    assert len(said) == 1 and "this metric and the merged one" in said[0]
    assert a.compute().num_examples == 20  # merged all the same: the estimate is unbiased


def test_own_seeds_a_reset_and_shards_are_not():
    model, x = _model(), _x()
    assert not _said(lambda: _measured(model, x[:10], 0).merge(_measured(model, x[10:], 1)))
    # after a reset the stream goes on: the metric's next examples draw other noise
    later = _measured(model, x[:10], 0)
    later.reset()
    later.update(x[10:])
    assert not _said(lambda: later.merge(_measured(model, x[:10], 0)))
    # shards of one batch share its stream by design: every copy's noise is drawn once
    halves = [_measured(model, x, 0, shard=(r, 2)) for r in range(2)]
    assert not _said(lambda: halves[0].merge(halves[1]))


def test_a_metric_holding_a_merge_carries_where_its_noise_started():
    model, x = _model(), _x(30)
    total = _measured(model, x[:10], 0)
    total.merge(_measured(model, x[10:20], 5))
    # the third job repeats the first one's seed: the total holds the first job's start
    assert len(_said(lambda: total.merge(_measured(model, x[20:], 0)))) == 1


def test_copies_of_an_unused_metric_draw_the_same_noise():
    model, x = _model(), _x()
    template = TokenSensitivity(model, Patches(2), sigma=1.0, generator=0)
    workers = [copy.deepcopy(template) for _ in range(2)]
    for w, part in zip(workers, (x[:10], x[10:]), strict=True):
        w.update(part)
    assert len(_said(lambda: workers[0].merge(workers[1]))) == 1


def test_ranks_with_one_seed_are_told():
    first = [0.25, -1.5]
    infos = [{"marks": [first]}, {"marks": [[0.5, 0.1]]}, {"marks": [first]}]
    said = shared_noise_ranks(infos)
    assert said is not None and said.startswith("ranks 0 and 2")
    assert shared_noise_ranks([{"marks": [first]}, {"marks": []}, {}]) is None


@pytest.mark.parametrize("kw", [{"antithetic": True, "repeats": 2},
                                {"replace_with": torch.randn(5, 4)}])
def test_every_kind_of_draw_is_marked(kw):
    model, x = _model(), _x()
    a = _measured(model, x[:10], 3, **kw)
    b = _measured(model, x[10:], 3, **kw)
    assert len(_said(lambda: a.merge(b))) == 1
