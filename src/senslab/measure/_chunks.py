"""Automatic chunk size: how many perturbed copies one forward pass may hold.

The first chunk of every ``update`` is a *probe*: it is evaluated (its results are kept) while an
:class:`ActivationMeter` records the peak number of bytes held by tensors that the forward pass
creates. That peak divided by the probe's copies is the memory one copy costs; the chunk size is
the memory budget divided by it. Because the noise is drawn in fixed blocks
(:mod:`senslab.measure._noise`), the chunking never changes the numbers.
"""

from __future__ import annotations

import os
import weakref
from typing import Any

import torch
from torch import Tensor
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

#: copies in the probe chunk (rounded to even, for antithetic pairs)
PROBE_COPIES = 8
#: fraction of the free memory used as the default budget
BUDGET_FRACTION = {"cuda": 0.5, "cpu": 0.25}
#: on CPU, a budget beyond the last-level cache buys nothing: activations that stay cache-sized
#: run fastest, and batch dimensions past a few hundred rows do not raise GEMM efficiency.
CPU_CHUNK_BYTES = 256 << 20


class ActivationMeter(TorchDispatchMode):
    """Peak bytes of the storages that operators create while the mode is active.

    Every tensor an operator returns is counted once per storage (views share their base's
    storage) and released when the last such tensor dies; storages given in ``external``
    (parameters, inputs) are not counted.
    """

    def __init__(self, external: set[int] | None = None) -> None:
        super().__init__()
        self.external = external or set()
        self.live: dict[int, list[int]] = {}
        self.current = 0
        self.peak = 0

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        out = func(*args, **(kwargs or {}))
        for t in tree_leaves(out):
            if isinstance(t, Tensor):
                self._track(t)
        return out

    def _track(self, t: Tensor) -> None:
        try:
            storage = t.untyped_storage()
            key, nbytes = storage.data_ptr(), storage.nbytes()
        except (RuntimeError, NotImplementedError):  # e.g. tensors without storage
            return
        if key == 0 or key in self.external:
            return
        entry = self.live.get(key)
        if entry is None:
            entry = self.live[key] = [nbytes, 0]
            self.current += nbytes
            self.peak = max(self.peak, self.current)
        entry[1] += 1
        weakref.finalize(t, self._release, key)

    def _release(self, key: int) -> None:
        entry = self.live.get(key)
        if entry is None:
            return
        entry[1] -= 1
        if entry[1] == 0:
            del self.live[key]
            self.current -= entry[0]


def storages(*objects: Any) -> set[int]:
    """Storage addresses of every tensor in ``objects`` (nested containers, modules' state)."""
    out: set[int] = set()
    for obj in objects:
        if isinstance(obj, torch.nn.Module):
            tensors = list(obj.parameters()) + list(obj.buffers())
        else:
            tensors = [t for t in tree_leaves(obj) if isinstance(t, Tensor)]
        for t in tensors:
            try:
                out.add(t.untyped_storage().data_ptr())
            except (RuntimeError, NotImplementedError):
                pass
    return out


def free_memory(device: torch.device) -> int:
    """Free bytes on ``device``: ``cuda.mem_get_info`` on a GPU, ``MemAvailable`` on the host."""
    if device.type == "cuda":
        return int(torch.cuda.mem_get_info(device)[0])
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return 1 << 30


def default_budget(device: torch.device) -> int:
    """Bytes one chunk may use when ``memory_budget`` is not given: a fraction of the free
    memory (half on a GPU, a quarter on the host), on CPU at most :data:`CPU_CHUNK_BYTES`."""
    frac = BUDGET_FRACTION.get(device.type, 0.25)
    budget = int(free_memory(device) * frac)
    if device.type == "cpu":
        budget = min(budget, CPU_CHUNK_BYTES)
    return max(budget, 1 << 20)


def chunk_from_probe(
    peak_bytes: int, copies: int, budget: int, total: int, even: bool = False
) -> int:
    """Copies per chunk such that ``copies_per_chunk × peak_bytes / copies ≤ budget``, at least
    one (two for antithetic pairs) and at most ``total``."""
    per_copy = max(peak_bytes / max(copies, 1), 1.0)
    chunk = max(1, min(total, int(budget // per_copy)))
    if even:
        chunk = max(2, chunk - chunk % 2)
    return chunk
