"""Automatic chunk size: how many perturbed copies one forward pass may hold.

The first chunk of every ``update`` is a *probe*: it is evaluated (its results are kept) while an
:class:`ActivationMeter` records the peak number of bytes held by tensors that the forward pass
creates (exactly on a GPU, from module outputs elsewhere). That peak divided by the probe's
copies is the memory one copy costs; the chunk size is the memory budget divided by it. Because
the noise is drawn in fixed blocks (:mod:`senslab.measure._noise`), the chunking never changes
the numbers.
"""

from __future__ import annotations

import os
import weakref
from typing import Any

import torch
from torch import Tensor

try:
    from torch.utils._pytree import tree_leaves
except ImportError:  # older torch (docs/compatibility.md): the same leaves, through tree_flatten
    from torch.utils._pytree import tree_flatten

    def tree_leaves(tree: Any) -> list[Any]:  # type: ignore[misc]
        return tree_flatten(tree)[0]

#: copies in the probe chunk (rounded to even, for antithetic pairs)
PROBE_COPIES = 8
#: fraction of the free memory used as the default budget
BUDGET_FRACTION = {"cuda": 0.5, "cpu": 0.25}
#: on CPU the budget is capped: activations that stay near the caches run fastest (measured on
#: 1 core: ViT-small 43 copies/s at 5–20 copies per pass, 23/s at 80; RoBERTa flat from 3 to 48)
CPU_CHUNK_BYTES = 64 << 20
#: module outputs seen by hooks × this ≈ the forward's peak (temporaries inside modules)
UNSEEN_FACTOR = 2.0


class ActivationMeter:
    """Peak bytes a model's forward passes allocate while the meter is active (a context
    manager).

    On a GPU this is ``torch.cuda.max_memory_allocated`` above the level at entry. Elsewhere,
    forward hooks on every submodule (and a pre-hook on the model for its inputs) count each
    output storage once (views share their base's storage) until the last tensor using it dies;
    the peak is multiplied by :data:`UNSEEN_FACTOR` for temporaries that live inside a module's
    forward and are no module's output (attention scores, for instance). Parameters and buffers
    are never counted. A model that is no ``nn.Module`` has nothing to hook: its peak reads 0 and
    the caller falls back to the size of its inputs.
    """

    def __init__(self, model: Any, device: torch.device) -> None:
        self.model = model if isinstance(model, torch.nn.Module) else None
        self.cuda = device.type == "cuda"
        self.device = device
        self.external: set[int] = set()
        self.live: dict[int, list[int]] = {}
        self.current = 0
        self.seen_peak = 0
        self._handles: list[Any] = []
        self._base = 0

    @property
    def peak(self) -> int:
        """Peak bytes above the state at entry (see the class docstring)."""
        if self.cuda:
            return self.seen_peak
        return int(self.seen_peak * UNSEEN_FACTOR)

    def __enter__(self) -> ActivationMeter:
        if self.cuda:
            torch.cuda.synchronize(self.device)
            torch.cuda.reset_peak_memory_stats(self.device)
            self._base = torch.cuda.memory_allocated(self.device)
        elif self.model is not None:
            self.external = storages(self.model)
            self._handles.append(self.model.register_forward_pre_hook(self._pre_hook))
            for module in self.model.modules():
                self._handles.append(module.register_forward_hook(self._hook))
        return self

    def __exit__(self, *exc: Any) -> None:
        for h in self._handles:
            h.remove()
        self._handles.clear()
        if self.cuda:
            torch.cuda.synchronize(self.device)
            self.seen_peak = torch.cuda.max_memory_allocated(self.device) - self._base

    def _pre_hook(self, module: Any, args: Any) -> None:
        for t in tree_leaves(args):
            if isinstance(t, Tensor):
                self._track(t)

    def _hook(self, module: Any, args: Any, out: Any) -> None:
        for t in tree_leaves(out):
            if isinstance(t, Tensor):
                self._track(t)

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
            self.seen_peak = max(self.seen_peak, self.current)
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
