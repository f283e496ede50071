"""TokenSensitivityMetric and the Lightning callback give the numbers of the same measurement
anywhere else: under ``set_dtype``, after a move (a process with no batch syncs float64), inside
a ``"bf16-true"`` step (the default dtype is bf16 there), after a failed update, and a warning
of the metric's own is said once over its resets.

Run as a script (``python test_metrics_trust.py OUT.json``) it is the two-process gloo worker of
:func:`test_a_process_without_batches_syncs_after_a_move`."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
import torch
from torch import nn

pytest.importorskip("torchmetrics")

from senslab.integrations.torchmetrics import TokenSensitivityMetric  # noqa: E402
from senslab.measure import TokenSensitivity, token_sensitivity  # noqa: E402
from senslab.tokens import Patches  # noqa: E402

OPTIONS = {"sigma": 0.8, "repeats": 3, "generator": 3}


def mlp() -> nn.Module:
    torch.manual_seed(0)  # test-only: model init
    return nn.Sequential(nn.Flatten(), nn.Linear(64, 16), nn.Tanh(), nn.Linear(16, 3))


def images(n: int) -> torch.Tensor:
    return torch.randn(n, 1, 8, 8, generator=torch.Generator().manual_seed(1))


def test_set_dtype_keeps_the_states_in_float64():
    """set_dtype(torch.float16) (a MetricCollection's too) had cast the counts and sums: the
    sum of rates rounded at every batch and the estimate moved, without a word. The states stay
    float64, with a warning; the numbers are TokenSensitivity's."""
    model, x = mlp(), images(40)
    metric = TokenSensitivityMetric(Patches(2), **OPTIONS)
    with pytest.warns(UserWarning, match=r"keeps its counts and sums in float64"):
        metric.set_dtype(torch.float16)
    assert metric.n.dtype == metric.s1.dtype == metric.dtype == torch.float64
    for part in x.split(7):
        metric.update(model, part)
    got = metric.result()
    ref = TokenSensitivity(model, Patches(2), **OPTIONS)
    for part in x.split(7):
        ref.update(part)
    want = ref.compute()
    assert 0 < want.estimate < 1
    assert (got.num_examples, got.estimate, got.stderr) == (40, want.estimate, want.stderr)


def test_a_moved_metric_syncs_float64():
    """torchmetrics set ``dtype`` to the default (float32) at every move — Lightning moves every
    module with .to(device) — and a process that measured nothing synced float32 empties
    against the others' float64 states. The states are float64, and so is ``dtype``."""
    metric = TokenSensitivityMetric(Patches(2), sigma=1.0)
    for move in (lambda m: m.to("cpu"), lambda m: m.to(torch.bfloat16), lambda m: m.cpu()):
        move(metric)
        assert metric.dtype == torch.float64 and metric.n.dtype == torch.float64


def _worker(rank: int, world: int, init: str, out: str) -> None:
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=world)
    metric = TokenSensitivityMetric(Patches(2), **OPTIONS).to("cpu")  # as Lightning moves it
    model = mlp()
    if rank == 0:  # rank 1 has no batch
        for part in images(10).split(4):
            metric.update(model, part)
    r = metric.result()
    if rank == 0:
        Path(out).write_text(json.dumps([r.estimate, r.stderr, r.num_examples]))
    dist.destroy_process_group()


