"""Where a warning points: the user's call, not senslab's or torch's insides."""

from __future__ import annotations

import contextlib
import os
import sys
import warnings
from collections.abc import Iterator
from contextlib import contextmanager

import torch


def user_level() -> int:
    """``stacklevel`` of the first frame outside senslab and torch (the user's call), for a
    ``warnings.warn`` in the function that calls this; contextlib's frames between senslab's are
    passed over too (senslab enters some of its contexts through an ``ExitStack``)."""
    inside = (os.path.dirname(__file__), os.path.dirname(torch.__file__),
              contextlib.__file__)
    frame, level = sys._getframe(2), 2  # the caller of the warning function is level 2
    while frame is not None and frame.f_code.co_filename.startswith(inside):
        frame, level = frame.f_back, level + 1
    return level


@contextmanager
def said_once(said: set[str]) -> Iterator[None]:
    """Warnings raised inside are said (re-raised on leaving) only the first time their cause —
    the text before the first ``:`` — comes up in ``said``, which remembers it. A training loop
    that measures at every evaluation passes one set per run: a cause such as "the standard
    error rests on no change" is said once, not once per evaluation with other numbers (a
    message with other numbers is another message to Python's once-per-location filter).

    Warnings raised before an exception are said too, before it goes on: they may be what
    explains it (a warning that raises, under ``-W error``, then gives way to the exception)."""
    caught: list[warnings.WarningMessage] = []
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            yield
    except BaseException:
        _say(caught, said, quiet=True)
        raise
    _say(caught, said)


def _say(caught: list[warnings.WarningMessage], said: set[str], quiet: bool = False) -> None:
    """Re-raise the warnings of ``caught`` whose cause is not in ``said`` (see
    :func:`said_once`); ``quiet``: one that the filters make an error is not raised."""
    for w in caught:
        cause = str(w.message).split(":", 1)[0]
        if cause not in said:
            said.add(cause)
            try:
                warnings.warn_explicit(w.message, w.category, w.filename, w.lineno,
                                       source=w.source)
            except Warning:
                if not quiet:
                    raise
