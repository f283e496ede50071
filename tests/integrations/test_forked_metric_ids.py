"""A metric inherited by forked processes (Lightning's ddp_fork, a fork-started pool) held one
id in every process, so the sync across processes would take their examples for one metric's
and refuse them; its first update in a forked process, on empty states, draws an id of that
process's own."""

from __future__ import annotations

import multiprocessing as mp
import sys

import pytest
import torch
from torch import nn

pytest.importorskip("torchmetrics")

from senslab.integrations.torchmetrics import TokenSensitivityMetric  # noqa: E402
from senslab.tokens import Patches  # noqa: E402


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Flatten(), nn.Linear(16, 3)).eval()


def _images() -> torch.Tensor:
    return torch.randn(4, 1, 4, 4, generator=torch.Generator().manual_seed(1))


def _child(metric: TokenSensitivityMetric, out: mp.Queue) -> None:
    torch.set_num_threads(1)
    metric.update(_model(), _images())
    out.put(sorted(metric._held_ids()))


@pytest.mark.skipif(sys.platform != "linux", reason="fork start method")
def test_a_forked_metric_measures_under_an_id_of_its_own() -> None:
    metric = TokenSensitivityMetric(Patches(2), sigma=1.0, repeats=2, generator=0)
    inherited = metric._id
    ctx = mp.get_context("fork")
    out = ctx.Queue()
    child = ctx.Process(target=_child, args=(metric, out))
    child.start()
    theirs = out.get(timeout=60)
    child.join(timeout=60)
    assert child.exitcode == 0
    metric.update(_model(), _images())
    mine = sorted(metric._held_ids())
    assert mine == [inherited]  # the process that drew the id keeps it
    assert len(theirs) == 1 and theirs != mine  # the forked one measured under its own


def test_a_metric_that_measured_keeps_its_id_when_forked() -> None:
    # states that are not empty are the same examples in both processes: their id stays, and
    # the sync refuses them (counted once per process otherwise)
    metric = TokenSensitivityMetric(Patches(2), sigma=1.0, repeats=2, generator=0)
    metric.update(_model(), _images())
    held = metric._held_ids()
    metric._id_pid = -1  # as in a forked process
    metric.update(_model(), _images())
    assert metric._held_ids() == held
