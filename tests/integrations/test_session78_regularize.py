"""The sensitivity regularizer on bf16 outputs (a change below the outputs' grid is warned
about, not returned as a penalty without a word) and on per-token outputs (the default
cross-entropy would read (B, T, C) logits as (B, C, T): refused)."""

from __future__ import annotations

import copy
import warnings

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from senslab.tokens import Sequence
from senslab.train import regularize
from senslab.train.regularize import sensitivity_penalty, sensitivity_regularized_loss


@pytest.fixture(autouse=True)
def fresh_said(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each test starts with no output-grid case said (they are said once per process)."""
    monkeypatch.setattr(regularize, "_OUTPUT_GRID_SAID", set())


def linear(bias: float, scale: float = 1.0) -> nn.Module:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Flatten(), nn.Linear(16, 3))
    with torch.no_grad():
        model[1].weight.mul_(scale)
        model[1].bias.fill_(bias)
    return model


def images() -> torch.Tensor:
    return torch.rand(8, 1, 4, 4, generator=torch.Generator().manual_seed(1)) * 2 - 1


def penalty(model: nn.Module, x: torch.Tensor, sigma: float) -> tuple[float, list[str]]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        value, _ = sensitivity_penalty(model, x, patch=2, sigma=sigma,
                                       generator=torch.Generator().manual_seed(0))
    return value.item(), [str(w.message) for w in caught if "sensitivity_penalty" in str(w.message)]


def test_bf16_outputs_too_coarse_for_the_noise_are_warned_about():
    # logits near 100: bf16's grid there has steps of 0.5, the noise moves them by ~0.03
    model = linear(100.0)
    exact, said = penalty(model, images(), 0.1)
    assert said == []  # float32 outputs: not looked at
    low, said = penalty(copy.deepcopy(model).bfloat16(), images().bfloat16(), 0.1)
    assert low > 5 * exact  # the rounding, not the model's sensitivity
    assert len(said) == 1 and "measure the rounding" in said[0] and "bfloat16" in said[0]
    assert "float32" in said[0]  # the fix
    # said once per process, not at every training step
    assert penalty(copy.deepcopy(model).bfloat16(), images().bfloat16(), 0.1)[1] == []
    # the value returned is the one computed before: the check only reads the outputs
    g = torch.Generator().manual_seed(0)
    clean, noisy = regularize._branches(copy.deepcopy(model).bfloat16(), images().bfloat16(),
                                        regularize.Patches(2), 0.1, g, None, None)
    assert low == F.mse_loss(noisy, clean).item()
    # logits near 0, σ = 1: the grid is fine enough; nothing said, the float32 value kept
    regularize._OUTPUT_GRID_SAID.clear()
    fine = linear(0.0)
    exact, _ = penalty(fine, images(), 1.0)
    low, said = penalty(copy.deepcopy(fine).bfloat16(), images().bfloat16(), 1.0)
    assert said == [] and low == pytest.approx(exact, rel=0.02)


def test_autocast_outputs_too_coarse_for_the_noise_are_warned_about():
    model = linear(100.0)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        _, said = penalty(model, images(), 0.1)
    assert len(said) == 1 and "measure the rounding" in said[0]


def test_a_bf16_penalty_of_exactly_zero_is_warned_about():
    # the noise's change (~1e-3) is far below bf16's steps of 8 near 1000: no output moves
    model = copy.deepcopy(linear(1000.0, scale=0.01)).bfloat16()
    value, said = penalty(model, images().bfloat16(), 0.5)
    assert value == 0.0
    assert len(said) == 1 and "exactly 0" in said[0] and "not regularized" in said[0]


def test_per_token_outputs_need_a_loss_fn():
    # (batch, tokens, classes) with tokens == classes: F.cross_entropy read the classes on
    # axis 1 and returned another loss without an error
    torch.manual_seed(0)
    model = nn.Linear(6, 5)
    x, y = torch.randn(4, 5, 6), torch.randint(5, (4, 5))
    with pytest.raises(ValueError, match=r"classes on axis 1.*transpose\(1, 2\)"):
        sensitivity_regularized_loss(model, x, y, tokens=Sequence(),
                                     generator=torch.Generator().manual_seed(0))
    # the fix the message names: the per-token cross-entropy
    _, parts = sensitivity_regularized_loss(
        model, x, y, tokens=Sequence(), generator=torch.Generator().manual_seed(0),
        loss_fn=lambda out, target: F.cross_entropy(out.transpose(1, 2), target))
    out = model(x)
    assert parts["task"].item() == pytest.approx(
        F.cross_entropy(out.reshape(-1, 5), y.reshape(-1)).item(), rel=1e-6)
    # tokens != classes was refused before too, but by torch, naming no fix
    with pytest.raises(ValueError, match="Pass loss_fn"):
        sensitivity_regularized_loss(nn.Linear(6, 3), x, y, tokens=Sequence(),
                                     generator=torch.Generator().manual_seed(0))
