"""Start a script in several gloo processes on this machine, as ``torchrun`` does."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path


def torchrun(script: str, folder: Path, nproc: int, *args: str, timeout: int = 300) -> None:
    """Write ``script`` into ``folder`` and run it in ``nproc`` processes
    (``torch.distributed.run --standalone``, loopback only, one torch thread each) with
    ``args``; assert that every process ended well."""
    path = folder / "ranks.py"
    path.write_text(script)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone",
           f"--nproc_per_node={nproc}", str(path), *args]
    env = {**os.environ, "GLOO_SOCKET_IFNAME": "lo", "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
