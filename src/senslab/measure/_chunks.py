"""Automatic chunk size: how many perturbed copies one forward pass may hold.

The first chunk of every ``update`` is a *probe*: it is evaluated (its results are kept) while an
:class:`ActivationMeter` records the peak number of bytes held by tensors that the forward pass
creates (exactly on a GPU, from module outputs elsewhere). That peak divided by the probe's
copies is the memory one copy costs; the chunk size is the memory budget divided by it. On the
host, under the default budget, the chunk is also kept small enough that no single temporary
tensor of the forward grows past :data:`CPU_TENSOR_BYTES` (the meter records the largest).
Because the noise is drawn in fixed blocks (:mod:`senslab.measure._noise`), the chunking never
changes the numbers.
"""

from __future__ import annotations

import os
import weakref
from typing import Any

import torch
from torch import Tensor
from torch.overrides import TorchFunctionMode

from .._autocast import autocast_on
from .._exclusive import OwnForwards

try:  # private module: without it the host's per-tensor cap is skipped (docs/compatibility.md)
    from torch.utils._python_dispatch import TorchDispatchMode
except ImportError:  # pragma: no cover - every supported torch has it
    TorchDispatchMode = None  # type: ignore[assignment,misc]
try:  # the same private module: without these, the meter's mode is switched off more broadly
    from torch.utils._python_dispatch import _get_current_dispatch_mode, _pop_mode_temporarily
except ImportError:  # pragma: no cover - every supported torch has them
    _get_current_dispatch_mode = _pop_mode_temporarily = None  # type: ignore[assignment]

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
#: on CPU (default budget) no temporary tensor of a chunk's forward may exceed this: glibc's
#: malloc serves a block above its mmap threshold (at most 32 MiB on 64-bit) with a fresh mapping
#: each time, whose pages fault in again on every call, and gives freed memory above twice the
#: threshold back to the system — a chunk that stays well below runs faster (docs/benchmarks.md,
#: ViT-small chunk-size measurements, where 25 MB tensors still ran slow once; 17 MB did not)
CPU_TENSOR_BYTES = 16 << 20
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

    That estimate sizes the chunks under the host's default budget, whose cap is set for speed
    (:data:`CPU_CHUNK_BYTES`). A budget the user gave must hold: with ``exact=True`` the peak is
    also at least :attr:`created_peak`, the most bytes that storages created by the forward's
    operations held at once, each counted until its last tensor dies. It sees temporaries
    inside modules and the forwards of a callable that is no ``nn.Module``, where the hooks
    see nothing (an L×L attention score was missed, so chunks ran 8–30× over the budget); not
    the temporaries inside one call run under autocast, nor a compiled model's (only its
    outputs), where the hooks' estimate remains.

    On the host it also records :attr:`largest`: the bytes of the largest storage that an operation
    of the forward created and that died before the meter closed — a temporary, not a cache the
    forward keeps (such as a layout a model builds on its first call) nor the output. It is seen
    through a dispatch mode, so it includes tensors inside modules and forwards no hook sees
    (``forward_local``, fused attention); 0 where the mode cannot run (a compiled model).
    """

    def __init__(self, model: Any, device: torch.device, autocast: bool = False,
                 exact: bool = False) -> None:
        self.model = model if isinstance(model, torch.nn.Module) else None
        #: on the host, :attr:`peak` also counts the storages the forward's operations create
        #: (:attr:`created_peak`): a budget the user gave must hold (see the class docstring)
        self.exact = exact
        #: the forwards may run under autocast: its operations are metered apart
        #: (:class:`_UnderAutocast`)
        self.autocast = autocast
        self.cuda = device.type == "cuda"
        self.device = device
        self.external: set[int] = set()
        self.live: dict[int, list[int]] = {}
        self.current = 0
        self.seen_peak = 0
        self._handles: list[Any] = []
        self._base = 0
        #: largest temporary storage of the forward, in bytes (host only; see the docstring)
        self.largest = 0
        #: bytes of the storages the forward's operations created that are alive now, and their
        #: peak (host only, where the dispatch mode runs; see the class docstring)
        self.created = 0
        self.created_peak = 0
        self._temps: dict[int, list[int]] = {}
        self._mode: Any = None
        self._autocast: Any = None
        self._own = OwnForwards(None)

    @property
    def peak(self) -> int:
        """Peak bytes above the state at entry (see the class docstring)."""
        if self.cuda:
            return self.seen_peak
        estimate = int(self.seen_peak * UNSEEN_FACTOR)
        return max(estimate, self.created_peak) if self.exact else estimate

    def __enter__(self) -> ActivationMeter:
        if self.cuda:
            torch.cuda.synchronize(self.device)
            torch.cuda.reset_peak_memory_stats(self.device)
            self._base = torch.cuda.memory_allocated(self.device)
        elif self.model is not None:
            self._own = OwnForwards(self.model)  # not the forwards of a thread running the model
            self.external = storages(self.model)
            self._handles.append(self.model.register_forward_pre_hook(
                self._own.hook(self._pre_hook)))
            for module in self.model.modules():
                self._handles.append(module.register_forward_hook(self._own.hook(self._hook)))
        if (self.device.type == "cpu" and TorchDispatchMode is not None
                and not _compiled(self.model)):
            self._mode = _Temporaries(self)
            self._mode.__enter__()
            if self.autocast:
                self._autocast = _UnderAutocast(self)
                self._autocast.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        if self._mode is not None:
            if self._autocast is not None:
                self._autocast.__exit__(*exc)
                self._autocast = None
            self._mode.__exit__(*exc)
            self._mode = None
        self._temps.clear()
        self._own.close()
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
        key, nbytes = _storage(t)
        if key == 0 or key in self.external:
            return
        entry = self.live.get(key)
        if entry is None:
            entry = self.live[key] = [nbytes, 0]
            self.current += nbytes
            self.seen_peak = max(self.seen_peak, self.current)
        entry[1] += 1
        weakref.finalize(t, self._release, key)

    def _temp(self, t: Tensor, inputs: set[int]) -> None:
        """An operation's output: counted in :attr:`largest` if its storage dies while open. An
        output on an input's storage (a view, an in-place result) only keeps a temporary alive:
        a view of a cache made before the meter opened is never a temporary."""
        key, nbytes = _storage(t)
        if key == 0 or key in self.external:
            return
        entry = self._temps.get(key)
        if entry is None:
            if key in inputs:
                return
            entry = self._temps[key] = [nbytes, 0]
            self.created += nbytes
            self.created_peak = max(self.created_peak, self.created)
        entry[1] += 1
        weakref.finalize(t, self._temp_died, key)

    def _temp_died(self, key: int) -> None:
        entry = self._temps.get(key)
        if entry is None or self._mode is None:
            return
        entry[1] -= 1
        if entry[1] == 0:
            del self._temps[key]
            self.created -= entry[0]
            self.largest = max(self.largest, entry[0])

    def _release(self, key: int) -> None:
        entry = self.live.get(key)
        if entry is None:
            return
        entry[1] -= 1
        if entry[1] == 0:
            del self.live[key]
            self.current -= entry[0]


def _compiled(model: Any) -> bool:
    """A ``torch.compile``'d module: a dispatch mode around it would change what it runs."""
    return model is not None and hasattr(model, "_orig_mod")


