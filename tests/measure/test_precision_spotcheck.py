"""Checked precisions keep verifying their calibrated bound: past the calibration, a random
share of the copies outside the band is re-evaluated in float32, and a change larger than
the calibration allows widens the bound and re-checks the chunk (audit variants53, D2)."""

import warnings

import pytest
import torch
from torch import nn

from senslab import Patches, TokenSensitivity
from senslab.measure import _int8, _precision

D = 64


def cancelling_linear(head: int) -> nn.Module:
    """One linear layer over 8 × 8 images: class 0's weights are 0.01 on the first 32 pixels
    and ±1.003, cancelling, on the last 32; a never-predicted class sits at −50 (as
    log-softmax puts one). ``head=3``: three classes; ``head=64``: a 64-wide head (int8 runs
    it), class 1 weighting the first 32 pixels −0.01."""
    w = torch.empty(D)
    w[:32] = 0.01
    w[32:] = torch.tensor([1.0 + 1 / 300, -(1.0 + 1 / 300)]).repeat(16)
    lin = nn.Linear(D, head)
    with torch.no_grad():
        lin.weight.zero_()
        lin.bias.zero_()
        if head == 3:
            lin.weight[0] = w
            lin.bias[2] = -50.0
        else:
            lin.bias.fill_(-50.0)
            lin.bias[:2] = 0.0
            lin.weight[0, 32:] = w[32:]
            lin.weight[1, :32] = -0.01
    return nn.Sequential(nn.Flatten(), lin).eval()


def batches(first: int, later: int) -> tuple[torch.Tensor, torch.Tensor]:
    """A first batch (the calibration's copies) on the small-weight pixels, then a later one on
    the cancelling pixels, each example put on class 0's boundary: bf16's error there is ten
    times the calibrated bound, and nothing the band widens for sees it."""
    g = torch.Generator().manual_seed(1)
    a = torch.zeros(first, D)
    a[:, :32] = torch.rand(first, 32, generator=g) * 2 - 1
    b = torch.zeros(later, D)
    b[:, 32:] = torch.rand(later, 32, generator=g) * 2 - 1
    w = cancelling_linear(3)[1].weight[0].detach()
    for _ in range(2):
        b[:, 63] -= (b @ w) / w[63]
    return a.view(-1, 1, 8, 8), b.view(-1, 1, 8, 8)


def run(model: nn.Module, precision: str, first: torch.Tensor, later: torch.Tensor,
        **kw) -> TokenSensitivity:
    m = TokenSensitivity(model, Patches(2), sigma=0.003, repeats=4, precision=precision,
                         generator=0, **kw)
    m.update(first)
    m.update(later)
    return m


@pytest.mark.parametrize("chunk_size", [None, 16])
def test_a_later_batch_with_larger_bf16_errors_gets_float32_flips(chunk_size):
    """Before, copies outside the band calibrated on the first batch took bf16's class: 0.408
    against float32's 0.397 here (30 of 80 examples' rates off; 0.423 against 0.403 in the
    audit's script)."""
    model = cancelling_linear(3)
    first, later = batches(16, 64)
    full = run(model, "float32", first, later, chunk_size=chunk_size).compute()
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        m = run(model, "bf16-checked", first, later, chunk_size=chunk_size)
    r = m.compute()
    assert 0.2 < full.estimate < 0.6
    assert torch.equal(r.per_sample, full.per_sample)
    assert [str(w.message)[:64] for w in said] == [
        "precision='bf16-checked': a float32 spot check found bf16 changi"]
    check = m._check
    assert check.widened >= 1 and check.calibrated is not None
    assert m.check_bound > 4 * check.calibrated  # the calibration's bound was far too narrow
    assert 0 < r.recheck_fraction < 1


@pytest.mark.parametrize("chunk_size", [None, 16])
def test_a_later_batch_with_larger_int8_errors_gets_float32_flips(chunk_size, monkeypatch):
    """The same with int8's linear layer (the 64-wide head): before, 1 or 2 copies outside the
    band took int8's class. Inputs are quantised to 7 bits, as on a CPU without VNNI: with
    VNNI's 8 bits (an AMX Xeon) the later batch's errors stay inside the band, and nothing
    would need widening."""
    monkeypatch.setattr(_int8, "reduce_range", lambda: True)
    model = cancelling_linear(64)
    first, later = batches(16, 64)
    full = run(model, "float32", first, later, chunk_size=chunk_size).compute()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        m = run(model, "int8-checked", first, later, chunk_size=chunk_size)
    assert torch.equal(m.compute().per_sample, full.per_sample)
    assert m._check.widened >= 1


def mlp_and_images() -> tuple[nn.Module, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    model = nn.Sequential(nn.Flatten(), nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 10))
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn(p.shape, generator=g) / p.shape[-1] ** 0.5)
    return model.eval(), torch.randn(48, 1, 8, 8, generator=g)


def test_spot_checks_on_an_ordinary_model_change_only_the_recheck_count(monkeypatch):
    """On a model whose errors the calibration covers, the spot checks find nothing to say,
    leave every number as float32's (and as without them), and are counted in the
    re-checked share; the same seed gives the same count, and neither the metric's noise
    nor torch's global generator moves."""
    model, x = mlp_and_images()
    kw = {"sigma": 0.5, "repeats": 2, "generator": 0}

    def measure(precision):
        m = TokenSensitivity(model, Patches(2), precision=precision, **kw)
        m.update(x)
        return m.compute()

    full = measure("float32")
    state = torch.get_rng_state()
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        a, b = measure("bf16-checked"), measure("bf16-checked")
    assert torch.equal(torch.get_rng_state(), state)
    assert 0.05 < full.estimate < 0.95
    assert torch.equal(a.per_sample, full.per_sample)
    assert a.num_forward_fp32 == b.num_forward_fp32
    least = _precision.SPOT_MIN
    monkeypatch.setattr(_precision, "SPOT_MIN", 0)
    monkeypatch.setattr(_precision, "SPOT_SHARE", 0.0)
    none = measure("bf16-checked")  # no spot checks: the old count
    assert torch.equal(none.per_sample, full.per_sample)
    # a small share of the copies outside the band, at least a few
    outside = 48 * 16 * 2 - none.num_forward_fp32
    spots = a.num_forward_fp32 - none.num_forward_fp32
    assert outside > 500 and least <= spots <= 0.03 * outside


def test_a_change_within_the_band_widens_the_bound_without_a_word():
    """A spot-checked copy whose margin changed by more than the calibration's largest change
    but less than the band (the safety factor absorbed it) widens the bound silently; a
    larger one, or a changed class, also warns (once)."""
    check = _precision.PrecisionCheck()
    check.low, check.bound = "bf16", 4.0
    check.calibrated = 4.0
    low = torch.tensor([[3.0, 0.0], [5.0, 0.0]])
    full = torch.tensor([[1.5, 0.0], [5.0, 0.0]])  # a change of 1.5, within the band of 4
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        assert check._widen(low, full, torch.ones(2), "logits", None)
    assert check.bound == 6.0 and check.widened == 1
    assert not check._widen(low, low.clone(), torch.ones(2), "logits", None)  # no change
    flipped = torch.tensor([[-1.0, 0.0], [5.0, 0.0]])  # class 0 → 1, a change of 4
    with pytest.warns(RuntimeWarning, match="could take bf16's class"):
        assert check._widen(low, flipped, torch.ones(2), "logits", None)
    assert check.bound == 16.0 and check.widened == 2
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)  # said once
        assert check._widen(low * 10, flipped, torch.ones(2), "logits", None)
