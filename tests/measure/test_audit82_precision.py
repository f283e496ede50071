"""Checked precisions (audit 82): a model whose parameters are inference tensors; a static int8
copy of a model measured in its own (train) mode."""

import pytest
import torch
from torch import nn

from senslab import Patches, TokenSensitivity


def _measure(model: nn.Module, x: torch.Tensor, precision: str, **options) -> TokenSensitivity:
    m = TokenSensitivity(model, Patches(2), sigma=0.5, repeats=4, precision=precision,
                         generator=0, **options)
    m.update(x)
    return m


@pytest.mark.parametrize("precision", ["auto", "bf16-checked", "int8-checked"])
def test_a_model_built_under_inference_mode_is_measured_checked(precision):
    """Before: every checked precision, the default "auto" included, failed with torch's raw
    "Inference tensors do not track version counter" (the weights' fingerprint read each
    parameter's version); float32 measured the same model."""
    with torch.inference_mode():
        torch.manual_seed(2)  # test-only: init
        model = nn.Sequential(nn.Flatten(), nn.Linear(64, 256), nn.ReLU(),
                              nn.Linear(256, 5)).eval()
    assert model[1].weight.is_inference()
    x = torch.randn(32, 1, 8, 8, generator=torch.Generator().manual_seed(3))
    full = _measure(model, x, "float32").compute()
    checked = _measure(model, x, precision)
    got = checked.compute()
    assert 0 < full.estimate < 1
    assert torch.equal(got.per_sample, full.per_sample)
    if precision != "auto":
        assert checked.checked_precision == precision.split("-")[0]


class _Gate(nn.Module):
    """Identity in train mode, ``abs`` in eval mode: a deterministic difference of modes."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x if self.training else x.abs()


def test_a_model_measured_in_train_mode_gets_no_static_int8_copy():
    """Before: with ``eval_mode=False`` the static int8 copy was made (and traced) in eval mode,
    another function than the model measured: its margins were off by up to 0.99, so every copy
    was re-checked in float32 (recheck_fraction 1.0) and rarer differences were left to the spot
    checks. Now such a model runs its linear layers in int8, on the model's own forward."""
    torch.manual_seed(1)  # test-only: init
    model = nn.Sequential(nn.Conv2d(1, 8, 3, padding=1), nn.ReLU(),
                          nn.Conv2d(8, 16, 3, padding=1), _Gate(), nn.Flatten(),
                          nn.Linear(16 * 64, 64), nn.ReLU(), nn.Linear(64, 10)).train()
    x = torch.randn(32, 1, 8, 8, generator=torch.Generator().manual_seed(3))
    full = _measure(model, x, "float32", eval_mode=False).compute()
    checked = _measure(model, x, "int8-checked", eval_mode=False)
    got = checked.compute()
    assert 0 < full.estimate < 1
    assert torch.equal(got.per_sample, full.per_sample)
    assert checked.checked_precision == "int8"
    assert got.recheck_fraction < 0.5
