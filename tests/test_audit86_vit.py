"""Audit 86 (vit): ViT-small's local reuse against the plain forward, and the size of what its
cache computes to know how many tokens a patch reaches."""

from __future__ import annotations

import itertools

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from senslab.models import create_model


def _small(**overrides):
    config = dict(image_size=16, dim=16, depth=2, heads=2, dim_head=8, mlp_dim=16, seed=0)
    return create_model("vit_small", **{**config, **overrides}).eval()


def _brute_reach(model, h, w, patch):
    """The reach as one mask per patch position (the definition)."""
    gh, gw = h // patch, w // patch
    mask = torch.zeros(gh * gw, 1, gh, patch, gw, patch)
    cells = torch.arange(gh * gw)
    mask[cells, :, cells // gw, :, cells % gw, :] = 1.0
    return int(model.reached_tokens(mask.view(gh * gw, 1, h, w)).sum(1).max())


class _Largest(TorchDispatchMode):
    """The most elements of any tensor an operation returns while active."""

    def __init__(self):
        super().__init__()
        self.most = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in out if isinstance(out, (tuple, list)) else (out,):
            if isinstance(t, torch.Tensor):
                self.most = max(self.most, t.numel())
        return out


def test_local_cache_counts_the_reach_without_a_mask_per_patch_position():
    """The reach was counted on one full-image mask per patch position ((H/p)²·H·W values,
    five times over in the shifted copies: 1.7 GB and 6 s for 160-pixel images and Patches(4),
    at every chunk's cache). It is now read off one image of patch numbers."""
    model = _small(image_size=32, patch_size=4, dim_head=16)
    x = torch.randn(1, 3, 32, 32, generator=torch.Generator().manual_seed(0))
    with torch.no_grad(), _Largest() as largest:
        cache = model.local_cache(x, 1)
    # tokens × patch positions: 64 · 1,025 = 65,600; the old masks: 1,024 · 32² · 5 = 5.2 M
    assert largest.most <= 100_000, largest.most
    assert cache["reach"] == _brute_reach(model, 32, 32, 1) == 3


@pytest.mark.parametrize("shift", ["axis", "diagonal", "none"])
def test_the_reach_equals_one_mask_per_position(shift):
    n = 0
    for mp, mult in itertools.product([1, 2, 3, 4, 8], [1, 2, 3]):
        image = mp * mult
        model = _small(image_size=image, patch_size=mp, shift=shift, in_channels=1, dim=8,
                       depth=1, heads=1, mlp_dim=8)
        for p in (d for d in range(1, image + 1) if image % d == 0):
            assert model._reach(image, image, p) == _brute_reach(model, image, image, p), (
                mp, image, p)
            n += 1
    assert n > 40


def _every_patch(images, side, patch):
    grid = side // patch
    rows = torch.arange(images).repeat_interleave(grid * grid)
    tok = torch.arange(grid * grid).repeat(images)
    return rows, tok // grid * patch, tok % grid * patch


def _perturbed_full(model, x, rows, top, left, patch):
    copies = x[rows].clone()
    p = patch.shape[-1]
    for i in range(len(rows)):
        copies[i, :, top[i]:top[i] + p, left[i]:left[i] + p] = patch[i]
    return model(copies)


@pytest.mark.parametrize("seed", range(12))
def test_forward_local_equals_the_plain_forward_on_random_configs(seed):
    """Every fast path (fused weights, kept memory, the first block's updated clean rows, the
    host's SDPA scale) against the plain forward: batches of one, LSA or not, relu attention,
    dropout in eval, one or three channels, large inputs, copies in any order, a second call
    on the kept memory."""
    g = torch.Generator().manual_seed(seed)

    def pick(options):
        return options[int(torch.randint(len(options), (1,), generator=g))]

    mp = pick([1, 2, 4])
    image = mp * pick([1, 2, 3])
    dim = pick([8, 16])
    cfg = dict(image_size=image, patch_size=mp, dim=dim, depth=pick([1, 2, 3]),
               heads=pick([1, 3]), dim_head=pick([dim // 2, dim, dim + 4]), mlp_dim=16,
               locality=pick([True, False]), shift=pick(["axis", "diagonal", "none"]),
               attention=pick(["softmax", "softmax", "relu"]), in_channels=pick([1, 3]),
               dropout=pick([0.0, 0.3]), emb_dropout=0.2, seed=seed)
    model = create_model("vit_small", **cfg).eval()
    p = pick([d for d in range(1, image + 1) if image % d == 0])
    images, scale = pick([1, 2]), pick([1.0, 1e3])
    x = torch.randn(images, cfg["in_channels"], image, image, generator=g) * scale
    rows, top, left = _every_patch(images, image, p)
    order = torch.randperm(len(rows), generator=g)
    rows, top, left = rows[order], top[order], left[order]
    noisy = torch.randn(len(rows), cfg["in_channels"], p, p, generator=g) * 2 * scale
    with torch.no_grad():
        cache = model.local_cache(x, p)
        fast = model.forward_local(cache, rows, top, left, noisy)
        again = model.forward_local(cache, rows, top, left, noisy)
        full = _perturbed_full(model, x, rows, top, left, noisy)
    size = max(1.0, float(full.abs().max()))
    torch.testing.assert_close(fast, full, rtol=0, atol=1e-4 * size)
    torch.testing.assert_close(again, full, rtol=0, atol=1e-4 * size)


@pytest.mark.parametrize("dim_head", [8, 16])
def test_forward_local_under_bf16_autocast_is_as_close_as_the_plain_forward(dim_head):
    model = _small(dim_head=dim_head)
    g = torch.Generator().manual_seed(0)
    x = torch.randn(2, 3, 16, 16, generator=g)
    rows, top, left = _every_patch(2, 16, 4)
    noisy = torch.randn(len(rows), 3, 4, 4, generator=g) * 2
    with torch.no_grad():
        with torch.autocast("cpu", dtype=torch.bfloat16):
            fast = model.forward_local(model.local_cache(x, 4), rows, top, left, noisy).float()
            full = _perturbed_full(model, x, rows, top, left, noisy).float()
        exact = _perturbed_full(model.double(), x.double(), rows, top, left,
                                noisy.double()).float()
    assert (fast - exact).abs().max() <= 3 * (full - exact).abs().max() + 1e-3
