"""TokenSensitivityMetric merges that would count examples twice without ``index=`` (audit
conc53 D3, fix54 H1): every metric carries a random id and the ids of the metrics whose examples
its states hold, through merges, copies and the state dict (``merged_ids``); older state dicts
still load. An Embedding module given as the object matches its dotted name once the metrics
have measured, and a state dict that cannot tell says how to build both metrics."""

from __future__ import annotations

import copy
import pickle
import warnings

import pytest
import torch
from metric_models import Text, patch_batches, patch_net
from torch import nn

pytest.importorskip("torchmetrics")

from senslab.integrations.torchmetrics import TokenSensitivityMetric  # noqa: E402
from senslab.tokens import Embedding, Patches  # noqa: E402

OPTS = {"sigma": 0.5, "precision": "float32"}


def measured(model: nn.Module, x: torch.Tensor, seed: int) -> TokenSensitivityMetric:
    m = TokenSensitivityMetric(Patches(2), generator=seed, **OPTS)
    m.persistent(True)
    m.update(model, x)
    return m


def test_the_same_metric_merged_twice_is_refused():
    """merge_state(b) twice, or b's state dict after b, counted b's examples again (n 32 -> 48
    -> 64, stderr 0.0332 -> 0.0275 -> 0.0240): refused, nothing added; so is a metric (or a
    loaded state dict) holding b's examples."""
    model, x = patch_net(), patch_batches(3)
    a, b = measured(model, x[0], 0), measured(model, x[1], 1)
    a.merge_state(b)
    once = a.result()
    assert once.num_examples == 32
    for again in (b, b.state_dict()):
        with pytest.raises(ValueError, match="already holds the examples.*merge each metric "
                                             "once"):
            a.merge_state(again)
    assert a.result().num_examples == 32 and a.result().stderr == once.stderr
    holder = measured(model, x[2], 2)
    holder.merge_state(b.state_dict())
    loaded = TokenSensitivityMetric(Patches(2), generator=3, **OPTS)
    loaded.persistent(True)
    loaded.load_state_dict(b.state_dict())
    for incoming in (holder, holder.state_dict(), loaded):
        with pytest.raises(ValueError, match="already holds the examples"):
            a.merge_state(incoming)
    assert a.result().num_examples == 32


def test_copies_merge_once():
    """clone() of a metric that has measured nothing: the copies merge freely; a copy made
    after measuring (clone, deepcopy, pickle) holds the original's examples and merging it back
    is refused; after reset() it merges."""
    model, x = patch_net(), patch_batches(3)
    template = TokenSensitivityMetric(Patches(2), generator=0, **OPTS)
    workers = [template.clone() for _ in range(2)]
    for w, batch in zip(workers, x, strict=False):
        w.update(model, batch)
    workers[0].merge_state(workers[1])
    assert workers[0].result().num_examples == 32

    original = measured(model, x[0], 0)
    for made in (lambda m: m.clone(), copy.deepcopy, lambda m: pickle.loads(pickle.dumps(m))):
        later = made(original)
        later.update(model, x[1])
        with pytest.raises(ValueError, match="a copy of this metric made after it measured"):
            original.merge_state(later)
    later.reset()
    later.update(model, x[2])
    original.merge_state(later)
    assert original.result().num_examples == 32


@pytest.mark.filterwarnings("ignore:The ``compute`` method")  # torchmetrics: loaded, not updated
def test_an_older_state_dict_loads_and_merges():
    """A state dict without ``merged_ids`` (senslab before it) loads and merges without a
    word; one without ``config`` either (an older one still) loads with the warning."""
    model, x = patch_net(), patch_batches(3)
    b = measured(model, x[1], 1)
    without_ids = {k: v for k, v in b.state_dict().items() if k != "merged_ids"}
    fresh = TokenSensitivityMetric(Patches(2), **OPTS)
    fresh.persistent(True)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        warnings.filterwarnings("ignore", "The ``compute`` method")
        fresh.load_state_dict(without_ids)
        a = measured(model, x[0], 0)
        a.merge_state(without_ids)
    assert fresh.result().num_examples == 16 and a.result().num_examples == 32
    oldest = {k: v for k, v in without_ids.items() if k != "config"}
    older = TokenSensitivityMetric(Patches(2), **OPTS)
    older.persistent(True)
    with pytest.warns(UserWarning, match="holds no configuration"):
        older.load_state_dict(oldest)
    assert older.result().estimate == b.result().estimate


