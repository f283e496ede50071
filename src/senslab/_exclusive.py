"""A model measured by one thread at a time, and hooks that act on the measurement's own
forwards only.

A measurement changes the model while it runs: it switches eval mode on and puts every module's
flag back at the end, restores the buffers a forward changed, hooks a submodule to add noise,
perturbs the weights (sharpness). Two measurements of one model in two threads saw each other's
changes: one thread's noise landed in the other's forwards (reported as a module "that ran twice
in one forward pass"), and the first to finish put the model back in its own starting mode while
the other still ran. :func:`exclusive` makes them take turns: a lock per model, held for the
whole measurement, re-entrant (a measurement inside another, in one thread, runs on). A wrapper
— ``torch.compile``, DDP, ``nn.DataParallel`` — shares its lock with the model inside.

A thread that runs the model without measuring it (a training loop while another thread
measures) takes no lock; :class:`OwnForwards` keeps the measurement's hooks out of its forwards.
Replicas stay in: ``nn.DataParallel`` runs copies of the modules in threads of its own, and
their forwards, which call the same hooks with the copy, are the measurement's.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from typing import Any

from torch import nn

_LOCKS: weakref.WeakKeyDictionary[nn.Module, threading.RLock] = weakref.WeakKeyDictionary()
_GUARD = threading.Lock()


def inner(model: Any) -> Any:
    """The model inside ``torch.compile`` (``_orig_mod``), DDP and ``nn.DataParallel``
    (``module``); else ``model``."""
    for _ in range(8):
        nxt = getattr(model, "_orig_mod", None) if isinstance(model, nn.Module) else None
        if nxt is None and isinstance(model, (nn.parallel.DistributedDataParallel,
                                              nn.DataParallel)):
            nxt = model.module
        if not isinstance(nxt, nn.Module):
            return model
        model = nxt
    return model


def model_lock(model: nn.Module) -> threading.RLock:
    """The lock of ``model`` (of the model inside a wrapper)."""
    model = inner(model)
    with _GUARD:
        lock = _LOCKS.get(model)
        if lock is None:
            lock = _LOCKS[model] = threading.RLock()
        return lock


@contextmanager
def exclusive(*models: Any) -> Iterator[None]:
    """Hold the locks of ``models`` (those that are modules; others — a plain callable, a
    table — have none) for the block. Several are taken in one fixed order, so two threads that
    take the same ones never wait for each other in a circle."""
    locks = {id(lock): lock for lock in (model_lock(m) for m in models
                                         if isinstance(m, nn.Module))}
    with ExitStack() as stack:
        for key in sorted(locks):
            stack.enter_context(locks[key])
        yield


class OwnForwards:
    """Tells a hook whether the call is the measurement's own: a forward that the thread which
    made this object runs, or a forward of a replica (a module not among ``model``'s when this
    was made: ``nn.DataParallel``'s copies run in threads of their own). Another thread's
    forward of the model itself is not."""

    def __init__(self, model: Any) -> None:
        self.thread = threading.get_ident()
        self.modules = ({id(m) for m in model.modules()} if isinstance(model, nn.Module)
                        else set())

    def __call__(self, module: Any) -> bool:
        return threading.get_ident() == self.thread or id(module) not in self.modules
