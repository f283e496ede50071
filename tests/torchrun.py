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


# The worker leaves without the interpreter's teardown: there, after fit has returned, its
# process group is destroyed and every output is written, torch's gloo backend now and then
# aborts a rank in C++ ("terminate called without an active exception", no Python frame; 4 of
# 120 runs of this worker beside a busy process, scratch). The outputs are what the tests check.
FIT_WORKER = """
import os, sys
from senslab.train.config import RunConfig, apply_overrides
from senslab.train.loop import fit
fit(apply_overrides(RunConfig(name="ddp"), sys.argv[2:]), sys.argv[1], progress=False)
sys.stdout.flush()
sys.stderr.flush()
os._exit(0)
"""


def torchrun_fit(folder: Path, out: Path, args: list[str]) -> None:
    """``senslab.train.loop.fit`` into ``out`` with the overrides ``args``, in 2 processes
    (:func:`torchrun`)."""
    torchrun(FIT_WORKER, folder, 2, str(out), *args)


def assert_ddp_equals_one_process(folder: Path, args: list[str]) -> None:
    """Two ranks under torchrun (into ``folder / "ddp"``) and one process (``folder /
    "single"``), trained on ``args``: the same final weights."""
    import torch

    from senslab.train.config import RunConfig, apply_overrides
    from senslab.train.loop import fit
    from senslab.train.rundir import RunDir

    torchrun_fit(folder, folder / "ddp", args)
    torch.set_num_threads(1)  # restored after the test (conftest)
    fit(apply_overrides(RunConfig(name="ddp"), list(args)), folder / "single", progress=False)
    a = RunDir.load_checkpoint(RunDir(folder / "ddp").checkpoints()[-1])["model"]
    b = RunDir.load_checkpoint(RunDir(folder / "single").checkpoints()[-1])["model"]
    assert all(torch.allclose(a[k], b[k], atol=1e-5) for k in a)
