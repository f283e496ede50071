"""Checked precisions (audit 86): a float32 ``-inf`` in the calibration, a float32 NaN found by a
spot check, and ``recheck_fraction`` where the calibration sent every copy to float32."""

import math
import warnings

import pytest
import torch
from torch import nn

from senslab import Patches, Sequence, TokenSensitivity


class _MaskedClass(nn.Module):
    """Two logits of a linear layer and a third class masked with ``-inf`` on the copies whose
    last feature the noise pushed above 0.5 (never on the clean inputs, where it is 0)."""

    def __init__(self) -> None:
        super().__init__()
        g = torch.Generator().manual_seed(0)
        self.lin = nn.Linear(64, 2, bias=False)
        with torch.no_grad():
            self.lin.weight.copy_(torch.randn(2, 64, generator=g))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        z = self.lin(x.mean(1))
        masked = torch.where(x[:, :, -1].amax(1) > 0.5, float("-inf"), z[:, 0] - 1)
        return torch.cat([z, masked[:, None]], 1)


def test_a_masked_class_on_calibration_copies_keeps_the_band_widening():
    """Before: a float32 ``-inf`` on one calibration copy made S, the largest output seen,
    infinite, so max(1, s / S) was 1 for every later copy: a copy with outputs 10 times any
    calibrated one kept the calibration's band (only the spot checks were left)."""
    g = torch.Generator().manual_seed(1)
    x = torch.randn(16, 4, 64, generator=g)
    x[:, :, -1] = 0
    model = _MaskedClass().eval()
    with torch.no_grad():  # the precondition: the noise masks the class on some copies
        noisy = x + 0.5 * torch.randn(256, 4, 64, generator=g)[:16]
        assert bool(torch.isinf(model(noisy)).any())
    m = TokenSensitivity(model, Sequence(), sigma=0.5, repeats=4, generator=3,
                         precision="bf16-checked")
    m.update(x)  # 256 copies: the calibration
    check = m._check
    assert check.bound is not None and math.isfinite(check.bound)
    assert math.isfinite(check.scale) and 0 < check.scale < 100
    wide = check._output_widening(torch.tensor([10 * check.scale, check.scale / 2]))
    assert torch.allclose(wide, torch.tensor([10.0, 1.0]))
    full = TokenSensitivity(model, Sequence(), sigma=0.5, repeats=4, generator=3,
                            precision="float32")
    full.update(x)
    assert m.compute().estimate == full.compute().estimate


#: a value bf16 rounds up to 1 + 2^-7 = 1.0078 from anywhere in (1.0039, 1.0078)
_EDGE = 1.0 + 2**-7 - 0.001


