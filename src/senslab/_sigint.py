"""Ctrl-C that is never lost.

Python raises the KeyboardInterrupt of SIGINT wherever the main thread happens to be. Where that
is a weakref finalizer or a ``__del__`` — run whenever an object dies, such as the allocation
bookkeeping of the chunk-size probe or the memory accounting of the tracked sensitivity —
Python prints "Exception ignored" with a traceback and goes on, and the work runs on as if
nothing was pressed. :class:`SigintWatch` puts a SIGINT handler in place that records the
interrupt (and, inside a finalizer or ``__del__``, raises nothing there), so the work it guards
stops all the same, without a traceback: at its next :meth:`SigintWatch.check`, or when the
guarded block ends.
"""

from __future__ import annotations

import os
import signal
import threading
from collections.abc import Callable
from typing import Any


def _in_finalizer(frame: Any) -> bool:
    """Whether ``frame`` runs inside a weakref finalizer or a ``__del__``, where an exception
    is swallowed."""
    while frame is not None:
        code = frame.f_code
        if code.co_name == "__del__" or (code.co_name == "__call__"
                                         and os.path.basename(code.co_filename) == "weakref.py"):
            return True
        frame = frame.f_back
    return False


class SigintWatch:
    """A context manager: while open, SIGINT raises KeyboardInterrupt as always and is also
    recorded (:attr:`seen`; ``mark()`` is called too). :meth:`check` raises KeyboardInterrupt
    for an interrupt that was swallowed, and so does leaving the block without an exception.

    Installed only from the main thread (the only one Python delivers signals to) and only over
    Python's own handler: a handler the user installed, or an enclosing watch, is left alone.
    The enclosing watch then records the interrupt, and :meth:`check` reads it there: a
    measurement inside a training loop's watch stops at its next chunk all the same."""

    def __init__(self, mark: Callable[[], None] | None = None) -> None:
        self.seen = False
        self._mark = mark
        self._installed = False
        #: the enclosing watch that records this block's Ctrl-C, where one does
        self._outer: SigintWatch | None = None

    def __enter__(self) -> SigintWatch:
        if threading.current_thread() is threading.main_thread():
            handler = signal.getsignal(signal.SIGINT)
            if handler is signal.default_int_handler:
                signal.signal(signal.SIGINT, self._handle)
                self._installed = True
            elif isinstance(outer := getattr(handler, "__self__", None), SigintWatch):
                self._outer = outer
        return self

    def _handle(self, signum: int, frame: Any) -> None:
        self.seen = True
        if self._mark is not None:
            self._mark()
        if _in_finalizer(frame):
            # Python would swallow it there and print "Exception ignored" with a traceback:
            # recorded instead, it is raised at the next check or when the block ends
            return
        raise KeyboardInterrupt

    def check(self) -> None:
        """Raise the KeyboardInterrupt of a Ctrl-C that was swallowed where it landed (recorded
        here, or by the enclosing watch)."""
        if self.seen or (self._outer is not None and self._outer.seen):
            raise KeyboardInterrupt

    def __exit__(self, exc_type: Any, *exc: object) -> None:
        self._outer = None
        if self._installed:
            # Python's handler back in place of this watch's only: a handler set inside the
            # block (by the user, a library) stays, as it would have without the watch
            if signal.getsignal(signal.SIGINT) == self._handle:
                signal.signal(signal.SIGINT, signal.default_int_handler)
            self._installed = False
        if self.seen and exc_type is None:
            raise KeyboardInterrupt
