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
inside another, in one thread, runs on — but not inside sharpness's forwards, whose weights
are perturbed: refused, see :func:`perturbing`). One lock, not one per model: measurements of
two models in two threads wait for each other too, but no order of taking several locks can
deadlock, and no container, callable or shared submodule can slip past it. A metric's own
lock is always taken after it.

A thread that runs the model without measuring it (a training loop while another thread
measures) takes no lock unless it asks for one (``with exclusive(model): ...``). A measurement's
hooks (:class:`OwnForwards`) leave its forwards alone: those of a thread, other than the
measuring one, whose call stack holds the measured model's top-level forward (called as
``model(x)`` or ``model.forward(x)``, or that of the model inside a ``torch.compile``/DDP/
DataParallel wrapper), and those of a thread running a backward pass (activation checkpointing
recomputes a segment's forward there, outside the model's forward). The model's own worker
threads (a forward that runs a submodule in a thread pool) and ``nn.DataParallel``'s replicas
(copies of the modules, run in threads of their own) are not inside that forward, so what they
run stays the measurement's. The hooks are objects that a copy of the model
(``copy.deepcopy``, a pickle) receives as hooks that do nothing.

Waiting for a turn is patient: a thread that has waited a minute is told by a warning which
thread measures, since one case never ends — a measurement called from a thread that the
measured model's forward started and waits for. In a process forked while another thread
measured, measurements refuse with an error (that thread is not in the child, and what it
changed stays half done there) instead of waiting forever; the same for a metric that another
thread was updating.
"""

from __future__ import annotations

import functools
import os
import sys
import threading
import warnings
import weakref
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import torch
from torch import nn

#: seconds a thread waits for its turn to measure before a warning says which thread measures
_PATIENCE = 60.0


class TurnLock:
    """A re-entrant lock that knows its holder. ``patient``: a thread that has waited
    ``_PATIENCE`` seconds for it is warned (and goes on waiting). In a forked child, one that
    another thread held at the fork (a measurement or a metric's update half done, whose thread
    is not in the child) raises a clear error instead of never being free; ``what`` names
    what it guards in that error."""

    def __init__(self, what: str, patient: bool = False) -> None:
        self.what, self.patient = what, patient
        self._lock = threading.RLock()
        self._holder: threading.Thread | None = None
        self._depth = 0  # read and written by the holder only
        self._orphaned: str | None = None  # in a forked child: the thread that held it
        #: the holder's: how often it was entered (a measurement started inside another's
        #: forward, :func:`entered`), and what sharpness perturbs now (:func:`perturbing`)
        self._entries = 0
        self._perturbed: str | None = None
        _TURN_LOCKS.add(self)

    def __enter__(self) -> TurnLock:
        if self._orphaned is not None:
            raise RuntimeError(
                f"this process was forked while {self._orphaned} held {self.what} (a "
                "measurement or a metric's update under way); that thread is not in this "
                "process, so what it changed stays half done here (a model in eval mode with "
                "the measurement's hooks, sharpness's perturbed weights, a half-added metric "
                "state). Fork before or after measuring (`with senslab.measure.exclusive(): "
                "...` around the fork waits for the turn), or start processes with 'spawn'")
        if not self._lock.acquire(timeout=_PATIENCE if self.patient else -1):
            holder = self._holder
            name = "another thread" if holder is None else f"thread {holder.name!r}"
            try:
                warnings.warn(
                    f"thread {threading.current_thread().name!r} has waited {_PATIENCE:g} s "
                    f"for its turn to measure while {name} measures (one measurement at a "
                    "time in a process: senslab.measure.exclusive). If that thread waits for "
                    "this one — a measurement called from a thread that the measured model's "
                    "forward started and waits for — neither ever goes on: measure in the "
                    "model's own thread, or after the measured forward returns",
                    RuntimeWarning, stacklevel=3)
            except Warning:  # warnings made errors (-W error): a notice, not a reason to stop
                pass
            self._lock.acquire()
        if self._perturbed is not None:  # only its holder gets here: a measurement inside
            what = self._perturbed
            self._lock.release()
            raise RuntimeError(
                f"a measurement was started while sharpness measured {what}, which perturbs "
                "its weights draw by draw (in eval mode): from inside the forward that "
                "sharpness runs — the model's forward, a forward hook, sharpness's output= or "
                "loss_fn — in the same thread. It would measure the perturbed weights, not the "
                "model's, without a word. Measure before or after the sharpness call, not "
                "from inside the forward it runs")
        if self._depth == 0:
            self._holder = threading.current_thread()
        self._depth += 1
        self._entries += 1
        return self

    def __exit__(self, *exc: object) -> None:
        self._depth -= 1
        if self._depth == 0:
            self._holder = None
        self._lock.release()

    def _after_fork(self) -> None:
        """In a forked child: free unless another thread held it at the fork."""
        if self._lock.acquire(blocking=False):  # free, or the forking thread's own
            self._lock.release()
            return
        holder = self._holder
        self._orphaned = "another thread" if holder is None else f"thread {holder.name!r}"


_TURN_LOCKS: weakref.WeakSet[TurnLock] = weakref.WeakSet()
_LOCK = TurnLock("the measurements' turn", patient=True)


def entered() -> int | None:
    """How often this thread has entered the measurements' lock (a measurement, or
    :func:`exclusive`) while holding it; None where it does not hold it. A change between two
    readings within one measurement is a measurement started inside it (in its forward)."""
    return _LOCK._entries if _LOCK._holder is threading.current_thread() else None


@contextmanager
def perturbing(what: str) -> Iterator[None]:
    """Sharpness has the model's weights perturbed for the block (``what``: the model, in
    words): a measurement started inside it in the holder's thread (from the model's forward,
    a hook, an ``output=`` callable) is refused instead of measuring the perturbed weights
    (a token-wise sensitivity of 0.34 for 0.16, a parameter_norm of 4.31 for 3.47, without a
    word). Call it holding the lock."""
    was, _LOCK._perturbed = _LOCK._perturbed, what
    try:
        yield
    finally:
        _LOCK._perturbed = was


def _after_fork_in_child() -> None:
    for lock in list(_TURN_LOCKS):
        lock._after_fork()


if hasattr(os, "register_at_fork"):  # not on Windows, which does not fork
    os.register_at_fork(after_in_child=_after_fork_in_child)


#: the code of ``nn.Module.__call__``'s frames, in whose ``self`` a forward's module is read
_CALL_CODES = frozenset(
    f.__code__ for f in (getattr(nn.Module, "_call_impl", None),
                         getattr(nn.Module, "_wrapped_call_impl", None)) if f is not None)


def _in_backward() -> bool:
    """Whether this thread runs a backward pass now."""
    task = getattr(torch._C, "_current_graph_task_id", None)
    return task is not None and task() != -1


def first_few(names: Any, limit: int = 3) -> str:
    """``names`` for an error message: the first ``limit`` joined by commas, then "and k more"."""
    names = list(names)
    return ", ".join(names[:limit]) + (f" and {len(names) - limit} more"
                                       if len(names) > limit else "")


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
            model.train()             # the mode is the model's, shared with the measurement
            loss_fn(model(x), y).backward()
            optimizer.step()          # never half-applied under a measurement

    ``model.train()`` belongs inside: called while another thread measures, it switches that
    measurement's remaining forwards to training mode (dropout on), and its number comes out
    wrong without a word; a forward run during a measurement runs in the measurement's mode
    (eval: no dropout, BatchNorm's running statistics).
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
    model inside a wrapper) or that runs a backward pass, and always False once the measurement
    ended (``close``).
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
        #: the codes of frames that run a top's forward (``model.forward(x)`` called directly)
        codes = set(_CALL_CODES)
        for t in tops:
            f = getattr(type(t), "forward", None)
            for _ in range(8):  # through decorators (functools.wraps keeps __wrapped__)
                if getattr(f, "__code__", None) is not None:
                    codes.add(f.__code__)
                f = getattr(f, "__wrapped__", None)
                if f is None:
                    break
        self._codes = frozenset(codes)

    def close(self) -> None:
        self.live = False

    def __call__(self) -> bool:
        if not self.live:
            return False
        if threading.get_ident() == self.thread:
            return True
        if _in_backward():  # a recomputation (activation checkpointing) of a training step
            return False
        frame = sys._getframe(1)
        while frame is not None:
            if frame.f_code in self._codes and id(frame.f_locals.get("self")) in self._tops:
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


def _version(t: torch.Tensor) -> int | None:
    """``t``'s version counter (None for an inference tensor, which has none)."""
    try:
        return t._version
    except RuntimeError:
        return None


