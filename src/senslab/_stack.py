"""Where a warning points: the user's call, not senslab's or torch's insides."""

from __future__ import annotations

import os
import sys

import torch


def user_level() -> int:
    """``stacklevel`` of the first frame outside senslab and torch (the user's call), for a
    ``warnings.warn`` in the function that calls this."""
    inside = (os.path.dirname(__file__), os.path.dirname(torch.__file__))
    frame, level = sys._getframe(2), 2  # the caller of the warning function is level 2
    while frame is not None and frame.f_code.co_filename.startswith(inside):
        frame, level = frame.f_back, level + 1
    return level