class _Float32Nan(nn.Module):
    """Two logits, and a term ``0 * sqrt(s - _EDGE)`` of feature 0 of the first token where
    s > 1: NaN in float32 for s in (1, _EDGE), never under bf16 autocast, which rounds such an
    s to 1 (no term) or 1.0078 (above _EDGE). s is a product with one factor (exact in float32
    whatever the batch)."""

    def __init__(self) -> None:
        super().__init__()
        g = torch.Generator().manual_seed(0)
        self.lin = nn.Linear(7, 2, bias=False)
        with torch.no_grad():
            self.lin.weight.copy_(torch.randn(2, 7, generator=g))
        self.register_buffer("one", torch.ones(1, 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        s = (x[:, 0, :1] @ self.one)[:, 0].float()
        nan = torch.where(s > 1, torch.sqrt(s - _EDGE) * 0, torch.zeros_like(s))
        z = self.lin(x[:, 0, 1:]).float()
        return torch.stack([3 + z[:, 0] + nan, z[:, 1]], 1)


def test_a_float32_nan_found_by_a_spot_check_is_named_and_refused():
    """Before: a spot check that found float32 NaN on a copy whose bf16 output was finite and
    far from the boundary read it as bf16 changing the margin by inf, and warned that bf16's
    errors exceeded the calibration's because the first batch was unlike the later ones (data
    sorted by class). Now the warning names the cause (float32 fails where bf16 does not), the
    copy is refused as a float32 run refuses it, and every later copy is re-checked."""
    g = torch.Generator().manual_seed(7)
    first = torch.randn(64, 1, 8, generator=g)
    first[:, :, 0] = 2.0  # far from the edge: finite in both precisions
    later = torch.randn(64, 1, 8, generator=g)
    later[:, :, 0] = _EDGE + 1e-4  # finite clean; half the copies NaN in float32 alone
    model = _Float32Nan().eval()
    m = TokenSensitivity(model, Sequence(), sigma=1e-3, repeats=4, generator=0,
                         precision="bf16-checked")
    m.update(first)
    assert m.check_bound is not None and math.isfinite(m.check_bound)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        with pytest.raises(FloatingPointError, match="NaN or infinite"):
            m.update(later)
    said = [str(w.message) for w in seen if issubclass(w.category, RuntimeWarning)]
    assert any("float32 output NaN or infinite on a copy whose bf16 output was finite" in s
               for s in said), said
    assert not any("data sorted by class" in s for s in said), said
    assert m.check_bound == math.inf
    with pytest.raises(FloatingPointError):  # as a float32 run refuses the batch
        TokenSensitivity(model, Sequence(), sigma=1e-3, repeats=4, generator=0,
                         precision="float32").update(later)


class _Step(nn.Module):
    """A binary classifier returning its decision, ``(z > 0).float()``: bf16 changes no
    calibration margin, so the copies run in float32."""

    def __init__(self) -> None:
        super().__init__()
        g = torch.Generator().manual_seed(4)
        self.scores = nn.Sequential(nn.Flatten(), nn.Linear(64, 256), nn.ReLU(),
                                    nn.Linear(256, 1))
        with torch.no_grad():
            for p in self.scores.parameters():
                p.copy_(torch.randn(p.shape, generator=g) / p.shape[-1] ** 0.5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return (self.scores(x)[:, 0] > 0).float()


def test_recheck_fraction_is_none_where_the_calibration_sent_every_copy_to_float32():
    """Before: ``recheck_fraction`` read 1.0 (every calibration copy ran in both precisions)
    for a metric whose calibration sent all its copies to float32, which re-checked nothing:
    "100% re-checked" beside ``checked_precision == "float32"``."""
    x = torch.randn(8, 1, 8, 8, generator=torch.Generator().manual_seed(4))
    m = TokenSensitivity(_Step().eval(), Patches(2), sigma=0.05, repeats=4, generator=0,
                         precision="bf16-checked")
    m.update(x[:2])  # 128 copies: the calibration goes on, each evaluated in both precisions
    assert m.recheck_fraction == 1.0 and m.state.forward_fp32 == 128
    with pytest.warns(RuntimeWarning, match="bf16 changed no output's margin"):
        m.update(x[2:])
    r = m.compute()
    assert m.checked_precision == "float32" and m.state.checked == 0
    assert r.recheck_fraction is None and m.recheck_fraction is None
    assert r.num_forward_fp32 == 256  # the calibration's float32 forwards, still counted
    full = TokenSensitivity(_Step().eval(), Patches(2), sigma=0.05, repeats=4, generator=0,
                            precision="float32")
    full.update(x)
    assert torch.equal(r.per_sample, full.compute().per_sample)


class _FailsOnce(nn.Module):
    """A model whose forward raises on its ``fail_at``-th call (counted while ``armed``)."""

    def __init__(self, inner: nn.Module) -> None:
        super().__init__()
        self.inner, self.armed, self.calls, self.fail_at = inner, False, 0, 3

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.armed:
            self.calls += 1
            if self.calls == self.fail_at:
                raise ValueError("interrupted")
        return self.inner(x)


@pytest.mark.parametrize("step", [False, True], ids=["checked", "to-float32"])
def test_a_failed_update_during_the_calibration_keeps_the_counts_consistent(step):
    """The calibration's copies count as checked ones; those of an update that failed are
    dropped with its other counts, and where the calibration then sends every copy to float32
    exactly those handed out are taken back: ``recheck_fraction`` is the share of the counted
    copies re-checked (at most 1), or None where none ran checked (never negative)."""
    x = torch.randn(12, 1, 8, 8, generator=torch.Generator().manual_seed(4))
    model = _FailsOnce(_Step() if step else _Step().scores).eval()
    m = TokenSensitivity(model, Patches(2), sigma=0.05, repeats=4, generator=0,
                         precision="bf16-checked", chunk_size=64)
    m.update(x[:2])  # 128 calibration copies
    model.armed = True
    with pytest.raises(ValueError, match="interrupted"):
        m.update(x[2:6])
    model.armed = False
    if step:
        with pytest.warns(RuntimeWarning, match="bf16 changed no output's margin"):
            m.update(x[6:])  # the calibration ends: every copy to float32
    else:
        m.update(x[6:])  # the calibration ends, then copies run checked
    r = m.compute()
    assert m.checked_precision == ("float32" if step else "bf16")
    if step:
        assert m.state.checked == 0 and r.recheck_fraction is None
        assert r.num_forward_fp32 >= 256
    else:
        assert m.check_bound is not None
        assert m.state.checked == (2 + 6) * 64  # the copies of the updates that were added
        assert r.recheck_fraction == r.num_forward_fp32 / m.state.checked
        assert 0 < r.recheck_fraction <= 1