class _ModeHook(_OwnHook):
    """A hook of :func:`modes_kept`: it only reads a module's mode and changes no output, so
    :func:`forward_hooks` never counts it (a traced int8 copy, which runs without hooks,
    computes the same function)."""


@contextmanager
def modes_kept(model: Any, hooks: bool = True, unit: str = "batch",
               undone: str = "") -> Iterator[None]:
    """Refuse the block (after it ends) where one of the measurement's own forwards ran a
    module of ``model`` (of the modules a callable holds) in another mode than the one it was
    in when the block began, or where a parameter was changed in place (another thread's
    ``optimizer.step()``: copies measured against the clean outputs of other weights, 0.195
    for 0.074, without a word). Another thread's ``model.train()`` and then ``model.eval()``
    between two of the measurement's forwards left the mode as it was at the end, and the
    copies in between ran with dropout, counted without a word. ``hooks``: a forward pre-hook
    on each module reads its mode at each of its calls (the forwards of another thread running
    the model itself pass, as :class:`OwnForwards` says); a module that takes no hooks (a
    ``torch.jit`` script's) is not read. The parameters are compared by their version
    counters, which every in-place write bumps (sharpness's own perturbation swaps tensors in
    as ``.data`` and writes through those, which moves no parameter's counter). ``unit``: what
    is refused, in the error (a token-wise ``"batch"``, whose forwards are its copies; else a
    ``"measurement"``, such as a sharpness or Boolean-sensitivity call). ``undone``: what
    became of the other thread's change, said where the parameters changed (sharpness puts its
    own weights back, and with them undoes a step taken on the perturbed ones)."""
    own = OwnForwards(model)
    switched: dict[str, bool] = {}
    handles: list[Any] = []
    seen: set[int] = set()
    params: list[tuple[str, torch.Tensor, int | None]] = []
    for top in held_modules(model):
        for name, m in top.named_modules():
            if id(m) in seen:
                continue
            seen.add(id(m))
            params += [(f"{name}.{k}" if name else k, p, _version(p))
                       for k, p in m._parameters.items() if p is not None]
            if not hooks:
                continue

            def look(module: nn.Module, args: Any, name: str = name or type(top).__name__,
                     mode: bool = m.training) -> None:
                if module.training != mode and name not in switched:
                    switched[name] = module.training

            try:
                handles.append(m.register_forward_pre_hook(_ModeHook(look, own)))
            except (RuntimeError, AttributeError):  # a ScriptModule's: no hooks
                pass
    try:
        yield
    finally:
        for h in handles:
            h.remove()
        own.close()
    runs, others = (("copies", "the clean forward's") if unit == "batch"
                    else ("forwards", "the others"))
    changed = [name for name, p, v in params if v is not None and _version(p) != v]
    if changed:
        shown = first_few(changed)
        raise RuntimeError(
            f"the model's parameters were changed while it was measured ({shown}): another "
            f"thread's optimizer.step(), or the forward's own in-place write, gave some {runs} "
            f"other weights than {others}, so this {unit} is not counted{undone}. Hold "
            "senslab.measure.exclusive(model) around the training step, optimizer.step() "
            "included, or measure a copy of the model (copy.deepcopy)")
    if switched:
        now = "train" if next(iter(switched.values())) else "eval"
        was = "eval" if now == "train" else "train"
        shown = first_few(switched)
        raise RuntimeError(
            f"the model was switched to {now} mode while it was measured in {was} mode "
            f"({shown}): another thread's model.{now}(), or the forward's own, ran some of its "
            f"{runs} in {now} mode (dropout, batch statistics), so this {unit} is not counted, "
            f"also where the mode was switched back before the {unit} ended. Hold "
            "senslab.measure.exclusive(model) around the training step, model.train() and "
            "model.eval() included, or measure a copy of the model (copy.deepcopy)")


