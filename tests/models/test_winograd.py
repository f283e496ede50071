"""Winograd's F(4×4, 3×3) for local reuse's 3×3 convolutions on whole small maps
(senslab.models._winograd; ResNet.forward_local)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from senslab.measure import TokenSensitivity
from senslab.models import _winograd as winograd
from senslab.tokens import Patches

from .test_local_reuse import assert_same_gradients, every_patch, perturbed_full, resnet


@pytest.mark.parametrize("c, k, h, w, bias", [
    (3, 5, 4, 4, True), (8, 4, 8, 12, False), (16, 16, 12, 4, True), (2, 7, 16, 16, True)])
def test_conv3x3_is_the_convolution_in_exact_arithmetic(c, k, h, w, bias):
    # in float64 only the transforms' rounding is left: the algebra (Bᵀ, G, Aᵀ) must be exact
    g = torch.Generator().manual_seed(0)
    x = torch.randn(3, c, h, w, generator=g, dtype=torch.float64)
    weight = torch.randn(k, c, 3, 3, generator=g, dtype=torch.float64)
    b = torch.randn(k, generator=g, dtype=torch.float64) if bias else None
    out = winograd.conv3x3(x, winograd.transform_weight(weight), b)
    ref = F.conv2d(x, weight, b, padding=1)
    assert out.shape == ref.shape and out.dtype == torch.float64
    assert out.is_contiguous(memory_format=torch.channels_last)
    torch.testing.assert_close(out, ref, rtol=0, atol=1e-11 * float(ref.abs().max()))


def test_conv3x3_float32_error_is_a_direct_convolutions():
    g = torch.Generator().manual_seed(1)
    x = torch.randn(16, 256, 8, 8, generator=g)
    weight = torch.randn(256, 256, 3, 3, generator=g) / 48
    b = torch.randn(256, generator=g)
    ref = F.conv2d(x.double(), weight.double(), b.double(), padding=1)
    wino = winograd.conv3x3(x, winograd.transform_weight(weight), b).double() - ref
    # float32 rounding of a 2,304-term sum through the transforms: 2.2e-6 of the largest output
    # (Lavin's points 0, ±1, ±2 gave 2.6× that). A direct float32 convolution's error depends
    # on the machine's kernels (as large on an AVX2 EPYC, 10× smaller on an AVX-512 one), so
    # the bound is relative to the outputs, not to it
    assert wino.abs().max() <= 4e-6 * ref.abs().max()
    assert wino.pow(2).mean().sqrt() <= 3e-6 * ref.pow(2).mean().sqrt()


def test_conv3x3_refuses_maps_that_are_not_whole_tiles():
    u = winograd.transform_weight(torch.randn(4, 3, 3, 3))
    with pytest.raises(ValueError, match="multiples of 4"):
        winograd.conv3x3(torch.randn(1, 3, 6, 8), u)
    with pytest.raises(ValueError, match=r"\(N, 3, H, W\)"):
        winograd.conv3x3(torch.randn(1, 5, 8, 8), u)
    with pytest.raises(ValueError, match="3, 3"):
        winograd.transform_weight(torch.randn(4, 3, 5, 5))


def test_applies_where_it_was_measured_to_pay():
    conv = nn.Conv2d(256, 256, 3, padding=1)
    assert winograd.applies(conv, torch.zeros(2, 256, 8, 8))
    assert winograd.applies(conv, torch.zeros(2, 256, 4, 16))
    assert not winograd.applies(conv, torch.zeros(2, 256, 16, 16))  # a larger map
    assert not winograd.applies(conv, torch.zeros(2, 256, 6, 6))  # not whole tiles
    assert not winograd.applies(conv, torch.zeros(2, 256, 8, 8, dtype=torch.float64))
    narrow = nn.Conv2d(128, 128, 3, padding=1)
    assert not winograd.applies(narrow, torch.zeros(2, 128, 8, 8))
    assert not winograd.applies(nn.Conv2d(256, 256, 3, padding=1, stride=2),
                                torch.zeros(2, 256, 8, 8))
    assert not winograd.applies(nn.Conv2d(256, 256, 1), torch.zeros(2, 256, 8, 8))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert not winograd.applies(conv, torch.zeros(2, 256, 8, 8))


def wide_resnet():
    """Stages of 32-64-128-256 channels, the last with two blocks: on 32×32 images its 4×4 maps
    have 256 channels, so three 3×3 convolutions (stride 1) run by Winograd's algorithm."""
    return resnet(32, stats=True, blocks=(1, 1, 1, 2), sens_patch=4, width=0.5)


