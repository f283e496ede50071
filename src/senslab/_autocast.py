"""What autocast is doing on a device, on every torch the package supports (the device argument
of the queries came with torch 2.4). The lowest module of the package, so that the models and
the measurement read it from one place."""

from __future__ import annotations

import torch


def autocast_on(device_type: str) -> bool:
    """Whether autocast is on for ``device_type``."""
    try:
        return bool(torch.is_autocast_enabled(device_type))
    except TypeError:  # torch < 2.4: no device argument
        if device_type == "cpu":
            return bool(torch.is_autocast_cpu_enabled())
        return bool(torch.is_autocast_enabled())


def autocast_dtype(device_type: str) -> torch.dtype:
    """The dtype autocast casts to on ``device_type``."""
    try:
        return torch.get_autocast_dtype(device_type)
    except (AttributeError, TypeError):  # torch < 2.4
        if device_type == "cpu":
            return torch.get_autocast_cpu_dtype()
        return torch.get_autocast_gpu_dtype()
