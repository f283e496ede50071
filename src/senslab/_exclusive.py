"""A model measured by one thread at a time, and hooks that leave other threads' forwards alone.

A measurement changes the model while it runs: it switches eval mode on and puts every module's
flag back at the end, restores the buffers a forward changed, hooks a submodule to add noise,
perturbs the weights (sharpness). Two measurements of one model in two threads saw each other's
changes: one thread's noise landed in the other's forwards (reported as a module "that ran twice
in one forward pass"), the first to finish put the model back in its own starting mode while the
other still ran, and a measurement took sharpness's perturbed weights for the model's.
:func:`exclusive` makes them take turns: a lock per module, taken for every module of the
measured model (so a model and a container or wrapper holding it — ``nn.Sequential(model, …)``,
a LightningModule's ``self.model``, ``torch.compile``, DDP — share their modules' locks), held
for the whole measurement and re-entrant (a measurement inside another, in one thread, runs on).
A plain callable's locks are those of the modules it holds (:func:`held_modules`).

A thread that runs the model without measuring it (a training loop while another thread
measures) takes no lock unless it asks for one (``with exclusive(model): ...``);
:class:`OwnForwards` keeps the measurement's hooks out of its forwards: those of a thread,
other than the measuring one, that entered the model's top-level forward. The model's own
worker threads (a forward that runs a branch in a thread pool) and ``nn.DataParallel``'s
replicas (copies of the modules, run in threads of their own) never enter it, so what they run
stays the measurement's.
"""

from __future__ import annotations

import functools
import inspect
import threading
import weakref
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from typing import Any

from torch import Tensor, nn

_LOCKS: weakref.WeakKeyDictionary[nn.Module, threading.RLock] = weakref.WeakKeyDictionary()
_GUARD = threading.Lock()


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


def _lock(module: nn.Module) -> threading.RLock:
    with _GUARD:
        lock = _LOCKS.get(module)
        if lock is None:
            lock = _LOCKS[module] = threading.RLock()
        return lock


@contextmanager
def exclusive(*models: Any) -> Iterator[None]:
    """Hold the locks of every module of ``models`` for the block: modules and everything
    inside them, a callable's :func:`held_modules`; a tensor (a truth table) has none. The
    locks are taken in one fixed order, so two threads never wait for each other in a circle.

    A training loop that shares its model with a thread measuring it can take turns too::

        with exclusive(model):
            optimizer.step()          # never half-applied under a measurement
    """
    locks: dict[int, threading.RLock] = {}
    for m in models:
        if isinstance(m, Tensor):
            continue
        for top in held_modules(m):
            for sub in top.modules():
                lock = _lock(sub)
                locks[id(lock)] = lock
    with ExitStack() as stack:
        for key in sorted(locks):
            stack.enter_context(locks[key])
        yield


def one_at_a_time(func: Callable[..., Any]) -> Callable[..., Any]:
    """``func`` (whose first parameter is the model measured) under :func:`exclusive` of it."""
    first = next(iter(inspect.signature(func).parameters))

    @functools.wraps(func)
    def guarded(*args: Any, **kwargs: Any) -> Any:
        model = args[0] if args else kwargs.get(first)
        with exclusive(model):
            return func(*args, **kwargs)

    return guarded


class OwnForwards:
    """Tells a measurement's hook whether a call is the measurement's own (see the module
    docstring). Inside ``with OwnForwards(model) as own:``, ``own()`` is False in a thread that
    is not the measuring one and entered ``model``'s top-level forward (or that of the model
    inside a ``torch.compile``/DDP/DataParallel wrapper) meanwhile, True elsewhere. A copy —
    ``copy.deepcopy`` of a model taken while a measurement's hooks are on it — says False
    everywhere: the hooks it carries pass every forward of the copy through."""

    def __init__(self, model: Any) -> None:
        self.thread = threading.get_ident()
        self.live = True
        self.foreign: set[int] = set()
        tops: list[nn.Module] = []
        for m in held_modules(model):  # a callable: the modules it calls
            for _ in range(8):  # and the model inside a wrapper
                if not isinstance(m, nn.Module) or any(m is t for t in tops):
                    break
                tops.append(m)
                inner = getattr(m, "_orig_mod", None)
                if inner is None and isinstance(m, (nn.DataParallel,
                                                    nn.parallel.DistributedDataParallel)):
                    inner = m.module
                m = inner
        self._tops = {id(t) for t in tops}
        self._models = tops
        self._handles: list[Any] = []

    def __enter__(self) -> OwnForwards:
        for t in self._models:
            try:
                self._handles.append(t.register_forward_pre_hook(self._entered))
            except RuntimeError:  # a ScriptModule takes no hooks: no thread is told apart
                pass
        return self

    def __exit__(self, *exc: Any) -> None:
        for h in self._handles:
            h.remove()
        self._handles = []

    def _entered(self, module: nn.Module, args: Any) -> None:
        thread = threading.get_ident()
        if self.live and thread != self.thread and id(module) in self._tops:
            self.foreign.add(thread)  # a replica is another object: its threads stay out

    def __call__(self) -> bool:
        return self.live and threading.get_ident() not in self.foreign

    def __deepcopy__(self, memo: dict[int, Any]) -> OwnForwards:
        dead = OwnForwards.__new__(OwnForwards)
        dead.__dict__.update(thread=None, live=False, foreign=set(), _tops=set(), _models=[],
                             _handles=[])
        return dead
