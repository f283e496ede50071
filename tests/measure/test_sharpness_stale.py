"""Sharpness of weights that are not what they seem: a parametrization's cache or its own
parameters, an autocast inside the forward, weights the forward rewrites through ``.data``,
and weights changed by the user between calls."""

from __future__ import annotations

import copy
import warnings

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.utils import parametrize
from torch.nn.utils.parametrizations import spectral_norm, weight_norm

from senslab.measure.sharpness import loss_sharpness, output_sharpness


def _mlp() -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(16, 64), nn.Tanh(), nn.Linear(64, 4))


def _x() -> torch.Tensor:
    return torch.randn(64, 16, generator=torch.Generator().manual_seed(1))


def _plain_copy(model: nn.Sequential) -> nn.Sequential:
    """The same network with every parametrization removed (the weights the layers use)."""
    plain = copy.deepcopy(model)
    for layer in plain:
        if parametrize.is_parametrized(layer):
            parametrize.remove_parametrizations(layer, "weight")
    return plain


def test_a_call_inside_parametrize_cached_is_refused():
    # the cache kept the clean weight_norm weight for every perturbed forward: only the
    # biases were perturbed (ShOp 0.19 where the uncached call gives 0.65)
    model = _mlp()
    model[0], model[2] = weight_norm(model[0]), weight_norm(model[2])
    x = _x()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        uncached = output_sharpness(model, x, generator=1).shop.estimate
        with parametrize.cached(), pytest.raises(ValueError, match=r"parametrize\.cached\(\)"):
            output_sharpness(model, x, generator=1)
        with parametrize.cached(), pytest.raises(ValueError, match="outside the cached"):
            loss_sharpness(model, F.mse_loss, x, torch.zeros(64, 4), generator=1)
    # the refusal left nothing behind: the next call outside the cache is as before
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert output_sharpness(model, x, generator=1).shop.estimate == uncached


@pytest.mark.parametrize("kind", ["weight_norm", "spectral_norm", "hook_weight_norm"])
def test_parametrized_weights_are_named_in_a_warning(kind):
    model = _mlp()
    x = _x()
    if kind == "weight_norm":
        model[0] = weight_norm(model[0])
        perturbed = "0.parametrizations.weight.original1"
    elif kind == "spectral_norm":
        model[0] = spectral_norm(model[0])
        model.train()
        for _ in range(10):  # power iteration: u, v settle
            model(x)
        perturbed = "0.parametrizations.weight.original"
    else:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)  # deprecated, still in use
            torch.nn.utils.weight_norm(model[0])
        perturbed = "0.weight_v"
    with pytest.warns(UserWarning, match="parametrized") as record:
        res = output_sharpness(model, x, generator=1).shop.estimate
    said = " ".join(str(w.message) for w in record)
    assert "'0.weight'" in said and repr(perturbed) in said
    # the warning is warranted: the same weights held plainly have another sharpness
    if kind != "hook_weight_norm":
        plain = output_sharpness(_plain_copy(model), x, generator=1).shop.estimate
        assert abs(res - plain) > 0.03 * plain


def test_a_parametrization_left_out_by_exclude_and_a_plain_model_are_not_warned_about():
    model = _mlp()
    model[2] = weight_norm(model[2])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        output_sharpness(model, _x(), generator=1, exclude=["2."])
        output_sharpness(_mlp(), _x(), generator=1)


class _OwnAutocast(nn.Module):
    """An MLP whose forward runs under a bf16 autocast of its own (``on``), or not."""

    def __init__(self, on: bool = True, functional: bool = False) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.net = nn.Sequential(nn.Linear(16, 64), nn.Tanh(), nn.Linear(64, 4))
        self.on, self.functional = on, functional

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=self.on):
            if self.functional:  # functional calls on the parameters: no submodule runs
                a, b = self.net[0], self.net[2]
                h = torch.tanh(F.linear(x, a.weight, a.bias))
                return F.linear(h, b.weight, b.bias).float()
            return self.net(x).float()


@pytest.mark.parametrize("functional", [False, True])
def test_noise_that_the_forwards_own_autocast_rounds_away_is_refused(functional):
    # before: sigma_w=3e-4 gave ShOp 0.0052 (95% CI 0.0048-0.0056) where the same weights in
    # float32 arithmetic give 0.0042: half the noise was rounded away by the bf16 cast, and
    # the outputs' bf16 rounding was counted as sensitivity. A bf16 model was refused.
    model, x = _OwnAutocast(functional=functional), _x()
    with pytest.raises(ValueError, match="its own torch.autocast") as err:
        output_sharpness(model, x, sigma_w=3e-4, generator=1)
    assert "'net." in str(err.value) and "bfloat16" in str(err.value)
    with pytest.raises(ValueError, match="its own torch.autocast"):
        loss_sharpness(model, F.mse_loss, x, torch.zeros(64, 4), sigma=3e-4, generator=1)
    # the same sigma in float32 arithmetic is measured
    output_sharpness(_OwnAutocast(on=False, functional=functional), x, sigma_w=3e-4,
                     generator=1)


def test_noise_well_above_the_autocast_grid_is_measured_as_in_float32():
    x = _x()
    got = output_sharpness(_OwnAutocast(), x, sigma_w=0.05, generator=1).shop.estimate
    ref = output_sharpness(_OwnAutocast(on=False), x, sigma_w=0.05, generator=1).shop.estimate
    assert got == pytest.approx(ref, rel=1e-2)


class _Clamped(nn.Module):
    """Clips its weights in its forward through ``.data`` (no version counter moves)."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.lin = nn.Linear(16, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.lin.weight.data.clamp_(-0.1, 0.1)
        return self.lin(x)


@pytest.mark.parametrize("which", ["output", "loss"])
def test_a_forward_that_rewrites_its_weights_through_data_is_refused(which):
    # before: ShOp 0.52 came back without a word, measured around weights the forward had
    # changed, and the call left the model's weights changed although it says it restores them
    model = _Clamped()
    with pytest.raises(ValueError, match=r"'lin\.weight' in place \(also through \.data"):
        if which == "output":
            output_sharpness(model, _x(), generator=1)
        else:
            loss_sharpness(model, F.mse_loss, _x(), torch.zeros(64, 4), generator=1)


def test_weights_changed_between_calls_are_measured_afresh():
    # nothing derived from the weights is kept from one call to the next: after a training
    # step, a load_state_dict and a write through .data each call equals that on a fresh copy
    model, x = _mlp(), _x()
    y = torch.randint(0, 4, (64,), generator=torch.Generator().manual_seed(2))
    first = output_sharpness(model, x, generator=1).shop.estimate
    F.cross_entropy(model(x), y).backward()
    with torch.no_grad():  # a plain SGD step (torch.optim's first import costs seconds)
        for p in model.parameters():
            p -= 1.0 * p.grad
    after_step = output_sharpness(model, x, generator=1).shop.estimate
    assert after_step != first
    assert after_step == output_sharpness(copy.deepcopy(model), x, generator=1).shop.estimate
    model.load_state_dict({k: 0.5 * v for k, v in model.state_dict().items()})
    loss = loss_sharpness(model, F.cross_entropy, x, y, generator=1)
    fresh = loss_sharpness(copy.deepcopy(model), F.cross_entropy, x, y, generator=1)
    assert (loss.estimate, loss.reference) == (fresh.estimate, fresh.reference)
    with torch.no_grad():
        model[0].weight.data.mul_(3)
    assert (output_sharpness(model, x, generator=1).shop.estimate
            == output_sharpness(copy.deepcopy(model), x, generator=1).shop.estimate)
