"""Run a command as an ordinary user, so that a read-only folder is read-only to it."""

from __future__ import annotations

import os
import shutil

import pytest


def as_ordinary_user(cmd: list[str]) -> list[str]:
    """``cmd`` as it must be started for a folder of mode 0o555 to refuse its writes: unchanged
    for an ordinary user; for root (who writes anywhere) under ``setpriv`` as nobody, or the test
    is skipped where there is no setpriv."""
    if os.geteuid() != 0:
        return cmd
    if shutil.which("setpriv") is None:
        pytest.skip("running as root without setpriv: no folder is read-only")
    return ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", *cmd]
