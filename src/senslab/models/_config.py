"""Helpers every model family shares: frozen-dataclass configs with checked overrides.

``create_model(name, **overrides)`` ends in ``override_config(DefaultConfig(), overrides)``: an
unknown key is an error naming the closest valid field, and a value of the wrong type (e.g.
``dim="256"``) is refused here rather than failing much later, deep inside a layer constructor.
"""

from __future__ import annotations

import difflib
import math
from collections.abc import Mapping
from dataclasses import fields, replace
from typing import Any, TypeVar

from torch import nn

from ..tokens import Patches

C = TypeVar("C")


def override_config(config: C, overrides: Mapping[str, Any]) -> C:
    """``config`` with the fields in ``overrides`` replaced (configs are frozen dataclasses).

    Each value must have the type of the field's current value: an int is fine for a float, a
    list for a tuple (JSON has no tuples); a bool is never a number; a field whose current value
    is ``None`` takes anything (the config's own checks then apply).
    """
    valid = {f.name: getattr(config, f.name) for f in fields(config)}  # type: ignore[arg-type]
    overrides = dict(overrides)  # never mutate the caller's dict
    name = type(config).__name__
    for key, value in list(overrides.items()):
        if key not in valid:
            close = difflib.get_close_matches(key, list(valid), n=1)
            hint = f" Did you mean {close[0]!r}?" if close else ""
            raise TypeError(f"unknown option {key!r} for {name}.{hint} "
                            f"Valid options: {', '.join(valid)}")
        current = valid[key]
        if isinstance(value, list) and isinstance(current, tuple):
            value = overrides[key] = tuple(value)
        if current is None:
            continue
        want = (int, float) if type(current) is float else type(current)
        if isinstance(value, bool) != isinstance(current, bool) or not isinstance(value, want):
            raise TypeError(f"option {key!r} of {name} expects {type(current).__name__} "
                            f"(default {current!r}), got {value!r} ({type(value).__name__})")
    return replace(config, **overrides)  # type: ignore[type-var]


def make_config(cls: type[C], overrides: Mapping[str, Any]) -> C:
    """``override_config(cls(), overrides)`` for a config class whose fields all have defaults."""
    return override_config(cls(), overrides)


def check_divides(patch: int, image_size: int, name: str) -> None:
    """Error (naming the config field and the valid choices) unless ``patch`` divides the image."""
    try:
        Patches(patch).grid(image_size, image_size)
    except ValueError as e:
        raise ValueError(f"{name}: {e}") from None


def check_positive(cfg: Any, *names: str, integer: bool = True) -> None:
    """Error unless each named field (or every entry of a tuple field) is a finite positive
    number, an ``int`` when ``integer`` (NaN passed ``x <= 0``, and infinity is no size)."""
    kinds = (int,) if integer else (int, float)
    for n in names:
        v = getattr(cfg, n)
        values = v if isinstance(v, tuple) else (v,)
        bad = [x for x in values if isinstance(x, bool) or not isinstance(x, kinds)
               or (isinstance(x, float) and not math.isfinite(x)) or x <= 0]
        if not values or bad:
            kind = "integer" if integer else "finite number"
            raise ValueError(f"{type(cfg).__name__}.{n} must be a positive {kind}, got {v!r}")


def check_one_of(name: str, value: Any, choices: tuple[str, ...]) -> None:
    """Error listing ``choices`` unless ``value`` is one of them."""
    if value not in choices:
        raise ValueError(f"{name} must be one of {', '.join(map(repr, choices))}, got {value!r}")


def check_choice(cfg: Any, name: str, choices: tuple[str, ...]) -> None:
    """:func:`check_one_of` for the config field ``name``."""
    check_one_of(f"{type(cfg).__name__}.{name}", getattr(cfg, name), choices)


def check_eval(model: nn.Module, reuse: str, option: str) -> None:
    """Error unless ``model`` and every one of its submodules are in eval mode, before a reuse
    path (``reuse``: "local" or "prefix") builds its clean cache.

    The reuse paths compute a copy as an eval-mode forward would (no dropout, BatchNorm's
    running statistics), so a single submodule left in train mode inside an eval model (a
    Dropout or BatchNorm switched on by hand) makes them return the numbers of another model
    than the one ``forward`` runs; ``model.training`` alone does not show it. ``option``: the
    tokenization's switch that turns the reuse off (named in the error)."""
    where = "" if model.training else next(
        (name for name, m in model.named_modules() if m.training), None)
    if where is None:
        return
    which = "the model" if not where else f"its submodule {where!r}"
    raise RuntimeError(
        f"{reuse} reuse needs eval mode, but {which} is in train mode: the reused copies skip "
        f"dropout and batch statistics that a full forward would apply, so their outputs would "
        f"differ from the model's own. Call model.eval() first, or measure with {option} to "
        f"run full forwards")


#: the error of a reuse path (``forward_local``, ``forward_suffix``) called on a model in train
#: mode: its cache was built in eval mode, and it has no dropout or batch statistics to apply
TRAIN_MODE_REUSE = (
    "the model is in train mode, but its reuse path (forward_local / forward_suffix) computes "
    "a copy as an eval-mode forward would (no dropout, BatchNorm's running statistics), so its "
    "outputs would differ from the model's own forward. Call model.eval() and build the cache "
    "again, or call the model itself")
