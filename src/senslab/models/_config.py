"""Helpers every model family shares: frozen-dataclass configs with checked overrides.

``create_model(name, **overrides)`` ends in ``override_config(DefaultConfig(), overrides)``: an
unknown key is an error naming the closest valid field, and a value of the wrong type (e.g.
``dim="256"``) is refused here rather than failing much later, deep inside a layer constructor.
"""

from __future__ import annotations

import difflib
from collections.abc import Mapping
from dataclasses import fields, replace
from typing import Any, TypeVar

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
    """Error unless each named field (or every entry of a tuple field) is a positive number,
    an ``int`` when ``integer``."""
    kinds = (int,) if integer else (int, float)
    for n in names:
        v = getattr(cfg, n)
        values = v if isinstance(v, tuple) else (v,)
        bad = [x for x in values if isinstance(x, bool) or not isinstance(x, kinds) or x <= 0]
        if not values or bad:
            kind = "integer" if integer else "number"
            raise ValueError(f"{type(cfg).__name__}.{n} must be a positive {kind}, got {v!r}")


def check_one_of(name: str, value: Any, choices: tuple[str, ...]) -> None:
    """Error listing ``choices`` unless ``value`` is one of them."""
    if value not in choices:
        raise ValueError(f"{name} must be one of {', '.join(map(repr, choices))}, got {value!r}")


def check_choice(cfg: Any, name: str, choices: tuple[str, ...]) -> None:
    """:func:`check_one_of` for the config field ``name``."""
    check_one_of(f"{type(cfg).__name__}.{name}", getattr(cfg, name), choices)
