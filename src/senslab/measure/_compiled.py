"""``compile=True``: the model as the perturbed copies see it, with every entry point they go
through compiled.

A copy is evaluated by the model's call, or — where the model reuses the clean computation — by
``forward_local`` (local reuse, :class:`~senslab.tokens.Patches`) or ``forward_suffix`` (prefix
reuse, :class:`~senslab.tokens.Embedding`). Compiling the model alone would leave those two
paths eager, and a zoo vision or sequence model would then run no compiled code at all.
:class:`CompiledModel` compiles the call and each reuse path the model has; the clean caches those
paths read (``local_cache``, ``prefix_cache``, built once per batch) and every other attribute
are the model's own.
"""

from __future__ import annotations

from contextlib import nullcontext
from typing import Any

import torch
from torch.utils._pytree import tree_flatten

#: the methods a tokenization's reuse path calls once per chunk of copies
REUSE_PATHS = ("forward_local", "forward_suffix")


class CompiledModel:
    """Stands in for ``model`` while the copies are evaluated: calls go through
    ``torch.compile(model)``, :data:`REUSE_PATHS` through their own compiled functions, each
    compiled with the first axis of its tensor arguments of any size (:func:`_rows_dynamic`),
    so chunks of other sizes run the same compiled code."""

    def __init__(self, model: Any) -> None:
        self._model = model
        self._call = torch.compile(model)
        self._paths = {name: _with_rows_dynamic(torch.compile(getattr(model, name)))
                       for name in REUSE_PATHS if callable(getattr(model, name, None))}

    def __getstate__(self) -> dict[str, Any]:
        """The model alone: a copy (``copy.deepcopy``, a pickle, as of a metric that has
        measured) compiles its own model again (lazily: nothing is compiled before its first
        call), so it never runs the original's compiled code, which reads the original model."""
        return {"_model": self._model}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["_model"])  # type: ignore[misc]

    @property
    def compiled_paths(self) -> tuple[str, ...]:
        """The reuse paths compiled besides the call."""
        return tuple(self._paths)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        _rows_dynamic(args, kwargs)
        with _hooks_guarded():
            return self._call(*args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        # only reached for names not set in __init__; the model's own for all but the paths
        paths = self.__dict__.get("_paths", {})
        if name in paths:
            return paths[name]
        if "_model" not in self.__dict__:  # being copied or unpickled: no model yet
            raise AttributeError(name)
        return getattr(self.__dict__["_model"], name)


def _rows_dynamic(args: Any, kwargs: Any) -> None:
    """Mark the first axis of every tensor in a call's arguments as of any size: the copies'
    axis (and the cache's examples), whose size changes with each chunk — the last chunk of a
    round is shorter, and a batch's last examples are fewer. Left static, the first call's
    sizes were compiled in, the first other size compiled the function again (as of torch's
    automatic dynamic shapes, which then makes that axis dynamic), and a batch of another
    example count (the cache's first axis) once more. A hint only (``maybe_mark_dynamic``):
    where the code fixes a size, Dynamo keeps it, with no error."""
    from torch import _dynamo

    mark = getattr(_dynamo, "maybe_mark_dynamic", None)
    if mark is None:  # a torch without the hint: its automatic dynamic shapes alone
        return
    for leaf in tree_flatten((args, kwargs))[0]:
        if isinstance(leaf, torch.Tensor) and leaf.dim() >= 1:
            mark(leaf, 0)


def _with_rows_dynamic(fn: Any) -> Any:
    """``fn`` (a compiled reuse path) with :func:`_rows_dynamic` before each call."""

    def call(*args: Any, **kwargs: Any) -> Any:
        _rows_dynamic(args, kwargs)
        with _hooks_guarded():
            return fn(*args, **kwargs)

    return call


def _hooks_guarded() -> Any:
    """The setting a compiled call runs under: Dynamo guards on the modules' hooks. By default
    (``torch._dynamo.config.skip_nnmodule_hook_guards``) it does not, and a hook added or
    removed after the first call went unseen: the copies ran the hooks as compiled while the
    clean forward, eager, ran them as they are (a hook negating the logits, added between two
    measurements of one metric, measured 0.88 for a sensitivity of 0.12). With the guard such
    a change compiles again. Hooks registered for every module at once
    (``torch.nn.modules.module.register_module_forward_hook``) Dynamo does not guard on."""
    from torch._dynamo import config

    if not hasattr(config, "skip_nnmodule_hook_guards"):  # a torch without the option
        return nullcontext()
    return config.patch(skip_nnmodule_hook_guards=False)
