"""What a benchmark record ran on: the CPU, its vector and matrix extensions, torch's kernel level,
the cores and the threads (``benchmarks/real_models.py`` and ``benchmarks/run.py`` write it into
every record)."""

from __future__ import annotations

import os
import platform
from pathlib import Path
from typing import Any

import torch

#: CPU flags a record keeps: the vector and matrix extensions that set the bf16 and int8 rates
CPU_FLAGS = ("avx2", "avx512f", "avx512_bf16", "avx512_vnni", "avx_vnni", "amx_tile",
             "amx_bf16", "amx_int8")


def machine() -> dict[str, Any]:
    """What a record ran on and with how many threads: the CPU's model name and which of
    :data:`CPU_FLAGS` it has (from ``/proc/cpuinfo`` where the system has one; else the
    platform's processor name and no flags), torch's CPU kernel level, the cores the system
    shows, and torch's intra-op and inter-op threads read back after they were set. The host
    name alone (a VM's is often ``vm``) cannot tell an AVX-512 Xeon from an AMX one or an EPYC,
    whose bf16 and int8 rates, and so the ratios, differ several-fold."""
    model: str | None = None
    flags: list[str] | None = None
    try:
        info = Path("/proc/cpuinfo").read_text()
    except OSError:
        info = ""
    for line in info.splitlines():  # the first processor's lines (every core is alike)
        key, _, value = (part.strip() for part in line.partition(":"))
        if key == "model name" and model is None:
            model = value
        elif key == "flags" and flags is None:
            flags = [f for f in CPU_FLAGS if f in set(value.split())]
    return {"cpu": model or platform.processor() or platform.machine(), "cpu_flags": flags,
            "cpu_capability": torch.backends.cpu.get_cpu_capability(),
            "cpu_count": os.cpu_count(), "threads": torch.get_num_threads(),
            "interop_threads": torch.get_num_interop_threads()}