def copies(images, seed):
    """``images`` random 32×32 images and a noisy copy at every 4×4 patch of each: (x, rows,
    top, left, noise)."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(images, 3, 32, 32, generator=g)
    rows, top, left = every_patch(images, 32, 4)
    return x, rows, top, left, torch.randn(len(rows), 3, 4, 4, generator=g)


def test_resnet_forward_local_runs_the_last_stage_by_winograd():
    model = wide_resnet()
    x, rows, top, left, noisy = copies(2, 0)
    with torch.no_grad():
        full = perturbed_full(model, x, rows, top, left, noisy)
        fast = model.forward_local(model.local_cache(x, 4), rows, top, left, noisy)
        model.winograd = False
        direct = model.forward_local(model.local_cache(x, 4), rows, top, left, noisy)
    last = [m for m in model.features if hasattr(m, "body")][-2:]
    kept = model.__dict__["_winograd_filters"]
    assert set(kept) == {last[0].body[2], last[1].body[0], last[1].body[2]}
    assert all(u.shape == (36, 256, 256) for _, u in kept.values())
    tol = {"rtol": 1e-4, "atol": 1e-6 * float(full.abs().max())}
    torch.testing.assert_close(fast, full, **tol)
    torch.testing.assert_close(fast, direct, **tol)
    assert not torch.equal(fast, direct)  # another algorithm did run


def test_resnet_winograd_filters_follow_the_weights():
    model = wide_resnet()
    x, rows, top, left, noisy = copies(1, 2)
    with torch.no_grad():
        model.forward_local(model.local_cache(x, 4), rows, top, left, noisy)
        kept = dict(model.__dict__["_winograd_filters"])
        layer = model.features[-3].body[2]  # the last block's second convolution + BatchNorm
        layer[1].running_var.mul_(4.0)  # in place, as load_state_dict or training would
        layer[0].weight.mul_(-1.0)
        fast = model.forward_local(model.local_cache(x, 4), rows, top, left, noisy)
        full = perturbed_full(model, x, rows, top, left, noisy)
    now = model.__dict__["_winograd_filters"]
    assert now[layer][1] is not kept[layer][1]  # remade after the change
    assert all(now[m][1] is kept[m][1] for m in kept if m is not layer)  # the rest kept
    torch.testing.assert_close(fast, full, rtol=1e-4, atol=1e-6 * float(full.abs().max()))


def test_token_sensitivity_with_winograd_equals_full_forwards():
    model = wide_resnet()
    x = torch.rand(3, 3, 32, 32, generator=torch.Generator().manual_seed(3)) * 2 - 1
    runs = {}
    for reuse in (False, True):
        m = TokenSensitivity(model, Patches(4, reuse_local=reuse), sigma=5.0, repeats=2,
                             generator=2, precision="float32")
        m.update(x)
        runs[reuse] = m.compute()
    assert model.__dict__.get("_winograd_filters")  # the local run did use the algorithm
    assert 0.02 < runs[False].estimate < 0.98
    assert torch.equal(runs[True].per_sample, runs[False].per_sample)


def test_winograd_keeps_the_gradient():
    model = wide_resnet()
    assert_same_gradients(model, 32, [0, 16], [4, 28])
    assert model.__dict__.get("_winograd_filters")
