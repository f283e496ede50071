"""Lightning: a classifier head applied outside ``forward`` through a parameter of the module
(``F.linear(self(x), self.w, self.b)``, no ``nn.Linear``) was not warned of, and the features
were measured as class scores without a word (0.225 on the toy below). Now the parameters the
forward takes are noted in the check before training, and a 2-D parameter of shape
(classes, width) it did not take is warned of; one the forward takes (``h @ self.W``,
``F.linear(h, self.W.T)``, a tied weight) is not.

Real tiny Trainer runs on the CPU, no mocks."""

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
from torch.nn import functional as F

pytest.importorskip("lightning")

import lightning  # noqa: E402
from lightning_toys import data  # noqa: E402

from senslab.integrations.lightning import SensitivityCallback  # noqa: E402
from senslab.tokens import Patches  # noqa: E402

logging.getLogger("lightning.pytorch").setLevel(logging.ERROR)


class _ParameterHead(lightning.LightningModule):
    """Features from ``forward``; ``kind`` says how a (3, 16) or (16, 3) parameter is used."""

    def __init__(self, kind: str) -> None:
        super().__init__()
        torch.manual_seed(0)  # test-only: init
        self.kind = kind
        self.body = nn.Sequential(nn.Flatten(), nn.Linear(64, 16), nn.Tanh())
        shape = (16, 3) if kind == "matmul" else (3, 16)
        self.w = nn.Parameter(torch.randn(*shape) * 0.3)
        self.b = nn.Parameter(torch.zeros(3))
        self.tied = self.w

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.body(x)
        if self.kind == "matmul":  # the class scores: h @ W, W of shape (16, 3)
            return h @ self.w + self.b
        if self.kind == "transposed":
            return h @ self.w.T + self.b
        if self.kind == "tied":  # through the other name of one parameter
            return F.linear(h, self.tied, self.b)
        return h  # "features": the head is applied in training_step

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], _: int) -> torch.Tensor:
        x, y = batch
        out = self(x)
        if self.kind == "features":
            out = F.linear(out, self.w, self.b)
        return F.cross_entropy(out, y)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.5)


def _fit(root: Path, module: lightning.LightningModule) -> list[str]:
    loader, subset = data()
    callback = SensitivityCallback(subset, Patches(4), sigma=0.7, repeats=2)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        lightning.Trainer(
            max_epochs=1, accelerator="cpu", devices=1, callbacks=[callback], logger=False,
            enable_progress_bar=False, enable_model_summary=False, enable_checkpointing=False,
            default_root_dir=root).fit(module, loader)
    assert len(callback.results) == 1
    return [str(w.message) for w in caught if "class scores" in str(w.message)]


def test_a_parameter_head_left_out_of_forward_is_warned_of(tmp_path: Path):
    said = _fit(tmp_path, _ParameterHead("features"))
    assert len(said) == 1
    assert "reads its output, (8, 16), as 16 class scores" in said[0]
    assert "module.w (a parameter of shape (3, 16)) takes 16 features" in said[0]
    assert "F.linear(h, module.w, ...)" in said[0]


@pytest.mark.parametrize("kind", ["matmul", "transposed", "tied"])
def test_a_parameter_the_forward_takes_is_not_warned_of(tmp_path: Path, kind: str):
    assert _fit(tmp_path, _ParameterHead(kind)) == []


def _gloo_worker(rank: int, world: int, init: str, out: str) -> None:
    """Each process measures its own 4 examples and saves its states; then every process loads
    rank 0's (as from a Lightning checkpoint) and, apart, its own, and syncs each."""
    import torch.distributed as dist

    from senslab.integrations.torchmetrics import TokenSensitivityMetric

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=world)
    torch.manual_seed(0)  # test-only: init
    model = nn.Sequential(nn.Flatten(), nn.Linear(64, 3))
    x = torch.randn(world, 4, 1, 8, 8, generator=torch.Generator().manual_seed(1))

    def metric() -> TokenSensitivityMetric:
        m = TokenSensitivityMetric(Patches(4), sigma=0.8, repeats=2)
        m.persistent(True)
        return m

    measured = metric()
    measured.update(model, x[rank])
    own = measured.state_dict()
    first = [own if rank == 0 else None]
    dist.broadcast_object_list(first, src=0)
    said = {}
    for name, states in (("rank0", first[0]), ("own", own)):
        resumed = metric()
        resumed.load_state_dict(states)
        try:
            said[name] = resumed.result().num_examples
        except ValueError as err:
            said[name] = str(err)
    everyone: list[object] = [None] * world
    dist.all_gather_object(everyone, said)
    if rank == 0:
        with open(out, "w") as f:
            json.dump(everyone, f)
    dist.destroy_process_group()


@pytest.mark.heavy
def test_one_processs_states_loaded_on_every_process_are_refused_by_the_sync(tmp_path: Path):
    out = tmp_path / "result.json"
    tests = str(Path(__file__).resolve().parents[1])  # lightning_toys, imported at the top
    path = os.pathsep.join(p for p in (tests, os.environ.get("PYTHONPATH")) if p)
    env = {**os.environ, "GLOO_SOCKET_IFNAME": "lo", "OMP_NUM_THREADS": "1", "PYTHONPATH": path}
    proc = subprocess.run([sys.executable, __file__, str(out)], capture_output=True, text=True,
                          timeout=300, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    for said in json.loads(out.read_text()):  # each process alike
        assert said["own"] == 8  # each process's own states: both processes' 4 examples
        assert isinstance(said["rank0"], str), said  # was 8: rank 0's 4 examples twice
        assert "processes 0 and 1 hold the same examples" in said["rank0"]
        assert "Load each process's own states" in said["rank0"]


if __name__ == "__main__":  # the gloo processes of the test above
    import torch.multiprocessing as mp

    target = sys.argv[1]
    init = "file://" + os.path.join(os.path.dirname(os.path.abspath(target)), "rendezvous")
    torch.set_num_threads(1)
    mp.start_processes(_gloo_worker, args=(2, init, target), nprocs=2, join=True,
                       start_method="fork")