@pytest.mark.heavy
def test_a_process_without_batches_syncs_after_a_move(tmp_path: Path):
    """Two gloo processes, the metric moved with .to("cpu"), rank 1 without a batch: the synced
    result is rank 0's alone (gloo aborted with a collective mismatch before)."""
    out = tmp_path / "result.json"
    env = {**os.environ, "GLOO_SOCKET_IFNAME": "lo", "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, __file__, str(out)], capture_output=True, text=True,
                          timeout=300, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    ref = TokenSensitivity(mlp(), Patches(2), **OPTIONS)
    for part in images(10).split(4):
        ref.update(part)
    want = ref.compute()
    assert json.loads(out.read_text()) == [want.estimate, want.stderr, 10]


def test_a_bf16_true_step_measures_as_anywhere_else(tmp_path: Path):
    """precision="bf16-true" sets the default dtype to bf16 around every step: the metric
    updated in validation_step drew its noise in bf16 (float32's draws rounded, then rounded
    again when added) — another value (0.0495) than the same measurement of the same bf16
    module outside the step (0.0521). It draws float32 noise as everywhere else; so does the
    callback's measure() called inside a step."""
    lightning = pytest.importorskip("lightning")
    from lightning.pytorch.plugins.precision import HalfPrecision
    from torch.utils.data import DataLoader, TensorDataset

    from senslab.integrations.lightning import SensitivityCallback

    logging.getLogger("lightning.pytorch").setLevel(logging.ERROR)
    options = {"sigma": 0.7, "repeats": 3, "generator": 2}

    class Tracked(lightning.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.net = mlp()
            self.sens = TokenSensitivityMetric(Patches(4), **options)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.net(x)

        def training_step(self, batch: list[torch.Tensor], _: int) -> torch.Tensor:
            return nn.functional.cross_entropy(self(batch[0]), batch[1])

        def validation_step(self, batch: list[torch.Tensor], _: int) -> None:
            self.sens.update(self, batch[0])
            self.log("val_sensitivity", self.sens, batch_size=len(batch[0]))

        def configure_optimizers(self) -> torch.optim.Optimizer:
            return torch.optim.SGD(self.parameters(), lr=0.5)

    g = torch.Generator().manual_seed(1)
    x = torch.randn(32, 1, 8, 8, generator=g)
    y = torch.randint(0, 3, (32,), generator=g)
    loader = DataLoader(TensorDataset(x, y), batch_size=8)
    module = Tracked()
    trainer = lightning.Trainer(
        max_epochs=1, accelerator="cpu", devices=1, precision="bf16-true", logger=False,
        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
        num_sanity_val_steps=0, default_root_dir=tmp_path)
    trainer.fit(module, loader, loader)
    ref = TokenSensitivity(module, Patches(4), **options)
    for part in x.split(8):
        ref.update(part.bfloat16())
    want = ref.compute().estimate
    assert 0 < want < 1
    assert trainer.callback_metrics["val_sensitivity"].item() == want

    callback = SensitivityCallback(x.bfloat16(), Patches(4), **options)
    outside = callback.measure(module)
    with HalfPrecision("bf16-true").forward_context():  # as around a step
        assert torch.get_default_dtype() == torch.bfloat16
        inside = callback.measure(module)
    assert inside.estimate == outside.estimate and inside.stderr == outside.stderr


def test_a_failed_update_leaves_its_examples_unmeasured():
    """An update that raised had marked its indices (index=) as measured: the retry was
    skipped as "measured before" and the examples were lost. It adds nothing, and a retry
    measures them."""
    model, x = mlp(), images(6)
    metric = TokenSensitivityMetric(Patches(4), **OPTIONS)
    with pytest.raises(TypeError, match="float64"):
        metric.update(model, x.double(), index=torch.arange(6))  # a float32 model
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no "measured before"
        metric.update(model, x, index=torch.arange(6))
    assert metric.result().estimate == token_sensitivity(model, x, Patches(4), **OPTIONS).estimate
    assert metric.result().num_examples == 6


def test_a_warning_is_said_once_over_resets():
    """A cause the metric says once (its options, its model) was said again after every reset
    — each epoch of a Lightning run — as each reset built a new engine; TokenSensitivity says
    it once over its resets, and so does the metric."""
    from ..measure.test_warned_once import FEW_PAIRS, count, few_pairs_case

    model, x, options = few_pairs_case()
    metric = TokenSensitivityMetric(Patches(2), **options)
    estimates = []
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(3):
            metric.reset()
            metric.update(model, x[:4])
            metric.update(model, x[4:])
            estimates.append(metric.compute().item())
    assert count([str(w.message) for w in caught], FEW_PAIRS) == 1  # was 3: once per epoch
    assert len(set(estimates)) == 1  # the same noise after each reset


if __name__ == "__main__":
    import torch.multiprocessing as mp

    target = sys.argv[1]
    rendezvous = "file://" + os.path.join(os.path.dirname(os.path.abspath(target)), "rendezvous")
    mp.start_processes(_worker, args=(2, rendezvous, target), nprocs=2, join=True,
                       start_method="fork")
