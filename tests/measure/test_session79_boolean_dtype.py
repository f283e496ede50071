"""A function wrapping a bf16 model gets float32 strings unless told: torch's "mat1 and mat2
must have the same dtype" named neither f nor ``dtype=``. The error now names the fix, and the
fix measures."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from senslab.measure.boolean import boolean_sensitivity


def _bf16_model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(10, 16), nn.Tanh(), nn.Linear(16, 1)).bfloat16().eval()


def test_a_wrapped_bf16_model_is_told_to_pass_its_dtype() -> None:
    model = _bf16_model()

    def f(x: torch.Tensor) -> torch.Tensor:
        return model(x).squeeze(-1)

    with pytest.raises(RuntimeError, match=r"float32 strings.*pass dtype=torch\.bfloat16"):
        boolean_sensitivity(f, 10, output="real")
    told = boolean_sensitivity(f, 10, output="real", dtype=torch.bfloat16)
    itself = boolean_sensitivity(model, 10, output="real")
    assert told.average == itself.average > 0


def test_a_dtype_error_of_a_function_holding_no_model_is_left_as_it_is() -> None:
    def f(x: torch.Tensor) -> torch.Tensor:
        return x @ torch.ones(10, dtype=torch.float64)

    with pytest.raises(RuntimeError) as raised:
        boolean_sensitivity(f, 10, output="real")
    assert "pass dtype=" not in str(raised.value)
