"""Checked precisions on outputs they cannot bound: a model whose outputs
are a step of its scores changes no calibration margin in the low precision, so the calibrated
bound is 0 and copies the low precision moved across the step kept its class, without a word."""

import warnings

import pytest
import torch
from torch import nn

from senslab import Patches, TokenSensitivity


class Step(nn.Module):
    """A binary classifier returning its decision, ``(z > 0).float()``, instead of its logit."""

    def __init__(self, scores: nn.Module) -> None:
        super().__init__()
        self.scores = scores

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return (self.scores(x)[:, 0] > 0).float()


class OwnFloat32(nn.Module):
    """Runs its layers with autocast switched off: nothing in it ever runs in bf16."""

    def __init__(self, inner: nn.Module) -> None:
        super().__init__()
        self.inner = inner

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        with torch.autocast("cpu", enabled=False):
            return self.inner(x)


def scores_and_images(seed: int = 4) -> tuple[nn.Module, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    model = nn.Sequential(nn.Flatten(), nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 1))
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn(p.shape, generator=g) / p.shape[-1] ** 0.5)
    return model.eval(), torch.randn(64, 1, 8, 8, generator=g)


def measure(model: nn.Module, x: torch.Tensor, precision: str) -> TokenSensitivity:
    m = TokenSensitivity(model, Patches(2), sigma=0.05, repeats=4, precision=precision,
                         generator=0)
    m.update(x)
    return m


@pytest.mark.parametrize("low", ["bf16", "int8"])
def test_a_step_output_runs_in_float32_with_a_word(low):
    """Before: the bound was calibrated as 0, and bf16 gave 0.00293 where float32 gives 0.00244
    (one example's rate off), int8 alike, with no warning."""
    scores, x = scores_and_images()
    model = Step(scores).eval()
    full = measure(model, x, "float32").compute()
    with pytest.warns(RuntimeWarning, match=f"{low} changed no output's margin"):
        m = measure(model, x, f"{low}-checked")
    r = m.compute()
    assert 0 < full.estimate < 0.05  # flips happen: the comparison is not vacuous
    assert torch.equal(r.per_sample, full.per_sample)
    assert r.estimate == full.estimate
    assert m.checked_precision == "float32" and "discrete" in m.float32_reason
    assert m.check_bound is None
    twice = measure(model, x, "float32")
    twice.update(x)
    with warnings.catch_warnings():  # said once per metric
        warnings.simplefilter("error", RuntimeWarning)
        m.update(x)
    assert torch.equal(m.compute().per_sample, twice.compute().per_sample)
    if low == "bf16":
        # a model that runs nothing in bf16 has a bound of 0 that is exact: it stays checked,
        # without a word
        with warnings.catch_warnings():
            warnings.simplefilter("error", RuntimeWarning)
            own = measure(OwnFloat32(model), x, "bf16-checked")
        assert own.checked_precision == "bf16" and own.check_bound == 0
        assert torch.equal(own.compute().per_sample, full.per_sample)


class NaNOnSome(nn.Module):
    """A linear classifier that also takes the square root of a gap: 10 plus the rounding
    error of its first logit on images of positive mean, 0.001 plus it on the others. float32's
    error (1e-7) keeps every gap positive; bf16's makes some negative: NaN on a few copies."""

    def __init__(self) -> None:
        super().__init__()
        g = torch.Generator().manual_seed(0)
        self.lin = nn.Linear(64, 3)
        with torch.no_grad():
            self.lin.weight.copy_(torch.randn(3, 64, generator=g) / 8)
            self.lin.bias.zero_()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        flat = x.flatten(1)
        z = self.lin(flat)
        exact = (flat.double() @ self.lin.weight.double().T)[:, 0]
        eps = torch.where(flat.mean(1) > 0, 10.0, 1e-3).double()
        gap = z[:, 0].double() - exact + eps
        return z.float() + 0 * gap.sqrt().float()[:, None]


def test_a_few_non_finite_bf16_outputs_leave_the_bound_finite():
    """Before: one NaN among the calibration's bf16 outputs made the bound infinite, and every
    copy of the metric's life was evaluated twice (recheck_fraction 1.0, check_bound inf), more
    than float32 alone, without a word. The NaN copies are re-checked whatever the bound."""
    g = torch.Generator().manual_seed(1)
    x = torch.randn(64, 1, 8, 8, generator=g) + 1.0
    x[::8] -= 2.0  # every eighth image: a negative mean, a gap within bf16's error
    model = NaNOnSome().eval()
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        assert 0 < int(model(x).float().isnan().any(1).sum()) < 8  # a few NaN, clean already
    assert not bool(model(x).isnan().any())
    full = measure(model, x, "float32").compute()
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        m = measure(model, x, "bf16-checked")
    r = m.compute()
    assert 0 < full.estimate < 0.5
    assert torch.equal(r.per_sample, full.per_sample)
    assert m.checked_precision == "bf16"
    assert m.check_bound is not None and 0 < m.check_bound < 1
    assert r.recheck_fraction < 0.5
