"""One measurement at a time in a process, and hooks that leave other threads' forwards alone.

A measurement changes the model while it runs: it switches eval mode on and puts every module's
flag back at the end, restores the buffers a forward changed, hooks a submodule to add noise,
perturbs the weights (sharpness). Two measurements of one model in two threads saw each other's
changes: one thread's noise landed in the other's forwards (reported as a module "that ran twice
in one forward pass"), the first to finish put the model back in its own starting mode while the
other still ran, and a measurement took sharpness's perturbed weights for the model's. The same
holds for a model and anything holding it (``nn.Sequential(model, …)``, a LightningModule's
``self.model``, a callable that calls it, a wrapper). :func:`exclusive` makes measurements take
turns: one re-entrant lock for the process, held for the whole measurement (a measurement
inside another, in one thread, runs on). One lock, not one per model: measurements of two models
in two threads wait for each other too, but no order of taking several locks can deadlock, and
no container, callable or shared submodule can slip past it. A metric's own lock is always
taken after it.

A thread that runs the model without measuring it (a training loop while another thread
measures) takes no lock unless it asks for one (``with exclusive(model): ...``). A measurement's
hooks (:class:`OwnForwards`) leave its forwards alone: those of a thread, other than the
measuring one, whose call stack holds the measured model's top-level forward (or that of the
model inside a ``torch.compile``/DDP/DataParallel wrapper). The model's own worker threads (a
forward that runs a submodule in a thread pool) and ``nn.DataParallel``'s replicas (copies of
the modules, run in threads of their own) are not inside that forward, so what they run stays
the measurement's. The hooks are objects that a copy of the model (``copy.deepcopy``, a
pickle) receives as hooks that do nothing.
"""

from __future__ import annotations

import functools
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from torch import nn

_LOCK = threading.RLock()
#: the code of ``nn.Module.__call__``'s frames, in whose ``self`` a forward's module is read
_CALL_CODES = frozenset(
    f.__code__ for f in (getattr(nn.Module, "_call_impl", None),
                         getattr(nn.Module, "_wrapped_call_impl", None)) if f is not None)


def held_modules(f: object) -> list[nn.Module]:
    """The modules a call of ``f`` may run: f itself if it is one, else those f holds one
    level down — a bound method's object, a ``functools.partial``'s function and arguments,
    closure cells, the globals its code names, its attributes. ``lambda x: m(x)`` holds ``m``;
    a module reached only through other functions is not found."""
    if isinstance(f, nn.Module):
        return [f]
    found: list[nn.Module] = []

    def add(v: object) -> None:
        if isinstance(v, nn.Module) and all(v is not m for m in found):
            found.append(v)

    if isinstance(f, functools.partial):
        for v in (f.func, *f.args, *f.keywords.values()):
            add(v)
        f = f.func
    add(getattr(f, "__self__", None))
    for cell in getattr(f, "__closure__", None) or ():
        try:
            add(cell.cell_contents)
        except ValueError:  # an empty cell
            pass
    code, names = getattr(f, "__code__", None), getattr(f, "__globals__", None)
    if code is not None and isinstance(names, dict):
        for name in code.co_names:
            add(names.get(name))
    for v in getattr(f, "__dict__", {}).values():
        add(v)
    return found


@contextmanager
def exclusive(*models: Any) -> Iterator[None]:
    """Hold the measurements' lock for the block (``models`` name what is protected; the lock
    is one for the process, see the module docstring). A training loop that shares its model
    with a thread measuring it can take turns too::

        with exclusive(model):
            optimizer.step()          # never half-applied under a measurement
    """
    with _LOCK:
        yield


def one_at_a_time(func: Callable[..., Any]) -> Callable[..., Any]:
    """``func`` under :func:`exclusive`."""

    @functools.wraps(func)
    def guarded(*args: Any, **kwargs: Any) -> Any:
        with _LOCK:
            return func(*args, **kwargs)

    return guarded


class OwnForwards:
    """Tells a measurement's hooks whether a call is the measurement's own (see the module
    docstring): ``own()`` is False in a thread other than the one that made this object whose
    stack holds the top-level forward of ``model`` (of the modules a callable holds, and of the
    model inside a wrapper), and always False once the measurement ended (``close``).
    :meth:`hook` wraps a hook so that it runs on the measurement's own calls only, and so that
    a copy of the model receives a hook that does nothing."""

    def __init__(self, model: Any) -> None:
        self.thread = threading.get_ident()
        self.live = True
        tops: list[nn.Module] = []
        for m in held_modules(model):
            for _ in range(8):  # the model inside a wrapper
                if not isinstance(m, nn.Module) or any(m is t for t in tops):
                    break
                tops.append(m)
                inner = getattr(m, "_orig_mod", None)
                if inner is None and isinstance(m, (nn.DataParallel,
                                                    nn.parallel.DistributedDataParallel)):
                    inner = m.module
                m = inner
        self._tops = frozenset(id(t) for t in tops)
        self._keep = tops  # the ids stay theirs while this object lives

    def close(self) -> None:
        self.live = False

    def __call__(self) -> bool:
        if not self.live:
            return False
        if threading.get_ident() == self.thread:
            return True
        frame = sys._getframe(1)
        while frame is not None:
            if frame.f_code in _CALL_CODES and id(frame.f_locals.get("self")) in self._tops:
                return False  # this thread runs the model itself: a training loop, say
            frame = frame.f_back
        return True

    def hook(self, fn: Callable[..., Any]) -> _OwnHook:
        """``fn`` as a forward (pre-)hook that runs on the measurement's own calls only."""
        return _OwnHook(fn, self)

    def __deepcopy__(self, memo: dict[int, Any]) -> OwnForwards:
        dead = OwnForwards(None)
        dead.live = False
        return dead


class _OwnHook:
    """A hook that calls ``fn`` where :class:`OwnForwards` says the call is the measurement's
    (a pass-through otherwise); copied or pickled with a model, it does nothing."""

    def __init__(self, fn: Callable[..., Any], own: OwnForwards) -> None:
        self.fn, self.own = fn, own

    def __call__(self, *args: Any) -> Any:
        return self.fn(*args) if self.own() else None

    def __deepcopy__(self, memo: dict[int, Any]) -> _Inert:
        return _Inert()

    def __reduce__(self) -> tuple[Any, tuple[()]]:
        return _Inert, ()


class _Inert:
    """What a measurement's hook becomes in a copy of the model: nothing."""

    def __call__(self, *args: Any) -> None:
        return None