class _Inert:
    """What a measurement's hook becomes in a copy of the model: nothing."""

    def __call__(self, *args: Any) -> None:
        return None


def forward_hooks(model: nn.Module, *, foreign: bool = False) -> list[tuple[str, int]]:
    """(module, handle id) of every forward hook and forward pre-hook registered on a module of
    ``model`` or for all modules (``register_module_forward_hook``; module ``"*"``).
    ``foreign``: only those that are not a measurement's own (:meth:`OwnForwards.hook`, or what
    such a hook becomes in a copy of the model) — the user's, a library's.

    A path that runs the model by other means than its call skips them: FX traces a module's
    ``forward``, so a static int8 copy runs without them; a zoo model's ``forward_suffix`` and
    ``forward_local`` (reuse of the clean computation) run its layers without its call, so a
    hook on the model that normalises the input, masks classes or edits an output is missing
    from the copies (those paths are not taken where a model holds such hooks)."""
    from torch.nn.modules import module as torch_module

    def counted(hook: Any) -> bool:
        return not (isinstance(hook, _ModeHook)
                    or foreign and (isinstance(hook, (_OwnHook, _Inert)) or _tracker(hook)))

    found = [("*", i) for d in ("_global_forward_pre_hooks", "_global_forward_hooks")
             for i, hook in getattr(torch_module, d, {}).items() if counted(hook)]
    return found + [(name, i) for name, m in model.named_modules()
                    for d in ("_forward_pre_hooks", "_forward_hooks")
                    for i, hook in getattr(m, d, {}).items() if counted(hook)]


def _tracker(hook: Any) -> bool:
    """Whether ``hook`` is a method of torch's ``ModuleTracker`` (which ``FlopCounterMode`` and
    torch's memory trackers register for all modules): it only follows which module runs,
    returns nothing and changes no output, so skipping it changes no number."""
    try:
        from torch.utils.module_tracker import ModuleTracker
    except ImportError:  # pragma: no cover - an older torch
        return False
    return isinstance(getattr(hook, "__self__", None), ModuleTracker)
