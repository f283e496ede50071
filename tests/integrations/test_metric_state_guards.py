"""Guards on the measuring state (audit conc53 D1-D3): one metric updated from several threads
counts every batch once (a lock per metric); merge_state / load_state_dict refuse the states of
another configuration, as TokenSensitivity.merge does; a metric merged into itself, or states
holding examples already measured, are refused."""

from __future__ import annotations

import copy
import pickle
import threading
import warnings

import pytest
import torch
from metric_models import Meter
from torch import nn

pytest.importorskip("torchmetrics")

from senslab.integrations.torchmetrics import TokenSensitivityMetric  # noqa: E402
from senslab.measure import TokenSensitivity  # noqa: E402
from senslab.tokens import Patches  # noqa: E402

OPTS = {"sigma": 0.5, "precision": "float32"}


class Gate(nn.Module):
    """A linear model that records how many forwards run at once. Its first forward waits (up to
    a second) for a second one to enter, so two threads that may measure at the same time do so
    every time, not by chance."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.net = nn.Sequential(nn.Flatten(), nn.Linear(16, 3))
        self.meter = Meter()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        with self.meter.running():
            return self.net(x)


def batches(n: int = 4) -> torch.Tensor:
    return torch.randn(n, 16, 1, 4, 4, generator=torch.Generator().manual_seed(1))


def in_threads(work, parts: list) -> list[str]:
    errors: list[str] = []

    def run(part):
        try:
            work(part)
        except Exception as err:  # reported, not lost with the thread
            errors.append(f"{type(err).__name__}: {err}")

    threads = [threading.Thread(target=run, args=(p,)) for p in parts]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return errors


def test_metric_updated_from_two_threads_counts_every_batch_once():
    """Two threads, four batches of 16 each, into one metric: 128 examples and 128 per-example
    rates (before: n 80/96/144, a per-example list of another length, or a thread crashing on
    an empty batch), the updates one at a time; the estimate is the mean of the rates."""
    model, x = Gate(), batches()
    metric = TokenSensitivityMetric(Patches(2), **OPTS)
    errors = in_threads(lambda k: [metric.update(model, x[i % 4]) for i in range(k, 8, 2)],
                        [0, 1])
    assert errors == []
    assert model.meter.most == 1
    r = metric.result()
    assert r.num_examples == 128 and int(metric.n) == 128
    assert sum(len(s) for s in metric.sample_rate) == 128
    assert r.estimate == pytest.approx(float(r.per_sample.double().mean()), abs=1e-6)
    copy_ = copy.deepcopy(metric)  # a copy gets its own lock, and still measures
    assert copy_._lock is not metric._lock
    pickle.loads(pickle.dumps(metric)).update(model, x[0])


def test_token_sensitivity_updated_from_two_threads_draws_distinct_noise():
    """TokenSensitivity.update from two threads runs one at a time: the result is that of the
    two batches measured one after the other, in one order or the other (before: both threads
    inside at once, free to take the same noise rows from the shared stream)."""
    model, x = Gate(), batches(2)
    metric = TokenSensitivity(model, Patches(2), generator=0, **OPTS)
    assert in_threads(lambda i: metric.update(x[i]), [0, 1]) == []
    assert model.meter.most == 1
    got = metric.compute().per_sample
    orders = []
    for first, second in ((0, 1), (1, 0)):
        ref = TokenSensitivity(model.net, Patches(2), generator=0, **OPTS)
        ref.update(x[first])
        ref.update(x[second])
        orders.append(ref.compute().per_sample)
    assert any(torch.equal(got, want) for want in orders)


@pytest.mark.parametrize("other", [
    {"sigma": 0.1}, {"compare": "l1"}, {"tokens": Patches(1)}, {"mode": "whole"},
])
def test_merge_state_refuses_another_configuration(other):
    """merge_state of a metric (or its state dict) of another sigma, compare rule, tokenization
    or mode is refused, naming the difference (before: accepted, the mix reported under this
    metric's sigma)."""
    model, x = Gate().net, batches(2)
    opts = {**OPTS, **other}
    theirs = TokenSensitivityMetric(opts.pop("tokens", Patches(2)), **opts)
    theirs.update(model, x[1])
    theirs.persistent(True)
    name = next(iter(other))
    for incoming in (theirs, theirs.state_dict()):
        mine = TokenSensitivityMetric(Patches(2), **OPTS)
        mine.update(model, x[0])
        with pytest.raises(ValueError, match=f"cannot merge: {name} "):
            mine.merge_state(incoming)
        assert mine.result().num_examples == 16  # nothing merged


@pytest.mark.filterwarnings("ignore:The ``compute`` method")  # torchmetrics: loaded, not updated
def test_load_state_dict_refuses_another_configuration_and_warns_without_one():
    """load_state_dict of a sigma=0.1 metric's states into a sigma=0.5 metric is refused; the
    same options load; a state dict without 'config' (an older senslab's) loads with a
    warning."""
    model, x = Gate().net, batches(2)
    saved = TokenSensitivityMetric(Patches(2), **{**OPTS, "sigma": 0.1})
    saved.persistent(True)
    saved.update(model, x[1])
    sd = saved.state_dict()
    fresh = TokenSensitivityMetric(Patches(2), **OPTS)
    fresh.persistent(True)
    with pytest.raises(ValueError, match="cannot load the state dict: sigma 0.5 vs 0.1"):
        fresh.load_state_dict(sd)
    same = TokenSensitivityMetric(Patches(2), **{**OPTS, "sigma": 0.1})
    same.persistent(True)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        same.load_state_dict(sd)
    assert same.result().estimate == saved.result().estimate
    old = {k: v for k, v in sd.items() if k != "config"}
    with pytest.warns(UserWarning, match="holds no configuration"):
        fresh.load_state_dict(old)
    assert fresh.result().num_examples == 16
    # states of no example (a checkpoint saved after a reset, before an update) mix nothing
    # in: a resume with other options loads them (before: refused for the sigma)
    saved.reset()
    other = TokenSensitivityMetric(Patches(2), **OPTS)
    other.persistent(True)
    other.load_state_dict(saved.state_dict())
    other.update(model, x[0])
    assert other.result().num_examples == 16


def test_a_metric_merged_into_itself_is_refused():
    """merge(self) / merge_state(self) would count every example twice (before: n 32 from 16
    examples, the standard error shrunk)."""
    model, x = Gate().net, batches(1)
    ts = TokenSensitivity(model, Patches(2), **OPTS)
    ts.update(x[0])
    with pytest.raises(ValueError, match="into itself"):
        ts.merge(ts)
    metric = TokenSensitivityMetric(Patches(2), **OPTS)
    metric.update(model, x[0])
    with pytest.raises(ValueError, match="into itself"):
        metric.merge_state(metric)
    assert ts.compute().num_examples == 16 and metric.result().num_examples == 16


def test_merge_state_refuses_examples_already_measured():
    """States whose example indices (index=) this metric holds already are refused, naming them
    (before: the same metric merged twice gave n 32 for 16 indices); disjoint shards merge."""
    model, x = Gate().net, batches(2)
    a = TokenSensitivityMetric(Patches(2), **OPTS)
    a.update(model, x[0], index=torch.arange(16))
    b = TokenSensitivityMetric(Patches(2), generator=1, **OPTS)
    b.update(model, x[1], index=torch.arange(16, 32))
    b.persistent(True)
    a.merge_state(b)
    assert a.result().num_examples == 32
    for again in (b, b.state_dict()):
        with pytest.raises(ValueError, match=r"16 example\(s\) are in both metrics "
                                             r"\(index 16, 17, 18"):
            a.merge_state(again)
    assert a.result().num_examples == 32


def test_a_numpy_threshold_survives_the_state_dict():
    """The configuration stored in the state dict kept a NumPy threshold as given, and
    state_dict() raised "Object of type float32 is not JSON serializable" at the first
    checkpoint; it is stored as a number and reads back equal."""
    import numpy as np

    torch.manual_seed(0)  # test-only: init
    net = nn.Sequential(nn.Flatten(), nn.Linear(16, 1), nn.Sigmoid())
    x = torch.randn(4, 1, 4, 4, generator=torch.Generator().manual_seed(1))
    metric = TokenSensitivityMetric(Patches(2), sigma=0.5, output_kind="scores",
                                    threshold=np.float32(0.5), generator=0)
    metric.persistent(True)
    metric.update(net, x)
    state = metric.state_dict()
    other = TokenSensitivityMetric(Patches(2), sigma=0.5, output_kind="scores",
                                   threshold=0.5, generator=0)
    other.persistent(True)
    other.load_state_dict(state)
    assert other.result().estimate == metric.result().estimate
