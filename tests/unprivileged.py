"""Run a command as an ordinary user, so that a read-only folder is read-only to it."""

from __future__ import annotations

import functools
import os
import shutil
import subprocess
import sys

import pytest

_NOBODY = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"]


@functools.cache
def _nobody_imports_senslab() -> bool:
    """Whether the ordinary user can import this senslab (a checkout in a folder only root may
    read, such as one made by ``mktemp -d``, is not importable as another user)."""
    done = subprocess.run([*_NOBODY, sys.executable, "-c", "import senslab"],
                          capture_output=True, timeout=120)
    return done.returncode == 0


def as_ordinary_user(cmd: list[str]) -> list[str]:
    """``cmd`` as it must be started for a folder of mode 0o555 to refuse its writes: unchanged
    for an ordinary user; for root (who writes anywhere) under ``setpriv`` as nobody, or the test
    is skipped where there is no setpriv, or where nobody cannot read this checkout."""
    if os.geteuid() != 0:
        return cmd
    if shutil.which("setpriv") is None:
        pytest.skip("running as root without setpriv: no folder is read-only")
    if not _nobody_imports_senslab():
        pytest.skip("running as root in a checkout an ordinary user cannot read: no user to "
                    "whom a folder is read-only can run senslab")
    return [*_NOBODY, *cmd]
