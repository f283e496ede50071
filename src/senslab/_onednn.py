"""What oneDNN (PyTorch's CPU kernel library) says when it has no kernel for a layer in a dtype.

On a CPU without AVX-512, oneDNN has no bf16 LSTM: under bf16 autocast ``nn.LSTM`` raises a
``RuntimeError`` with this text instead of computing. The zoo's LSTM catches it and runs in
float32 (``senslab.models.text``); the measurement turns it into an error that names the fix
(``senslab.measure.tokenwise``). Both layers read it from here, the lowest module of the package.
"""

from __future__ import annotations

import torch

#: the text of oneDNN's error when it has no kernel for an op in a dtype on this CPU
NO_ONEDNN_KERNEL = "could not create a primitive descriptor"


def missing_kernel(err: BaseException, device: torch.device) -> bool:
    """Whether ``err`` is oneDNN's "no kernel for this dtype here" on a CPU device."""
    return device.type == "cpu" and NO_ONEDNN_KERNEL in str(err)