@pytest.mark.filterwarnings("ignore:The ``compute`` method")  # torchmetrics: loaded, not updated
def test_an_embedding_module_object_matches_its_dotted_name():
    """Metrics of Embedding(model.norm) and Embedding('norm') merge once both have measured
    (before: refused as different tokenizations); a state dict of one loaded into a metric of
    the other that has not measured is refused with the fix (build both with
    Embedding('norm')); two layers of one shape given as objects are told apart."""
    model = Text()
    ids = torch.randint(0, 10, (3, 8, 5), generator=torch.Generator().manual_seed(1))

    def metric(tokens, i: int | None = None) -> TokenSensitivityMetric:
        m = TokenSensitivityMetric(tokens, generator=i or 0, **OPTS)
        m.persistent(True)
        if i is not None:
            m.update(model, ids[i])
        return m

    by_name = metric(Embedding("norm"), 1)
    for incoming in (by_name, by_name.state_dict()):
        mine = metric(Embedding(model.norm), 0)
        mine.merge_state(incoming)
        assert mine.result().num_examples == 16
    with pytest.raises(ValueError, match=r"cannot load the state dict: tokens .* module object "
                                         r".* Build both metrics with the dotted name, "
                                         r"Embedding\('norm'\)"):
        metric(Embedding(model.norm)).load_state_dict(by_name.state_dict())
    same_way = metric(Embedding(model.norm))  # as a resumed run builds it: loads as before
    same_way.load_state_dict(metric(Embedding(model.norm), 2).state_dict())
    assert same_way.result().num_examples == 8
    with pytest.raises(ValueError, match="cannot merge: tokens .*'norm'.* vs .*'norm2'"):
        metric(Embedding(model.norm), 0).merge_state(metric(Embedding(model.norm2), 1))


def test_a_second_epoch_without_reset_says_that_its_batches_are_skipped():
    """A plain loop over two epochs with index= and no reset(): the second epoch's batches were
    all measured before, skipped without a word, and compute() kept the first epoch's value
    for the new weights. The first whole batch skipped warns, once until reset()."""
    model, x = patch_net(), patch_batches(3)[0].reshape(16, 1, 4, 4)[:8]
    metric = TokenSensitivityMetric(Patches(2), generator=0, **OPTS)
    for lo in (0, 4):
        metric.update(model, x[lo:lo + 4], index=torch.arange(lo, lo + 4))
    with pytest.warns(UserWarning, match=r"measured before(?s:.*)metric.reset\(\)"):
        metric.update(model, x[:4], index=torch.arange(4))
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # once
        metric.update(model, x[4:], index=torch.arange(4, 8))
        metric.reset()
        metric.update(model, x[:4], index=torch.arange(4))  # a new epoch after reset: measured
    assert metric.result().num_examples == 4


def test_a_resumed_metric_says_that_a_batch_of_its_loaded_examples_is_skipped():
    """A metric loaded from a state dict and run over the same epoch again without reset():
    its examples' indices were taken for another process's (the loaded ones were not this
    process's own), so every batch was skipped without a word. Now it warns as the metric
    that measured them would; a fresh metric measuring new indices still does not."""
    model, x = patch_net(), patch_batches(3)[0].reshape(16, 1, 4, 4)[:8]
    first = TokenSensitivityMetric(Patches(2), generator=0, **OPTS)
    first.persistent(True)
    first.update(model, x[:4], index=torch.arange(4))
    for states in (first.state_dict(),
                   {k: v for k, v in first.state_dict().items() if k != "seen_index"}):
        resumed = TokenSensitivityMetric(Patches(2), generator=0, **OPTS)
        resumed.persistent(True)
        resumed.load_state_dict(states)
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            resumed.update(model, x[4:], index=torch.arange(4, 8))  # new examples: measured
        with pytest.warns(UserWarning, match=r"measured before(?s:.*)metric.reset\(\)"):
            resumed.update(model, x[:4], index=torch.arange(4))
        assert resumed.result().num_examples == 8


def test_a_batch_another_process_measured_is_skipped_without_a_word():
    """A DistributedSampler's padding: a rank's last batch may hold only examples another rank
    measured. They are skipped, as always, but that is no second epoch: no warning. (Here the
    other process's examples come in through merge_state, as a sync would bring them.)"""
    model, x = patch_net(), patch_batches(3)[0].reshape(16, 1, 4, 4)[:8]
    other = TokenSensitivityMetric(Patches(2), generator=1, **OPTS)
    other.update(model, x[:2], index=torch.arange(2))
    metric = TokenSensitivityMetric(Patches(2), generator=0, **OPTS)
    metric.update(model, x[2:6], index=torch.arange(2, 6))
    metric.merge_state(other)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        metric.update(model, x[:1], index=torch.arange(1))  # the other's example: padding
    assert metric.result().num_examples == 6
