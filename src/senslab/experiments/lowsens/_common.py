"""Shared plumbing for the small-model experiments: settings with dotted overrides and the
scale table. Their run directories are written by a custom training loop through
:class:`~senslab.experiments._manual.ManualRun` and :func:`~senslab.experiments._manual.run_all`
(re-exported here; see that module for the format and the reuse/restart rules).
"""

from __future__ import annotations

import dataclasses
from typing import TypeVar

from ...train.config import apply_overrides
from .._manual import ManualRun, run_all

__all__ = ["ManualRun", "pick_scale", "resolve_settings", "run_all"]

S = TypeVar("S")


def resolve_settings(settings: S, overrides: list[str]) -> S:
    """Apply ``key=value`` overrides to a flat settings dataclass (a copy; types are checked and
    an unknown key names the closest valid one, as for ``senslab train --set``)."""
    out = dataclasses.replace(settings)  # type: ignore[type-var]
    text_fields = {f.name for f in dataclasses.fields(out) if f.type in (str, "str")}
    items = []
    for item in overrides:
        key, sep, value = item.partition("=")
        # a text field takes the text as written: only=0 means the string "0", not the int 0
        items.append(f"{key}={value!r}" if sep and key.strip() in text_fields else item)
    apply_overrides(out, items)  # type: ignore[arg-type]
    return out


def pick_scale(scale: str, table: dict[str, S]) -> S:
    if scale not in table:
        raise ValueError(f"unknown scale {scale!r}; use one of {', '.join(map(repr, table))}")
    return table[scale]
