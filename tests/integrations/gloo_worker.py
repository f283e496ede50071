"""Two gloo processes (``torch.multiprocessing``) measure 7 examples under a
``DistributedSampler`` with :class:`TokenSensitivityMetric`; rank 0 writes the synced result of
two runs as JSON (``runs``), and the values ``forward`` returned on each rank, step by step, with
``dist_sync_on_step=True`` (``on_step``). Run by tests/integrations/test_torchmetrics.py:
``python gloo_worker.py OUT.json``.

The processes are forked from this fresh one after the imports (torchmetrics pulls in
transformers: seconds of CPU a process); nothing here has touched CUDA or started threads."""

from __future__ import annotations

import json
import os
import sys

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

from senslab.integrations.torchmetrics import TokenSensitivityMetric
from senslab.tokens import Patches

N, BATCH, SEED, SAMPLER_SEED = 7, 2, 3, 11
OPTIONS = {"sigma": 0.8, "repeats": 4}


def model_and_data() -> tuple[nn.Module, TensorDataset]:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Flatten(), nn.Linear(64, 16), nn.Tanh(), nn.Linear(16, 3))
    x = torch.randn(N, 1, 8, 8, generator=torch.Generator().manual_seed(1))
    return model, TensorDataset(torch.arange(N), x)


def loader(data: TensorDataset, rank: int, world: int) -> DataLoader:
    sampler = DistributedSampler(data, num_replicas=world, rank=rank, shuffle=True,
                                 seed=SAMPLER_SEED)  # pads 7 to 8: one example twice
    return DataLoader(data, batch_size=BATCH, sampler=sampler)


def worker(rank: int, world: int, init: str, out: str) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=world)
    model, data = model_and_data()
    metric = TokenSensitivityMetric(Patches(2), generator=SEED, **OPTIONS)
    runs = []
    for _ in range(2):  # the same world size twice: the same numbers
        metric.reset()
        for idx, x in loader(data, rank, world):
            metric.update(model, x, index=idx)
        r = metric.result()
        runs.append({"estimate": r.estimate, "stderr": r.stderr, "stderr_subset": r.stderr_subset,
                     "n": r.num_examples, "num_forward": r.num_forward,
                     "per_sample": r.per_sample.tolist(), "per_position": r.per_position.tolist(),
                     "compute": float(metric.compute())})
    # the same batches through forward, synced per step: the value of the step's examples on all
    # ranks together (the same numbers: the same seed, so rank r draws rank r's stream again)
    synced = TokenSensitivityMetric(Patches(2), generator=SEED, dist_sync_on_step=True, **OPTIONS)
    mine = [float(synced(model, x, index=idx)) for idx, x in loader(data, rank, world)]
    on_step: list[object] = [None] * world
    dist.all_gather_object(on_step, mine)
    if rank == 0:
        with open(out, "w") as f:
            json.dump({"runs": runs, "on_step": on_step}, f)
    dist.destroy_process_group()


if __name__ == "__main__":
    target = sys.argv[1]
    init = "file://" + os.path.join(os.path.dirname(os.path.abspath(target)), "rendezvous")
    torch.set_num_threads(1)
    mp.start_processes(worker, args=(2, init, target), nprocs=2, join=True, start_method="fork")