def _handed(meter: ActivationMeter, out: Any, args: Any, kwargs: Any) -> Any:
    """``out``, each of its tensors handed to ``meter`` (:meth:`ActivationMeter._temp`)."""
    inputs = {_storage(t)[0] for t in tree_leaves((args, kwargs)) if isinstance(t, Tensor)}
    for t in tree_leaves(out):
        if isinstance(t, Tensor):
            meter._temp(t, inputs)
    return out


if TorchDispatchMode is not None:

    class _Temporaries(TorchDispatchMode):
        """Hands every tensor an operation returns to the meter (:meth:`ActivationMeter._temp`)."""

        def __init__(self, meter: ActivationMeter) -> None:
            super().__init__()
            self.meter = meter

        def __torch_dispatch__(self, func: Any, types: Any, args: Any = (),
                               kwargs: Any = None) -> Any:
            kwargs = kwargs or {}
            return _handed(self.meter, func(*args, **kwargs), args, kwargs)

    class _UnderAutocast(TorchFunctionMode):
        """Under autocast, each call runs with the dispatch mode off, and its outputs are handed
        to the meter here: under inference mode PyTorch skips autocast's casts inside an
        operation a dispatch mode sees whole (``einsum`` of a float32 parameter and a bf16
        activation failed, a dtype mismatch), so the mode must not see operations autocast is
        to cast. Temporaries inside such a call go unseen; its outputs are counted.

        Only the meter's own mode is set aside, not Python dispatch as a whole: that also
        switched off the ``__torch_dispatch__`` of tensor subclasses (a wrapper-subclass weight,
        as quantization libraries make), whose ops then read unallocated data, so the probe
        chunk failed under autocast where a given ``chunk_size`` ran."""

        def __init__(self, meter: ActivationMeter) -> None:
            super().__init__()
            self.meter = meter

        def __torch_function__(self, func: Any, types: Any, args: Any = (),
                               kwargs: Any = None) -> Any:
            kwargs = kwargs or {}
            if not autocast_on(self.meter.device.type):
                return func(*args, **kwargs)
            mode = self.meter._mode
            if _pop_mode_temporarily is not None and _get_current_dispatch_mode() is mode:
                with _pop_mode_temporarily():
                    return _handed(self.meter, func(*args, **kwargs), args, kwargs)
            with torch._C._DisableTorchDispatch():  # another mode above the meter's
                return _handed(self.meter, func(*args, **kwargs), args, kwargs)


def _storage(t: Tensor) -> tuple[int, int]:
    """(address, bytes) of ``t``'s storage; (0, 0) for tensors without one."""
    try:
        storage = t.untyped_storage()
        return storage.data_ptr(), storage.nbytes()
    except (RuntimeError, NotImplementedError):
        return 0, 0


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


def memory_share(device: torch.device) -> int:
    """The share of ``device``'s free memory one chunk may hold (half on a GPU, a quarter on
    the host; at least 1 MiB)."""
    return max(int(free_memory(device) * BUDGET_FRACTION.get(device.type, 0.25)), 1 << 20)


def default_budget(device: torch.device) -> int:
    """Bytes one chunk may use when ``memory_budget`` is not given: :func:`memory_share`, on
    CPU at most :data:`CPU_CHUNK_BYTES`."""
    budget = memory_share(device)
    if device.type == "cpu":
        budget = min(budget, CPU_CHUNK_BYTES)
    return budget


def with_tensor_cap(per_copy: float, largest_per_copy: float, budget: int) -> float:
    """Bytes per copy to size chunks by, so that ``budget / result`` copies keep the largest
    temporary tensor under :data:`CPU_TENSOR_BYTES` (host, default budget: see the module
    docstring): ``per_copy`` or more."""
    if largest_per_copy <= 0:
        return per_copy
    return max(per_copy, largest_per_copy * budget / CPU_TENSOR_BYTES)


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
