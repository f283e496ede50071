"""Sensitivity under torch.distributed: two CPU processes (gloo) equal one process."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch import nn

from senslab.measure import TokenSensitivity
from senslab.tokens import Patches

SCRIPT = r'''
import json, os, sys
import torch, torch.distributed as dist
from torch import nn
from senslab.measure import TokenSensitivity
from senslab.tokens import Patches

dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
torch.manual_seed(0)
model = nn.Sequential(nn.Flatten(), nn.Linear(64, 16), nn.Tanh(), nn.Linear(16, 3))
x = torch.randn(13, 1, 8, 8, generator=torch.Generator().manual_seed(1))
m = TokenSensitivity(model, Patches(2), sigma=1.0, repeats=3, generator=7, chunk_size=10,
                     shard=(rank, world))
m.update(x[:6])
interim = m.all_reduce().compute()  # an interim value, then more updates
twice = m.all_reduce().compute()  # reduced again: the ranks' own states, not the total twice
m.update(x[6:])
r = m.all_reduce().compute()
again = m.all_reduce().compute()
if rank == 0:
    with open(sys.argv[1], "w") as f:
        json.dump({"estimate": r.estimate, "stderr": r.stderr, "stderr_subset": r.stderr_subset,
                   "per_sample": r.per_sample.tolist(), "per_position": r.per_position.tolist(),
                   "num_forward": r.num_forward, "n": r.num_examples,
                   "interim_n": [interim.num_examples, twice.num_examples],
                   "interim_forward": [interim.num_forward, twice.num_forward],
                   "again": [again.num_examples, again.num_forward, again.estimate,
                             again.stderr]}, f)
dist.destroy_process_group()
# past the interpreter's teardown, where gloo now and then aborts a rank after everything is
# done (tests/train/test_distributed_training.py)
sys.stdout.flush()
sys.stderr.flush()
os._exit(0)
'''


def one_process() -> dict:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Flatten(), nn.Linear(64, 16), nn.Tanh(), nn.Linear(16, 3))
    x = torch.randn(13, 1, 8, 8, generator=torch.Generator().manual_seed(1))
    m = TokenSensitivity(model, Patches(2), sigma=1.0, repeats=3, generator=7, chunk_size=10)
    m.update(x[:6])
    m.update(x[6:])
    return m.compute()


@pytest.mark.heavy
def test_two_gloo_processes_equal_one_process(tmp_path: Path):
    script = tmp_path / "worker.py"
    script.write_text(SCRIPT)
    out = tmp_path / "result.json"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
           str(script), str(out)]
    env = {**os.environ, "GLOO_SOCKET_IFNAME": "lo"}  # loopback only
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=240, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = json.loads(out.read_text())
    ref = one_process()
    assert got["n"] == ref.num_examples == 13
    assert got["num_forward"] == ref.num_forward
    assert got["per_sample"] == ref.per_sample.tolist()
    assert got["estimate"] == pytest.approx(ref.estimate, abs=1e-12)
    assert got["stderr"] == pytest.approx(ref.stderr, abs=1e-12)
    assert got["stderr_subset"] == pytest.approx(ref.stderr_subset, abs=1e-12)
    assert got["per_position"] == pytest.approx(ref.per_position.tolist(), abs=1e-12)
    # all_reduce twice, or after an interim all_reduce and more updates: nothing counted twice
    assert got["interim_n"] == [6, 6] and got["interim_forward"][0] == got["interim_forward"][1]
    assert got["again"] == [13, ref.num_forward, got["estimate"], got["stderr"]]


def test_sharded_pieces_merge_to_one_process_without_a_process_group():
    """The same identity without torch.distributed: shards merged by hand."""
    ref = one_process()
    torch.manual_seed(0)
    model = nn.Sequential(nn.Flatten(), nn.Linear(64, 16), nn.Tanh(), nn.Linear(16, 3))
    x = torch.randn(13, 1, 8, 8, generator=torch.Generator().manual_seed(1))
    parts = []
    for rank in range(3):
        m = TokenSensitivity(model, Patches(2), sigma=1.0, repeats=3, generator=7,
                             chunk_size=10, shard=(rank, 3))
        m.update(x[:6])
        m.update(x[6:])
        parts.append(m)
    first = parts[0].compute().per_sample.tolist()
    merged = parts[0].merge(parts[1]).merge(parts[2]).compute()
    assert merged.num_examples == 13 and merged.num_forward == ref.num_forward
    assert merged.estimate == pytest.approx(ref.estimate, abs=1e-12)
    assert sorted(merged.per_sample.tolist()) == sorted(ref.per_sample.tolist())
    with pytest.raises(ValueError, match="shard"):
        TokenSensitivity(model, Patches(2), sigma=1.0, shard=(2, 2))
    # per_sample of a merge: this metric's examples, then the other's (shards not interleaved)
    assert merged.per_sample[:len(first)].tolist() == first


@pytest.mark.parametrize("backend", ["gloo", "mpi", "cpu:gloo,cuda:nccl", "nccl"])
def test_sums_reduce_where_the_backend_reduces(backend: str):
    """gloo and MPI reduce CPU tensors; NCCL only CUDA tensors (this process's GPU)."""
    from senslab.measure._stats import reduce_device

    device = reduce_device(backend)
    if backend == "nccl" and torch.cuda.is_available():
        assert device == torch.device("cuda", torch.cuda.current_device())
    else:
        assert device == torch.device("cpu")


def test_all_reduce_keeps_the_ranks_own_state_and_merge_refuses_a_total(tmp_path: Path):
    """A one-process group: all_reduce twice changes nothing, an update after it adds to the
    process's own state, and merging a reduced total (which would count it again) is refused."""
    import torch.distributed as dist

    store = dist.FileStore(str(tmp_path / "store"), 1)
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    try:
        torch.manual_seed(0)
        model = nn.Sequential(nn.Flatten(), nn.Linear(64, 16), nn.Tanh(), nn.Linear(16, 3))
        x = torch.randn(9, 1, 8, 8, generator=torch.Generator().manual_seed(1))
        m = TokenSensitivity(model, Patches(2), sigma=1.0, repeats=2, generator=7)
        m.update(x[:4])
        a = m.all_reduce().compute()
        b = m.all_reduce().compute()
        assert a.num_examples == b.num_examples == 4 and a.num_forward == b.num_forward
        m.update(x[4:])
        assert m.all_reduce().compute().num_examples == 9
        other = TokenSensitivity(model, Patches(2), sigma=1.0, repeats=2, generator=8)
        other.update(x[:2])
        with pytest.raises(ValueError, match="all_reduce"):
            m.merge(other)
        with pytest.raises(ValueError, match="all_reduce"):
            other.merge(m)
    finally:
        dist.destroy_process_group()
