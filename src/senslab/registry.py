"""A tiny name → factory registry shared by models, datasets and experiments (timm-style)."""

from __future__ import annotations

import difflib
import fnmatch
from collections.abc import Callable
from typing import Any, Generic, TypeVar

F = TypeVar("F", bound=Callable[..., Any])


class Registry(Generic[F]):
    """Maps names to factories. ``register`` is a decorator; ``get`` errors with close names."""

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self._entries: dict[str, F] = {}

    def register(self, name: str | None = None) -> Callable[[F], F]:
        def deco(fn: F) -> F:
            key = name or fn.__name__
            if key in self._entries:
                raise ValueError(f"{self.kind} {key!r} is registered twice")
            self._entries[key] = fn
            return fn

        return deco

    def get(self, name: str) -> F:
        try:
            return self._entries[name]
        except KeyError:
            close = difflib.get_close_matches(name, list(self._entries), n=3, cutoff=0.4)
            hint = f" Did you mean {', '.join(map(repr, close))}?" if close else ""
            raise KeyError(
                f"unknown {self.kind} {name!r}.{hint} "
                f"Known: {', '.join(sorted(self._entries))}"
            ) from None

    def names(self, pattern: str = "*") -> list[str]:
        return sorted(n for n in self._entries if fnmatch.fnmatch(n, pattern))

    def __contains__(self, name: object) -> bool:
        return name in self._entries
